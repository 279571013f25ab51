//! Home-region routing ([`RoutedStore`]) with two DynamoDB Local servers standing for two AWS regions
//! (`scripts/test` starts both): a key lives in exactly one region, the one `home` names; callers in
//! both regions race in that one place, so the body runs once; a home region that stops answering is
//! [`Error::RegionUnavailable`] (and nothing runs), unless failover was opted into, which is then
//! logged and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idempotent_runtime::{
    DynamoDbStore, Error, Idempotency, RoutedStore, Status, Store, derive_key,
};
use idempotent_tests::proxy::{Fault, FaultProxy, Rule};
use idempotent_tests::{AppError, client_at, endpoint, faulty_client, unique_table};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The environment variable `scripts/test` sets to the second DynamoDB Local's endpoint.
const ENDPOINT_2_VAR: &str = "IDEMPOTENT_DYNAMODB_ENDPOINT_2";

/// The two regions' names. They decide every key's home, so these tests are deterministic.
const A: &str = "region-a";
const B: &str = "region-b";

/// The second DynamoDB Local's endpoint. Panics (failing the test, never skipping it) when none is
/// configured.
fn endpoint_2() -> String {
    std::env::var(ENDPOINT_2_VAR).unwrap_or_else(|_| {
        panic!(
            "this test needs a second DynamoDB Local (a second region), and {ENDPOINT_2_VAR} is not set: \
             run the tests with `scripts/test` (it starts two), or start one with \
             `scripts/dynamodb-local --dir .dynamodb-local/region-2 start` and export \
             {ENDPOINT_2_VAR}=<the printed endpoint>"
        )
    })
}

/// A table of one name on both servers, as a global table has in every region.
struct Regions {
    table: String,
    endpoints: [String; 2],
}

impl Regions {
    async fn new() -> Self {
        let regions = Self {
            table: unique_table("regions"),
            endpoints: [endpoint(), endpoint_2()],
        };
        for endpoint in &regions.endpoints {
            DynamoDbStore::new(client_at(endpoint).0, &regions.table)
                .create_table()
                .await
                .expect("create the test table");
        }
        regions
    }

    /// A routed store with a client of its own for each region, listed in `order`.
    fn routed(&self, order: [usize; 2]) -> RoutedStore {
        RoutedStore::dynamodb(
            &self.table,
            order.map(|i| ([A, B][i], client_at(&self.endpoints[i]).0)),
        )
        .unwrap()
    }

    /// A store reading region `i`'s table directly.
    fn direct(&self, i: usize) -> DynamoDbStore {
        DynamoDbStore::new(client_at(&self.endpoints[i]).0, &self.table)
    }
}

/// The first key (an integer) in `namespace` whose home region is `region`.
fn homed(store: &RoutedStore, namespace: &str, region: &str) -> u32 {
    (0..1000)
        .find(|i| store.home(&derive_key(namespace, i).unwrap()) == region)
        .expect("a key homed in each region")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_lives_in_exactly_one_region_the_one_home_names() {
    const NS: &str = "regions::spread";
    const KEYS: u32 = 200;
    let regions = Regions::new().await;
    let store = Arc::new(regions.routed([0, 1]));
    let idem = Idempotency::builder_arc(store.clone()).build();

    let mut calls = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let idem = idem.clone();
        calls.spawn(async move {
            idem.operation(NS, &i)
                .run(|_| async move { Ok::<_, AppError>(i * 2) })
                .await
                .map_err(|e| e.to_string())
        });
    }
    while let Some(result) = calls.join_next().await {
        result.unwrap().unwrap();
    }

    // Each region's table, read directly.
    let direct = [regions.direct(0), regions.direct(1)];
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let direct = direct.clone();
        reads.spawn(async move {
            let key = derive_key(NS, &i).unwrap();
            let found = [
                direct[0].get(&key).await.unwrap(),
                direct[1].get(&key).await.unwrap(),
            ];
            (i, key, found)
        });
    }
    let mut per_region = HashMap::new();
    while let Some(read) = reads.join_next().await {
        let (i, key, found) = read.unwrap();
        let holders: Vec<&str> = found
            .iter()
            .zip([A, B])
            .filter_map(|(record, name)| record.as_ref().map(|_| name))
            .collect();
        assert_eq!(holders, [store.home(&key)], "key {i}");
        let record = found.into_iter().flatten().next().unwrap();
        assert_eq!(record.status, Status::Completed);
        *per_region.entry(store.home(&key)).or_insert(0_u32) += 1;
    }
    eprintln!("{KEYS} keys over two regions: {per_region:?}");
    for name in [A, B] {
        assert!(per_region[name] >= KEYS * 3 / 10, "{per_region:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_in_both_regions_run_a_key_once() {
    const NS: &str = "regions::race";
    const CALLERS: usize = 32;
    let regions = Regions::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    // Every caller has its own handle, store and clients; half list the regions the other way round.
    let handles: Vec<Idempotency> = (0..CALLERS)
        .map(|c| {
            let order = if c % 2 == 0 { [0, 1] } else { [1, 0] };
            Idempotency::builder(regions.routed(order)).build()
        })
        .collect();
    let start = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let mut calls = tokio::task::JoinSet::new();
    for idem in handles {
        let (runs, start) = (runs.clone(), start.clone());
        calls.spawn(async move {
            start.wait().await;
            idem.operation(NS, "order-17")
                .wait(Duration::from_secs(30))
                .run(|_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    // Each execution would produce another value.
                    Ok::<_, AppError>(uuid::Uuid::new_v4().to_string())
                })
                .await
                .map_err(|e| e.to_string())
        });
    }
    let mut results = Vec::new();
    while let Some(result) = calls.join_next().await {
        results.push(result.unwrap().unwrap());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );
    assert_eq!(results.len(), CALLERS);
    assert!(results.iter().all(|r| *r == results[0]), "{results:?}");
}

/// What routing prevents: two regions that each decide claims on their own both accept one key.
#[tokio::test]
async fn without_routing_two_regions_both_accept_a_claim() {
    const NS: &str = "regions::unrouted";
    let regions = Regions::new().await;
    let runs = AtomicUsize::new(0);
    for i in 0..2 {
        let idem = Idempotency::builder(regions.direct(i)).build();
        idem.operation(NS, "order-17")
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(())
            })
            .await
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The process's metrics recorder (shared by the tests of this binary; each reads its own counters).
fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
        snapshotter
    })
}

/// A counter's name, labels and total.
type Counted = (String, HashMap<String, String>, u64);

/// Every counter's total so far, by name and labels. A snapshot of the debugging recorder resets the
/// counters it reads, so each read adds them to these totals: tests running at once never take each
/// other's counts.
fn counters() -> Vec<Counted> {
    static TOTALS: Mutex<Vec<Counted>> = Mutex::new(Vec::new());
    let mut totals = TOTALS.lock().unwrap();
    for (key, _, _, value) in recorder().snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        let key = key.key();
        let labels: HashMap<String, String> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        match totals
            .iter_mut()
            .find(|(name, l, _)| name == key.name() && *l == labels)
        {
            Some((_, _, total)) => *total += n,
            None => totals.push((key.name().to_owned(), labels, n)),
        }
    }
    totals.clone()
}

/// The failover counters, by `op`.
fn failovers(from: &str, to: &str) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for (name, labels, n) in counters() {
        if name == "idempotency_region_failovers_total"
            && labels["from"] == from
            && labels["to"] == to
        {
            *counts.entry(labels["op"].clone()).or_insert(0) += n;
        }
    }
    counts
}

/// The `warn` events' messages and fields.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<HashMap<String, String>>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = HashMap::new();
            event.record(&mut Fields(&mut fields));
            self.0.lock().unwrap().push(fields);
        }
    }
}

// The log is captured on this thread: the runtime must not move the calls to others.
#[tokio::test(flavor = "current_thread")]
async fn an_unreachable_home_region_is_an_error_unless_failover_is_opted_into() {
    use tracing_subscriber::layer::SubscriberExt as _;
    const NS: &str = "regions::outage";
    let warnings = Warnings::default();
    let _log =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    recorder();

    let regions = Regions::new().await;
    // Region A is reached through a proxy, which is then stopped: its port refuses connections.
    let proxy = FaultProxy::start(&regions.endpoints[0]).await;
    let (client_a, _) = faulty_client(proxy.endpoint());
    let client_b = client_at(&regions.endpoints[1]).0;
    let build = |failover: bool| {
        RoutedStore::dynamodb(
            &regions.table,
            [(A, client_a.clone()), (B, client_b.clone())],
        )
        .unwrap()
        .failover(failover)
    };
    let store = build(false);
    let at_a = homed(&store, NS, A);
    let at_b = homed(&store, NS, B);
    let idem = Idempotency::builder(store).build();
    drop(proxy);

    let runs = AtomicUsize::new(0);
    let call = |idem: &Idempotency, key: u32| {
        let idem = idem.clone();
        let runs = &runs;
        async move {
            idem.operation(NS, &key)
                .run(|_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, AppError>(key + 1)
                })
                .await
        }
    };

    // The key at home in A fails, naming A; nothing runs, nothing is written in B.
    let err = call(&idem, at_a).await.unwrap_err().idempotency();
    let Error::RegionUnavailable {
        namespace, region, ..
    } = &err
    else {
        panic!("expected RegionUnavailable, got {err:?}");
    };
    assert_eq!((namespace.as_str(), region.as_str()), (NS, A));
    assert!(err.is_retryable());
    assert!(
        err.to_string()
            .contains("region `region-a`, which serves this key, is unavailable"),
        "{err}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let key_a = derive_key(NS, &at_a).unwrap();
    assert!(regions.direct(1).get(&key_a).await.unwrap().is_none());

    // A key at home in B is served as usual.
    assert_eq!(call(&idem, at_b).await.unwrap(), at_b + 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The failed claim's fate is unknown: its release keeps trying in the unreachable region until
    // the claim's end (`decide::release_retry`), and stays there.
    let left = idem.drain(Duration::from_millis(500)).await;
    assert_eq!(
        left, 1,
        "the release is still trying in its unreachable region"
    );
    // No failover without opting in, and nothing to warn of yet.
    let logged = warnings.0.lock().unwrap().clone();
    assert!(
        logged.is_empty(),
        "no failover without opting in: {logged:?}"
    );
    assert!(failovers(A, B).is_empty());

    // With failover, the key at home in A runs in B, once; a duplicate is replayed from B.
    let idem = Idempotency::builder(build(true)).build();
    assert_eq!(call(&idem, at_a).await.unwrap(), at_a + 1);
    assert_eq!(call(&idem, at_a).await.unwrap(), at_a + 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let record = regions.direct(1).get(&key_a).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Completed);

    let counted = failovers(A, B);
    eprintln!("failovers from {A} to {B}: {counted:?}");
    // Two claims (the call and its duplicate) and one completion went to B.
    assert_eq!(counted.get("claim"), Some(&2), "{counted:?}");
    assert_eq!(counted.get("complete"), Some(&1), "{counted:?}");
    let warnings = warnings.0.lock().unwrap();
    assert!(
        warnings.iter().any(|w| {
            w.get("message").is_some_and(|m| m.contains("failing over"))
                && w.get("from").map(String::as_str) == Some(A)
                && w.get("to").map(String::as_str) == Some(B)
        }),
        "{warnings:?}"
    );
}

/// Only an unavailable region counts as an outage: a server error does, throttling never moves a key,
/// even with failover on.
#[tokio::test]
async fn server_errors_are_outages_and_throttling_is_not() {
    const NS: &str = "regions::faults";
    let regions = Regions::new().await;
    let proxy = FaultProxy::start(&regions.endpoints[0]).await;
    let (client_a, _) = faulty_client(proxy.endpoint());
    let client_b = client_at(&regions.endpoints[1]).0;
    // Names of their own, so that this test's failovers are not counted as the other test's.
    let store = RoutedStore::dynamodb(&regions.table, [("east", client_a), ("west", client_b)])
        .unwrap()
        .failover(true);
    let at_a = homed(&store, NS, "east");
    let store: Arc<dyn Store> = Arc::new(store);
    let idem = Idempotency::builder_arc(store).build();
    let runs = AtomicUsize::new(0);
    let call = || {
        idem.operation(NS, &at_a).run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AppError>(())
        })
    };

    proxy.set_rules([Rule::new(Fault::Throttle)]);
    let err = call().await.unwrap_err().idempotency();
    assert!(matches!(err, Error::Throttled { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let key = derive_key(NS, &at_a).unwrap();
    assert!(regions.direct(1).get(&key).await.unwrap().is_none());

    // HTTP 500s: the region is down; with failover on, the call runs in B.
    proxy.set_rules([Rule::new(Fault::ServerError)]);
    call().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(regions.direct(1).get(&key).await.unwrap().is_some());
    assert!(regions.direct(0).get(&key).await.unwrap().is_none());
}

/// A record completed in region B, found (as if replicated) in region A by a routed store whose home
/// for the key is A: counted in `dynamo_cross_region_duplicate_detected_total`, and replayed.
#[tokio::test]
async fn a_record_completed_in_another_region_than_the_home_is_counted() {
    const NS: &str = "regions::cross";
    // Region names of this test's own: the failover test's calls may count duplicates between `A` and
    // `B` while this one runs (a key claimed during the outage, found later in its home).
    const A: &str = "cross-a";
    const B: &str = "cross-b";
    recorder();
    let regions = Regions::new().await;
    let routed = || {
        RoutedStore::dynamodb(
            &regions.table,
            [
                (A, client_at(&regions.endpoints[0]).0),
                (B, client_at(&regions.endpoints[1]).0),
            ],
        )
        .unwrap()
    };
    let key = homed(&routed(), NS, A);
    // A store on region A's table that calls itself B: what replication of B's record would leave.
    let elsewhere = Idempotency::builder(regions.direct(0).with_region(B)).build();
    let first: u32 = elsewhere
        .operation(NS, &key)
        .run(|_| async move { Ok::<_, AppError>(key + 1) })
        .await
        .unwrap();
    let record = regions
        .direct(0)
        .get(&derive_key(NS, &key).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.completed_in.as_deref(), Some(B));
    let before = cross_region_duplicates(A, B);
    let idem = Idempotency::builder(routed()).build();
    let replayed: u32 = idem
        .operation(NS, &key)
        .run(|_| async move { Ok::<_, AppError>(0) })
        .await
        .unwrap();
    assert_eq!(replayed, first, "the stored response is replayed");
    assert_eq!(cross_region_duplicates(A, B), before + 1);
    // A key completed in its own home is not counted.
    let at_b = homed(&routed(), NS, B);
    let _: u32 = idem
        .operation(NS, &at_b)
        .run(|_| async move { Ok::<_, AppError>(1) })
        .await
        .unwrap();
    let _: u32 = idem
        .operation(NS, &at_b)
        .run(|_| async move { Ok::<_, AppError>(2) })
        .await
        .unwrap();
    let record = regions
        .direct(1)
        .get(&derive_key(NS, &at_b).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.completed_in.as_deref(), Some(B));
    assert_eq!(cross_region_duplicates(A, B), before + 1);
    assert_eq!(cross_region_duplicates(B, B), 0);
}

/// A record's `completed_in` is the text of whoever wrote the table: the counter's label and the
/// warning carry it with its control characters escaped.
#[tokio::test]
async fn a_region_name_from_a_record_is_escaped_in_telemetry() {
    const NS: &str = "regions::escaped";
    const A: &str = "escaped-a";
    const B: &str = "escaped-b";
    const FORGED: &str = "west\u{1b}]0;owned\u{7}\nforged line";
    recorder();
    let regions = Regions::new().await;
    let routed = RoutedStore::dynamodb(
        &regions.table,
        [
            (A, client_at(&regions.endpoints[0]).0),
            (B, client_at(&regions.endpoints[1]).0),
        ],
    )
    .unwrap();
    let key = homed(&routed, NS, A);
    let elsewhere = Idempotency::builder(regions.direct(0).with_region(FORGED)).build();
    let _: u32 = elsewhere
        .operation(NS, &key)
        .run(|_| async move { Ok::<_, AppError>(7) })
        .await
        .unwrap();
    let idem = Idempotency::builder(routed).build();
    let replayed: u32 = idem
        .operation(NS, &key)
        .run(|_| async move { Ok::<_, AppError>(0) })
        .await
        .unwrap();
    assert_eq!(replayed, 7);
    let shown = r"west\u{1b}]0;owned\u{7}\nforged line";
    assert_eq!(cross_region_duplicates(A, shown), 1);
    assert_eq!(cross_region_duplicates(A, FORGED), 0);
}

/// `dynamo_cross_region_duplicate_detected_total{home, completed_in}`.
fn cross_region_duplicates(home: &str, completed_in: &str) -> u64 {
    counters()
        .into_iter()
        .filter(|(name, labels, _)| {
            name == "dynamo_cross_region_duplicate_detected_total"
                && labels["home"] == home
                && labels["completed_in"] == completed_in
        })
        .map(|(_, _, n)| n)
        .sum()
}

/// A routed store with failover on whose region `home` is reached through a fault proxy and whose
/// region `other` directly; `names` are the test's own, so that its failovers are counted apart from
/// the other tests'.
fn behind_proxy(regions: &Regions, proxy: &FaultProxy, names: [&'static str; 2]) -> RoutedStore {
    RoutedStore::dynamodb(
        &regions.table,
        [
            (names[0], faulty_client(proxy.endpoint()).0),
            (names[1], client_at(&regions.endpoints[1]).0),
        ],
    )
    .unwrap()
    .failover(true)
}

/// Every failover counted from `from`, whatever its destination or kind of request.
fn failovers_from(from: &str) -> u64 {
    counters()
        .into_iter()
        .filter(|(name, labels, _)| {
            name == "idempotency_region_failovers_total" && labels["from"] == from
        })
        .map(|(_, _, n)| n)
        .sum()
}

/// Failover moves claims only: a call claimed at home whose heartbeat meets a short outage there (three
/// HTTP 500s, one heartbeat's every attempt) keeps beating at home, where its claim is, instead of
/// sending the heartbeat to a region that has no claim (which rejects it, so the call stops beating and
/// a duplicate takes the key over after the lease while the body still runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_failover_a_heartbeat_outage_at_home_is_retried_at_home() {
    const NS: &str = "regions::heartbeat";
    const NAMES: [&str; 2] = ["beat-home", "beat-other"];
    const LEASE: Duration = Duration::from_secs(2);
    recorder();
    let regions = Regions::new().await;
    let proxy = FaultProxy::start(&regions.endpoints[0]).await;
    let store = behind_proxy(&regions, &proxy, NAMES);
    let at_home = homed(&store, NS, NAMES[0]);
    let idem = Idempotency::builder(store).default_lease(LEASE).build();
    // The first heartbeat (a third of the lease in) fails, every attempt.
    proxy.set_rules([Rule::new(Fault::ServerError)
        .operation("UpdateItem")
        .body_contains("SET #lu = :lu, #ex = :ex")
        .first(3)]);

    let runs = Arc::new(AtomicUsize::new(0));
    let call = |wait: Duration| {
        let (idem, runs) = (idem.clone(), runs.clone());
        async move {
            idem.operation(NS, &at_home)
                .wait(wait)
                .run(|_| async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    // Over two leases: only heartbeats keep the claim.
                    tokio::time::sleep(LEASE * 5 / 2).await;
                    Ok::<_, AppError>(run)
                })
                .await
                .map_err(|e| e.to_string())
        }
    };
    let first = tokio::spawn(call(Duration::ZERO));
    // After the lease and the skew margin: the key is taken over unless the heartbeats got through.
    tokio::time::sleep(LEASE + Duration::from_millis(1_500)).await;
    let duplicate = call(Duration::from_secs(10)).await;
    let first = first.await.unwrap();

    assert_eq!(proxy.stats().operation("UpdateItem").server_errors, 3);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "first {first:?}, duplicate {duplicate:?}"
    );
    assert_eq!(first, Ok(1));
    assert_eq!(
        duplicate,
        Ok(1),
        "the duplicate waits for the first call's result"
    );
    let key = derive_key(NS, &at_home).unwrap();
    let record = regions.direct(0).get(&key).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Completed);
    assert!(regions.direct(1).get(&key).await.unwrap().is_none());
    assert_eq!(failovers_from(NAMES[0]), 0, "nothing left the home region");
}

/// A completion that meets an outage at home (its first two attempts' every SDK attempt gets an HTTP
/// 500) is retried at home and stored there; it never goes to a region without the claim, where it
/// would be rejected (`LeaseLost`) and leave the home record PENDING, so that a retry after the lease
/// would run the body again.
#[tokio::test]
async fn with_failover_a_completion_outage_at_home_is_retried_at_home() {
    const NS: &str = "regions::complete";
    const NAMES: [&str; 2] = ["done-home", "done-other"];
    recorder();
    let regions = Regions::new().await;
    let proxy = FaultProxy::start(&regions.endpoints[0]).await;
    let store = behind_proxy(&regions, &proxy, NAMES);
    let at_home = homed(&store, NS, NAMES[0]);
    let idem = Idempotency::builder(store).build();
    proxy.set_rules([Rule::new(Fault::ServerError)
        .operation("UpdateItem")
        .body_contains(":completed")
        .first(6)]);

    let runs = AtomicUsize::new(0);
    let call = || {
        idem.operation(NS, &at_home)
            .run(|_| async { Ok::<_, AppError>(runs.fetch_add(1, Ordering::SeqCst) + 1) })
    };
    let first = call().await.map_err(|e| e.to_string());
    assert_eq!(first, Ok(1));
    assert_eq!(proxy.stats().operation("UpdateItem").server_errors, 6);
    let key = derive_key(NS, &at_home).unwrap();
    let record = regions.direct(0).get(&key).await.unwrap().unwrap();
    assert_eq!(
        record.status,
        Status::Completed,
        "stored in the home region"
    );
    assert!(regions.direct(1).get(&key).await.unwrap().is_none());
    // A retry is a replay.
    assert_eq!(call().await.map_err(|e| e.to_string()), Ok(1));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(failovers_from(NAMES[0]), 0, "nothing left the home region");
}

/// A failure that meets an outage at home is retried there and lands as FAILED, so the key is free at
/// once: a retry runs the body again right away instead of finding the key PENDING for the lease.
#[tokio::test]
async fn with_failover_a_failure_outage_at_home_is_retried_at_home() {
    const NS: &str = "regions::fail";
    const NAMES: [&str; 2] = ["fail-home", "fail-other"];
    recorder();
    let regions = Regions::new().await;
    let proxy = FaultProxy::start(&regions.endpoints[0]).await;
    let store = behind_proxy(&regions, &proxy, NAMES);
    let at_home = homed(&store, NS, NAMES[0]);
    let idem = Idempotency::builder(store).build();
    proxy.set_rules([Rule::new(Fault::ServerError)
        .operation("UpdateItem")
        .body_contains(":er")
        .first(3)]);

    let runs = AtomicUsize::new(0);
    let call = |fail: bool| {
        let runs = &runs;
        idem.operation(NS, &at_home).run(move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if fail {
                return Err(AppError::Declined);
            }
            Ok::<_, AppError>(7)
        })
    };
    let err = call(true).await.unwrap_err();
    assert!(matches!(err, AppError::Declined), "{err:?}");
    assert_eq!(proxy.stats().operation("UpdateItem").server_errors, 3);
    let key = derive_key(NS, &at_home).unwrap();
    let record = regions.direct(0).get(&key).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Failed, "the failure landed at home");
    assert!(regions.direct(1).get(&key).await.unwrap().is_none());
    // The key is free at once.
    assert_eq!(call(false).await.map_err(|e| e.to_string()), Ok(7));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(failovers_from(NAMES[0]), 0, "nothing left the home region");
}
