//! The kill switch, `IDEMPOTENT_DISABLED=1`: bodies run directly, duplicates run again, nothing is
//! stored; calls with business writes still go through the store. The switch is read once per process,
//! so the checks run in a child process started with it set.

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{DISABLED_VAR, Error, Idempotency, MemoryStore, idempotent};

#[idempotent(key = order, store = idem, name = "kill-switch::charge")]
async fn charge(idem: &Idempotency, runs: &AtomicUsize, order: &str) -> Result<usize, Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

/// Runs in the child process, with the switch on.
#[tokio::test]
#[ignore = "run by `the_kill_switch_turns_idempotency_off` in a process with IDEMPOTENT_DISABLED=1"]
async fn with_the_switch_on() {
    assert_eq!(std::env::var(DISABLED_VAR).as_deref(), Ok("1"));
    let store = std::sync::Arc::new(MemoryStore::new());
    let idem = Idempotency::builder_arc(store.clone()).build();
    let runs = AtomicUsize::new(0);
    assert_eq!(charge(&idem, &runs, "o-1").await.unwrap(), 1);
    assert_eq!(
        charge(&idem, &runs, "o-1").await.unwrap(),
        2,
        "a duplicate runs again"
    );
    let value = idem
        .operation("kill-switch::op", "o-1")
        .run(|_| async { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) + 1) })
        .await
        .unwrap();
    assert_eq!(value, 3);
    assert!(store.is_empty(), "nothing was stored");
    // Writes that commit with the record still go through the store, so that none is lost.
    store.create_table("orders", "pk", None).unwrap();
    let put = aws_sdk_dynamodb::types::Put::builder()
        .table_name("orders")
        .item(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("o-3".into()),
        )
        .build()
        .unwrap();
    idem.operation("kill-switch::tx", "o-3")
        .transact()
        .run(|cx| async move {
            let ((), tx) = cx.into_parts();
            tx.put(put);
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert_eq!(store.len(), 1, "the transactional call kept its record");
    assert_eq!(store.items("orders").len(), 1);
    // Not even a handle is needed.
    Idempotency::uninstall();
    #[idempotent(key = order)]
    async fn uninstalled(order: &str) -> Result<String, Error> {
        Ok(format!("ran {order}"))
    }
    assert_eq!(uninstalled("o-2").await.unwrap(), "ran o-2");
}

#[test]
fn the_kill_switch_turns_idempotency_off() {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            &idempotent_tests::test_path(module_path!(), "with_the_switch_on"),
            "--nocapture",
        ])
        .env(DISABLED_VAR, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
