//! Business writes on a store without transactions (a third-party store that never implemented them, or
//! the memory store built without the `emulator` feature): the trait's defaults refuse them, and the call
//! fails with `Error::Unsupported`, naming the store and what it lacks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use idempotent_runtime::{Error, Idempotency, Status};
use idempotent_tests::RecordsOnly;

const NAMESPACE: &str = "shop::reserve";

fn put(id: &str) -> Put {
    Put::builder()
        .table_name("inventory")
        .item("sku", AttributeValue::S(id.to_owned()))
        .build()
        .unwrap()
}

fn handle() -> (Idempotency, Arc<RecordsOnly>) {
    let store = Arc::new(RecordsOnly::default());
    (Idempotency::builder_arc(store.clone()).build(), store)
}

#[tokio::test]
async fn claim_with_fails_before_the_body_runs_and_writes_nothing() {
    let (idem, store) = handle();
    let runs = AtomicUsize::new(0);
    let result: Result<u32, Error> = idem
        .operation(NAMESPACE, "order-1")
        .claim_with([TransactWriteItem::builder().put(put("apple")).build()])
        .compensate_with([TransactWriteItem::builder().put(put("pear")).build()])
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        })
        .await;
    let error = result.unwrap_err();
    assert!(
        matches!(&error, Error::Unsupported { namespace, store: "records-only", capability, .. }
            if namespace == NAMESPACE && capability.contains("claim_with")),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "`shop::reserve`: the records-only store does not support claims with business writes (`claim_with`)"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body must not run");
    assert!(store.0.is_empty(), "no record was written");
}

#[tokio::test]
async fn staged_writes_fail_the_completion_and_release_the_key() {
    let (idem, store) = handle();
    let runs = AtomicUsize::new(0);
    let counter = &runs;
    let result: Result<u32, Error> = idem
        .operation(NAMESPACE, "order-2")
        .transact()
        .run(|cx| async move {
            let ((), tx) = cx.into_parts();
            counter.fetch_add(1, Ordering::SeqCst);
            tx.put(put("apple"));
            Ok(1)
        })
        .await;
    let error = result.unwrap_err();
    assert!(
        matches!(&error, Error::Unsupported { store: "records-only", capability, .. }
            if capability.contains("transact")),
        "{error:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let records = store.0.records();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].status,
        Status::Failed,
        "the result is not stored without its writes, and the key is free again at once (not PENDING until the lease runs out)"
    );
    assert_eq!(records[0].response, None);
    // The key is not blocked: the next call runs the body again (and fails the same way).
    let again: Result<u32, Error> = idem
        .operation(NAMESPACE, "order-2")
        .transact()
        .run(|cx| async move {
            let ((), tx) = cx.into_parts();
            counter.fetch_add(1, Ordering::SeqCst);
            tx.put(put("apple"));
            Ok(1)
        })
        .await;
    assert!(matches!(again, Err(Error::Unsupported { .. })), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn calls_without_business_writes_are_unaffected() {
    let (idem, store) = handle();
    let runs = AtomicUsize::new(0);
    for _ in 0..2 {
        let value: u32 = idem
            .operation(NAMESPACE, "order-3")
            .transact()
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(7)
            })
            .await
            .unwrap();
        assert_eq!(value, 7);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate is replayed");
    let records = store.0.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Status::Completed);
}
