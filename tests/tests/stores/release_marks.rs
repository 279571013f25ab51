//! Release marks ([`Change::MarkReleased`]) made by stores that break a rule of them one way: the
//! mark lands on another call's record, which must keep everything but its released tokens, their
//! end and its expiry. The scenario beside each wrong store shows what the handler would meet (a
//! second claim of a key whose first claim is live, that is, a second run of the body), and the
//! conformance suite must fail each of them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idempotent_runtime::aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use idempotent_runtime::store::conformance::{
    self, BusinessTable, Delegating, Override, Report, Subject,
};
use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, Marking, Store, TransactOutcome, Transition, WriteOutcome,
    Writes,
};
use idempotent_runtime::{
    Error, Idempotency, ManualClock, MemoryStore, Record, Status, StoreError,
};
use idempotent_tests::{ClaimAppliedLate, Forward, Runs};

/// The time every scenario starts at (epoch milliseconds).
const T0: u64 = 1_700_000_000_000;
/// The lease every claim asks for: the attribute's default, 60 s.
const LEASE: u64 = 60_000;
/// The replay window of a completed response: the attribute's default, 24 h.
const TTL_S: u64 = 24 * 3600;

/// A memory store broken by `with`.
fn broken<O: Override<MemoryStore>>(with: O) -> Delegating<MemoryStore, O> {
    Delegating::new(MemoryStore::new(), with)
}

/// The names of the cases `report` failed.
fn failed(report: &Report) -> Vec<&'static str> {
    report.failed().map(|c| c.name).collect()
}

/// A claim at `now_ms` under `token`, holding the key for [`LEASE`] and living [`TTL_S`] past it.
fn claim<'a>(key: &'a str, token: &'a str, now_ms: u64) -> ClaimRequest<'a> {
    ClaimRequest::new(
        key,
        token,
        now_ms,
        now_ms + LEASE,
        (now_ms + LEASE) / 1000 + TTL_S,
    )
}

/// The mark a release under `token` makes at `now_ms` on `seen`, for a claim that holds the key until
/// `hold_until_ms`: the change the handler sends when its claim is in flight and it finds `seen`
/// (its token joins the released ones; their end and the record's expiry reach the claim's end).
fn mark_on(seen: &Record, now_ms: u64, hold_until_ms: u64) -> Change<'static> {
    Change::MarkReleased {
        now_ms,
        released_until_ms: seen
            .released_until_ms
            .map_or(hold_until_ms, |u| u.max(hold_until_ms)),
        expires_at_s: seen.expires_at_s.max(hold_until_ms.div_ceil(1000)),
        seen_until_ms: seen.released_until_ms,
        seen_expires_at_s: seen.expires_at_s,
        marking: Marking::Join,
    }
}

/// Breaks "the rest is left as it is": a mark on another call's PENDING claim also ends that claim's
/// lease at the mark's time (as if the mark released the record's claim rather than the caller's).
#[derive(Debug, Default)]
struct MarkEndsTheLease;

#[async_trait::async_trait]
impl Override<MemoryStore> for MarkEndsTheLease {
    fn kind(&self) -> &'static str {
        "mark-ends-the-lease"
    }

    async fn transition(
        &self,
        inner: &MemoryStore,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let outcome = inner.transition(transition).await?;
        if let (Change::MarkReleased { now_ms, .. }, WriteOutcome::Applied) =
            (transition.change, &outcome)
            && let Some(mut marked) = inner.get(transition.key).await?
            && marked.status == Status::Pending
        {
            marked.lease_until_ms = Some(now_ms.saturating_sub(1));
            inner.insert(marked);
        }
        Ok(outcome)
    }
}

/// The handler's path: call `t1` sent its claim at [`T0`] and gave it up before the answer came
/// (dropped, or the answer lost); meanwhile `t3` claimed the key and is running the body. `t1`'s
/// release finds `t3`'s live claim and leaves its token on it. A third call `t5`, 1 s later, must find
/// `t3`'s claim live. Returns what `t5`'s claim got.
async fn claim_after_a_mark_on_a_live_claim(store: &impl Store) -> ClaimOutcome {
    let hold_until = T0 + LEASE;
    let claimed_at = T0 + 5_000;
    assert_eq!(
        store.claim(&claim("k", "t3", claimed_at)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let live = store.get("k").await.unwrap().unwrap();
    let change = mark_on(&live, claimed_at + 1, hold_until);
    assert_eq!(
        store
            .transition(&Transition::new("k", "t1", change))
            .await
            .unwrap(),
        WriteOutcome::Applied,
        "the release leaves its token on t3's live claim"
    );
    store
        .claim(&claim("k", "t5", claimed_at + 1_000))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mark_that_ends_another_calls_lease_lets_a_second_claim_in() {
    // The memory store keeps the rule: t5 is refused by t3's live claim.
    let kept = claim_after_a_mark_on_a_live_claim(&MemoryStore::new()).await;
    assert!(
        matches!(&kept, ClaimOutcome::Existing(r) if r.token == "t3" && r.status == Status::Pending),
        "{kept:?}"
    );
    // The wrong store lets t5 in while t3's body runs: the body runs twice.
    let second = claim_after_a_mark_on_a_live_claim(&broken(MarkEndsTheLease)).await;
    assert_eq!(second, ClaimOutcome::Claimed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_fails_a_store_whose_mark_ends_another_calls_lease() {
    let report = conformance::check(|| async { broken(MarkEndsTheLease) }).await;
    assert!(
        failed(&report).contains(&"a_token_released_on_a_record_is_refused_by_it"),
        "a store whose mark ends the lease of the claim it lands on passed: {report}"
    );
}

/// Breaks "made only on a record that still holds `seen_expires_at_s`": the mark checks the released
/// tokens' end it read, not the expiry (and writes the expiry it was given, as the contract says). A mark computed from a
/// short-lived record (a FAILED one) and landing after another call claimed that record then
/// shortens the new claim's life to the released claim's end.
#[derive(Debug, Default)]
struct MarkIgnoresTheSeenExpiry;

#[async_trait::async_trait]
impl Override<MemoryStore> for MarkIgnoresTheSeenExpiry {
    fn kind(&self) -> &'static str {
        "mark-ignores-the-seen-expiry"
    }

    async fn transition(
        &self,
        inner: &MemoryStore,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let Change::MarkReleased {
            now_ms,
            released_until_ms,
            expires_at_s,
            seen_until_ms,
            marking,
            ..
        } = transition.change
        else {
            return inner.transition(transition).await;
        };
        let current = inner.get(transition.key).await?;
        let mut unchecked = *transition;
        unchecked.change = Change::MarkReleased {
            now_ms,
            released_until_ms,
            expires_at_s,
            seen_until_ms,
            seen_expires_at_s: current.as_ref().map_or(0, |r| r.expires_at_s),
            marking,
        };
        inner.transition(&unchecked).await
    }
}

/// The handler's path: call `t1` sent its claim at [`T0`]; the key held `t2`'s FAILED record
/// (expiring soon), which `t1`'s release reads when its fenced failure is rejected. Before the mark
/// lands, `t3` claims the FAILED record and starts the body (expiry a day on). The mark, computed from
/// the FAILED record, lands. A fourth call `t5`, after `t1`'s claim's end but within `t3`'s lease (and
/// before `t3`'s first heartbeat, a third of the lease after its claim), must find `t3`'s claim live.
/// Returns what `t5`'s claim got.
async fn claim_after_a_mark_from_an_earlier_read(store: &impl Store) -> ClaimOutcome {
    let hold_until = T0 + LEASE;
    // t2's FAILED record, expiring 10 s after T0.
    assert_eq!(
        store.claim(&claim("k", "t2", T0 - 1_000)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let fail = Change::Fail {
        error: "boom",
        expires_at_s: T0 / 1000 + 10,
        release_claim_writes: false,
    };
    assert_eq!(
        store
            .transition(&Transition::new("k", "t2", fail))
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    let release_at = T0 + 40_000;
    let seen = store.get("k").await.unwrap().unwrap();
    let change = mark_on(&seen, release_at, hold_until);
    // t3 claims between the release's read and its mark.
    assert_eq!(
        store.claim(&claim("k", "t3", release_at)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    // Rejected by a store that keeps the rule (the record changed since it was read); applied by
    // the wrong one.
    let _ = store
        .transition(&Transition::new("k", "t1", change))
        .await
        .unwrap();
    store
        .claim(&claim("k", "t5", hold_until + 2_000))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mark_from_an_earlier_read_can_cut_a_live_claims_life_short() {
    let kept = claim_after_a_mark_from_an_earlier_read(&MemoryStore::new()).await;
    assert!(
        matches!(&kept, ClaimOutcome::Existing(r) if r.token == "t3" && r.status == Status::Pending),
        "{kept:?}"
    );
    let second = claim_after_a_mark_from_an_earlier_read(&broken(MarkIgnoresTheSeenExpiry)).await;
    assert_eq!(second, ClaimOutcome::Claimed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_fails_a_store_whose_mark_ignores_the_expiry_it_read() {
    let report = conformance::check(|| async { broken(MarkIgnoresTheSeenExpiry) }).await;
    assert!(
        failed(&report).contains(&"a_token_released_on_a_record_is_refused_by_it"),
        "a store whose mark ignores `seen_expires_at_s` passed: {report}"
    );
}

/// The first finding through the handler. A call holds the key and runs its body; a second call, on
/// a slow path to the same store, gives up while its claim is on the wire, and its release leaves its
/// token on the first call's live claim; a third call, from another process, comes while the first
/// body still runs. It must
/// be told the key is in progress, and the body must have run once.
async fn a_third_call_while_the_first_runs(store: Arc<dyn Store>) -> Answers {
    let clock = ManualClock::starting_now();
    let fast = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    // The third call is another process's: one of the first call's own process would follow its
    // call in flight and send nothing.
    let other = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .build();
    let slow = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(store),
        ClaimAppliedLate(Duration::from_millis(150)),
    )))
    .clock(clock)
    .build();
    let runs = Runs::default();
    let first_may_end = Arc::new(tokio::sync::Notify::new());
    let charge = |idem: Idempotency, runs: Runs, gate: Arc<tokio::sync::Notify>| async move {
        idem.operation("release_marks::charge", "order-1")
            .lease(Duration::from_mins(1))
            .run(|_| async move {
                let run = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
                if run == 1 {
                    gate.notified().await;
                }
                Ok::<_, Error>(run)
            })
            .await
    };
    let first = tokio::spawn(charge(fast.clone(), runs.clone(), first_may_end.clone()));
    while runs.count() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        charge(slow.clone(), runs.clone(), first_may_end.clone()),
    )
    .await;
    assert!(gave_up.is_err(), "the second call gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
    // Its release and its late claim have landed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let third = charge(other, runs.clone(), first_may_end.clone()).await;
    let ran = runs.count();
    first_may_end.notify_one();
    Answers {
        first: first.await.unwrap(),
        third,
        ran,
    }
}

/// What [`a_third_call_while_the_first_runs`] saw.
#[derive(Debug)]
struct Answers {
    /// The first call's answer, once its body was let go.
    first: Result<usize, Error>,
    /// The third call's answer.
    third: Result<usize, Error>,
    /// How many times the body had run when the third call returned.
    ran: usize,
}

impl Answers {
    /// The promise: the third call is told the key is in progress, the body ran once, and the first
    /// call gets its run's value.
    fn assert_one_run(&self) {
        assert!(
            matches!(self.third, Err(Error::InProgress { .. })),
            "the third call must find the first one's claim live: {self:?}"
        );
        assert_eq!(
            self.ran, 1,
            "the body ran again while its first run was going: {self:?}"
        );
        assert!(matches!(self.first, Ok(1)), "{self:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_on_a_live_claim_keeps_it_on_the_memory_store() {
    a_third_call_while_the_first_runs(Arc::new(MemoryStore::new()))
        .await
        .assert_one_run();
}

/// Breaks "the rest is left as it is" on a record whose claim-time writes are in effect: a mark also
/// clears [`Record::claim_writes_in_effect`] (as if the token it adds released them). Transactions
/// go to the memory store.
#[derive(Debug, Default)]
struct MarkForgetsClaimWrites;

#[async_trait::async_trait]
impl Override<MemoryStore> for MarkForgetsClaimWrites {
    fn kind(&self) -> &'static str {
        "mark-forgets-claim-writes"
    }

    async fn transition(
        &self,
        inner: &MemoryStore,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let outcome = inner.transition(transition).await?;
        if let (Change::MarkReleased { .. }, WriteOutcome::Applied) = (transition.change, &outcome)
            && let Some(mut marked) = inner.get(transition.key).await?
        {
            marked.claim_writes_in_effect = false;
            inner.insert(marked);
        }
        Ok(outcome)
    }

    async fn claim_transaction(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        inner.claim_transaction(request, writes).await
    }

    async fn transact_transition(
        &self,
        inner: &MemoryStore,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        inner.transact_transition(transition, writes).await
    }
}

/// A memory store with the business table `stock` (partition key `pk`) holding `sku-1` with 10
/// available.
fn with_stock(store: &MemoryStore) {
    store.create_table("stock", "pk", None).unwrap();
    store
        .put_item(
            "stock",
            HashMap::from([
                ("pk".to_owned(), AttributeValue::S("sku-1".to_owned())),
                ("available".to_owned(), AttributeValue::N("10".to_owned())),
            ]),
        )
        .unwrap();
}

/// How many of `sku-1` are left.
fn available(store: &MemoryStore) -> u32 {
    let key = HashMap::from([("pk".to_owned(), AttributeValue::S("sku-1".to_owned()))]);
    let item = store.get_item("stock", &key).unwrap();
    item["available"].as_n().unwrap().parse().unwrap()
}

/// One unit of `sku-1` reserved: a claim-time write.
fn reserve() -> Writes {
    let update = Update::builder()
        .table_name("stock")
        .key("pk", AttributeValue::S("sku-1".to_owned()))
        .update_expression("SET available = available - :one")
        .condition_expression("available >= :one")
        .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
        .build()
        .unwrap();
    std::iter::once(TransactWriteItem::builder().update(update).build()).collect()
}

/// The handler's path with claim-time writes: call `t2` claimed the key with its reservation and its
/// body failed without compensation (the record is FAILED, the reservation in effect). Call `t1`,
/// which gave up a claim in flight, leaves its token on that record. Call `t5` claims with the same
/// reservation: the record must refuse it (the reservation is in effect), so that the handler
/// claims with a plain claim that keeps it. Returns what `t5`'s claim got, and the units left.
async fn a_claim_with_writes_after_a_mark<O: Override<MemoryStore>>(
    store: &Delegating<MemoryStore, O>,
) -> (TransactOutcome, u32) {
    with_stock(&store.inner);
    let first = claim("k", "t2", T0);
    assert_eq!(
        store.claim_transaction(&first, &reserve()).await.unwrap(),
        TransactOutcome::Committed
    );
    let fail = Change::Fail {
        error: "the body failed",
        expires_at_s: T0 / 1000 + 3600,
        release_claim_writes: false,
    };
    assert_eq!(
        store
            .transition(&Transition::new("k", "t2", fail))
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    let failed = store.get("k").await.unwrap().unwrap();
    assert!(failed.claim_writes_in_effect, "{failed:?}");
    let mark = mark_on(&failed, T0 + 1_000, T0 + LEASE);
    assert_eq!(
        store
            .transition(&Transition::new("k", "t1", mark))
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    let again = store
        .claim_transaction(&claim("k", "t5", T0 + 2_000), &reserve())
        .await
        .unwrap();
    (again, available(&store.inner))
}

/// A no-op override: the memory store as it is, with its transactions.
#[derive(Debug, Default)]
struct AsIs;

#[async_trait::async_trait]
impl Override<MemoryStore> for AsIs {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn claim_transaction(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        inner.claim_transaction(request, writes).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mark_that_forgets_claim_writes_lets_them_apply_twice() {
    let (kept, left) = a_claim_with_writes_after_a_mark(&broken(AsIs)).await;
    assert!(
        matches!(kept, TransactOutcome::Rejected(Some(_))),
        "{kept:?}"
    );
    assert_eq!(left, 9, "one reservation for the key");
    let (again, left) = a_claim_with_writes_after_a_mark(&broken(MarkForgetsClaimWrites)).await;
    assert_eq!(again, TransactOutcome::Committed);
    assert_eq!(left, 8, "the wrong store reserved twice for one key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_fails_a_store_whose_mark_forgets_claim_writes() {
    let report = conformance::check(|| async {
        let store = MemoryStore::new();
        store.create_table("business", "id", None).unwrap();
        Subject::new(Delegating::new(store, MarkForgetsClaimWrites))
            .with_business_table(BusinessTable::new("business", "id"))
    })
    .await;
    assert!(
        !failed(&report).is_empty(),
        "a store whose mark clears claim writes in effect passed: {report}"
    );
}

/// Breaks "a claim under any token up to `released_through` is refused": the store's claims check the
/// released tokens alone, as a store written before `released_through` was part of a record would.
#[derive(Debug, Default)]
struct ClaimIgnoresReleasedThrough;

#[async_trait::async_trait]
impl Override<MemoryStore> for ClaimIgnoresReleasedThrough {
    fn kind(&self) -> &'static str {
        "claim-ignores-released-through"
    }

    async fn claim(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        if let Some(mut record) = inner.get(request.key).await?
            && let Some(through) = record.released_through.take()
        {
            // Claimed as if it were not there, and kept on the record.
            inner.insert(record);
            let outcome = inner.claim(request).await?;
            if let Some(mut after) = inner.get(request.key).await? {
                after.released_through = Some(through);
                inner.insert(after);
            }
            return Ok(outcome);
        }
        inner.claim(request).await
    }
}

/// The handler's path past [`MAX_RELEASED`](idempotent_runtime::MAX_RELEASED) releases within one
/// lease: sixteen calls released their claims on `owner`'s FAILED record, and a seventeenth, `r20`,
/// found the set full and raised `released_through` to its token. Returns what `r20`'s late claim got.
async fn a_late_claim_past_a_full_set(store: &impl Store) -> ClaimOutcome {
    let hold_until = T0 + LEASE;
    assert_eq!(
        store.claim(&claim("k", "owner", T0)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let fail = Change::Fail {
        error: "boom",
        expires_at_s: T0 / 1000 + 10,
        release_claim_writes: false,
    };
    store
        .transition(&Transition::new("k", "owner", fail))
        .await
        .unwrap();
    for i in 0..idempotent_runtime::MAX_RELEASED {
        let seen = store.get("k").await.unwrap().unwrap();
        let token = format!("r{i:02}");
        let change = mark_on(&seen, T0 + 1, hold_until);
        store
            .transition(&Transition::new("k", &token, change))
            .await
            .unwrap();
    }
    let full = store.get("k").await.unwrap().unwrap();
    let Change::MarkReleased {
        now_ms,
        released_until_ms,
        expires_at_s,
        seen_until_ms,
        seen_expires_at_s,
        ..
    } = mark_on(&full, T0 + 2, hold_until)
    else {
        unreachable!("a mark")
    };
    let through = Change::MarkReleased {
        now_ms,
        released_until_ms,
        expires_at_s,
        seen_until_ms,
        seen_expires_at_s,
        marking: Marking::Through,
    };
    assert_eq!(
        store
            .transition(&Transition::new("k", "r20", through))
            .await
            .unwrap(),
        WriteOutcome::Applied,
        "the seventeenth release raises released_through"
    );
    store.claim(&claim("k", "r20", T0 + 3)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_that_ignores_released_through_holds_the_key_for_a_call_that_gave_up() {
    let kept = a_late_claim_past_a_full_set(&MemoryStore::new()).await;
    assert!(
        matches!(&kept, ClaimOutcome::Existing(r) if r.token == "owner" && r.status == Status::Failed),
        "{kept:?}"
    );
    let landed = a_late_claim_past_a_full_set(&broken(ClaimIgnoresReleasedThrough)).await;
    assert_eq!(landed, ClaimOutcome::Claimed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_fails_a_store_whose_claims_ignore_released_through() {
    let report = conformance::check(|| async { broken(ClaimIgnoresReleasedThrough) }).await;
    assert!(
        failed(&report).contains(&"a_token_released_on_a_record_is_refused_by_it"),
        "a store whose claims ignore released_through passed: {report}"
    );
}
