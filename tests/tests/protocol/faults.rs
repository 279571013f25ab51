//! Exactly-once under lost responses, throttling, server errors, crashes and races: DynamoDB Local behind
//! the fault-injection proxy (and the memory store where it applies).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::types::{AttributeValue, Update};
use idempotent_runtime::{
    DynamoDbStore, Error, Idempotency, ManualClock, MemoryStore, Status, Store, idempotent,
};
use idempotent_tests::proxy::{Fault, FaultProxy, Rule};
use idempotent_tests::{AppError, RequestCounter, faulty_client, unique_table};

/// Counts executions per key.
#[derive(Debug, Default)]
struct Runs(std::sync::Mutex<HashMap<u64, usize>>);

impl Runs {
    fn record(&self, id: u64) {
        *self.0.lock().unwrap().entry(id).or_default() += 1;
    }
    fn of(&self, id: u64) -> usize {
        self.0.lock().unwrap().get(&id).copied().unwrap_or(0)
    }
    fn total(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }
}

#[idempotent(key = id, store = idem, name = "faults::work", lease = "30s")]
async fn work(idem: &Idempotency, runs: &Runs, id: u64, fail: bool) -> Result<String, AppError> {
    runs.record(id);
    if fail {
        return Err(AppError::Declined);
    }
    Ok(format!("result-{id}"))
}

/// A fresh table, a proxy in front of DynamoDB Local, and a handle whose client goes through it.
struct Rig {
    proxy: FaultProxy,
    idem: Idempotency,
    store: DynamoDbStore,
    clock: ManualClock,
    requests: RequestCounter,
}

impl Rig {
    async fn new() -> Self {
        let (direct, _) = idempotent_tests::client();
        let table = unique_table("faults");
        DynamoDbStore::new(direct, &table)
            .create_table()
            .await
            .unwrap();
        let proxy = FaultProxy::start(&idempotent_tests::endpoint()).await;
        let (client, requests) = faulty_client(proxy.endpoint());
        let store = DynamoDbStore::new(client, &table);
        let clock = ManualClock::starting_now();
        let idem = Idempotency::builder(store.clone())
            .clock(clock.clone())
            .build();
        Self {
            proxy,
            idem,
            store,
            clock,
            requests,
        }
    }

    async fn record(&self, id: u64) -> Option<idempotent_runtime::Record> {
        let key = idempotent_runtime::derive_key("faults::work", &id).unwrap();
        self.store.get(&key).await.unwrap()
    }
}

#[tokio::test]
async fn a_claim_whose_response_was_lost_is_recognised_by_its_token() {
    let rig = Rig::new().await;
    rig.proxy.set_rules([Rule::new(Fault::DropResponse)
        .operation("UpdateItem")
        .body_contains(":now_ms")
        .nth(1)]);
    let runs = Runs::default();
    assert_eq!(work(&rig.idem, &runs, 1, false).await.unwrap(), "result-1");
    assert_eq!(runs.of(1), 1);
    let stats = rig.proxy.stats().operation("UpdateItem");
    assert_eq!(
        (stats.dropped, stats.requests),
        (1, 3),
        "claim, its retry, complete"
    );
    assert_eq!(rig.requests.of("GetItem"), 0, "no extra read");
    let record = rig.record(1).await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 1));
}

#[tokio::test]
async fn a_completion_whose_response_was_lost_is_recognised_by_its_token() {
    let rig = Rig::new().await;
    rig.proxy.set_rules([Rule::new(Fault::DropResponse)
        .operation("UpdateItem")
        .body_contains(":completed")
        .nth(1)]);
    let runs = Runs::default();
    assert_eq!(work(&rig.idem, &runs, 2, false).await.unwrap(), "result-2");
    assert_eq!(rig.proxy.stats().operation("UpdateItem").dropped, 1);
    assert_eq!(rig.requests.of("GetItem"), 0);
    assert_eq!(rig.record(2).await.unwrap().status, Status::Completed);
    assert_eq!(work(&rig.idem, &runs, 2, false).await.unwrap(), "result-2");
    assert_eq!(runs.of(2), 1);
}

#[tokio::test]
async fn a_failure_whose_response_was_lost_still_leaves_the_key_retryable() {
    let rig = Rig::new().await;
    rig.proxy.set_rules([Rule::new(Fault::DropResponse)
        .operation("UpdateItem")
        .body_contains(":er")
        .nth(1)]);
    let runs = Runs::default();
    assert!(matches!(
        work(&rig.idem, &runs, 3, true).await,
        Err(AppError::Declined)
    ));
    assert_eq!(rig.proxy.stats().operation("UpdateItem").dropped, 1);
    assert_eq!(rig.record(3).await.unwrap().status, Status::Failed);
    assert_eq!(work(&rig.idem, &runs, 3, false).await.unwrap(), "result-3");
    assert_eq!(runs.of(3), 2);
}

#[tokio::test]
async fn a_claim_throttled_until_retries_run_out_is_throttled_and_writes_nothing() {
    let rig = Rig::new().await;
    rig.proxy
        .set_rules([Rule::new(Fault::Throttle).operation("UpdateItem")]);
    let runs = Runs::default();
    let err = work(&rig.idem, &runs, 4, false).await.unwrap_err();
    assert!(
        matches!(&err, AppError::Idempotency(Error::Throttled { namespace, .. }) if namespace == "faults::work"),
        "{err:?}"
    );
    assert_eq!(
        rig.proxy.stats().operation("UpdateItem").throttled,
        3,
        "three attempts"
    );
    assert_eq!(runs.total(), 0);
    rig.proxy.clear();
    assert!(rig.record(4).await.is_none());
    assert_eq!(work(&rig.idem, &runs, 4, false).await.unwrap(), "result-4");
}

#[tokio::test]
async fn a_completion_throttled_for_its_whole_lease_is_not_stored_and_the_key_frees_after_it() {
    let rig = Rig::new().await;
    rig.proxy.set_rules([Rule::new(Fault::ThrottlingException)
        .operation("UpdateItem")
        .body_contains(":completed")]);
    let runs = Runs::default();
    // A 2 s lease: the completion is retried (on top of the SDK's own retries) for that long.
    let short = |runs: &Runs| {
        runs.record(5);
        rig.idem
            .operation("faults::work", &5_u64)
            .lease(Duration::from_secs(2))
            .run(|_| async { Ok::<_, AppError>("result-5".to_owned()) })
    };
    let err = short(&runs).await.unwrap_err();
    let AppError::Idempotency(Error::ResultNotStored { source, .. }) = &err else {
        panic!("expected ResultNotStored, got {err:?}")
    };
    assert!(source.to_string().contains("throttling"), "{source}");
    let throttled = rig.proxy.stats().operation("UpdateItem").throttled;
    assert!(
        throttled > 3,
        "retried beyond the SDK's 3 attempts: {throttled}"
    );
    rig.proxy.clear();
    assert_eq!(
        rig.record(5).await.unwrap().status,
        Status::Pending,
        "not wedged: the lease bounds it"
    );
    assert!(matches!(
        work(&rig.idem, &runs, 5, false).await,
        Err(AppError::Idempotency(Error::InProgress { .. }))
    ));
    // Past the 2 s lease by more than the 1 s clock-skew margin.
    rig.clock.advance(Duration::from_secs(4));
    assert_eq!(work(&rig.idem, &runs, 5, false).await.unwrap(), "result-5");
    assert_eq!(runs.of(5), 2);
    assert_eq!(rig.record(5).await.unwrap().status, Status::Completed);
}

#[tokio::test]
async fn server_errors_are_retried_by_the_sdk() {
    let rig = Rig::new().await;
    rig.proxy.set_rules([Rule::new(Fault::ServerError)
        .operation("UpdateItem")
        .first(2)]);
    let runs = Runs::default();
    assert_eq!(work(&rig.idem, &runs, 6, false).await.unwrap(), "result-6");
    assert_eq!(rig.proxy.stats().operation("UpdateItem").server_errors, 2);
    assert_eq!(runs.of(6), 1);
}

#[idempotent(key = order, store = idem, name = "faults::reserve", transact = tx)]
async fn reserve(idem: &Idempotency, table: &str, order: &str) -> Result<(), AppError> {
    tx.update(
        Update::builder()
            .table_name(table)
            .key("pk", AttributeValue::S("counter".into()))
            .update_expression("ADD applied :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .unwrap(),
    );
    Ok(())
}

#[tokio::test]
async fn a_commit_whose_response_was_lost_is_applied_once_by_the_sdk_retry() {
    let rig = Rig::new().await;
    let (direct, _) = idempotent_tests::client();
    let table = unique_table("counter");
    // A business table of the same shape; its counter item counts how often the staged write landed.
    DynamoDbStore::new(direct.clone(), &table)
        .create_table()
        .await
        .unwrap();
    rig.proxy.set_rules([Rule::new(Fault::DropResponse)
        .operation("TransactWriteItems")
        .nth(1)]);
    reserve(&rig.idem, &table, "o-1").await.unwrap();
    let stats = rig.proxy.stats().operation("TransactWriteItems");
    assert_eq!(
        (stats.dropped, stats.requests),
        (1, 2),
        "the commit landed, its response was lost, the SDK retried"
    );
    let counter = direct
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("counter".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let applied = counter.item().unwrap()["applied"]
        .as_n()
        .unwrap()
        .to_owned();
    println!(
        "lost commit response: TransactWriteItems sent {} times, counter item `applied` = {applied}",
        stats.requests
    );
    assert_eq!(
        applied, "1",
        "the ClientRequestToken made the retry a no-op"
    );
    let key = idempotent_runtime::derive_key("faults::reserve", "o-1").unwrap();
    assert_eq!(
        rig.store.get(&key).await.unwrap().unwrap().status,
        Status::Completed
    );
}

#[idempotent(key = id, store = idem, name = "faults::race", lease = "60s")]
async fn race(idem: &Idempotency, runs: &Runs, id: u64) -> Result<u64, AppError> {
    runs.record(id);
    tokio::task::yield_now().await;
    Ok(id * 3)
}

async fn rounds_of_32(idem: &Idempotency, rounds: u64) -> (usize, usize) {
    let runs = Arc::new(Runs::default());
    let (mut replayed, mut in_progress) = (0, 0);
    // Eight rounds at a time: each key still sees 32 concurrent callers.
    for batch in (0..rounds).collect::<Vec<_>>().chunks(8) {
        let mut tasks = tokio::task::JoinSet::new();
        for &round in batch {
            for _ in 0..32 {
                let (idem, runs) = (idem.clone(), runs.clone());
                tasks.spawn(async move { (round, race(&idem, &runs, round).await) });
            }
        }
        while let Some(joined) = tasks.join_next().await {
            match joined.unwrap() {
                (round, Ok(v)) => {
                    assert_eq!(v, round * 3);
                    replayed += 1;
                }
                (_, Err(AppError::Idempotency(Error::InProgress { .. }))) => in_progress += 1,
                (_, Err(e)) => panic!("unexpected {e:?}"),
            }
        }
    }
    for round in 0..rounds {
        assert_eq!(
            runs.of(round),
            1,
            "round {round}: the body must run exactly once"
        );
    }
    (replayed, in_progress)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_rounds_of_32_concurrent_callers_run_each_body_once_on_dynamodb() {
    let rig = Rig::new().await;
    let (ok, in_progress) = rounds_of_32(&rig.idem, 1_000).await;
    println!(
        "dynamodb via proxy: 1000 rounds x 32 callers: 1000 executions, {ok} Ok results (first + replays), {in_progress} InProgress, {} requests",
        rig.proxy.stats().total.requests
    );
    assert_eq!(ok + in_progress, 32_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_rounds_of_32_concurrent_callers_run_each_body_once_in_memory() {
    let idem = Idempotency::builder(MemoryStore::new()).build();
    let (ok, in_progress) = rounds_of_32(&idem, 1_000).await;
    println!("memory: 1000 rounds x 32 callers: {ok} Ok, {in_progress} InProgress");
    assert_eq!(ok + in_progress, 32_000);
}

fn print_traffic(stats: &idempotent_tests::proxy::Stats) {
    println!(
        "  requests {} | dropped responses {} | throttles {} | HTTP 500 {}",
        stats.total.requests, stats.total.dropped, stats.total.throttled, stats.total.server_errors
    );
    for (op, c) in &stats.by_operation {
        println!(
            "  {op}: {} requests, {} dropped, {} throttled, {} HTTP 500",
            c.requests, c.dropped, c.throttled, c.server_errors
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario, read top to bottom: the calls, what each key's record holds, one more call"
)]
async fn two_thousand_keys_under_drops_throttles_and_server_errors_run_exactly_once() {
    const KEYS: u64 = 2_000;
    let rig = Rig::new().await;
    let seed = 20_261_130;
    rig.proxy.set_rules([
        Rule::new(Fault::DropResponse).probability(0.10, seed),
        Rule::new(Fault::Throttle).probability(0.10, seed + 1),
        Rule::new(Fault::ServerError).probability(0.05, seed + 2),
    ]);
    let runs = Arc::new(Runs::default());
    let mut errors: HashMap<String, usize> = HashMap::new();
    // Each key is called three times, one call after another, 32 keys at a time.
    let keys: Vec<u64> = (0..KEYS).collect();
    for chunk in keys.chunks(32) {
        let mut tasks = tokio::task::JoinSet::new();
        for &id in chunk {
            let (idem, runs) = (rig.idem.clone(), runs.clone());
            tasks.spawn(async move {
                let mut outcomes = Vec::new();
                for _ in 0..3 {
                    outcomes.push(work(&idem, &runs, id, false).await);
                }
                (id, outcomes)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let (id, outcomes) = joined.unwrap();
            for outcome in outcomes {
                match outcome {
                    Ok(v) => assert_eq!(
                        v,
                        format!("result-{id}"),
                        "a replay must be this key's own result"
                    ),
                    Err(AppError::Idempotency(e)) => {
                        let kind = format!("{e:?}")
                            .split([' ', '{', '('])
                            .next()
                            .unwrap()
                            .to_owned();
                        *errors.entry(kind).or_default() += 1;
                    }
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
        }
    }
    let stats = rig.proxy.stats();
    rig.proxy.clear();

    let mut ran_once = 0;
    let mut completed = 0;
    let mut pending = Vec::new();
    let mut never_claimed = Vec::new();
    let mut released = Vec::new();
    for id in 0..KEYS {
        assert!(runs.of(id) <= 1, "key {id} ran {} times", runs.of(id));
        ran_once += usize::from(runs.of(id) == 1);
        match rig.record(id).await {
            Some(r) if r.status == Status::Completed => completed += 1,
            Some(r) if r.status == Status::Pending => pending.push(id),
            // Nothing fails in this body: a FAILED record is a claim its call gave up on (every
            // answer lost), released before any body ran.
            Some(r) => {
                assert!(
                    r.error
                        .as_deref()
                        .is_some_and(|e| e.starts_with("released"))
                        && runs.of(id) == 0,
                    "key {id}: nothing fails in this body, got {r:?} after {} runs",
                    runs.of(id)
                );
                released.push(id);
            }
            None => never_claimed.push(id),
        }
    }
    // A PENDING key whose body ran is a lost completion: the result was produced, and storing it
    // failed for the whole lease. A PENDING key whose body did not run is a claim whose response was
    // lost (the caller got an error, the body never started). Both free up after the lease: one more
    // call runs the body if it never ran, and must not run it again otherwise.
    let lost_completions = pending.iter().filter(|&&id| runs.of(id) == 1).count();
    // Past the 30 s lease by more than the 1 s clock-skew margin.
    rig.clock.advance(Duration::from_secs(32));
    for &id in pending.iter().chain(&never_claimed).chain(&released) {
        assert_eq!(
            work(&rig.idem, &runs, id, false).await.unwrap(),
            format!("result-{id}")
        );
        assert_eq!(rig.record(id).await.unwrap().status, Status::Completed);
    }
    let mut histogram: HashMap<usize, usize> = HashMap::new();
    for id in 0..KEYS {
        *histogram.entry(runs.of(id)).or_default() += 1;
    }
    let re_runs = (0..KEYS).filter(|&id| runs.of(id) > 1).count();
    let mut histogram: Vec<_> = histogram.into_iter().collect();
    histogram.sort_unstable();
    println!("{KEYS} keys x 3 calls, seed {seed}, faults on every operation:");
    print_traffic(&stats);
    println!("  errors seen by callers: {errors:?}");
    println!(
        "  after the calls: {completed} COMPLETED, {} PENDING ({lost_completions} of them lost completions, the rest claims whose response was lost before the body ran), {} released by calls that gave up on their claims, {} never claimed; bodies run during the calls: {ran_once}",
        pending.len(),
        released.len(),
        never_claimed.len()
    );
    println!(
        "  executions per key after the lease and one more call for the unfinished keys: {histogram:?}"
    );
    println!("  lost completions: {lost_completions} | bodies run twice: {re_runs}");
    assert!(stats.total.dropped > 0 && stats.total.throttled > 0 && stats.total.server_errors > 0);
    // Completions are retried for as long as the lease allows, so at these rates none is lost and no
    // body runs twice.
    assert_eq!(lost_completions, 0, "completions given up");
    assert_eq!(re_runs, 0, "bodies run twice");
    assert_eq!(
        histogram,
        [(1, usize::try_from(KEYS).unwrap())],
        "every key ran exactly once"
    );
}

#[tokio::test]
async fn the_store_retry_policy_overrides_the_client_for_the_store_calls() {
    let rig = Rig::new().await;
    let store = rig
        .store
        .clone()
        .with_retry_config(RetryConfig::standard().with_max_attempts(1));
    let single_attempt = Idempotency::builder(store).clock(rig.clock.clone()).build();
    rig.proxy
        .set_rules([Rule::new(Fault::Throttle).operation("UpdateItem").first(1)]);
    let runs = Runs::default();
    let err = work(&single_attempt, &runs, 7, false).await.unwrap_err();
    assert!(
        matches!(err, AppError::Idempotency(Error::Throttled { .. })),
        "{err:?}"
    );
    assert_eq!(
        rig.proxy.stats().operation("UpdateItem").requests,
        1,
        "no retry with max_attempts = 1"
    );
    // The client's own policy (3 attempts) still applies to a handle without the override.
    rig.proxy
        .set_rules([Rule::new(Fault::Throttle).operation("UpdateItem").first(1)]);
    rig.proxy.reset_stats();
    assert_eq!(work(&rig.idem, &runs, 7, false).await.unwrap(), "result-7");
    assert_eq!(rig.proxy.stats().operation("UpdateItem").throttled, 1);
}
