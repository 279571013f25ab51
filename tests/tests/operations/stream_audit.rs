//! The stream audit on DynamoDB Local, with real TTL deletions: one table, seeded once, whose stream
//! holds a COMPLETED record deleted by TTL and then claimed again (a late retry: the body ran twice), a
//! record a user deleted, and another application's item deleted by TTL. Every assertion reads that
//! table's stream (Local deletes an expired item a few seconds after TTL is on, so the seeding waits once).
//!
//! That table lives on a DynamoDB Local of its own, started here: DynamoDB Local runs the TTL deletions
//! of at most 7 tables at a time (a job per table with TTL on, in a pool of 10 threads shared with
//! other jobs), for as long as each table exists, and the rest of the suite leaves dozens of tables with
//! TTL on the shared server: there, a new table's expired items are never deleted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodbstreams::config::interceptors::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodbstreams::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use idempotent_runtime::audit::{
    AuditConfig, Auditor, Finding, ReadOptions, StreamReader, stream_arn,
};
use idempotent_runtime::{DynamoDbStore, Error, Idempotency, ManualClock, admin, derive_key};
use idempotent_tests::{client, client_at, create_plain_table, raw_item, unique_table};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

const NS: &str = "billing::charge";

/// The seeded table and what the seeding did.
struct Seeded {
    table: String,
    /// The record TTL deleted, then claimed again.
    retried: String,
    /// The record a user deleted.
    deleted_by_user: String,
    /// How many times the retried key's body ran.
    runs: usize,
}

fn streams_client(endpoint: &str, interceptor: Option<Fault>) -> aws_sdk_dynamodbstreams::Client {
    let mut config = aws_sdk_dynamodbstreams::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("dummy", "dummy", None, None, "tests"));
    if let Some(fault) = interceptor {
        config = config.interceptor(fault);
    }
    aws_sdk_dynamodbstreams::Client::from_conf(config.build())
}

fn options() -> ReadOptions {
    ReadOptions::default()
        .idle_polls(2)
        .poll_interval(Duration::from_millis(20))
}

/// A DynamoDB Local of this test's own (see the module's docs), stopped when dropped (also when the
/// test fails).
struct OwnLocal {
    dir: std::path::PathBuf,
    endpoint: String,
}

impl OwnLocal {
    fn start() -> Self {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let shared = std::env::var_os("IDEMPOTENT_DYNAMODB_LOCAL_DIR")
            .map_or_else(|| root.join(".dynamodb-local"), std::path::PathBuf::from);
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("ttl-local-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // The installed jar, shared (as `scripts/test` shares it with its second server).
        let modules = dir.join("node_modules");
        if !modules.exists() {
            std::os::unix::fs::symlink(shared.join("node_modules"), &modules).unwrap();
        }
        let out = std::process::Command::new("bash")
            .arg(root.join("scripts/dynamodb-local"))
            .arg("--dir")
            .arg(&dir)
            .arg("start")
            .output()
            .expect("run scripts/dynamodb-local");
        assert!(
            out.status.success(),
            "this test starts a DynamoDB Local of its own with scripts/dynamodb-local, which failed (install it with `scripts/dynamodb-local install`, or run the tests with `scripts/test`): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let endpoint = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        Self { dir, endpoint }
    }
}

impl Drop for OwnLocal {
    fn drop(&mut self) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let _ = std::process::Command::new("bash")
            .arg(root.join("scripts/dynamodb-local"))
            .arg("--dir")
            .arg(&self.dir)
            .arg("stop")
            .output();
    }
}

async fn seed(endpoint: &str) -> Seeded {
    let (client, _) = client_at(endpoint);
    // TTL off while the table is seeded: DynamoDB Local deletes what expired a few seconds after TTL
    // is turned on (and not again for a long while), so it is turned on once the records are there.
    let table = unique_table("audit");
    create_plain_table(&client, &table, "pk").await;
    let store = DynamoDbStore::new(client, table);
    let stream = admin::enable_stream(&store)
        .await
        .expect("turn the stream on");
    assert!(stream.fits_the_audit(), "{stream:?}");
    // Records written two hours ago with a one-hour ttl: expired an hour ago, so TTL deletes them.
    let past = ManualClock::starting_now();
    past.set(past_ms(2 * 3600));
    let then = Idempotency::builder(store.clone()).clock(past).build();
    let now = Idempotency::builder(store.clone()).build();
    let runs = AtomicUsize::new(0);
    let charge = |idem: &Idempotency| {
        let runs = &runs;
        let idem = idem.clone();
        async move {
            idem.operation(NS, &(7, "order-1"))
                .ttl(Duration::from_hours(1))
                .run(|_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>("ch_7".to_owned())
                })
                .await
                .unwrap()
        }
    };
    assert_eq!(charge(&then).await, "ch_7");
    let retried = derive_key(NS, &(7, "order-1")).unwrap();
    // A live record a user deletes.
    let _: String = now
        .operation(NS, &(8, "order-2"))
        .run(|_| async { Ok::<_, Error>("ch_8".to_owned()) })
        .await
        .unwrap();
    let deleted_by_user = derive_key(NS, &(8, "order-2")).unwrap();
    store
        .client()
        .delete_item()
        .table_name(store.table())
        .set_key(Some(store.item_key(&deleted_by_user).unwrap()))
        .send()
        .await
        .unwrap();
    // Another application's item, expired: TTL deletes it too.
    store
        .client()
        .put_item()
        .table_name(store.table())
        .item("pk", AttributeValue::S("order-9".into()))
        .item(
            "expires_at",
            AttributeValue::N((past_ms(3600) / 1000).to_string()),
        )
        .send()
        .await
        .unwrap();
    store.ensure_table().await.expect("turn TTL on");
    // Wait for TTL: a few seconds on DynamoDB Local.
    let start = std::time::Instant::now();
    while raw_item(&store, &retried).await.is_some() {
        assert!(
            start.elapsed() < Duration::from_mins(1),
            "TTL never deleted the record"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while raw_item(&store, "order-9").await.is_some() {
        assert!(
            start.elapsed() < Duration::from_mins(1),
            "TTL never deleted the item"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The late duplicate: no record, so it claims the key and runs the body again.
    assert_eq!(charge(&now).await, "ch_7");
    // Its duplicates are replays: no new claim.
    assert_eq!(charge(&now).await, "ch_7");
    Seeded {
        table: store.table().to_owned(),
        retried,
        deleted_by_user,
        runs: runs.load(Ordering::SeqCst),
    }
}

fn past_ms(seconds_ago: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    u64::try_from(now.as_millis()).unwrap() - seconds_ago * 1000
}

/// Reads the whole stream of `store`'s table into `auditor`, `limit` records per `GetRecords`; the
/// findings.
async fn read(
    endpoint: &str,
    store: &DynamoDbStore,
    auditor: &mut Auditor,
    fault: Option<Fault>,
    limit: i32,
) -> (Vec<Finding>, idempotent_runtime::audit::ReadStats) {
    let arn = stream_arn(store.client(), store.table()).await.unwrap();
    let mut reader =
        StreamReader::new(streams_client(endpoint, fault), arn, options().limit(limit));
    let mut findings = Vec::new();
    reader
        .read(auditor, &mut |f| findings.push(f))
        .await
        .expect("read the stream");
    (findings, reader.stats().clone())
}

async fn ttl_deletions_user_deletes_and_a_late_retry_are_told_apart(
    endpoint: &str,
    seeded: &Seeded,
    store: &DynamoDbStore,
) {
    assert_eq!(seeded.runs, 2, "the late duplicate ran the body again");
    let mut auditor = Auditor::new(store, AuditConfig::default().ttl(Duration::from_hours(1)));
    let (findings, stats) = read(endpoint, store, &mut auditor, None, 1000).await;
    let deletions: Vec<_> = findings
        .iter()
        .filter_map(|f| match f {
            Finding::TtlDeletion(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(deletions.len(), 1, "{findings:#?}");
    let d = deletions[0];
    assert_eq!(d.key, seeded.retried);
    assert_eq!(d.namespace, NS);
    // No identity on DynamoDB Local: the expiry rule.
    assert_eq!(d.rule, idempotent_runtime::audit::Rule::Expiry);
    // Expired about an hour before it was deleted (the stream's time is rounded to the minute).
    assert!((3500..=3700).contains(&d.deletion_lag_s), "{d:?}");
    // Completed two hours before it was deleted.
    assert!(
        d.age_since_completion_s
            .is_some_and(|age| (7100..=7300).contains(&age)),
        "{d:?}"
    );
    let retries: Vec<_> = findings
        .iter()
        .filter_map(|f| match f {
            Finding::LateRetry(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(retries.len(), 1, "{findings:#?}");
    let r = retries[0];
    assert_eq!(r.key, seeded.retried);
    assert!(r.after_deletion_s <= 120, "{r:?}");
    assert!((3500..=3800).contains(&r.after_expiry_s), "{r:?}");
    let s = auditor.summary();
    assert_eq!(
        (s.ttl_deletions(), s.late_retries, s.other_deletions),
        (1, 1, 1),
        "{s:?}"
    );
    // The other application's item: its insert and its deletion.
    assert_eq!(s.not_records, 2, "{s:?}");
    assert!(stats.records >= 9, "{stats:?}");
    assert_eq!((stats.expired_iterators, stats.trimmed), (0, 0));
    let _ = &seeded.deleted_by_user;

    // The whole stream again, into the same auditor (a restarted reader): nothing counted twice.
    let (again, _) = read(endpoint, store, &mut auditor, None, 1000).await;
    let deletions_again = again
        .iter()
        .filter(|f| matches!(f, Finding::TtlDeletion(_)))
        .count();
    assert_eq!(deletions_again, 0, "{again:#?}");
    assert!(again.iter().all(|f| !matches!(f, Finding::LateRetry(_))));
    let s = auditor.summary();
    assert_eq!((s.ttl_deletions(), s.late_retries), (1, 1));
    assert!(s.duplicates >= 2, "{s:?}");
}

async fn a_late_retry_is_counted_in_the_metric_by_namespace(
    endpoint: &str,
    _seeded: &Seeded,
    store: &DynamoDbStore,
) {
    let snapshotter = recorder();
    // A snapshot drains the counters: what the next one shows is this test's.
    snapshotter.snapshot();
    let mut auditor = Auditor::new(store, AuditConfig::default());
    read(endpoint, store, &mut auditor, None, 1000).await;
    let counters: HashMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            Some((format!("{}{{{}}}", key.key().name(), labels.join(",")), n))
        })
        .collect();
    assert_eq!(
        counters.get(&format!(
            "dynamo_ttl_delete_before_retry_total{{namespace={NS}}}"
        )),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get(&format!(
            "idempotency_ttl_deletions_total{{namespace={NS},rule=expiry}}"
        )),
        Some(&1),
        "{counters:?}"
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

/// An error DynamoDB Streams answers `GetRecords` with, in place of the real answer, on the calls
/// numbered in `on` (from 1).
#[derive(Debug, Clone)]
struct Fault {
    code: &'static str,
    on: &'static [usize],
    calls: Arc<Mutex<usize>>,
}

impl Fault {
    fn new(code: &'static str, on: &'static [usize]) -> Self {
        Self {
            code,
            on,
            calls: Arc::new(Mutex::new(0)),
        }
    }
}

#[derive(Debug, Clone)]
struct IsGetRecords;

impl Storable for IsGetRecords {
    type Storer = StoreReplace<Self>;
}

impl Intercept for Fault {
    fn name(&self) -> &'static str {
        "Fault"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodbstreams::error::BoxError> {
        let target = context.request().headers().get("x-amz-target");
        if target.is_some_and(|t| t.ends_with(".GetRecords")) {
            cfg.interceptor_state().store_put(IsGetRecords);
        }
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodbstreams::error::BoxError> {
        if cfg.load::<IsGetRecords>().is_none() {
            return Ok(());
        }
        let mut calls = self.calls.lock().unwrap();
        *calls += 1;
        if !self.on.contains(&calls) {
            return Ok(());
        }
        let body = format!(
            r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{}","message":"injected"}}"#,
            self.code
        );
        let mut response = aws_smithy_runtime_api::http::Response::new(
            aws_smithy_runtime_api::http::StatusCode::try_from(400).unwrap(),
            aws_smithy_types::body::SdkBody::from(body),
        );
        response
            .headers_mut()
            .insert("content-type", "application/x-amz-json-1.0");
        *context.response_mut() = response;
        Ok(())
    }
}

async fn an_expired_iterator_is_renewed_after_the_last_record_read(
    endpoint: &str,
    _seeded: &Seeded,
    store: &DynamoDbStore,
) {
    // Three records per read; the second and third reads are refused: the renewed iterator continues
    // after the third record, the one after it too.
    let fault = Fault::new("ExpiredIteratorException", &[2, 3]);
    let mut auditor = Auditor::new(store, AuditConfig::default());
    let (findings, stats) = read(endpoint, store, &mut auditor, Some(fault), 3).await;
    assert_eq!(stats.expired_iterators, 2, "{stats:?}");
    let s = auditor.summary();
    assert_eq!(
        (s.ttl_deletions(), s.late_retries, s.duplicates),
        (1, 1, 0),
        "{s:?}"
    );
    assert_eq!(findings.len(), 2);
}

async fn a_trimmed_position_restarts_the_shard_at_its_oldest_record(
    endpoint: &str,
    _seeded: &Seeded,
    store: &DynamoDbStore,
) {
    // The fourth read's position was trimmed (three records a read: after the TTL deletion and the
    // late retry were read): the shard is read again from its oldest record, and what was read
    // before is not fed to the auditor again (neither the deletion and retry, which the auditor would
    // recognise, nor the user's delete, which it would count twice).
    let fault = Fault::new("TrimmedDataAccessException", &[4]);
    let mut auditor = Auditor::new(store, AuditConfig::default());
    let (findings, stats) = read(endpoint, store, &mut auditor, Some(fault), 3).await;
    assert_eq!(stats.trimmed, 1, "{stats:?}");
    assert_eq!(findings.len(), 2, "{findings:#?}");
    let s = auditor.summary();
    assert_eq!(
        (s.ttl_deletions(), s.late_retries, s.other_deletions),
        (1, 1, 1),
        "{s:?}"
    );
    assert_eq!((s.not_records, s.duplicates), (2, 0), "{s:?}");
    assert!(
        stats.records >= s.changes + 9,
        "read again: {stats:?}, fed: {s:?}"
    );
}

#[tokio::test]
async fn a_table_without_a_stream_is_refused_with_the_fix() {
    let (client, _) = client();
    let store = DynamoDbStore::new(client, unique_table("nostream"));
    store.ensure_table().await.unwrap();
    assert!(!admin::stream_report(&store).await.unwrap().enabled);
    let e = stream_arn(store.client(), store.table()).await.unwrap_err();
    assert!(
        e.to_string().contains("--stream") && e.to_string().contains("no stream"),
        "{e}"
    );
    // Turned on, it is on; asking again changes nothing.
    let on = admin::enable_stream(&store).await.unwrap();
    assert!(on.fits_the_audit() && on.arn.is_some(), "{on:?}");
    assert_eq!(admin::enable_stream(&store).await.unwrap(), on);
    assert_eq!(
        stream_arn(store.client(), store.table()).await.unwrap(),
        on.arn.unwrap()
    );
}

#[tokio::test]
async fn the_audit_on_real_ttl_deletions() {
    let local = OwnLocal::start();
    let seeded = seed(&local.endpoint).await;
    let store = DynamoDbStore::new(client_at(&local.endpoint).0, &seeded.table);
    let endpoint = local.endpoint.as_str();
    ttl_deletions_user_deletes_and_a_late_retry_are_told_apart(endpoint, &seeded, &store).await;
    a_late_retry_is_counted_in_the_metric_by_namespace(endpoint, &seeded, &store).await;
    an_expired_iterator_is_renewed_after_the_last_record_read(endpoint, &seeded, &store).await;
    a_trimmed_position_restarts_the_shard_at_its_oldest_record(endpoint, &seeded, &store).await;
}
