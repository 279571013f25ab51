//! The replay signal: `observe` tells an execution from a replay without changing the function's return
//! type, and `Operation::on_replay` adjusts replayed values only.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::{Error, Execution, Idempotency, idempotent, observe};
use idempotent_tests::{Backend, Harness};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    run: usize,
    replayed: bool,
}

#[derive(Debug)]
enum ShopError {
    Declined,
    Idempotency(#[expect(dead_code, reason = "read through Debug only")] Error),
}

impl From<Error> for ShopError {
    fn from(e: Error) -> Self {
        ShopError::Idempotency(e)
    }
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = order, store = idem, name = "replay::charge")]
async fn charge(idem: &Idempotency, order: &str, decline: bool) -> Result<Receipt, ShopError> {
    if decline {
        return Err(ShopError::Declined);
    }
    Ok(Receipt {
        order: order.to_owned(),
        run: RUNS.fetch_add(1, Ordering::SeqCst) + 1,
        replayed: false,
    })
}

#[idempotent(key = order, store = idem, name = "replay::checkout")]
async fn checkout(idem: &Idempotency, order: &str) -> Result<Receipt, ShopError> {
    // A nested idempotent call: the outer one is what `observe` reports.
    charge(idem, &format!("{order}/inner"), false).await
}

async fn executed_then_replayed(backend: Backend) {
    let h = Harness::new(backend).await;
    let order = format!("order-{backend:?}");

    let (first, execution) = observe(charge(&h.idem, &order, false)).await;
    let first = first.unwrap();
    assert_eq!(execution, Some(Execution::Executed));
    let (again, execution) = observe(charge(&h.idem, &order, false)).await;
    assert_eq!(execution, Some(Execution::Replayed));
    assert_eq!(
        again.unwrap(),
        first,
        "the replay is the stored value, unchanged"
    );

    // A failing body ran: executed, with its own error.
    let failed = format!("{order}-declined");
    let (result, execution) = observe(charge(&h.idem, &failed, true)).await;
    assert!(matches!(result, Err(ShopError::Declined)));
    assert_eq!(execution, Some(Execution::Executed));
}

#[tokio::test]
async fn observe_tells_executed_from_replayed_on_memory() {
    executed_then_replayed(Backend::Memory).await;
}

#[tokio::test]
async fn observe_tells_executed_from_replayed_on_dynamodb() {
    executed_then_replayed(Backend::DynamoDb).await;
}

#[tokio::test]
async fn observe_reports_none_when_the_body_could_not_run() {
    let h = Harness::new(Backend::Memory).await;
    let started = tokio::sync::Notify::new();
    let release = tokio::sync::Notify::new();
    let slow = h.idem.operation("replay::slow", "k").run(|_| async {
        started.notify_one();
        release.notified().await;
        Ok::<_, Error>(1)
    });
    let duplicate = async {
        started.notified().await;
        let observed = observe(
            h.idem
                .operation("replay::slow", "k")
                .run(|_| async { Ok::<_, Error>(2) }),
        )
        .await;
        release.notify_one();
        observed
    };
    let (first, (second, execution)) = tokio::join!(slow, duplicate);
    assert_eq!(first.unwrap(), 1);
    assert!(matches!(second, Err(Error::InProgress { .. })));
    assert_eq!(
        execution, None,
        "an in-flight duplicate neither ran nor replayed"
    );

    let (nothing, execution) = observe(async { 5 }).await;
    assert_eq!((nothing, execution), (5, None));
}

#[tokio::test]
async fn nested_calls_report_the_outer_one() {
    let h = Harness::new(Backend::Memory).await;
    // The inner call was made before: the outer one executes, the inner one replays.
    charge(&h.idem, "nested/inner", false).await.unwrap();
    let (_, execution) = observe(checkout(&h.idem, "nested")).await;
    assert_eq!(execution, Some(Execution::Executed));
    let (_, execution) = observe(checkout(&h.idem, "nested")).await;
    assert_eq!(execution, Some(Execution::Replayed));
}

#[tokio::test]
async fn on_replay_adjusts_replayed_values_only() {
    let h = Harness::new(Backend::DynamoDb).await;
    let runs = AtomicUsize::new(0);
    let call = || {
        h.idem
            .operation("replay::hook", "order-9")
            .ttl(Duration::from_mins(1))
            .on_replay(|r: Receipt| Receipt {
                replayed: true,
                ..r
            })
            .run(|_| async {
                Ok::<_, Error>(Receipt {
                    order: "order-9".into(),
                    run: runs.fetch_add(1, Ordering::SeqCst) + 1,
                    replayed: false,
                })
            })
    };
    let (first, execution) = observe(call()).await;
    let first = first.unwrap();
    assert_eq!(execution, Some(Execution::Executed));
    assert!(!first.replayed, "the hook does not touch a fresh value");

    // The hook's own `observe` does not hide the replay from the caller's.
    let (again, execution) = observe(call()).await;
    let again = again.unwrap();
    assert_eq!(execution, Some(Execution::Replayed));
    assert!(again.replayed);
    assert_eq!(again.run, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // What is stored is the body's value, not the hook's.
    let stored: Result<Receipt, Error> = h
        .idem
        .operation("replay::hook", "order-9")
        .run(|_| async { unreachable!("replayed") })
        .await;
    assert!(!stored.unwrap().replayed);
}
