//! Bad input: each case is a clear error naming the namespace, the body does not run, and nothing is left
//! PENDING.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_sdk_dynamodb::types::AttributeValue;
use idempotent_runtime::{Error, Idempotency, Status, idempotent};
use idempotent_tests::{Backend, Harness};

#[derive(Debug)]
enum AppError {
    Idempotency(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idempotency(e)
    }
}

fn idem_error(result: Result<impl std::fmt::Debug, AppError>) -> Error {
    match result {
        Err(AppError::Idempotency(e)) => e,
        other => panic!("expected an idempotency error, got {other:?}"),
    }
}

#[idempotent(key = key, store = idem, name = "bad-input::by-map")]
async fn by_map(
    idem: &Idempotency,
    runs: &AtomicUsize,
    key: &HashMap<(u8, u8), u8>,
) -> Result<u32, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

#[idempotent(key = id, store = idem, name = "bad-input::number")]
async fn number(idem: &Idempotency, runs: &AtomicUsize, id: &str) -> Result<u32, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(41)
}

#[idempotent(key = id, store = idem, name = "bad-input::number")]
async fn text(idem: &Idempotency, runs: &AtomicUsize, id: &str) -> Result<String, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok("text".into())
}

async fn a_key_that_does_not_serialize_is_an_error_and_writes_nothing(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let key: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let err = idem_error(by_map(&h.idem, &runs, &key).await);
    assert!(
        matches!(&err, Error::Serialize { what: "key", .. }),
        "{err:?}"
    );
    assert_eq!(err.namespace(), "bad-input::by-map");
    assert!(
        err.to_string().contains("could not serialize the key"),
        "{err}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        h.requests.total(),
        0,
        "nothing is sent for a key that cannot be derived"
    );
}

async fn a_stored_response_of_another_type_is_a_deserialize_error(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    assert_eq!(number(&h.idem, &runs, "k").await.unwrap(), 41);
    // Same namespace and key, new output type (a deploy changed it).
    let err = idem_error(text(&h.idem, &runs, "k").await);
    assert!(
        matches!(&err, Error::Deserialize { namespace, .. } if namespace == "bad-input::number"),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not deserialize"), "{err}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body must not run again"
    );
    let record = h.record("bad-input::number", "k").await.unwrap();
    assert_eq!(
        (record.status, record.response.as_deref()),
        (Status::Completed, Some(&b"41"[..]))
    );
}

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test]
    a_key_that_does_not_serialize_is_an_error_and_writes_nothing,
    #[tokio::test]
    a_stored_response_of_another_type_is_a_deserialize_error,
}

#[tokio::test]
async fn a_missing_table_is_a_clear_error_and_the_body_does_not_run() {
    let (client, _) = idempotent_tests::client();
    let idem = Idempotency::dynamodb(client, "no-such-table");
    let runs = AtomicUsize::new(0);
    let err = idem_error(number(&idem, &runs, "k").await);
    assert!(
        matches!(&err, Error::TableNotFound { table, .. } if table == "no-such-table"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("create it at start-up with `DynamoDbStore::ensure_table`"),
        "{err}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_record_this_library_cannot_read_is_corrupt_and_left_untouched() {
    let h = Harness::new(Backend::DynamoDb).await;
    let store = h.dynamodb.as_ref().expect("a DynamoDB harness");
    let key = idempotent_runtime::derive_key("bad-input::number", "k").unwrap();
    let item: HashMap<String, AttributeValue> = [
        ("pk".to_owned(), AttributeValue::S(key.clone())),
        ("status".to_owned(), AttributeValue::S("ARCHIVED".into())),
        ("token".to_owned(), AttributeValue::S("someone".into())),
        (
            "expires_at".to_owned(),
            AttributeValue::N("99999999999".into()),
        ),
    ]
    .into();
    store
        .client()
        .put_item()
        .table_name(store.table())
        .set_item(Some(item.clone()))
        .send()
        .await
        .unwrap();
    let runs = AtomicUsize::new(0);
    let err = idem_error(number(&h.idem, &runs, "k").await);
    assert!(
        matches!(&err, Error::CorruptRecord { detail, .. } if detail.contains("ARCHIVED")),
        "{err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let stored = store
        .client()
        .get_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S(key))
        .send()
        .await
        .unwrap();
    assert_eq!(
        stored.item(),
        Some(&item),
        "the unreadable record must not be overwritten"
    );
}
