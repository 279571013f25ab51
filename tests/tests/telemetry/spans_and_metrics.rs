//! What the runtime reports: the `idempotent` span of each call closes with its outcome (captured by a
//! `tracing-subscriber` layer), and the `metrics` counters count calls, store requests, cancellation
//! reasons and consumed capacity exactly (a debugging recorder, on DynamoDB Local).

use std::collections::HashMap;
use std::sync::OnceLock;

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use idempotent_runtime::{Error, Idempotency, MemoryStore};
use idempotent_tests::{AppError, Backend, Harness};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tracing_subscriber::layer::SubscriberExt as _;

use idempotent_tests::spans::ClosedSpans as Spans;

async fn charge(idem: &Idempotency, order: &str, amount: u64, fail: bool) -> Result<u64, AppError> {
    idem.operation("telemetry::charge", order)
        .payload(&amount)
        .run(|_| async move {
            if fail {
                Err(AppError::Declined)
            } else {
                Ok(amount)
            }
        })
        .await
}

#[tokio::test(flavor = "current_thread")]
async fn each_call_has_a_span_that_closes_with_its_outcome() {
    let _one = ONE_AT_A_TIME.lock().await;
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let idem = Idempotency::builder(MemoryStore::new())
        .local_cache(8)
        .build();
    let plain = Idempotency::in_memory();

    assert_eq!(charge(&plain, "o-1", 100, false).await.unwrap(), 100);
    assert_eq!(charge(&plain, "o-1", 100, false).await.unwrap(), 100);
    assert!(matches!(
        charge(&plain, "o-1", 999, false).await,
        Err(AppError::Idempotency(Error::PayloadMismatch { .. }))
    ));
    assert!(matches!(
        charge(&plain, "o-2", 100, true).await,
        Err(AppError::Declined)
    ));
    assert!(matches!(
        plain
            .operation("telemetry::charge", &None::<String>)
            .run(|_| async { Ok::<_, AppError>(1) })
            .await,
        Err(AppError::Idempotency(Error::MissingKey { .. }))
    ));
    charge(&idem, "o-3", 1, false).await.unwrap();
    charge(&idem, "o-3", 1, false).await.unwrap();
    assert_eq!(
        spans.outcomes(),
        [
            "executed",
            "replayed",
            "payload_mismatch",
            "failed",
            "missing_key",
            "executed",
            "cached"
        ]
    );
    let first = spans.fields()[0].clone();
    assert_eq!(first["namespace"], "telemetry::charge");
    assert_eq!(first["attempt"], "1");
    let key = idempotent_runtime::derive_key("telemetry::charge", "o-1").unwrap();
    assert_eq!(first["key"].len(), 12, "a short hash of the key");
    assert!(key.ends_with(&first["key"][..]) || key.contains(&first["key"][..]));
    assert!(
        !first.values().any(|v| v.contains("o-1")),
        "never the raw key"
    );
}

fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
        snapshotter
    })
}

/// Counter values by `name{label=value,..}` (labels sorted).
fn counters() -> HashMap<String, u64> {
    recorder()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            let mut labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            Some((format!("{}{{{}}}", key.key().name(), labels.join(",")), n))
        })
        .collect()
}

/// The two tests share the process's recorder: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The counters counted since the last snapshot (a snapshot of the debugging recorder drains them),
/// without the zeros.
fn since_last() -> HashMap<String, u64> {
    counters().into_iter().filter(|(_, v)| *v > 0).collect()
}

fn count(delta: &HashMap<String, u64>, key: &str) -> u64 {
    delta.get(key).copied().unwrap_or(0)
}

/// A `Put` of an item that already exists, with a condition that it does not.
async fn taken_item(h: &Harness) -> Put {
    let table = idempotent_tests::unique_table("telemetry");
    let client = h.client();
    idempotent_runtime::DynamoDbStore::new(client.clone(), &table)
        .create_table()
        .await
        .unwrap();
    client
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("taken".into()))
        .send()
        .await
        .unwrap();
    Put::builder()
        .table_name(&table)
        .item("pk", AttributeValue::S("taken".into()))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn metrics_count_calls_store_requests_and_capacity() {
    let _one = ONE_AT_A_TIME.lock().await;
    recorder();
    let h = Harness::with(Backend::DynamoDb, |b| b.heartbeat(false)).await;

    since_last();
    assert_eq!(charge(&h.idem, "m-1", 5, false).await.unwrap(), 5);
    let first = since_last();
    assert_eq!(
        count(
            &first,
            "idempotency_calls_total{namespace=telemetry::charge,outcome=executed}"
        ),
        1
    );
    assert_eq!(
        count(
            &first,
            "idempotency_store_requests_total{op=claim,result=ok}"
        ),
        1
    );
    assert_eq!(
        count(
            &first,
            "idempotency_store_requests_total{op=complete,result=ok}"
        ),
        1
    );
    assert_eq!(count(&first, "idempotency_consumed_wcu_total{op=claim}"), 1);
    assert_eq!(
        count(&first, "idempotency_consumed_wcu_total{op=complete}"),
        1
    );

    since_last();
    assert_eq!(charge(&h.idem, "m-1", 5, false).await.unwrap(), 5);
    let replay = since_last();
    assert_eq!(
        count(
            &replay,
            "idempotency_calls_total{namespace=telemetry::charge,outcome=replayed}"
        ),
        1
    );
    assert_eq!(
        count(
            &replay,
            "idempotency_store_requests_total{op=claim,result=condition_failed}"
        ),
        1
    );
    assert_eq!(
        replay
            .keys()
            .filter(|k| k.starts_with("idempotency_store_requests_total"))
            .count(),
        1
    );

    since_last();
    assert!(charge(&h.idem, "m-2", 5, true).await.is_err());
    let failure = since_last();
    assert_eq!(
        count(
            &failure,
            "idempotency_calls_total{namespace=telemetry::charge,outcome=failed}"
        ),
        1
    );
    assert_eq!(
        count(
            &failure,
            "idempotency_store_requests_total{op=fail,result=ok}"
        ),
        1
    );

    // Past the ttl, a duplicate finds the record expired but not yet deleted, and claims it anew.
    h.clock.advance(std::time::Duration::from_hours(25));
    since_last();
    assert_eq!(charge(&h.idem, "m-1", 5, false).await.unwrap(), 5);
    let late = since_last();
    assert_eq!(count(&late, "dynamo_ttl_delete_before_retry_total{}"), 1);
    assert_eq!(
        count(
            &late,
            "idempotency_calls_total{namespace=telemetry::charge,outcome=executed}"
        ),
        1
    );
}

#[tokio::test(flavor = "current_thread")]
async fn metrics_count_a_canceled_transaction() {
    let _one = ONE_AT_A_TIME.lock().await;
    recorder();
    let h = Harness::with(Backend::DynamoDb, |b| b.heartbeat(false)).await;
    // A transaction canceled by a business condition (the item already exists).
    let put = taken_item(&h).await;
    since_last();
    let err = h
        .idem
        .operation("telemetry::reserve", "m-3")
        .transact()
        .run(|cx| async move {
            let ((), tx) = cx.into_parts();
            tx.put(put);
            Ok::<_, AppError>(())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AppError::Idempotency(Error::TransactionCanceled { .. })
        ),
        "{err:?}"
    );
    let canceled = since_last();
    assert_eq!(
        count(
            &canceled,
            "transact_write_cancellation_reason_total{reason=ConditionalCheckFailed}"
        ),
        1
    );
    assert_eq!(
        count(
            &canceled,
            "idempotency_store_requests_total{op=complete_transaction,result=canceled}"
        ),
        1
    );
    assert_eq!(
        count(
            &canceled,
            "idempotency_calls_total{namespace=telemetry::reserve,outcome=error}"
        ),
        1
    );
    assert_eq!(
        count(
            &canceled,
            "idempotency_store_requests_total{op=fail,result=ok}"
        ),
        1
    );
}

/// A call whose body panics is counted once, as `failed` (its record is FAILED): the panic leaves
/// the call before its caller's side could count it, so the count is made where the failure is stored.
#[tokio::test(flavor = "current_thread")]
#[allow(
    clippy::manual_assert,
    reason = "a `panic!` behind a condition the compiler cannot see through keeps the `Ok` after it reachable"
)]
async fn metrics_count_a_panicking_body_once_as_failed() {
    use futures_util::FutureExt as _;
    let _one = ONE_AT_A_TIME.lock().await;
    recorder();
    let idem = Idempotency::in_memory();
    since_last();
    let panicked =
        std::panic::AssertUnwindSafe(idem.operation("telemetry::panics", "p-1").run(|_| async {
            if std::hint::black_box(true) {
                panic!("the body panics");
            }
            Ok::<u64, AppError>(1)
        }))
        .catch_unwind()
        .await;
    assert!(panicked.is_err());
    let delta = since_last();
    let calls: Vec<_> = delta
        .keys()
        .filter(|k| k.starts_with("idempotency_calls_total"))
        .collect();
    assert_eq!(
        calls,
        ["idempotency_calls_total{namespace=telemetry::panics,outcome=failed}"],
        "{delta:?}"
    );
    assert_eq!(
        count(
            &delta,
            "idempotency_calls_total{namespace=telemetry::panics,outcome=failed}"
        ),
        1
    );
}
