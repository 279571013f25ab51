//! Without the `emulator` feature the memory store holds records only: business writes on it are
//! refused through the [`Store`] trait's defaults, and a call with them fails with
//! [`Error::Unsupported`]. Run with `cargo test -p idempotent-runtime --no-default-features --features
//! dynamodb --lib`.

use std::sync::atomic::{AtomicUsize, Ordering};

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

use super::*;
use crate::{Error, Idempotency};

fn put() -> Put {
    Put::builder()
        .table_name("inventory")
        .item("sku", AttributeValue::S("apple".to_owned()))
        .build()
        .unwrap()
}

#[tokio::test]
async fn claim_with_on_the_memory_store_is_unsupported_before_the_body_runs() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let idem = Idempotency::builder_arc(store.clone()).build();
    let runs = AtomicUsize::new(0);
    let result: Result<u32, Error> = idem
        .operation("shop::reserve", "order-1")
        .claim_with([TransactWriteItem::builder().put(put()).build()])
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        })
        .await;
    let error = result.unwrap_err();
    assert!(
        matches!(&error, Error::Unsupported { store: "memory", capability, .. } if capability.contains("claim_with")),
        "{error:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(store.is_empty());
}

#[tokio::test]
async fn transact_on_the_memory_store_is_unsupported_and_stores_no_result() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let idem = Idempotency::builder_arc(store.clone()).build();
    let result: Result<u32, Error> = idem
        .operation("shop::reserve", "order-2")
        .transact()
        .run(|cx| async move {
            let ((), tx) = cx.into_parts();
            tx.put(put());
            Ok(1)
        })
        .await;
    let error = result.unwrap_err();
    assert!(
        matches!(&error, Error::Unsupported { store: "memory", capability, .. } if capability.contains("transact")),
        "{error:?}"
    );
    assert!(
        store
            .records()
            .iter()
            .all(|r| r.status != Status::Completed)
    );
}
