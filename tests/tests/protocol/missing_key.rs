//! A key that serializes to `null` (an `Option` that is `None`) shared one record with every
//! other such key, so the second keyless caller got the first one's response. A missing key is now
//! rejected before any I/O, unless the function allows `null` as a value or skips idempotency for it.

use std::sync::atomic::{AtomicUsize, Ordering};

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use idempotent_runtime::{Error, Idempotency, MissingKey, Status, derive_key, idempotent};
use idempotent_tests::{Backend, Harness, idem_error};
use serde_json::{Value, json};

use super::AppError;
use idempotent_tests::on_both_stores;

/// The caller's own data, so that a response handed to the wrong caller shows.
fn receipt(runs: &AtomicUsize, caller: &str) -> String {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    format!("receipt of {caller} (run {run})")
}

const REJECT: &str = "missing-key::reject";

/// Keyed by `order_id` (the default policy): returns its caller's receipt.
#[idempotent(key = order_id, store = idem, name = "missing-key::reject")]
async fn reject(
    idem: &Idempotency,
    runs: &AtomicUsize,
    caller: &str,
    order_id: Option<String>,
) -> Result<String, AppError> {
    Ok(receipt(runs, caller))
}

async fn a_none_key_is_rejected_before_any_io(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let alice = reject(&h.idem, &runs, "alice", None).await;
    let bob = reject(&h.idem, &runs, "bob", None).await;
    // Bob first: without the check, he gets Alice's receipt.
    for result in [bob, alice] {
        let err = idem_error(result);
        assert!(
            matches!(&err, Error::MissingKey { namespace, .. } if namespace == REJECT),
            "{err:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body must not run");
    assert_eq!(h.requests.total(), 0, "nothing is sent for a missing key");
    let null_key = derive_key(REJECT, &None::<String>).unwrap();
    assert_eq!(h.store.get(&null_key).await.unwrap(), None, "no record");
}

const TUPLE: &str = "missing-key::tuple";

#[idempotent(key = (tenant, order_id), store = idem, name = "missing-key::tuple")]
async fn by_tuple(
    idem: &Idempotency,
    runs: &AtomicUsize,
    caller: &str,
    tenant: &str,
    order_id: Option<&str>,
) -> Result<String, AppError> {
    Ok(receipt(runs, caller))
}

const VALUE: &str = "missing-key::value";

#[idempotent(key = key, store = idem, name = "missing-key::value")]
async fn by_value(
    idem: &Idempotency,
    runs: &AtomicUsize,
    caller: &str,
    key: &Value,
) -> Result<String, AppError> {
    Ok(receipt(runs, caller))
}

async fn a_tuple_key_with_a_none_part_is_missing_but_empty_values_are_keys(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let err = idem_error(by_tuple(&h.idem, &runs, "alice", "acme", None).await);
    assert!(
        matches!(&err, Error::MissingKey { namespace, .. } if namespace == TUPLE),
        "{err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body must not run");
    assert_eq!(h.requests.total(), 0, "nothing is sent for a missing key");
    assert_eq!(h.record(TUPLE, &("acme", None::<&str>)).await, None);

    // An empty part is a value.
    let first = by_tuple(&h.idem, &runs, "alice", "", Some(""))
        .await
        .unwrap();
    assert_eq!(first, "receipt of alice (run 1)");
    let again = by_tuple(&h.idem, &runs, "bob", "", Some("")).await.unwrap();
    assert_eq!(again, first, "replayed");

    // Empty and false values are keys, each its own.
    let keys = [
        json!(["", 0, false]),
        json!([]),
        json!({}),
        json!(""),
        json!(0),
        json!(false),
    ];
    for (i, key) in keys.iter().enumerate() {
        let caller = format!("caller {i}");
        let first = by_value(&h.idem, &runs, &caller, key).await.unwrap();
        assert_eq!(
            first,
            format!("receipt of {caller} (run {})", i + 2),
            "{key}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1 + keys.len(),
        "one run per key"
    );
    for (i, key) in keys.iter().enumerate() {
        let replay = by_value(&h.idem, &runs, "someone else", key).await.unwrap();
        assert_eq!(
            replay,
            format!("receipt of caller {i} (run {})", i + 2),
            "{key}"
        );
        let record = h.record(VALUE, key).await.unwrap();
        assert_eq!(record.status, Status::Completed, "{key}");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1 + keys.len(),
        "every duplicate was replayed"
    );
}

const ALLOW: &str = "missing-key::allow";

/// Keyed by `order_id`, with `missing_key = "allow"`: returns its caller's receipt.
#[idempotent(key = order_id, store = idem, name = "missing-key::allow", missing_key = "allow")]
async fn allow(
    idem: &Idempotency,
    runs: &AtomicUsize,
    caller: &str,
    order_id: Option<String>,
) -> Result<String, AppError> {
    Ok(receipt(runs, caller))
}

async fn allow_makes_null_a_key_like_any_other(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let alice = allow(&h.idem, &runs, "alice", None).await.unwrap();
    let bob = allow(&h.idem, &runs, "bob", None).await.unwrap();
    assert_eq!(alice, "receipt of alice (run 1)");
    assert_eq!(bob, alice, "the second call is a duplicate of the first");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = h.record(ALLOW, &None::<String>).await.unwrap();
    assert_eq!(record.status, Status::Completed);
}

const SKIP: &str = "missing-key::skip";

/// Keyed by `order_id`, with `missing_key = "skip"`: returns its caller's receipt.
#[idempotent(key = order_id, store = idem, name = "missing-key::skip", missing_key = "skip")]
async fn skip(
    idem: &Idempotency,
    runs: &AtomicUsize,
    caller: &str,
    order_id: Option<String>,
) -> Result<String, AppError> {
    Ok(receipt(runs, caller))
}

async fn skip_runs_the_body_without_the_store(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let alice = skip(&h.idem, &runs, "alice", None).await.unwrap();
    let bob = skip(&h.idem, &runs, "bob", None).await.unwrap();
    assert_eq!(alice, "receipt of alice (run 1)");
    assert_eq!(
        bob, "receipt of bob (run 2)",
        "each keyless call runs its own body"
    );
    assert_eq!(h.requests.total(), 0, "no store call");
    assert_eq!(h.record(SKIP, &None::<String>).await, None, "no record");

    // A key that is there is idempotent as ever.
    let first = skip(&h.idem, &runs, "carol", Some("o-1".into()))
        .await
        .unwrap();
    let again = skip(&h.idem, &runs, "dave", Some("o-1".into()))
        .await
        .unwrap();
    assert_eq!(
        (first.as_str(), again.as_str()),
        ("receipt of carol (run 3)", "receipt of carol (run 3)")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

const OPERATION: &str = "missing-key::operation";

/// Two keyless calls of the same operation under `policy` (`None`: the builder's default).
async fn twice(
    h: &Harness,
    runs: &AtomicUsize,
    policy: Option<MissingKey>,
) -> [Result<String, Error>; 2] {
    let order_id: Option<&str> = None;
    let mut results = Vec::new();
    for caller in ["alice", "bob"] {
        let operation = h.idem.operation(OPERATION, &order_id);
        let operation = match policy {
            Some(policy) => operation.missing_key(policy),
            None => operation,
        };
        results.push(operation.run(|_| async { Ok(receipt(runs, caller)) }).await);
    }
    results.try_into().unwrap()
}

async fn the_operation_builder_applies_the_same_policies(backend: Backend) {
    let h = Harness::new(backend).await;
    for policy in [None, Some(MissingKey::Reject)] {
        let runs = AtomicUsize::new(0);
        for result in twice(&h, &runs, policy).await {
            let err = result.unwrap_err();
            assert!(
                matches!(&err, Error::MissingKey { namespace, .. } if namespace == OPERATION),
                "{policy:?}: {err:?}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{policy:?}");
    }

    let runs = AtomicUsize::new(0);
    let [alice, bob] = twice(&h, &runs, Some(MissingKey::Skip)).await;
    assert_eq!(alice.unwrap(), "receipt of alice (run 1)");
    assert_eq!(bob.unwrap(), "receipt of bob (run 2)");
    assert_eq!(
        h.requests.total(),
        0,
        "neither reject nor skip calls the store"
    );
    assert_eq!(h.record(OPERATION, &None::<&str>).await, None, "no record");

    let runs = AtomicUsize::new(0);
    let [alice, bob] = twice(&h, &runs, Some(MissingKey::Allow)).await;
    assert_eq!(alice.unwrap(), "receipt of alice (run 1)");
    assert_eq!(bob.unwrap(), "receipt of alice (run 1)", "replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = h.record(OPERATION, &None::<&str>).await.unwrap();
    assert_eq!(record.status, Status::Completed);
}

/// A write to a business table that the test never creates: nothing may reach it.
fn business_write() -> TransactWriteItem {
    let put = Put::builder()
        .table_name("missing-key-inventory")
        .item("sku", AttributeValue::S("sku-1".into()))
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

async fn skip_never_drops_business_writes(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = &AtomicUsize::new(0);
    let order_id: Option<&str> = None;
    let claimed = h
        .idem
        .operation(OPERATION, &order_id)
        .missing_key(MissingKey::Skip)
        .claim_with([business_write()])
        .run(|_| async { Ok::<_, Error>(receipt(runs, "alice")) })
        .await;
    let staged = h
        .idem
        .operation(OPERATION, &order_id)
        .missing_key(MissingKey::Skip)
        .transact()
        .run(|cx| async move {
            let ((), tx) = cx.into_parts();
            tx.push(business_write());
            Ok::<_, Error>(receipt(runs, "bob"))
        })
        .await;
    for result in [claimed, staged] {
        let err = result.unwrap_err();
        assert!(matches!(&err, Error::MissingKey { .. }), "{err:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body must not run");
    assert_eq!(h.requests.total(), 0, "nothing is sent");
}

on_both_stores!(
    a_none_key_is_rejected_before_any_io,
    a_tuple_key_with_a_none_part_is_missing_but_empty_values_are_keys,
    allow_makes_null_a_key_like_any_other,
    skip_runs_the_body_without_the_store,
    the_operation_builder_applies_the_same_policies,
    skip_never_drops_business_writes,
);
