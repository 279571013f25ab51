//! A call that gives up its claim while the claim is still on the wire: its release leaves its token
//! where the claim, landing later, must find it. These tests drive the release against the record's
//! limits (how many released tokens it holds) and its neighbours, on both stores.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idempotent_runtime::aws_sdk_dynamodb::Client;
use idempotent_runtime::aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, TransactOutcome, Transition, WriteOutcome, Writes,
};
use idempotent_runtime::{
    Clock, Error, Idempotency, MAX_RELEASED, ManualClock, MemoryStore, Record, Status, Store,
    StoreError,
};
use idempotent_tests::{Backend, ClaimAppliedLate, Forward, Runs, backing, dynamodb_store};

const NAMESPACE: &str = "released_claims::charge";
const KEY: &str = "order-1";

/// The operation under test on [`KEY`], with a one-minute lease: counts its runs, returns which run
/// it was.
async fn charge(idem: &Idempotency, runs: &Runs) -> Result<usize, Error> {
    idem.operation(NAMESPACE, KEY)
        .lease(Duration::from_mins(1))
        .run(|_| async { Ok::<_, Error>(runs.0.fetch_add(1, Ordering::SeqCst) + 1) })
        .await
}

/// The record of [`KEY`].
async fn record(store: &dyn Store) -> Option<Record> {
    let key = idempotent_runtime::derive_key(NAMESPACE, KEY).unwrap();
    store.get(&key).await.unwrap()
}

/// One caller on a slow store (its claim lands 150 ms after it was sent) that gives up after 50 ms,
/// then waits until its release and its late claim have both landed. The caller's timer is polled
/// before the call: on a loaded machine both can be ready at once (the claim landed and answered
/// before the caller was scheduled again), and the caller gives up all the same, as one that is
/// slow to be scheduled does.
async fn give_up_while_claiming(slow: &Idempotency, runs: &Runs) {
    {
        let call = charge(slow, runs);
        tokio::pin!(call);
        tokio::select! {
            biased;
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
            answered = &mut call => panic!("the caller gave up: {answered:?}"),
        }
    }
    slow.drain(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// A store slow enough that every claim is still on the wire when its caller hangs up (a latency
/// spike, clients with short timeouts that retry): each dropped call's release leaves its token on
/// the key's record. The first sixteen are kept and their late claims refused; the seventeenth finds
/// the record full and raises its `released_through` to its own token, so its late claim is refused
/// too: the next caller runs at once rather than being refused for the late claim's whole lease.
async fn the_seventeenth_call_given_up_on_a_slow_store_does_not_hold_the_key(backend: Backend) {
    let store = backing(backend).await;
    let late = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(150)),
    ));
    let clock = ManualClock::starting_now();
    let slow = Idempotency::builder_arc(late).clock(clock.clone()).build();
    let runs = Runs::default();
    for given_up in 1..=MAX_RELEASED {
        give_up_while_claiming(&slow, &runs).await;
        let marked = record(&*store).await.expect("the release leaves a record");
        assert_eq!(marked.status, Status::Failed, "{marked:?}");
        assert_eq!(marked.released.len(), given_up, "{marked:?}");
    }
    // The seventeenth call gives up the same way.
    give_up_while_claiming(&slow, &runs).await;
    assert_eq!(runs.count(), 0, "no call that gave up ran the body");
    let after = record(&*store).await.expect("a record");
    let next = Idempotency::builder_arc(store).clock(clock).build();
    let answer = charge(&next, &runs).await;
    assert!(
        matches!(answer, Ok(1)),
        "the key must be free at once, not held for a lease by a call that returned: {answer:?}; \
         record after the seventeenth release: status {:?}, token {}, lease until {:?}, {} released tokens",
        after.status,
        after.token,
        after.lease_until_ms,
        after.released.len(),
    );
    assert_eq!(runs.count(), 1);
}

/// Sixteen calls give up on a slow store as above; the lease (and the margin) passes, so none of their
/// claims can hold the key any more; then a seventeenth gives up the same way. Its release finds the
/// record full of stale tokens and replaces them with its own: its late claim is refused, and the
/// next caller runs at once.
async fn a_release_on_a_full_record_of_stale_tokens_replaces_them(backend: Backend) {
    let store = backing(backend).await;
    let late = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(150)),
    ));
    let clock = ManualClock::starting_now();
    let slow = Idempotency::builder_arc(late).clock(clock.clone()).build();
    let runs = Runs::default();
    for _ in 1..=MAX_RELEASED {
        give_up_while_claiming(&slow, &runs).await;
    }
    let full = record(&*store).await.expect("a record");
    assert_eq!(full.released.len(), MAX_RELEASED, "{full:?}");
    // The lease passes, and the clock-skew margin twice (once for the claim, once for this clock):
    // every released claim has lapsed.
    clock.advance(Duration::from_mins(1) + Duration::from_secs(3));
    give_up_while_claiming(&slow, &runs).await;
    let after = record(&*store).await.expect("a record");
    assert_eq!(
        after.released.len(),
        1,
        "the stale tokens replaced: {after:?}"
    );
    assert_eq!(after.status, Status::Failed, "{after:?}");
    let next = Idempotency::builder_arc(store).clock(clock).build();
    let answer = charge(&next, &runs).await;
    assert!(
        matches!(answer, Ok(1)),
        "the key must be free at once: {answer:?}; record after the last release: {after:?}"
    );
    assert_eq!(runs.count(), 1);
}

/// A claim the store applies and whose answer is then lost on every attempt (throttling or a network
/// fault past the SDK's retries): the call fails with [`Error::Unavailable`] and releases the claim.
#[derive(Debug)]
struct AnswerLost;

#[async_trait::async_trait]
impl Override<Forward> for AnswerLost {
    fn kind(&self) -> &'static str {
        "answer-lost"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        inner.claim(request).await?;
        Err(StoreError::Unavailable("the answer was lost".into()))
    }
}

/// A busy key during a burst of store faults: sixteen calls whose claims land but whose answers are
/// lost. Each fails with `Unavailable`, and its release fails its claim at once (the next call takes
/// the key) but also leaves its token on the record, where it stays until a completion. Then one call
/// gives up a claim still on the wire: the record is full, no mark is left, and the late claim holds
/// the key for its lease. No call was dropped to fill the record: transient errors alone did.
async fn a_burst_of_lost_answers_does_not_disarm_the_next_release(backend: Backend) {
    let store = backing(backend).await;
    let clock = ManualClock::starting_now();
    let faulty = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(store.clone()),
        AnswerLost,
    )))
    .clock(clock.clone())
    .build();
    let runs = Runs::default();
    for lost in 1..=MAX_RELEASED {
        let answer = charge(&faulty, &runs).await;
        assert!(
            matches!(answer, Err(Error::Unavailable { .. })),
            "{answer:?}"
        );
        faulty.drain(Duration::from_secs(10)).await;
        let failed = record(&*store).await.expect("a record");
        assert_eq!(
            failed.status,
            Status::Failed,
            "released at once: {failed:?}"
        );
        assert_eq!(failed.released.len(), lost, "{failed:?}");
    }
    assert_eq!(runs.count(), 0);
    let slow = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(150)),
    )))
    .clock(clock.clone())
    .build();
    give_up_while_claiming(&slow, &runs).await;
    let after = record(&*store).await.expect("a record");
    let next = Idempotency::builder_arc(store).clock(clock).build();
    let answer = charge(&next, &runs).await;
    assert!(
        matches!(answer, Ok(1)),
        "the key must be free at once, not held for a lease by a call that returned: {answer:?}; \
         record after the last release: status {:?}, lease until {:?}, {} released tokens",
        after.status,
        after.lease_until_ms,
        after.released.len(),
    );
    assert_eq!(runs.count(), 1);
}

/// A claim with business writes the store applies `after` it was sent, whether or not its caller is
/// still there; plain claims go through at once.
#[derive(Debug)]
pub(super) struct TransactionAppliedLate(pub(super) Duration);

#[async_trait::async_trait]
impl Override<Forward> for TransactionAppliedLate {
    fn kind(&self) -> &'static str {
        "transaction-applied-late"
    }

    async fn claim_transaction(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let store = inner.0.clone();
        let (key, token) = (request.key.to_owned(), request.token.to_owned());
        let fingerprint = request.fingerprint.map(str::to_owned);
        let (attempt, now_ms, lease_until_ms, expires_at_s, keep) = (
            request.attempt,
            request.now_ms,
            request.lease_until_ms,
            request.expires_at_s,
            request.keep_claim_writes,
        );
        let (writes, after) = (writes.clone(), self.0);
        let applied = tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let mut request = ClaimRequest::new(&key, &token, now_ms, lease_until_ms, expires_at_s);
            request.attempt = attempt;
            request.fingerprint = fingerprint.as_deref();
            request.keep_claim_writes = keep;
            store.claim_transaction(&request, &writes).await
        });
        applied.await.unwrap()
    }

    async fn transact_transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        inner.transact_transition(transition, writes).await
    }
}

/// A business table with one item, `sku-1`, whose `available` a claim reserves from.
pub(super) struct Stock {
    table: String,
    memory: Option<Arc<MemoryStore>>,
    client: Option<Client>,
}

impl Stock {
    /// The store a test runs on, and its stock of `available` units.
    pub(super) async fn new(backend: Backend, available: u64) -> (Arc<dyn Store>, Self) {
        let item = std::collections::HashMap::from([
            ("pk".to_owned(), AttributeValue::S("sku-1".into())),
            (
                "available".to_owned(),
                AttributeValue::N(available.to_string()),
            ),
        ]);
        match backend {
            Backend::Memory => {
                let memory = Arc::new(MemoryStore::new());
                memory.create_table("inventory", "pk", None).unwrap();
                memory.put_item("inventory", item).unwrap();
                let stock = Self {
                    table: "inventory".into(),
                    memory: Some(memory.clone()),
                    client: None,
                };
                (memory, stock)
            }
            Backend::DynamoDb => {
                let (store, _) = dynamodb_store().await;
                let client = store.client().clone();
                let table = idempotent_tests::unique_table("inventory");
                idempotent_tests::create_plain_table(&client, &table, "pk").await;
                client
                    .put_item()
                    .table_name(&table)
                    .set_item(Some(item))
                    .send()
                    .await
                    .unwrap();
                let stock = Self {
                    table,
                    memory: None,
                    client: Some(client),
                };
                (Arc::new(store), stock)
            }
        }
    }

    pub(super) async fn available(&self) -> u64 {
        let key =
            std::collections::HashMap::from([("pk".to_owned(), AttributeValue::S("sku-1".into()))]);
        let item = match (&self.memory, &self.client) {
            (Some(memory), _) => memory.get_item(&self.table, &key).unwrap(),
            (None, Some(client)) => client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(key))
                .consistent_read(true)
                .send()
                .await
                .unwrap()
                .item
                .unwrap(),
            (None, None) => unreachable!("a stock is on one store"),
        };
        item["available"].as_n().unwrap().parse().unwrap()
    }

    /// `available -= 1` if any is left.
    pub(super) fn reserve(&self) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(&self.table)
            .key("pk", AttributeValue::S("sku-1".into()))
            .update_expression("SET available = available - :one")
            .condition_expression("available >= :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .unwrap();
        TransactWriteItem::builder().update(update).build()
    }
}

/// The operation under test with one unit reserved at claim time.
async fn reserve(idem: &Idempotency, stock: &Stock, runs: &Runs) -> Result<usize, Error> {
    idem.operation(NAMESPACE, KEY)
        .lease(Duration::from_mins(1))
        .claim_with([stock.reserve()])
        .run(|_| async { Ok::<_, Error>(runs.0.fetch_add(1, Ordering::SeqCst) + 1) })
        .await
}

/// A call with claim-time writes (a reservation) gives up while its transaction is on the wire; the
/// transaction lands after the release. It must be refused as a whole: no unit reserved for a call
/// that returned, and the key free for the next caller, whose own claim reserves exactly one unit.
async fn a_claim_with_writes_given_up_in_flight_reserves_nothing(backend: Backend) {
    let (store, stock) = Stock::new(backend, 5).await;
    let clock = ManualClock::starting_now();
    let slow = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(store.clone()),
        TransactionAppliedLate(Duration::from_millis(150)),
    )))
    .clock(clock.clone())
    .build();
    let runs = Runs::default();
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), reserve(&slow, &stock, &runs)).await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        stock.available().await,
        5,
        "the late transaction of a call that gave it up must not reserve"
    );
    let mark = record(&*store).await.expect("the release's mark");
    assert_eq!(mark.status, Status::Failed, "{mark:?}");
    assert!(!mark.claim_writes_in_effect, "{mark:?}");
    let next = Idempotency::builder_arc(store.clone()).clock(clock).build();
    assert_eq!(reserve(&next, &stock, &runs).await.unwrap(), 1);
    assert_eq!(stock.available().await, 4, "one unit, reserved once");
    assert_eq!(runs.count(), 1);
    let done = record(&*store).await.unwrap();
    assert_eq!(done.status, Status::Completed);
    assert!(done.released.is_empty(), "{done:?}");
}

/// The error of a body that fails on purpose, or the library's.
#[derive(Debug)]
enum BodyError {
    Failed,
    Idempotency(Error),
}

impl From<Error> for BodyError {
    fn from(e: Error) -> Self {
        Self::Idempotency(e)
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed => f.write_str("the body failed"),
            Self::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

/// Another caller holds the key (its body waits on `go`, then fails) when a call gives up a claim
/// still on the wire: the release finds the holder's live claim and leaves its token there. The
/// holder's failure keeps the token, so the late claim, landing on a FAILED (claimable) record, is
/// refused; the next caller runs the body at once, and its completion clears the tokens.
async fn a_release_on_another_callers_claim_outlives_its_failure(backend: Backend) {
    let store = backing(backend).await;
    let clock = ManualClock::starting_now();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    let go = Arc::new(tokio::sync::Semaphore::new(0));
    let holder = tokio::spawn({
        let (idem, runs, go) = (direct.clone(), runs.clone(), go.clone());
        async move {
            idem.operation(NAMESPACE, KEY)
                .lease(Duration::from_mins(1))
                .run(|_| async {
                    runs.0.fetch_add(1, Ordering::SeqCst);
                    go.acquire().await.unwrap().forget();
                    Err::<usize, _>(BodyError::Failed)
                })
                .await
        }
    });
    while runs.count() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = record(&*store).await.expect("the holder's claim");
    let slow = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(150)),
    )))
    .clock(clock.clone())
    .build();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), charge(&slow, &runs)).await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
    let marked = record(&*store).await.unwrap();
    assert_eq!(
        (marked.status, &marked.token, marked.released.len()),
        (Status::Pending, &held.token, 1),
        "the holder's claim, with the released token: {marked:?}"
    );
    // The holder fails before the late claim lands.
    go.add_permits(1);
    assert!(matches!(holder.await.unwrap(), Err(BodyError::Failed)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failed = record(&*store).await.unwrap();
    assert_eq!(
        (failed.status, &failed.token, &failed.released),
        (Status::Failed, &held.token, &marked.released),
        "the late claim must be refused by the token the holder's failure kept: {failed:?}"
    );
    assert_eq!(runs.count(), 1, "only the holder ran");
    assert_eq!(
        charge(&direct, &runs).await.unwrap(),
        2,
        "the next caller runs at once"
    );
    let done = record(&*store).await.unwrap();
    assert_eq!(done.status, Status::Completed);
    assert!(done.released.is_empty(), "{done:?}");
}

/// A release that finds a FAILED record about to expire (by default `failed_ttl` = the lease) leaves
/// its token there, and the record's expiry reaches the end of the claim the token keeps out. Were it
/// left at the failure's, TTL would delete the record (here `purge_expired`) while the claim is still
/// on the wire, and the late claim, landing on nothing, would hold the key for its lease. On the
/// memory store, whose purge is explicit; DynamoDB's TTL deletes at a time of its own choosing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_released_token_lives_as_long_as_the_claim_it_stands_for() {
    let memory = Arc::new(MemoryStore::new());
    let store: Arc<dyn Store> = memory.clone();
    let clock = ManualClock::starting_now();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    let failed = direct
        .operation(NAMESPACE, KEY)
        .lease(Duration::from_mins(1))
        .run(|_| async {
            runs.0.fetch_add(1, Ordering::SeqCst);
            Err::<usize, _>(BodyError::Failed)
        })
        .await;
    assert!(matches!(failed, Err(BodyError::Failed)));
    let failure = record(&*store).await.unwrap();
    // Just before the failure expires, a call on a slow store gives up its claim.
    clock.advance(Duration::from_secs(59));
    let slow = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_millis(300)),
    )))
    .clock(clock.clone())
    .build();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), charge(&slow, &runs)).await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
    let marked = record(&*store).await.unwrap();
    assert_eq!(marked.released.len(), 1, "{marked:?}");
    // The claim can hold the key for its lease (and the margin) after the release started.
    let claim_end_s = (clock.now_ms() + 60_000).div_ceil(1000);
    assert!(
        marked.expires_at_s > failure.expires_at_s && marked.expires_at_s >= claim_end_s,
        "the record lives as long as the claim its token keeps out: {marked:?}, failure {failure:?}"
    );
    // The failure expires and TTL deletes it, while the claim is still on the wire; then it lands.
    clock.advance(Duration::from_secs(3));
    memory.purge_expired(clock.now_ms());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = record(&*store).await;
    let answer = charge(&direct, &runs).await;
    assert!(
        matches!(answer, Ok(2)),
        "the key must be free, not held for a lease by a call that returned: {answer:?}; record: {after:?}"
    );
}

/// One region of a routed store: down (every request `Unavailable`), or up with its claims applied
/// `late` after they were sent.
#[derive(Debug)]
struct Region {
    down: std::sync::atomic::AtomicBool,
    late: Duration,
}

impl Region {
    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable("the region is down".into()))
        } else {
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl Override<Forward> for Region {
    fn kind(&self) -> &'static str {
        "region"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.check()?;
        ClaimAppliedLate(self.late).claim(inner, request).await
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        self.check()?;
        inner.transition(transition).await
    }

    async fn get(&self, inner: &Forward, key: &str) -> Result<Option<Record>, StoreError> {
        self.check()?;
        inner.get(key).await
    }
}

/// A region's records, behind its switches.
type RegionStore = Delegating<Forward, Region>;

/// Home-region routing with failover, the key's home down and the other region slow: a call's claim
/// fails over and is still on the wire when its caller gives up. The release is sent where the call's
/// claims are followed, the home (a claim is pinned to the region it failed over to only once it is
/// held), which is down: no mark is left anywhere, and the claim lands in the other region, holding
/// the key there for its lease while the next caller fails over to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_claim_failed_over_in_flight_is_released_where_it_went() {
    let names = ["region-a", "region-b"];
    let regions: Vec<(Arc<MemoryStore>, Arc<RegionStore>)> = names
        .iter()
        .map(|_| {
            let memory = Arc::new(MemoryStore::new());
            let region = Region {
                down: std::sync::atomic::AtomicBool::new(false),
                late: Duration::from_millis(150),
            };
            let store = Arc::new(Delegating::new(Forward(memory.clone()), region));
            (memory, store)
        })
        .collect();
    let routed = idempotent_runtime::RoutedStore::new(
        names
            .iter()
            .zip(&regions)
            .map(|(name, (_, store))| (*name, store.clone() as Arc<dyn Store>)),
    )
    .unwrap()
    .failover(true);
    let key = idempotent_runtime::derive_key(NAMESPACE, KEY).unwrap();
    let home = names.iter().position(|n| *n == routed.home(&key)).unwrap();
    let away = 1 - home;
    regions[home].1.with.down.store(true, Ordering::SeqCst);
    let routed: Arc<dyn Store> = Arc::new(routed);
    let clock = ManualClock::starting_now();
    let idem = Idempotency::builder_arc(routed.clone())
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), charge(&idem, &runs)).await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    idem.drain(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let landed = regions[away].0.records();
    // The next caller, with the home still down, fails over too; its claims are answered at once.
    let next = Idempotency::builder_arc(Arc::new(
        idempotent_runtime::RoutedStore::new(names.iter().zip(&regions).enumerate().map(
            |(i, (name, (memory, store)))| {
                let store: Arc<dyn Store> = if i == home {
                    store.clone()
                } else {
                    memory.clone()
                };
                (*name, store)
            },
        ))
        .unwrap()
        .failover(true),
    ))
    .clock(clock)
    .build();
    let answer = charge(&next, &runs).await;
    assert!(
        matches!(answer, Ok(1)),
        "the key must be free, not held for a lease by a call that returned: {answer:?}; \
         records in the region the claim failed over to: {landed:?}"
    );
}

/// A claim held back until the release's mark is about to be written: the claim lands between the
/// release's first write (a fail, refused: no record yet) and its mark, which then finds the claim.
#[derive(Debug)]
struct ClaimLandsBeforeTheMark {
    land: Arc<tokio::sync::Semaphore>,
    landed: Arc<tokio::sync::Semaphore>,
    writes: std::sync::Mutex<Vec<&'static str>>,
}

impl ClaimLandsBeforeTheMark {
    fn new() -> Self {
        Self {
            land: Arc::new(tokio::sync::Semaphore::new(0)),
            landed: Arc::new(tokio::sync::Semaphore::new(0)),
            writes: std::sync::Mutex::default(),
        }
    }
}

#[async_trait::async_trait]
impl Override<Forward> for ClaimLandsBeforeTheMark {
    fn kind(&self) -> &'static str {
        "claim-lands-before-the-mark"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        // Applied on a task of its own, as the store goes on with a request whose client left.
        let store = inner.0.clone();
        let (key, token) = (request.key.to_owned(), request.token.to_owned());
        let (attempt, now_ms, lease_until_ms, expires_at_s) = (
            request.attempt,
            request.now_ms,
            request.lease_until_ms,
            request.expires_at_s,
        );
        let (land, landed) = (self.land.clone(), self.landed.clone());
        tokio::spawn(async move {
            land.acquire().await.unwrap().forget();
            let mut request = ClaimRequest::new(&key, &token, now_ms, lease_until_ms, expires_at_s);
            request.attempt = attempt;
            let outcome = store.claim(&request).await;
            landed.add_permits(1);
            outcome
        })
        .await
        .unwrap()
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let name = match transition.change {
            Change::Fail { .. } => "fail",
            Change::Release { .. } => "mark",
            Change::MarkReleased { .. } => "mark-record",
            _ => "other",
        };
        self.writes.lock().unwrap().push(name);
        if name == "mark" {
            self.land.add_permits(1);
            self.landed.acquire().await.unwrap().forget();
        }
        inner.transition(transition).await
    }
}

/// A release racing its own claim in the order fail (no record) → the claim lands → mark (finds the
/// claim): the release fails the claim it found, then leaves its token on it; the key is FAILED at
/// once, and the next caller runs the body.
async fn a_claim_landing_between_the_releases_writes_is_failed(backend: Backend) {
    let store = backing(backend).await;
    let race = Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimLandsBeforeTheMark::new(),
    ));
    let clock = ManualClock::starting_now();
    let dropped = Idempotency::builder_arc(race.clone())
        .clock(clock.clone())
        .build();
    let runs = Runs::default();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), charge(&dropped, &runs)).await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    dropped.drain(Duration::from_secs(10)).await;
    assert_eq!(
        *race.with.writes.lock().unwrap(),
        ["fail", "mark", "fail", "mark-record"],
        "the release's writes"
    );
    let released = record(&*store).await.unwrap();
    assert_eq!(released.status, Status::Failed, "{released:?}");
    assert_eq!(
        released.released,
        std::slice::from_ref(&released.token),
        "{released:?}"
    );
    let next = Idempotency::builder_arc(store).clock(clock).build();
    assert_eq!(charge(&next, &runs).await.unwrap(), 1);
    assert_eq!(runs.count(), 1);
}

idempotent_tests::on_both_stores!(
    the_seventeenth_call_given_up_on_a_slow_store_does_not_hold_the_key,
    a_burst_of_lost_answers_does_not_disarm_the_next_release,
    a_release_on_a_full_record_of_stale_tokens_replaces_them,
    a_claim_with_writes_given_up_in_flight_reserves_nothing,
    a_release_on_another_callers_claim_outlives_its_failure,
    a_claim_landing_between_the_releases_writes_is_failed,
);
