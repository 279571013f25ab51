//! The state machine: claim → execute → complete or fail. Every request it makes, with its exact
//! condition, is listed in the docs of [`DynamoDbStore`](crate::store::dynamodb::DynamoDbStore)'s module.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::Poll;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cache::Cached;
use crate::codec;
use crate::config::Idempotency;

use crate::error::CancellationReason;
use crate::error::Error;
use crate::record::{Record, Status};
use crate::steps::Steps;
use crate::store::writes::Staged;
use crate::store::{
    Change, ClaimOutcome, ClaimRequest, StepsClaim, StoreError, TransactOutcome, Transition,
    WriteOutcome, Writes,
};
use crate::telemetry::{self, Dropped, Outcome};

/// What the attribute says about one function: its namespace and its durations (`None` = the handle's
/// default). Generated code keeps one in a `static`.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// The key namespace: `name = ".."`, or `module_path!()::fn_name`.
    pub namespace: &'static str,
    /// `ttl = ".."`.
    pub ttl: Option<Duration>,
    /// `lease = ".."`.
    pub lease: Option<Duration>,
    /// `wait = ".."`.
    pub wait: Option<Duration>,
    /// `missing_key = ".."`: what a key that serializes to `null` (or a tuple key with a `null` part) means.
    pub missing_key: MissingKey,
}

/// What to do with a *missing* key: one that serializes to `null` (an `Option` that is `None`), or a
/// top-level tuple or array key with a `null` element (`key = (tenant, order_id)` with no `order_id`).
///
/// Keyless calls must never share a record: the second would get the first one's response. So a missing
/// key is an error unless the function says otherwise. Empty strings, `0`, `false`, `[]` and `{}` are
/// values, never missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// [`Error::MissingKey`] before any I/O: no record, the body does not run (the default).
    #[default]
    Reject,
    /// `null` is a deliberate value: every call whose key is `null` shares one record.
    Allow,
    /// Run the body without idempotency (no record, no replay) and log a warning. Not with business
    /// writes (`transact`, `claim_with`): they commit only with a record, so such a call is rejected as
    /// with [`Reject`](Self::Reject) (the attribute refuses the combination at compile time).
    Skip,
}

impl Call {
    /// A call in `namespace` with every duration left to the handle's defaults.
    #[must_use]
    pub const fn new(namespace: &'static str) -> Self {
        Self {
            namespace,
            ttl: None,
            lease: None,
            wait: None,
            missing_key: MissingKey::Reject,
        }
    }
}

/// Maps a store failure to the crate's error, naming the namespace.
#[cold]
pub(crate) fn store_error(namespace: &str, err: StoreError) -> Error {
    let namespace = namespace.to_owned();
    match err {
        StoreError::Throttled(source) => Error::Throttled { namespace, source },
        StoreError::Unavailable(source) => Error::Unavailable { namespace, source },
        StoreError::TableNotFound(table) => Error::TableNotFound { namespace, table },
        StoreError::Corrupt(detail) => Error::CorruptRecord { namespace, detail },
        StoreError::Schema(detail) => Error::TableMismatch { namespace, detail },
        StoreError::AccessDenied { table, source } => Error::AccessDenied {
            namespace,
            table,
            source,
        },
        StoreError::Unsupported { store, capability } => Error::Unsupported {
            namespace,
            store,
            capability,
        },
        StoreError::Invalid(source) | StoreError::Other(source) => {
            Error::Store { namespace, source }
        }
        StoreError::RegionUnavailable { region, source } => Error::RegionUnavailable {
            namespace,
            region,
            source,
        },
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Epoch seconds of `now_ms + extra`, rounded up so a record never expires early; saturating, so that
/// no duration, however absurd, overflows.
pub(crate) fn expiry_s(now_ms: u64, extra: Duration) -> u64 {
    now_ms.saturating_add(millis(extra)).div_ceil(1000)
}

/// What a blocking record means for this call.
#[derive(Debug)]
pub(crate) enum Found {
    /// Our own claim (a retried write whose first response was lost).
    Ours,
    /// The record's stored response is to be returned.
    Replay,
    /// Another call is running; its lease (plus the skew margin) ends in this long.
    InProgress(Duration),
    /// The record became claimable after all; try to claim again.
    Claimable,
}

/// [`Error::PayloadMismatch`] when both the stored answer (a record or a cached response) and the call
/// have a payload fingerprint, and they differ.
fn same_payload(namespace: &str, stored: Option<&str>, ours: Option<&str>) -> Result<(), Error> {
    match (stored, ours) {
        (Some(stored), Some(ours)) if stored != ours => Err(payload_mismatch(namespace)),
        _ => Ok(()),
    }
}

/// [`Error::PayloadMismatch`]. Out of line and `#[cold]`, like the other error constructors of this
/// module: the code a call runs stays dense in the instruction cache, which the store's client evicts
/// between calls, and the compiler lays the error paths out of the way.
#[cold]
fn payload_mismatch(namespace: &str) -> Error {
    Error::PayloadMismatch {
        namespace: namespace.to_owned(),
    }
}

/// [`Error::Serialize`] of a response, for the caller whose body produced it.
#[cold]
fn unserializable_response(namespace: &str, source: serde_json::Error) -> Error {
    Error::Serialize {
        namespace: namespace.to_owned(),
        what: "response",
        source,
    }
}

/// [`Error::Expired`].
#[cold]
fn expired(namespace: &str) -> Error {
    Error::Expired {
        namespace: namespace.to_owned(),
    }
}

/// [`Error::ResponseTooLarge`].
#[cold]
fn response_too_large(namespace: &str) -> Error {
    Error::ResponseTooLarge {
        namespace: namespace.to_owned(),
    }
}

/// What `record` means for a call holding `token`, at `now_ms` (the caller's clock less the skew margin,
/// as in the claim condition).
pub(crate) fn examine(
    call: &Call,
    record: &Record,
    token: &str,
    fingerprint: Option<&str>,
    now_ms: u64,
) -> Result<Found, Error> {
    if record.token == token {
        return Ok(Found::Ours);
    }
    // An expired record counts as absent: the key is new, whatever payload the old call had.
    if record.is_expired(now_ms) {
        return Ok(Found::Claimable);
    }
    same_payload(call.namespace, record.fingerprint.as_deref(), fingerprint)?;
    if record.is_claimable(now_ms) {
        return Ok(Found::Claimable);
    }
    match record.status {
        Status::Completed
            if record
                .replay_until_s
                .is_some_and(|until| until < now_ms / 1000) =>
        {
            Err(expired(call.namespace))
        }
        Status::Completed if record.response.is_none() => Err(response_too_large(call.namespace)),
        Status::Completed => Ok(Found::Replay),
        Status::Pending => Ok(Found::InProgress(Duration::from_millis(
            record
                .lease_until_ms
                .unwrap_or(now_ms)
                .saturating_sub(now_ms),
        ))),
        // A FAILED record is always claimable.
        Status::Failed => Ok(Found::Claimable),
    }
}

/// The time a caller whose clock reads `now_ms` judges leases and expiry at: its clock less the skew
/// margin, so that a clock running ahead by less than the margin never sees a live lease as lapsed, nor a
/// live record as expired. Both the claim condition and [`examine`] use it.
pub(crate) fn judged_ms(now_ms: u64, margin: Duration) -> u64 {
    now_ms.saturating_sub(millis(margin))
}

/// The times of a claim attempt made when the caller's clock reads `now_ms`: the condition's time
/// ([`judged_ms`]), the lease's end and the record's expiry (counted from the unmargined clock, so a
/// lease is never shortened by the margin).
pub(crate) fn claim_times(
    now_ms: u64,
    margin: Duration,
    lease: Duration,
    ttl: Duration,
) -> ClaimTimes {
    ClaimTimes {
        now_ms: judged_ms(now_ms, margin),
        lease_until_ms: now_ms.saturating_add(millis(lease)),
        expires_at_s: expiry_s(now_ms, lease.saturating_add(ttl)),
    }
}

/// The times of one claim attempt (see [`claim_times`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimTimes {
    /// What the claim condition is evaluated at ([`ClaimRequest::now_ms`]).
    pub(crate) now_ms: u64,
    /// Until when the claim blocks others.
    pub(crate) lease_until_ms: u64,
    /// When the PENDING record counts as absent.
    pub(crate) expires_at_s: u64,
}

/// How long after a claim (past its lease) or a failure the record lives: the operation's `ttl`, and
/// for a call with claim-time writes its `ttl` and `retain` too, so that the mark that the writes are in
/// effect ([`Record::claim_writes_in_effect`]) lasts as long as a completed record would. Once the
/// record has expired the key is a new operation, which applies them again.
fn writes_lifetime(idem: &Idempotency, plan: &Plan<'_>, ttl: Duration) -> Duration {
    if plan.claim_writes.is_empty() {
        ttl
    } else {
        ttl.saturating_add(idem.retain().unwrap_or_default())
    }
}

/// How long a FAILED record lives: `failed_ttl`, or, when the failure leaves claim-time writes in
/// effect, at least `keeps_writes` (the operation's [`writes_lifetime`]).
pub(crate) fn failed_lifetime(failed_ttl: Duration, keeps_writes: Option<Duration>) -> Duration {
    keeps_writes.map_or(failed_ttl, |lifetime| lifetime.max(failed_ttl))
}

/// Whether a failure keeps its record for the operation's lifetime rather than `failed_ttl`: it leaves
/// claim-time writes in effect (`keeps_claim_writes`), or its body's steps are resumed by a retry.
pub(crate) fn failure_keeps_record(keeps_claim_writes: bool, steps: Option<&Steps>) -> bool {
    keeps_claim_writes || steps.is_some_and(|steps| !steps.restart_failed())
}

/// Whether a fenced transition that was rejected with `record` had landed after all: our own earlier
/// attempt (its response lost) already moved the record to `status` under our `token`.
pub(crate) fn landed(record: Option<&Record>, token: &str, status: Status) -> bool {
    record.is_some_and(|r| r.token == token && r.status == status)
}

/// First poll after this long, doubling up to [`MAX_POLL`], while waiting for an in-flight call.
const FIRST_POLL: Duration = Duration::from_millis(25);
const MAX_POLL: Duration = Duration::from_secs(1);
/// How often a call re-claims a key it found claimable, before it reports [`Error::Contended`].
pub(crate) const CLAIMABLE_RETRIES: u32 = 3;
/// The most bytes of the body's error text stored on a FAILED record.
pub(crate) const MAX_ERROR_BYTES: usize = 4096;

/// Everything about one call except the body.
pub(crate) struct Plan<'a> {
    pub(crate) call: &'a Call,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: Option<&'a str>,
    /// Writes the body stages, committed with the COMPLETED record.
    pub(crate) staging: Option<&'a Staged>,
    /// Writes committed with the claim, in effect at most once per key.
    pub(crate) claim_writes: &'a Writes,
    /// Writes that undo `claim_writes`, committed with a FAILED record.
    pub(crate) compensation: &'a Writes,
    /// The body's steps, for an operation run with steps.
    pub(crate) steps: Option<&'a Steps>,
}

/// What a call's state machine owns: its handle, and what its [`Plan`] borrows.
pub(crate) struct Parts<'s, I> {
    /// The handle (`I` is a `Cow` or a reference).
    pub(crate) idem: I,
    pub(crate) call: Call,
    pub(crate) key: String,
    pub(crate) fingerprint: Option<String>,
    pub(crate) staging: Option<&'s Staged>,
    pub(crate) claim_writes: Writes,
    pub(crate) compensation: Writes,
    pub(crate) steps: Option<Steps>,
}

/// A claim with claim-time writes, as a transaction; `None` when the key is to be taken with a plain
/// claim instead. Boxed and out of line: most calls have no claim-time writes, and their claim's code
/// stays dense in the instruction cache.
#[cold]
fn claim_with_writes<'a>(
    idem: &'a Idempotency,
    plan: &'a Plan<'_>,
    request: &'a ClaimRequest<'_>,
) -> Pin<Box<dyn Future<Output = Result<Option<ClaimOutcome>, Error>> + Send + 'a>> {
    Box::pin(async move {
        let namespace = plan.call.namespace;
        let fingerprint = plan.fingerprint.map_or(0, str::len);
        if let Err(detail) = plan.claim_writes.check_limits(plan.key, fingerprint) {
            return Err(Error::TooManyWrites {
                namespace: namespace.to_owned(),
                detail,
            });
        }
        let claimed = idem.store().claim_transaction(request, plan.claim_writes);
        match telemetry::observe("claim_transaction", claimed).await {
            Ok(TransactOutcome::Committed) => Ok(Some(ClaimOutcome::Claimed)),
            // Claimable, but its claim-time writes are still in effect (a failure without compensation,
            // or a lapsed claim): take it with a plain claim, which keeps them, so they are never applied
            // twice.
            Ok(TransactOutcome::Rejected(Some(record)))
                if record.is_claimable_keeping_writes(request.now_ms) =>
            {
                tracing::debug!(
                    namespace,
                    "claim-time writes still in effect; claiming without applying them again"
                );
                Ok(None)
            }
            Ok(TransactOutcome::Rejected(Some(record))) => Ok(Some(ClaimOutcome::Existing(record))),
            // A resume whose record is gone: the plain claim finds it gone too, and the call claims
            // afresh.
            Ok(TransactOutcome::Rejected(None))
                if matches!(request.steps, StepsClaim::Resume { .. }) =>
            {
                Ok(None)
            }
            Ok(TransactOutcome::Rejected(None)) => Err(Error::CorruptRecord {
                namespace: namespace.to_owned(),
                detail: "the claim condition failed but no item was returned".into(),
            }),
            Ok(TransactOutcome::Canceled(reasons)) => Err(Error::TransactionCanceled {
                namespace: namespace.to_owned(),
                reasons,
            }),
            Err(StoreError::Invalid(source)) => Err(Error::WriteRejected {
                namespace: namespace.to_owned(),
                source,
            }),
            Err(e) => Err(store_error(namespace, e)),
        }
    })
}

/// How the claim phase ended.
enum Acquired<T> {
    /// We hold the claim until this instant (epoch milliseconds): run the body. `took_over`: the key was
    /// held by a lapsed claim when this call found it.
    Held {
        lease_until_ms: u64,
        took_over: bool,
    },
    /// The answer is known without running the body: a replay from the store or from the local cache.
    Done(T, Outcome),
}

/// What a call's claim attempts need: the call, its fencing token and its durations; and where the call
/// is, for what dropping it must do (see its `Drop`).
struct Attempt<'a> {
    idem: &'a Idempotency,
    plan: &'a Plan<'a>,
    token: &'a str,
    lease: Duration,
    ttl: Duration,
    stage: Where,
}

impl<'a> Attempt<'a> {
    /// The claim request of attempt `number`, with its own times (a plain claim: it applies no
    /// claim-time writes and keeps none; with steps, it starts the operation afresh).
    fn request(&self, number: u32) -> ClaimRequest<'a> {
        let times = claim_times(
            self.idem.clock().now_ms(),
            self.idem.clock_skew_margin(),
            self.lease,
            writes_lifetime(self.idem, self.plan, self.ttl),
        );
        ClaimRequest {
            key: self.plan.key,
            token: self.token,
            attempt: number,
            now_ms: times.now_ms,
            lease_until_ms: times.lease_until_ms,
            expires_at_s: times.expires_at_s,
            fingerprint: self.plan.fingerprint,
            keep_claim_writes: false,
            steps: self
                .plan
                .steps
                .map_or(StepsClaim::Untouched, |steps| steps.claim(self.token, None)),
        }
    }
}

/// Where a call is, as far as dropping its future is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Stage {
    /// A claim request is out, or its answer not yet read: it may have landed.
    Claiming,
    /// The key is someone else's (the call is reading it, or waiting): nothing of ours is stored.
    Waiting,
    /// The body runs in the caller's future.
    Running,
    /// The body runs on its own task, or the call is over: a drop changes nothing.
    Done,
}

/// A call's [`Stage`], shared by its future's parts. Atomic only so that a call's future stays `Send`
/// (a `Cell` borrowed across an await would not be); one thread reads and writes it at a time.
pub(crate) struct Where(AtomicU8);

impl Where {
    fn new(stage: Stage) -> Self {
        Self(AtomicU8::new(stage as u8))
    }

    fn get(&self) -> Stage {
        match self.0.load(Ordering::Relaxed) {
            0 => Stage::Claiming,
            1 => Stage::Waiting,
            2 => Stage::Running,
            _ => Stage::Done,
        }
    }

    pub(crate) fn set(&self, stage: Stage) {
        self.0.store(stage as u8, Ordering::Relaxed);
    }
}

/// An `Attempt` lives in the call's future: when the future is dropped before it finished (a client hung
/// up, a `timeout` or `select!` gave up on it), it says so and cleans up by the call's [`Stage`]. A claim
/// that may have landed is released at once by a fenced write with the call's own token (its condition
/// fails harmlessly if the claim never landed), so the key is free for the next caller; a body cut off
/// mid-way leaves the key PENDING until its lease runs out (it may have had effects: running it again
/// early would be worse), with a warning and `idempotency_calls_dropped_total{phase="body"}`.
impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let attempt = &*self;
        let namespace = attempt.plan.call.namespace;
        match attempt.stage.get() {
            Stage::Claiming if attempt.plan.steps.is_some_and(|steps| !steps.releasable()) => {
                telemetry::call_dropped(namespace, Dropped::Claim);
            }
            Stage::Claiming => {
                telemetry::call_dropped(namespace, Dropped::Claim);
                // A claim with claim-time writes leaves them in effect (a release sends no
                // compensation), so its record must live as long as a failure that keeps them.
                // So must a claim that may hold finished steps (a resume).
                let lifetime = failed_lifetime(
                    attempt.idem.failed_ttl(),
                    (!attempt.plan.claim_writes.is_empty() || attempt.plan.steps.is_some())
                        .then(|| writes_lifetime(attempt.idem, attempt.plan, attempt.ttl)),
                );
                release(
                    attempt.idem,
                    namespace,
                    attempt.plan.key,
                    attempt.token,
                    lifetime,
                );
            }
            Stage::Running => telemetry::call_dropped(namespace, Dropped::Body),
            Stage::Waiting | Stage::Done => {}
        }
    }
}

/// The error text of a claim released because its call was dropped before the body started.
pub(crate) const RELEASED: &str = "released: the call was dropped before its body started";

/// Moves a claim that `token` may hold on `key` to FAILED ([`RELEASED`]), on a task of its own (a drop
/// cannot await): the key is claimable again at once, and the FAILED record shows why. Fenced like
/// every transition, so a claim that never landed, or was taken over since, is left alone. Outside a
/// Tokio runtime nothing can be sent, and the claim lapses with its lease.
#[cold]
fn release(
    idem: &Idempotency,
    namespace: &'static str,
    key: &str,
    token: &str,
    lifetime: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            namespace,
            "call dropped outside a Tokio runtime: its claim is not released and lapses with its lease"
        );
        return;
    };
    let (idem, key, token) = (idem.clone(), key.to_owned(), token.to_owned());
    let tasks = idem.tasks().clone();
    let release = async move {
        let now_ms = idem.clock().now_ms();
        let transition = Transition {
            key: &key,
            token: &token,
            change: Change::Fail {
                error: RELEASED,
                expires_at_s: expiry_s(now_ms, lifetime),
                release_claim_writes: false,
            },
        };
        match telemetry::observe("release", idem.store().transition(&transition)).await {
            Ok(WriteOutcome::Applied) => {
                tracing::debug!(namespace, "dropped call's claim released");
            }
            // The claim never landed, or is no longer ours: nothing to release.
            Ok(WriteOutcome::Rejected(_)) => {}
            Err(error) => tracing::warn!(
                namespace,
                %error,
                "could not release a dropped call's claim; it lapses with its lease"
            ),
        }
    };
    runtime.spawn(tasks.track_future(release));
}

/// Claims the key, or finds the stored answer, or says why neither is possible; with `wait`, polls an
/// in-flight call until it finishes or the wait runs out.
async fn acquire<T: DeserializeOwned>(attempt: &Attempt<'_>) -> Result<Acquired<T>, Error> {
    // Read from `attempt` where used rather than copied into locals: this future is part of every
    // call's, and each local that lives across an await makes it larger.
    let Attempt {
        idem, plan, token, ..
    } = *attempt;
    let wait_until = plan
        .call
        .wait
        .filter(|w| !w.is_zero())
        .map(|w| tokio::time::Instant::now() + w);

    if let Some(value) = cached(idem, plan)? {
        return Ok(Acquired::Done(value, Outcome::Cached));
    }

    // Claim, or find out why not. Loops only when waiting, or when a record became claimable between
    // two reads; each pass is a new claim attempt, with its own times. (No record, and nothing decided
    // from one, is held across an await: this future is part of every call's, and stays small.)
    let mut poll = FIRST_POLL;
    let mut number = 0;
    let mut took_over = false;
    // With steps: the stored steps of a record to resume, as last seen (boxed: a pointer in every
    // call's future, where most calls have no steps).
    let mut resume: Option<Box<Vec<u8>>> = None;
    'claim: loop {
        number += 1;
        tracing::Span::current().record("attempt", number);
        let mut request = attempt.request(number);
        if let (Some(steps), Some(seen)) = (plan.steps, resume.as_deref().map(Vec::as_slice)) {
            steps.resuming();
            request.steps = steps.claim(token, Some(seen));
        }
        let claimed_until_ms = request.lease_until_ms;
        attempt.stage.set(Stage::Claiming);
        // The request is moved into the attempt's own future: this one then holds it only while that
        // future is awaited, and the record it may return can share its place.
        let mut record = match claim_once(idem, plan, request).await? {
            Claim::Held => {
                if let Some(steps) = plan.steps {
                    steps.claimed(resume.map(|seen| *seen));
                }
                return Ok(Acquired::Held {
                    lease_until_ms: claimed_until_ms,
                    took_over,
                });
            }
            Claim::Blocked(record) => record,
            // The record is gone (deleted since the transaction, or the claim that saw it): a new
            // operation, whose claim applies the writes, and starts its steps afresh.
            Claim::Vanished(_) if number <= CLAIMABLE_RETRIES => {
                resume = None;
                continue 'claim;
            }
            Claim::Vanished(e) => return Err(store_error(plan.call.namespace, e)),
        };
        // The claim was refused: the record is someone else's (or ours, which `examine` says).
        attempt.stage.set(Stage::Waiting);
        // Inspect the record; while waiting, keep re-reading it until it is done or claimable.
        loop {
            let now_ms = judged_ms(idem.clock().now_ms(), idem.clock_skew_margin());
            let lease_until_ms = record.lease_until_ms;
            let (lapsed, expired) = (record.status == Status::Pending, record.is_expired(now_ms));
            let retry_after = match examine(plan.call, &record, token, plan.fingerprint, now_ms)? {
                Found::Ours => {
                    if let Some(steps) = plan.steps {
                        steps.claimed(record.steps);
                    }
                    return Ok(Acquired::Held {
                        lease_until_ms: lease_until_ms.unwrap_or(claimed_until_ms),
                        took_over,
                    });
                }
                Found::Replay => {
                    return replay_record(idem, plan, record)
                        .map(|value| Acquired::Done(value, Outcome::Replayed));
                }
                Found::Claimable if number > CLAIMABLE_RETRIES => {
                    return Err(contended(plan.call.namespace, number));
                }
                Found::Claimable => {
                    took_over = lapsed && !expired;
                    // Steps that live on are resumed (a claim that starts afresh is refused by them).
                    resume = plan
                        .steps
                        .filter(|steps| steps.resumes(&record, now_ms))
                        .and(record.steps)
                        .map(Box::new);
                    continue 'claim;
                }
                Found::InProgress(retry_after) => retry_after,
            };
            let Some(deadline) = wait_until.filter(|d| *d > tokio::time::Instant::now()) else {
                return Err(in_progress(
                    idem,
                    plan.call.namespace,
                    retry_after,
                    attempt.lease,
                ));
            };
            let pause = deadline.min(tokio::time::Instant::now() + poll);
            poll = (poll * 2).min(MAX_POLL);
            // Boxed: a timer and a read are large, and a call that finds no one in flight never waits.
            match Box::pin(reread(idem, plan.call.namespace, plan.key, pause)).await? {
                Some(next) => record = next,
                // Deleted (by TTL or by hand): the key is new.
                None => continue 'claim,
            }
        }
    }
}

/// What one claim attempt found.
enum Claim {
    /// The key is ours.
    Held,
    /// Here is the record that blocked the claim.
    Blocked(Record),
    /// A claim that needs the record (one keeping claim-time writes, or a resume of steps) found none:
    /// the store's error, for when the call claims no more.
    Vanished(StoreError),
}

/// One claim attempt: a plain conditional write, or first a transaction when business writes go with
/// it (and, when that is refused for writes still in effect, a plain claim that keeps them).
#[allow(
    clippy::manual_async_fn,
    reason = "an async block: as an `async fn`, its future would hold the request twice"
)]
fn claim_once<'a>(
    idem: &'a Idempotency,
    plan: &'a Plan<'a>,
    mut request: ClaimRequest<'a>,
) -> impl Future<Output = Result<Claim, Error>> + 'a {
    async move {
        if !plan.claim_writes.is_empty() {
            match claim_with_writes(idem, plan, &request).await? {
                Some(ClaimOutcome::Claimed) => return Ok(Claim::Held),
                Some(ClaimOutcome::Existing(record)) => return Ok(Claim::Blocked(record)),
                // The writes are in effect: a plain claim keeps them, conditioned on their mark still
                // being set, so that a decision made stale by another caller (who released them
                // meanwhile) never runs the body without them.
                None => request.keep_claim_writes = true,
            }
        }
        match telemetry::observe("claim", idem.store().claim(&request)).await {
            Ok(ClaimOutcome::Claimed) => Ok(Claim::Held),
            Ok(ClaimOutcome::Existing(record)) => Ok(Claim::Blocked(record)),
            Err(e @ StoreError::Corrupt(_))
                if request.keep_claim_writes
                    || matches!(request.steps, StepsClaim::Resume { .. }) =>
            {
                Ok(Claim::Vanished(e))
            }
            Err(e) => Err(store_error(plan.call.namespace, e)),
        }
    }
}

/// [`Error::Contended`].
#[cold]
fn contended(namespace: &str, attempts: u32) -> Error {
    Error::Contended {
        namespace: namespace.to_owned(),
        attempts,
    }
}

/// Logs, at `error` level, a store that is not set up for the service ([`Error::is_setup`]): every
/// call fails the same way until an operator acts, and the caller may well turn the error into a
/// generic one. In the call's span (its namespace and key hash); the message says what to do.
#[cold]
fn setup_error(error: &Error) {
    let table = match error {
        Error::TableNotFound { table, .. } | Error::AccessDenied { table, .. } => {
            Some(table.as_str())
        }
        _ => None,
    };
    tracing::error!(
        namespace = error.namespace(),
        table,
        error = %error,
        "the idempotency store is not set up for this service; every call fails until it is"
    );
}

/// [`Error::InProgress`] for a call with `lease` that found the key held by a claim that may be taken
/// over once `retry_after` has passed (see [`Found::InProgress`]).
#[cold]
fn in_progress(
    idem: &Idempotency,
    namespace: &str,
    retry_after: Duration,
    lease: Duration,
) -> Error {
    Error::InProgress {
        namespace: namespace.to_owned(),
        retry_after,
        retry_hint: retry_hint(idem.heartbeat(), idem.retry_hint(), retry_after, lease),
    }
}

/// The [`retry_hint`](Error::InProgress) for a caller that found a claim it may take over once
/// `retry_after` has passed (counted from the caller's clock less the skew margin, as every takeover
/// decision is).
///
/// While heartbeats are on, a live holder extends its lease to `lease` from its own now every
/// [`heartbeat_interval`]: just after a heartbeat `retry_after` is `lease` (plus the margin), and it
/// falls to `lease - interval` (plus the margin) by the time the next one is due. So a `retry_after`
/// below `lease - interval` means the lease has not been extended for longer than an interval even if
/// the holder's clock runs behind this caller's by the whole margin: the claim is *stalled* (its
/// worker died, hangs, or cannot reach the store), and the hint is the time until it can be taken
/// over — whole seconds, rounded up past the instant the lease counts as lapsed, never zero. A live
/// holder (and any holder while heartbeats are off, when a lease never moves and its result may come
/// at any moment) gets `hint`, at most `retry_after`.
///
/// Judged with this caller's `lease`: a holder that claimed with a longer one looks live, one with a
/// shorter one looks stalled sooner (its hint is still what is left of its lease).
pub(crate) fn retry_hint(
    heartbeat: bool,
    hint: Duration,
    retry_after: Duration,
    lease: Duration,
) -> Duration {
    let stalled = heartbeat && retry_after < lease.saturating_sub(heartbeat_interval(lease));
    if stalled {
        // Lapsed once the judged clock is strictly past the lease's end: one millisecond after
        // `retry_after`.
        Duration::from_secs(millis(retry_after).saturating_add(1).div_ceil(1000).max(1))
    } else {
        retry_after.min(hint)
    }
}

/// How often a running body's heartbeat extends its lease: every third of the lease (at least every
/// millisecond).
pub(crate) fn heartbeat_interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// Sleeps until `pause`, then reads the key's record again, for a call waiting on an in-flight one.
async fn reread(
    idem: &Idempotency,
    namespace: &str,
    key: &str,
    pause: tokio::time::Instant,
) -> Result<Option<Record>, Error> {
    tokio::time::sleep_until(pause).await;
    telemetry::observe("get", idem.store().get(key))
        .await
        .map_err(|e| store_error(namespace, e))
}

/// The local cache's answer, if it has one for the key.
fn cached<T: DeserializeOwned>(idem: &Idempotency, plan: &Plan<'_>) -> Result<Option<T>, Error> {
    let namespace = plan.call.namespace;
    let Some(hit) = idem
        .cache()
        .and_then(|c| c.get(plan.key, idem.clock().now_ms()))
    else {
        return Ok(None);
    };
    same_payload(namespace, hit.fingerprint.as_deref(), plan.fingerprint)?;
    tracing::debug!(namespace, "replaying cached response");
    replay(namespace, &hit.response).map(Some)
}

/// Keeps a stored response in the local cache (when the handle has one) until `replay_until_s`.
fn remember(
    idem: &Idempotency,
    key: &str,
    response: Vec<u8>,
    fingerprint: Option<&str>,
    replay_until_s: u64,
) {
    if let Some(cache) = idem.cache() {
        cache.insert(
            key,
            Cached {
                response: response.into(),
                fingerprint: fingerprint.map(Into::into),
                replay_until_s,
            },
        );
    }
}

/// The stored response of a COMPLETED record, which the local cache then keeps too.
fn replay_record<T: DeserializeOwned>(
    idem: &Idempotency,
    plan: &Plan<'_>,
    record: Record,
) -> Result<T, Error> {
    tracing::debug!(namespace = plan.call.namespace, "replaying stored response");
    let response = record.response.unwrap_or_default();
    let value = replay(plan.call.namespace, &response)?;
    remember(
        idem,
        plan.key,
        response,
        record.fingerprint.as_deref(),
        record.replay_until_s.unwrap_or(record.expires_at_s),
    );
    Ok(value)
}

/// Runs `body` at most once per key while its record lives, and says how the call ended. The caller
/// runs it inside the call's span ([`telemetry::call_span`]) and closes that with the [`Outcome`]
/// ([`telemetry::finish`]).
///
/// It owns what the call needs (`parts`) and is built before anything awaits it, so that a caller's
/// future holds it in place, with the body's future once, and no call allocates a box for it (see
/// `future_size`).
#[allow(
    clippy::manual_async_fn,
    reason = "an async block: as an `async fn`, its future would hold the body's twice (see `future_size`)"
)]
pub(crate) fn run<I, T, E, F, D, R>(
    parts: Parts<'_, I>,
    describe: D,
    body: F,
    runner: R,
) -> impl Future<Output = (Result<T, E>, Outcome)>
where
    I: std::borrow::Borrow<Idempotency>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
    D: FnOnce(&E) -> String,
    R: Runner<T, E, F, D>,
{
    async move {
        let idem: &Idempotency = parts.idem.borrow();
        // Borrowed where the block keeps them, not moved out: a moved field would be held twice.
        let plan = &Plan {
            call: &parts.call,
            key: &parts.key,
            fingerprint: parts.fingerprint.as_deref(),
            staging: parts.staging,
            claim_writes: &parts.claim_writes,
            compensation: &parts.compensation,
            steps: parts.steps.as_ref(),
        };
        let call = plan.call;
        let ttl = call.ttl.unwrap_or_else(|| idem.default_ttl());
        let lease = call.lease.unwrap_or_else(|| idem.default_lease());
        // Written into a buffer in the call's own future: a token lives exactly as long as its call.
        let mut token_buffer = uuid::Uuid::encode_buffer();
        let token: &str = uuid::Uuid::new_v4()
            .hyphenated()
            .encode_lower(&mut token_buffer);
        let attempt = Attempt {
            idem,
            plan,
            token,
            lease,
            ttl,
            stage: Where::new(Stage::Claiming),
        };
        // Dropped with this future: what a drop must do depends on `attempt.stage`.
        let acquired = acquire(&attempt).await;
        attempt.stage.set(Stage::Done);
        let (lease_until_ms, took_over) = match acquired {
            Ok(Acquired::Done(value, outcome)) => {
                crate::execution::record(crate::Execution::Replayed);
                return (Ok(value), outcome);
            }
            Ok(Acquired::Held {
                lease_until_ms,
                took_over,
            }) => {
                if let Some(steps) = plan.steps {
                    steps.begin(idem, plan.key, token, plan.fingerprint, lease, plan.staging);
                }
                (lease_until_ms, took_over)
            }
            Err(e) => {
                if e.is_setup() {
                    setup_error(&e);
                }
                let outcome = Outcome::of(&e);
                return (Err(e.into()), outcome);
            }
        };
        tracing::debug!(namespace = call.namespace, "claimed; running the body");
        attempt.stage.set(Stage::Running);
        let claim = Held {
            idem,
            plan,
            token,
            ttl,
        };
        let finished = if R::DETACHED {
            let work = Work {
                body,
                describe,
                lease,
                lease_until_ms,
                took_over,
            };
            let task = runner.spawn(&claim, work);
            // From here on the body's end does not depend on the caller.
            attempt.stage.set(Stage::Done);
            // Boxed: every call's future would carry the wait for the task otherwise.
            Box::pin(joined(call.namespace, task)).await
        } else {
            // The heartbeat keeps the claim ours while the body runs and while its result is being
            // stored. Boxed: a replay (the common duplicate) never gets here, so its future need not
            // carry the body, the completion and the timer.
            let work = finish(claim, body, describe, lease, lease_until_ms, took_over);
            let lifetime = writes_lifetime(idem, plan, ttl);
            Box::pin(with_heartbeat(idem, plan.key, token, lease, lifetime, work)).await
        };
        attempt.stage.set(Stage::Done);
        let outcome = match finished {
            Ok(outcome) => outcome,
            // The record is FAILED (`panicked: ..`); the panic goes on to the caller as it was.
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // Recorded once the body and its bookkeeping are done, so that an idempotent call nested in the body
        // (which records first) does not mask the outer one.
        crate::execution::record(crate::Execution::Executed);
        outcome
    }
}

/// A panic's payload, as `catch_unwind` gives it and `resume_unwind` takes it back.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

/// How a body that holds its claim ended: its result and the call's outcome, or its panic (the record is
/// FAILED by then; COMPLETED when the body returned `Ok` and its value's `Serialize` panicked).
pub(crate) type Finished<T, E> = Result<(Result<T, E>, Outcome), Panic>;

/// The body of a call that holds its claim, with what storing its outcome needs.
pub(crate) struct Work<F, D> {
    body: F,
    describe: D,
    lease: Duration,
    /// The claim's lease end (epoch milliseconds), and whether it took over a lapsed claim.
    lease_until_ms: u64,
    took_over: bool,
}

/// Where a call that holds its claim runs its body and the writes that store its outcome, with the
/// heartbeat beside them: in the caller's future ([`Inline`]) or on a task of its own ([`Detach`]).
/// Chosen at compile time (`DETACHED`), so that the inline path is the code it always was.
pub(crate) trait Runner<T, E, F, D> {
    /// Whether the body runs on a task of its own ([`spawn`](Self::spawn)) rather than in place.
    const DETACHED: bool;

    /// Starts `work` for `claim` on a task of its own; only called when `DETACHED`.
    fn spawn(self, claim: &Held<'_>, work: Work<F, D>) -> tokio::task::JoinHandle<Finished<T, E>>;

    /// The body of a call with no record (the kill switch is on, or a missing key under
    /// [`MissingKey::Skip`]): in place, or on a task of its own (tracked by `tasks` when the handle is
    /// known), so that a detached call keeps its promise that a caller who gives up stops the waiting,
    /// not the work. Lazy: nothing starts before the returned future is first polled.
    type Alone: Future<Output = Result<T, E>>;

    /// See [`Alone`](Self::Alone).
    fn alone(
        self,
        namespace: &'static str,
        tasks: Option<&tokio_util::task::TaskTracker>,
        body: F,
    ) -> Self::Alone;
}

/// Runs the body in the caller's future: dropping the future stops the body where it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inline;

impl<T, E, F, D> Runner<T, E, F, D> for Inline
where
    F: Future<Output = Result<T, E>>,
{
    const DETACHED: bool = false;

    fn spawn(self, _: &Held<'_>, _: Work<F, D>) -> tokio::task::JoinHandle<Finished<T, E>> {
        unreachable!("an inline call runs its body in place")
    }

    type Alone = F;

    fn alone(self, _: &'static str, _: Option<&tokio_util::task::TaskTracker>, body: F) -> F {
        body
    }
}

/// Runs the body, and the storing of its outcome, on a Tokio task of its own (tracked by the handle, for
/// [`Idempotency::drain`]): the caller's future only waits for it, so a caller that is dropped (a
/// client hung up, a `timeout`) leaves the body running to its end and its result stored.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Detach;

impl<T, E, F, D> Runner<T, E, F, D> for Detach
where
    T: Serialize + Send + 'static,
    E: From<Error> + Send + 'static,
    F: Future<Output = Result<T, E>> + Send + 'static,
    D: FnOnce(&E) -> String + Send + 'static,
{
    const DETACHED: bool = true;

    fn spawn(self, claim: &Held<'_>, work: Work<F, D>) -> tokio::task::JoinHandle<Finished<T, E>> {
        use tracing::Instrument as _;
        let owned = OwnedClaim::of(claim);
        let task = async move {
            let plan = owned.plan();
            let claim = Held {
                idem: &owned.idem,
                plan: &plan,
                token: &owned.token,
                ttl: owned.ttl,
            };
            let lease = work.lease;
            let finished = finish(
                claim,
                work.body,
                work.describe,
                lease,
                work.lease_until_ms,
                work.took_over,
            );
            with_heartbeat(
                &owned.idem,
                &owned.key,
                &owned.token,
                lease,
                writes_lifetime(&owned.idem, &plan, owned.ttl),
                finished,
            )
            .await
        };
        // Panics outside a Tokio runtime, as `tokio::spawn` does (documented on `detach`).
        claim
            .idem
            .tasks()
            .spawn(task.instrument(tracing::Span::current()))
    }

    type Alone = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

    fn alone(
        self,
        namespace: &'static str,
        tasks: Option<&tokio_util::task::TaskTracker>,
        body: F,
    ) -> Self::Alone {
        use tracing::Instrument as _;
        let tasks = tasks.cloned();
        Box::pin(async move {
            let body = body.instrument(tracing::Span::current());
            let task = match tasks {
                Some(tasks) => tasks.spawn(body),
                None => tokio::spawn(body),
            };
            match task.await {
                Ok(result) => result,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Err(Error::ResultNotStored {
                    namespace: namespace.to_owned(),
                    source: "the runtime shut down before the detached body finished".into(),
                }
                .into()),
            }
        })
    }
}

/// The end of a detached body's task, for its caller.
async fn joined<T, E: From<Error>>(
    namespace: &'static str,
    task: tokio::task::JoinHandle<Finished<T, E>>,
) -> Finished<T, E> {
    match task.await {
        Ok(finished) => finished,
        Err(e) if e.is_panic() => Err(e.into_panic()),
        // The runtime shut down under the task: like a crash, the claim lapses with its lease.
        Err(_) => {
            let error = Error::ResultNotStored {
                namespace: namespace.to_owned(),
                source: "the runtime shut down before the detached body finished".into(),
            };
            let outcome = Outcome::of(&error);
            Ok((Err(error.into()), outcome))
        }
    }
}

/// What a detached body's task owns of its call (a [`Held`] borrows it).
struct OwnedClaim {
    idem: Idempotency,
    call: Call,
    key: String,
    fingerprint: Option<String>,
    staging: Option<Staged>,
    claim_writes: Writes,
    compensation: Writes,
    steps: Option<Steps>,
    token: String,
    ttl: Duration,
}

impl OwnedClaim {
    fn of(claim: &Held<'_>) -> Self {
        let plan = claim.plan;
        Self {
            idem: claim.idem.clone(),
            call: *plan.call,
            key: plan.key.to_owned(),
            fingerprint: plan.fingerprint.map(ToOwned::to_owned),
            staging: plan.staging.cloned(),
            claim_writes: plan.claim_writes.clone(),
            compensation: plan.compensation.clone(),
            steps: plan.steps.cloned(),
            token: claim.token.to_owned(),
            ttl: claim.ttl,
        }
    }

    fn plan(&self) -> Plan<'_> {
        Plan {
            call: &self.call,
            key: &self.key,
            fingerprint: self.fingerprint.as_deref(),
            staging: self.staging.as_ref(),
            claim_writes: &self.claim_writes,
            compensation: &self.compensation,
            steps: self.steps.as_ref(),
        }
    }
}

pin_project_lite::pin_project! {
    /// `future`, with a panic in its `poll` caught and returned (the future is not polled again).
    struct CatchUnwind<F> {
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Panic>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let future = self.project().future;
        // Unwind safety: after a panic the body's future is never polled again, only dropped; what
        // the call does next (record FAILED, resume the panic) touches none of its state.
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// The text stored for a body that panicked: `panicked: <message>` (a payload that is not a string, as
/// `std::panic::panic_any` may give, has no message).
pub(crate) fn panicked(panic: &(dyn Any + Send)) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    format!("panicked: {message}")
}

/// What a call that holds its claim runs: the body, then its outcome stored (completed, or failed). `run`
/// boxes it, with the heartbeat beside it; `lease_until_ms` and `took_over` are the claim's.
#[allow(
    clippy::manual_async_fn,
    reason = "an async block: as an `async fn`, its future holds the body's twice and is 72 bytes larger (see `future_size`)"
)]
fn finish<T, E, F>(
    claim: Held<'_>,
    body: F,
    describe: impl FnOnce(&E) -> String,
    lease: Duration,
    lease_until_ms: u64,
    took_over: bool,
) -> impl Future<Output = Finished<T, E>>
where
    T: Serialize,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    async move {
        let idem = claim.idem;
        let outcome = CatchUnwind { future: body }.await;
        // Retries of the writes that store the outcome: for as long as the lease allows (heartbeats
        // extend it, so a whole lease from now; without them, what is left of it).
        let window = if idem.heartbeat() {
            lease
        } else {
            Duration::from_millis(lease_until_ms.saturating_sub(idem.clock().now_ms()))
        };
        let mut persist = Persist::new(window);
        Ok(match outcome {
            // Each boxed on its own, so that no box of a call is above the allocator's small sizes
            // (see `future_size`).
            Ok(Ok(value)) => {
                let mut thrown = None;
                let completed = Box::pin(claim.complete(value, &mut persist, &mut thrown)).await;
                // The value's `Serialize` panicked: the success is stored as final all the same
                // (duplicates get `ResponseNotSerialized`), and the panic goes on to the caller.
                if let Some(panic) = thrown {
                    return Err(panic);
                }
                match completed {
                    Ok(value) if took_over => (Ok(value), Outcome::TakenOver),
                    Ok(value) => (Ok(value), Outcome::Executed),
                    Err(e) => {
                        let outcome = Outcome::of(&e);
                        (Err(e.into()), outcome)
                    }
                }
            }
            Ok(Err(err)) => {
                // A panic in the error's text (its `Display`) is a failure like a panicking body's:
                // recorded as one, then the panic goes on. Unwind safety: `describe` only reads `err`.
                match std::panic::catch_unwind(AssertUnwindSafe(|| describe(&err))) {
                    Ok(text) => {
                        Box::pin(claim.fail(&text, &mut persist)).await;
                        (Err(err), Outcome::Failed)
                    }
                    Err(panic) => {
                        Box::pin(claim.fail(&panicked(&*panic), &mut persist)).await;
                        return Err(panic);
                    }
                }
            }
            // A panic is a failure: recorded as one, so that the key is free at once.
            Err(panic) => {
                tracing::warn!(
                    namespace = claim.namespace(),
                    "the body panicked; recording the failure"
                );
                Box::pin(claim.fail(&panicked(&*panic), &mut persist)).await;
                return Err(panic);
            }
        })
    }
}

/// Decodes a stored response.
fn replay<T: DeserializeOwned>(namespace: &str, response: &[u8]) -> Result<T, Error> {
    codec::decode(response).map_err(|e| undecodable(namespace, e))
}

/// The error of a stored response that does not decode.
#[cold]
fn undecodable(namespace: &str, e: codec::DecodeError) -> Error {
    let namespace = namespace.to_owned();
    match e {
        codec::DecodeError::Json(source) => Error::Deserialize { namespace, source },
        codec::DecodeError::Compression(e) => Error::CorruptRecord {
            namespace,
            detail: format!("the stored response does not decompress: {e}"),
        },
        codec::DecodeError::NotSerialized(detail) => {
            Error::ResponseNotSerialized { namespace, detail }
        }
    }
}

/// Retries of a write that must land once the body has run (its result is in memory and the claim is
/// still ours): jittered exponential backoff until a deadline. On top of the SDK's own retries, which
/// give up after a few attempts.
struct Persist {
    deadline: tokio::time::Instant,
    delay: Duration,
}

/// First pause between two attempts of a write that must land, doubling up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

impl Persist {
    fn new(window: Duration) -> Self {
        Self {
            deadline: tokio::time::Instant::now() + window.min(crate::config::MAX_DURATION),
            delay: FIRST_RETRY_DELAY,
        }
    }

    /// Waits before the next attempt; `false` when the window is spent.
    async fn again(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now >= self.deadline {
            return false;
        }
        // "Equal jitter": half the delay, plus a random part of the other half, so that callers that
        // collided do not collide again.
        let half = self.delay / 2;
        let random = u64::try_from(uuid::Uuid::new_v4().as_u128() % u128::from(millis(half) + 1))
            .unwrap_or(0);
        let pause = (half + Duration::from_millis(random)).min(self.deadline - now);
        // Boxed: only a retry waits, and every completion's future would carry the timer otherwise.
        Box::pin(tokio::time::sleep(pause)).await;
        self.delay = (self.delay * 2).min(MAX_RETRY_DELAY);
        true
    }
}

/// One attempt at a fenced transition, as the store reported it.
enum Written {
    Applied,
    Rejected(Option<Record>),
    Canceled(Vec<CancellationReason>),
}

/// What ended a run of attempts at a transition.
enum Stored {
    Applied,
    Rejected(Option<Record>),
    /// A business condition (or another reason that does not pass) canceled the transaction.
    Canceled(Vec<CancellationReason>),
    /// The transaction was refused as a whole, before any condition.
    Refused(crate::BoxError),
    /// The store has no transactions, and there were writes to commit with the transition.
    Unsupported(Error),
    /// Transient faults outlasted the window; the last one.
    GaveUp(Error),
    /// A fault that does not pass with a retry.
    Failed(Error),
}

/// A claim we hold: the body has run, and its outcome must be stored.
pub(crate) struct Held<'a> {
    idem: &'a Idempotency,
    plan: &'a Plan<'a>,
    token: &'a str,
    ttl: Duration,
}

impl Held<'_> {
    fn namespace(&self) -> &'static str {
        self.plan.call.namespace
    }

    /// Sends `transition` (with `writes`, in one transaction, when there are any) until it lands, is
    /// rejected or canceled for good, or transient faults outlast `persist`. Every attempt is the same
    /// request, so a store that recognises repeated requests (DynamoDB's `ClientRequestToken`) applies
    /// it once.
    async fn store(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
        persist: &mut Persist,
    ) -> Stored {
        let namespace = self.namespace();
        loop {
            let last = match self.write_once(transition, writes).await {
                Ok(Written::Applied) => return Stored::Applied,
                Ok(Written::Rejected(record)) => return Stored::Rejected(record),
                Ok(Written::Canceled(reasons))
                    if crate::error::transient_cancellation(&reasons) =>
                {
                    Error::TransactionCanceled {
                        namespace: namespace.to_owned(),
                        reasons,
                    }
                }
                Ok(Written::Canceled(reasons)) => return Stored::Canceled(reasons),
                Err(StoreError::Invalid(source)) if !writes.is_empty() => {
                    return Stored::Refused(source);
                }
                Err(e @ StoreError::Unsupported { .. }) if !writes.is_empty() => {
                    return Stored::Unsupported(store_error(namespace, e));
                }
                Err(
                    e @ (StoreError::Throttled(_)
                    | StoreError::Unavailable(_)
                    | StoreError::RegionUnavailable { .. }),
                ) => store_error(namespace, e),
                Err(e) => return Stored::Failed(store_error(namespace, e)),
            };
            tracing::debug!(namespace, error = %last, "transient fault while storing the outcome; retrying");
            if !persist.again().await {
                return Stored::GaveUp(last);
            }
        }
    }

    async fn write_once(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<Written, StoreError> {
        if !writes.is_empty() {
            let request = self.idem.store().transact_transition(transition, writes);
            return Ok(
                match telemetry::observe(transition.change.op(true), request).await? {
                    TransactOutcome::Committed => Written::Applied,
                    TransactOutcome::Rejected(record) => Written::Rejected(record),
                    TransactOutcome::Canceled(reasons) => Written::Canceled(reasons),
                },
            );
        }
        let request = self.idem.store().transition(transition);
        Ok(
            match telemetry::observe(transition.change.op(false), request).await? {
                WriteOutcome::Applied => Written::Applied,
                WriteOutcome::Rejected(record) => Written::Rejected(record),
            },
        )
    }

    /// Stores `value` as the response: PENDING → COMPLETED (with the staged writes, in one
    /// transaction), retried while the lease allows.
    ///
    /// A panic in the value's `Serialize` impl is caught: the body has run, so the record is COMPLETED
    /// with `panicked: <message>` in place of the value (duplicates get `ResponseNotSerialized`), and
    /// the panic is left in `thrown` for the caller to resume.
    async fn complete<T: Serialize>(
        &self,
        value: T,
        persist: &mut Persist,
        thrown: &mut Option<Panic>,
    ) -> Result<T, Error> {
        let Plan {
            call,
            key,
            fingerprint,
            staging,
            ..
        } = *self.plan;
        let namespace = call.namespace;
        // A value that does not serialize is still a success, and final: the record is COMPLETED with
        // the reason instead of the value, duplicates get `ResponseNotSerialized`, and the body never
        // runs again. Only this caller hears the serialization error.
        // Unwind safety: after a panic only the value's reference was touched, and the value is
        // handed back (or dropped) untouched by this call.
        let encoded = std::panic::catch_unwind(AssertUnwindSafe(|| self.encode(&value)));
        let (bytes, fits, unserializable) = match encoded {
            Ok(Ok((bytes, fits))) => (bytes, fits, None),
            Ok(Err(source)) => (
                codec::not_serialized(&source.to_string()),
                true,
                Some(source),
            ),
            Err(panic) => {
                let detail = panicked(&*panic);
                *thrown = Some(panic);
                (codec::not_serialized(&detail), true, None)
            }
        };
        let response = fits.then_some(&bytes[..]);
        let now_ms = self.idem.clock().now_ms();
        // Taken before the write, so the cached window never outlasts the stored one.
        let replay_until_s = expiry_s(now_ms, self.ttl);
        let retain = self.idem.retain();
        // Built once: every retry sends the same request.
        let transition = Transition {
            key,
            token: self.token,
            change: Change::Complete {
                response,
                expires_at_s: expiry_s(now_ms, self.ttl.saturating_add(retain.unwrap_or_default())),
                replay_until_s: retain.map(|_| replay_until_s),
            },
        };
        let writes = staging.map(Staged::take).unwrap_or_default();
        if !writes.is_empty()
            && let Err(detail) = writes.check_limits(key, response.map_or(0, <[u8]>::len))
        {
            self.fail_boxed(&detail, persist).await;
            return Err(Error::TooManyWrites {
                namespace: namespace.to_owned(),
                detail,
            });
        }
        match self.store(&transition, &writes, persist).await {
            Stored::Applied => {}
            Stored::Rejected(record) => self.settle(record.as_ref())?,
            Stored::Canceled(reasons) => {
                let error = Error::TransactionCanceled {
                    namespace: namespace.to_owned(),
                    reasons,
                };
                self.fail_boxed(&format!("transaction canceled: {error}"), persist)
                    .await;
                return Err(error);
            }
            Stored::Refused(source) => {
                let error = Error::WriteRejected {
                    namespace: namespace.to_owned(),
                    source,
                };
                self.fail_boxed(&error.to_string(), persist).await;
                return Err(error);
            }
            Stored::GaveUp(last) => {
                tracing::warn!(namespace, error = %last, "could not store the result while the lease allowed; the key is claimable after its lease");
                return Err(Error::ResultNotStored {
                    namespace: namespace.to_owned(),
                    source: Box::new(last),
                });
            }
            // Without its writes the result must not be stored: the failure is recorded instead (with no
            // writes), so that the key is free at once rather than blocked until the lease runs out.
            Stored::Unsupported(error) => {
                self.fail_boxed(&error.to_string(), persist).await;
                return Err(error);
            }
            Stored::Failed(error) => {
                // As at claim time: an operator must act (credentials that expired during the body).
                if error.is_setup() {
                    setup_error(&error);
                }
                return Err(error);
            }
        }
        if let Some(source) = unserializable {
            return Err(unserializable_response(namespace, source));
        }
        if fits {
            remember(self.idem, key, bytes, fingerprint, replay_until_s);
        }
        Ok(value)
    }

    /// [`Held::fail`] on a completion's error paths, boxed: awaited in place, its future would be part of
    /// every completion's, which the response already makes large (see `future_size`).
    async fn fail_boxed(&self, error: &str, persist: &mut Persist) {
        Box::pin(self.fail(error, persist)).await;
    }

    /// The response as stored (JSON, compressed when large), and whether it fits in the record; an
    /// error for a value that does not serialize, or whose JSON would not decode back into it (a
    /// non-finite float).
    fn encode<T: Serialize>(&self, value: &T) -> Result<(Vec<u8>, bool), serde_json::Error> {
        let json = codec::to_json(value)?;
        if let Some(e) = codec::non_finite(value, &json) {
            return Err(e);
        }
        let bytes = codec::pack(json);
        let budget = self
            .idem
            .store()
            .response_budget(self.plan.key, self.plan.fingerprint);
        let fits = bytes.len() <= budget;
        if !fits {
            tracing::warn!(
                namespace = self.namespace(),
                bytes = bytes.len(),
                "response too large to store even compressed; duplicates will get ResponseTooLarge"
            );
        }
        Ok((bytes, fits))
    }

    /// Whether a completion that was rejected had landed after all: our own earlier attempt, whose
    /// response was lost.
    fn settle(&self, record: Option<&Record>) -> Result<(), Error> {
        if landed(record, self.token, Status::Completed) {
            return Ok(());
        }
        tracing::warn!(
            namespace = self.namespace(),
            "claim lost before completion; result not stored"
        );
        Err(Error::LeaseLost {
            namespace: self.namespace().to_owned(),
        })
    }

    /// Moves our claim to FAILED (with the compensating writes, which release the claim-time writes),
    /// retried while the lease allows. The caller gets the body's own error whatever happens here; a
    /// FAILED write that never lands only means the key stays PENDING until its lease runs out.
    async fn fail(&self, error: &str, persist: &mut Persist) {
        let namespace = self.namespace();
        let error = truncate(error, MAX_ERROR_BYTES);
        let now_ms = self.idem.clock().now_ms();
        let compensate = !self.plan.claim_writes.is_empty() && !self.plan.compensation.is_empty();
        let mut writes = if compensate {
            self.plan.compensation.clone()
        } else {
            Writes::new()
        };
        loop {
            // A failure that leaves claim-time writes in effect keeps the record (and with it the mark)
            // for the operation's ttl and retain, not the short `failed_ttl`: once it expired, a retry
            // would be a new operation and apply the writes again.
            // Likewise the steps of a body that resumes after a failure: once the record expired, a
            // retry would run them all again.
            let keeps_writes = failure_keeps_record(
                !self.plan.claim_writes.is_empty() && writes.is_empty(),
                self.plan.steps,
            );
            let lifetime = failed_lifetime(
                self.idem.failed_ttl(),
                keeps_writes.then(|| writes_lifetime(self.idem, self.plan, self.ttl)),
            );
            let transition = Transition {
                key: self.plan.key,
                token: self.token,
                change: Change::Fail {
                    error: &error,
                    expires_at_s: expiry_s(now_ms, lifetime),
                    release_claim_writes: !writes.is_empty(),
                },
            };
            let problem = match self.store(&transition, &writes, persist).await {
                Stored::Applied => return,
                // Our own earlier attempt landed; its response was lost.
                Stored::Rejected(record) if landed(record.as_ref(), self.token, Status::Failed) => {
                    return;
                }
                // Still ours, but the claim-time writes are not in effect (the compensation is
                // conditioned on them): there is nothing to undo, and undoing it would undo another
                // caller's writes. Record the failure without the compensation.
                Stored::Rejected(Some(record))
                    if !writes.is_empty()
                        && record.status == Status::Pending
                        && record.token == self.token =>
                {
                    tracing::warn!(
                        namespace,
                        "claim-time writes not in effect; failure recorded without compensation"
                    );
                    writes = Writes::new();
                    continue;
                }
                Stored::Rejected(_) => {
                    tracing::warn!(namespace, "claim lost before the failure was recorded");
                    return;
                }
                Stored::Canceled(reasons) => Error::TransactionCanceled {
                    namespace: namespace.to_owned(),
                    reasons,
                },
                Stored::Refused(source) => Error::WriteRejected {
                    namespace: namespace.to_owned(),
                    source,
                },
                Stored::Unsupported(e) => e,
                Stored::GaveUp(e) | Stored::Failed(e) => {
                    tracing::warn!(namespace, error = %e, "could not record the failure; the key is claimable after its lease");
                    return;
                }
            };
            // The compensating writes cannot commit: record the failure without them, so the key is
            // free at once and its claim-time writes stay in effect (a retry does not apply them again).
            tracing::warn!(namespace, error = %problem, "compensating writes refused; the claim-time writes stay in effect");
            writes = Writes::new();
        }
    }
}

/// Stores an operation's finished steps (`steps`, encoded) in its record, fenced by the call's claim
/// (`token`): retried through transient faults while a lease allows (heartbeats extend it meanwhile).
/// A rejection means the claim is no longer ours: [`Error::LeaseLost`], and the body stops at its step.
pub(crate) async fn save_steps(
    idem: &Idempotency,
    namespace: &'static str,
    key: &str,
    token: &str,
    steps: &[u8],
    lease: Duration,
) -> Result<(), Error> {
    let transition = Transition {
        key,
        token,
        change: Change::SaveSteps { steps },
    };
    let mut persist = Persist::new(lease);
    loop {
        // The same request every time: a retry after a lost response writes the same steps again,
        // which the fence still allows.
        let last = match telemetry::observe("step", idem.store().transition(&transition)).await {
            Ok(WriteOutcome::Applied) => return Ok(()),
            Ok(WriteOutcome::Rejected(_)) => {
                tracing::warn!(
                    namespace,
                    "claim lost while the body ran; the step's value was not stored and the body stops"
                );
                return Err(Error::LeaseLost {
                    namespace: namespace.to_owned(),
                });
            }
            Err(
                e @ (StoreError::Throttled(_)
                | StoreError::Unavailable(_)
                | StoreError::RegionUnavailable { .. }),
            ) => store_error(namespace, e),
            Err(e) => return Err(store_error(namespace, e)),
        };
        tracing::debug!(namespace, error = %last, "transient fault while storing a step; retrying");
        if !persist.again().await {
            return Err(Error::ResultNotStored {
                namespace: namespace.to_owned(),
                source: Box::new(last),
            });
        }
    }
}

/// `text`, cut on a character boundary to at most `max` bytes, saying how long it was.
fn truncate(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let suffix = format!("… ({} bytes in all)", text.len());
    let cut = text.floor_char_boundary(max.saturating_sub(suffix.len()));
    format!("{}{suffix}", &text[..cut]).into()
}

/// Runs `work` (the body, then the writes that store its outcome) while extending the lease every third
/// of it, so a live worker is never taken over (when the handle has heartbeats on).
fn with_heartbeat<'a, F: Future>(
    idem: &'a Idempotency,
    key: &'a str,
    token: &'a str,
    lease: Duration,
    ttl: Duration,
    work: F,
) -> WithHeartbeat<'a, F> {
    WithHeartbeat {
        work,
        beat: None,
        heartbeat: Heartbeat {
            idem,
            key,
            token,
            lease,
            ttl,
        },
    }
}

pin_project_lite::pin_project! {
    /// `work`, with the lease heartbeat beside it while it is pending ([`with_heartbeat`]). A future of its
    /// own rather than an `async fn` around `select!`, which would hold `work` twice (the argument, and
    /// the pinned local it is moved into) in the box every call that runs its body takes (see
    /// `future_size`). The heartbeat is boxed when first needed, that is when `work` did not finish at its
    /// first poll, so that its timer and request are not part of that box either.
    struct WithHeartbeat<'a, F> {
        #[pin]
        work: F,
        beat: Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
        heartbeat: Heartbeat<'a>,
    }
}

/// What the heartbeat needs: the claim on `key` held by `token`, whose lease it extends.
#[derive(Clone, Copy)]
struct Heartbeat<'a> {
    idem: &'a Idempotency,
    key: &'a str,
    token: &'a str,
    lease: Duration,
    ttl: Duration,
}

impl<F: Future> Future for WithHeartbeat<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let this = self.project();
        // The work first: once it is done, the heartbeat stops (it is dropped with this future).
        if let std::task::Poll::Ready(out) = this.work.poll(cx) {
            return std::task::Poll::Ready(out);
        }
        let heartbeat = *this.heartbeat;
        if !heartbeat.idem.heartbeat() {
            return std::task::Poll::Pending;
        }
        let beat = this
            .beat
            .get_or_insert_with(|| Box::pin(heartbeats(heartbeat)));
        // The heartbeat never finishes; polled here to arm its timer and send its requests.
        let _ = beat.as_mut().poll(cx);
        std::task::Poll::Pending
    }
}

/// Extends the lease every third of it, until the claim is found lost or completed; never returns.
async fn heartbeats(heartbeat: Heartbeat<'_>) {
    let every = heartbeat_interval(heartbeat.lease);
    loop {
        tokio::time::sleep(every).await;
        let now_ms = heartbeat.idem.clock().now_ms();
        let transition = Transition {
            key: heartbeat.key,
            token: heartbeat.token,
            change: Change::ExtendLease {
                lease_until_ms: now_ms.saturating_add(millis(heartbeat.lease)),
                expires_at_s: expiry_s(now_ms, heartbeat.lease.saturating_add(heartbeat.ttl)),
            },
        };
        match telemetry::observe("heartbeat", heartbeat.idem.store().transition(&transition)).await
        {
            Ok(WriteOutcome::Applied) => {}
            Ok(WriteOutcome::Rejected(_)) => {
                // Lost, or already completed: the completion reports which. Stop beating.
                std::future::pending::<()>().await;
            }
            Err(e) => tracing::warn!(error = %e, "lease heartbeat failed; will retry"),
        }
    }
}

#[cfg(test)]
mod future_size {
    use super::*;

    /// A response of the bench's receipt's size.
    type Receipt = (String, u64, String, String);

    /// The parts of a call for `run`, with no writes.
    fn parts(idem: &Idempotency) -> Parts<'static, &Idempotency> {
        Parts {
            idem,
            call: Call::new("bench::charge"),
            key: "k".to_owned(),
            fingerprint: None,
            staging: None,
            claim_writes: Writes::new(),
            compensation: Writes::new(),
            steps: None,
        }
    }

    /// A call's state machine is held in place by every caller's future (not boxed: a box per call
    /// costs a duplicate about 1% of its CPU on the null DynamoDB), so it stays small: the parts only
    /// a call that runs its body needs (the body's completion, the heartbeat) and only a waiting call
    /// needs (the timer, the re-read) are boxed on their own paths, and a replay never allocates them.
    #[test]
    fn a_calls_state_machine_stays_under_a_kilobyte() {
        let idem =
            crate::Idempotency::builder_arc(std::sync::Arc::new(crate::MemoryStore::new())).build();
        // A body holding a request of about the bench's size.
        let request = [7_u8; 96];
        let body = async move { Ok::<u32, Error>(u32::from(request[0])) };
        let instrumented = tracing::Instrument::instrument(
            run(parts(&idem), |e: &Error| e.to_string(), body, Inline),
            tracing::Span::none(),
        );
        let size = std::mem::size_of_val(&instrumented);
        assert!(
            size <= 1024,
            "the state machine is {size} bytes: box the new part on its own path"
        );
        // The body is in it once: a body 512 bytes larger makes it 512 bytes larger, not 1,024 (an
        // `async fn` keeps its arguments beside the locals they are moved into).
        let large = [7_u8; 96 + 512];
        let larger = std::mem::size_of_val(&run(
            parts(&idem),
            |e: &Error| e.to_string(),
            async move { Ok::<u32, Error>(u32::from(large[0])) },
            Inline,
        ));
        let small = std::mem::size_of_val(&run(
            parts(&idem),
            |e: &Error| e.to_string(),
            async move { Ok::<u32, Error>(u32::from(request[0])) },
            Inline,
        ));
        assert!(
            larger - small <= 512 + 16,
            "a body 512 bytes larger made the state machine {} bytes larger",
            larger - small
        );
        let call = Call::new("bench::charge");
        let none = Writes::new();
        let plan = Plan {
            call: &call,
            key: "k",
            fingerprint: None,
            staging: None,
            claim_writes: &none,
            compensation: &none,
            steps: None,
        };
        let held = Held {
            idem: &idem,
            plan: &plan,
            token: "t",
            ttl: Duration::ZERO,
        };
        // A value of the bench's receipt's size (three strings and a number): the completion holds it.
        let receipt = || (String::new(), 0, String::new(), String::new());
        let mut persist = Persist::new(Duration::ZERO);
        let mut thrown = None;
        let complete = std::mem::size_of_val(&held.complete(receipt(), &mut persist, &mut thrown));
        let fail = std::mem::size_of_val(&held.fail("declined", &mut persist));
        // What `run` boxes for a call that runs its body: the body and the storing of its outcome, with
        // the heartbeat beside them.
        let body = async move {
            Ok::<Receipt, Error>((
                String::new(),
                u64::from(request[1]),
                String::new(),
                String::new(),
            ))
        };
        let work = finish(
            held,
            body,
            |e: &Error| e.to_string(),
            Duration::ZERO,
            0,
            false,
        );
        let heartbeat = std::mem::size_of_val(&with_heartbeat(
            &idem,
            "k",
            "t",
            Duration::ZERO,
            Duration::ZERO,
            work,
        ));
        for (part, size) in [
            ("completion", complete),
            ("failure", fail),
            ("body with its heartbeat", heartbeat),
        ] {
            assert!(size <= 1024, "the boxed {part} is {size} bytes");
        }
    }
}

#[cfg(test)]
mod examine_order {
    use super::*;

    /// A record that expired between the refused claim and its examination is a new key: claimable,
    /// whatever payload it was written with, never a `PayloadMismatch`.
    #[test]
    fn an_expired_record_is_claimable_before_payloads_are_compared() {
        let record = Record {
            key: "ns#k".into(),
            status: Status::Completed,
            token: "theirs".into(),
            attempt: 1,
            lease_until_ms: None,
            expires_at_s: 1_000,
            fingerprint: Some("their-payload".into()),
            response: Some(b"1".to_vec()),
            error: None,
            replay_until_s: None,
            claim_writes_in_effect: false,
            completed_in: None,
            steps: None,
        };
        let call = Call::new("ns");
        let found = examine(&call, &record, "ours", Some("our-payload"), 1_001_000);
        assert!(matches!(found, Ok(Found::Claimable)), "{found:?}");
        // While it lives, another payload is still refused.
        let found = examine(&call, &record, "ours", Some("our-payload"), 1_000_000);
        assert!(
            matches!(found, Err(Error::PayloadMismatch { .. })),
            "{found:?}"
        );
    }
}

/// The pure decisions every claim, replay and completion goes through, each held to its exact answer
/// at the edges (`scripts/mutants` mutates them; the model reaches only the ones it models).
#[cfg(test)]
mod decision {
    use super::*;

    const NOW_MS: u64 = 1_000_000;
    const NOW_S: u64 = NOW_MS / 1000;

    /// Another call's record, alive well past `NOW_MS`.
    fn record(status: Status) -> Record {
        Record {
            key: "ns#k".into(),
            status,
            token: "theirs".into(),
            attempt: 1,
            lease_until_ms: (status == Status::Pending).then_some(NOW_MS + 1_500),
            expires_at_s: NOW_S + 100,
            fingerprint: None,
            response: (status == Status::Completed).then(|| b"1".to_vec()),
            error: None,
            replay_until_s: None,
            claim_writes_in_effect: false,
            completed_in: None,
            steps: None,
        }
    }

    fn examined(record: &Record, token: &str, fingerprint: Option<&str>) -> Result<Found, Error> {
        examine(&Call::new("ns"), record, token, fingerprint, NOW_MS)
    }

    #[test]
    fn only_a_differing_fingerprint_on_both_sides_is_a_payload_mismatch() {
        let same_payload = |stored, ours| same_payload("ns", stored, ours);
        assert!(same_payload(Some("a"), Some("a")).is_ok());
        assert!(same_payload(Some("a"), None).is_ok());
        assert!(same_payload(None, Some("a")).is_ok());
        assert!(same_payload(None, None).is_ok());
        assert!(matches!(
            same_payload(Some("a"), Some("b")),
            Err(Error::PayloadMismatch { namespace }) if namespace == "ns"
        ));
    }

    #[test]
    fn our_own_record_is_ours_and_anothers_is_not() {
        let pending = record(Status::Pending);
        assert!(matches!(
            examined(&pending, "theirs", None),
            Ok(Found::Ours)
        ));
        assert!(matches!(
            examined(&pending, "ours", None),
            Ok(Found::InProgress(_))
        ));
    }

    #[test]
    fn a_completed_record_replays_only_with_its_response_and_within_its_window() {
        let mut completed = record(Status::Completed);
        assert!(matches!(
            examined(&completed, "ours", None),
            Ok(Found::Replay)
        ));
        // The same fingerprint replays; another one is refused.
        completed.fingerprint = Some("p".into());
        assert!(matches!(
            examined(&completed, "ours", Some("p")),
            Ok(Found::Replay)
        ));
        assert!(matches!(
            examined(&completed, "ours", Some("q")),
            Err(Error::PayloadMismatch { .. })
        ));
        // Replayed through its last second of retention, expired after it.
        completed.replay_until_s = Some(NOW_S);
        assert!(matches!(
            examined(&completed, "ours", Some("p")),
            Ok(Found::Replay)
        ));
        completed.replay_until_s = Some(NOW_S - 1);
        assert!(matches!(
            examined(&completed, "ours", Some("p")),
            Err(Error::Expired { .. })
        ));
        // A response too large to store is never replayed as if it were there.
        completed.replay_until_s = None;
        completed.response = None;
        assert!(matches!(
            examined(&completed, "ours", Some("p")),
            Err(Error::ResponseTooLarge { .. })
        ));
    }

    #[test]
    fn a_live_claim_is_in_progress_until_its_lease_ends() {
        let pending = record(Status::Pending);
        let found = examined(&pending, "ours", None);
        assert!(
            matches!(found, Ok(Found::InProgress(d)) if d == Duration::from_millis(1_500)),
            "{found:?}"
        );
        let mut lapsed = pending;
        lapsed.lease_until_ms = Some(NOW_MS - 1);
        assert!(matches!(
            examined(&lapsed, "ours", None),
            Ok(Found::Claimable)
        ));
        let failed = record(Status::Failed);
        assert!(matches!(
            examined(&failed, "ours", None),
            Ok(Found::Claimable)
        ));
    }

    #[test]
    fn a_callers_times_are_its_clock_less_the_margin_and_never_shorten_its_lease() {
        let margin = Duration::from_secs(1);
        assert_eq!(judged_ms(NOW_MS, margin), NOW_MS - 1_000);
        assert_eq!(judged_ms(500, margin), 0, "saturates");
        let times = claim_times(
            NOW_MS,
            margin,
            Duration::from_secs(30),
            Duration::from_mins(1),
        );
        assert_eq!(times.now_ms, NOW_MS - 1_000);
        assert_eq!(times.lease_until_ms, NOW_MS + 30_000);
        assert_eq!(times.expires_at_s, NOW_S + 90);
    }

    #[test]
    fn an_expiry_is_rounded_up_to_the_second_and_saturates() {
        assert_eq!(expiry_s(NOW_MS, Duration::from_secs(2)), NOW_S + 2);
        assert_eq!(expiry_s(NOW_MS + 1, Duration::ZERO), NOW_S + 1);
        assert_eq!(expiry_s(NOW_MS, Duration::MAX), u64::MAX.div_ceil(1000));
    }

    #[test]
    fn a_rejected_transition_landed_only_if_the_record_has_our_token_and_its_status() {
        let mut failed = record(Status::Failed);
        failed.token = "ours".into();
        assert!(landed(Some(&failed), "ours", Status::Failed));
        assert!(!landed(Some(&failed), "theirs", Status::Failed));
        assert!(!landed(Some(&failed), "ours", Status::Completed));
        assert!(!landed(None, "ours", Status::Failed));
    }

    #[test]
    fn a_panics_message_is_stored_after_panicked() {
        let text: Box<dyn Any + Send> = Box::new("out of stock");
        assert_eq!(panicked(&*text), "panicked: out of stock");
        let owned: Box<dyn Any + Send> = Box::new(String::from("card 42 declined"));
        assert_eq!(panicked(&*owned), "panicked: card 42 declined");
        let other: Box<dyn Any + Send> = Box::new(42_u32);
        assert_eq!(panicked(&*other), "panicked: a panic without a message");
    }

    #[test]
    fn a_long_error_is_cut_on_a_character_boundary_and_says_how_long_it_was() {
        assert_eq!(truncate("declined", 8), "declined");
        let long = "é".repeat(40);
        let cut = truncate(&long, 40);
        assert!(cut.len() <= 40, "{cut}");
        assert_eq!(cut, format!("{}… (80 bytes in all)", "é".repeat(9)));
    }
}

#[cfg(test)]
mod serialize_panic {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::{Error, Idempotency, ManualClock, MemoryStore};

    /// A value whose `Serialize` impl panics.
    #[derive(Debug, serde::Deserialize)]
    struct Bomb;

    impl serde::Serialize for Bomb {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            panic!("bomb went off while serializing");
        }
    }

    /// A body that returned `Ok` has run: a panic in its value's `Serialize` impl must not leave the
    /// key PENDING, to be run again once the lease lapses. The record is COMPLETED (duplicates get
    /// `ResponseNotSerialized`), and the panic reaches the caller unchanged.
    #[tokio::test]
    async fn a_panic_while_serializing_the_value_is_still_final() {
        let clock = ManualClock::new(1_000_000);
        let store = Arc::new(MemoryStore::new());
        let idem = Idempotency::builder_arc(store.clone())
            .clock(clock.clone())
            .build();
        let runs = Arc::new(AtomicUsize::new(0));
        let call = |idem: Idempotency, runs: Arc<AtomicUsize>| async move {
            idem.operation("tests::bomb", "k")
                .lease(std::time::Duration::from_secs(10))
                .run(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(Bomb)
                })
                .await
        };
        let first = tokio::spawn(call(idem.clone(), runs.clone())).await;
        let panic = first.expect_err("the caller panics").into_panic();
        assert_eq!(
            panic.downcast_ref::<&str>(),
            Some(&"bomb went off while serializing")
        );
        // Long past the lease.
        clock.advance(std::time::Duration::from_mins(1));
        let second = call(idem.clone(), runs.clone()).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran twice");
        assert!(
            matches!(second, Err(Error::ResponseNotSerialized { .. })),
            "{second:?}"
        );
    }

    /// An error whose `Display` panics.
    #[derive(Debug)]
    struct Grumpy;

    impl std::fmt::Display for Grumpy {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            panic!("display of the error panicked");
        }
    }

    impl From<Error> for Grumpy {
        fn from(_: Error) -> Self {
            Self
        }
    }

    /// A panic while describing the body's error (its `Display`) is a failure like a panicking body:
    /// FAILED with `panicked: <message>`, so the key is free at once rather than blocked for the lease,
    /// and the panic reaches the caller.
    #[tokio::test]
    async fn a_panic_while_describing_the_error_fails_the_record() {
        let idem = Idempotency::in_memory();
        let runs = Arc::new(AtomicUsize::new(0));
        let call = |idem: Idempotency, runs: Arc<AtomicUsize>| async move {
            idem.operation("tests::grumpy", "k")
                .run(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<u32, _>(Grumpy)
                })
                .await
        };
        let first = tokio::spawn(call(idem.clone(), runs.clone())).await;
        let panic = first.expect_err("the caller panics").into_panic();
        assert_eq!(
            panic.downcast_ref::<&str>(),
            Some(&"display of the error panicked")
        );
        // The key is free at once: the next call runs the body (and panics the same way).
        let second = tokio::spawn(call(idem.clone(), runs.clone())).await;
        assert!(second.is_err(), "the second call panics too");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the key was left blocked");
    }
}

/// How [`Held::fail`] settles a FAILED write the store rejected (with the memory store's emulated
/// business tables).
#[cfg(all(test, feature = "emulator"))]
mod failure {
    use std::fmt;
    use std::sync::Arc;
    use std::time::Duration;

    use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};

    use crate::record::Status;
    use crate::{Error, Idempotency, ManualClock, MemoryStore};

    /// A body's own error, or the library's.
    #[derive(Debug)]
    enum Failure {
        Declined,
        Idempotency(Error),
    }

    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Self::Declined => f.write_str("declined"),
                Self::Idempotency(e) => e.fmt(f),
            }
        }
    }

    impl From<Error> for Failure {
        fn from(e: Error) -> Self {
            Self::Idempotency(e)
        }
    }

    /// A zombie (its lease lapsed, another call took the key over and completed it) whose body fails:
    /// its FAILED write is rejected by the new holder's record, which it leaves alone, and it returns its
    /// body's error at once rather than trying again. Run on a thread of its own, so that a call that
    /// never returns (a retry loop that never yields) fails the test instead of hanging it; the call
    /// takes milliseconds, the test waits 10 s.
    #[test]
    fn a_zombies_failure_leaves_the_new_holders_record_alone() {
        let (done, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let clock = ManualClock::new(1_000_000);
            let store = Arc::new(MemoryStore::new());
            let idem = Idempotency::builder_arc(store.clone())
                .clock(clock.clone())
                .heartbeat(false)
                .build();
            let op = || {
                idem.operation("tests::zombie", "k")
                    .lease(Duration::from_secs(10))
            };
            let zombie = runtime.block_on(op().run(|| async {
                clock.advance(Duration::from_mins(1));
                let taken_over = op().run(|| async { Ok::<u32, Failure>(2) }).await;
                assert!(matches!(taken_over, Ok(2)), "{taken_over:?}");
                Err::<u32, _>(Failure::Declined)
            }));
            let replay = runtime.block_on(op().run(|| async { Ok::<u32, Failure>(3) }));
            done.send((zombie, replay, store.records()))
                .expect("the test waits");
        });
        let (zombie, replay, records) = outcome
            .recv_timeout(Duration::from_secs(10))
            .expect("the zombie's call never returned");
        assert!(matches!(zombie, Err(Failure::Declined)), "{zombie:?}");
        assert!(matches!(replay, Ok(2)), "{replay:?}");
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].status, Status::Completed);
    }

    /// `available = available <op> 1` on the one apple of `inventory`.
    fn adjust(op: &str) -> TransactWriteItem {
        let update = Update::builder()
            .table_name("inventory")
            .key("sku", AttributeValue::S("apple".into()))
            .update_expression(format!("SET available = available {op} :one"))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .expect("an update");
        TransactWriteItem::builder().update(update).build()
    }

    /// A failure whose compensation is refused because its claim-time writes are no longer in effect
    /// (the compensation is conditioned on the mark) has nothing to undo: it is recorded without the
    /// compensation, so the key is free at once, and the writes are not undone a second time.
    #[tokio::test]
    async fn a_failure_whose_claim_writes_are_gone_is_recorded_without_its_compensation() {
        let store = Arc::new(MemoryStore::new());
        store
            .create_table("inventory", "sku", None)
            .expect("a table");
        store
            .put_item(
                "inventory",
                [
                    ("sku".to_owned(), AttributeValue::S("apple".into())),
                    ("available".to_owned(), AttributeValue::N("10".into())),
                ]
                .into(),
            )
            .expect("an apple");
        let available = || {
            store
                .get_item(
                    "inventory",
                    &[("sku".to_owned(), AttributeValue::S("apple".into()))].into(),
                )
                .expect("the apple")["available"]
                .clone()
        };
        let idem = Idempotency::builder_arc(store.clone()).build();
        let result = idem
            .operation("tests::reserve", "order-1")
            .claim_with([adjust("-")])
            .compensate_with([adjust("+")])
            .run(|| async {
                assert_eq!(available(), AttributeValue::N("9".into()));
                // The mark goes away under the running call (as if undone elsewhere).
                let mut record = store.records().pop().expect("our claim");
                record.claim_writes_in_effect = false;
                store.insert(record);
                Err::<u32, _>(Failure::Declined)
            })
            .await;
        assert!(matches!(result, Err(Failure::Declined)), "{result:?}");
        let record = store.records().pop().expect("the record");
        assert_eq!(record.status, Status::Failed, "the key is left blocked");
        assert_eq!(available(), AttributeValue::N("9".into()), "undone again");
    }
}

#[cfg(test)]
mod retry_hints {
    use super::*;

    const LEASE: Duration = Duration::from_mins(1);
    const SHORT: Duration = Duration::from_secs(1);

    fn hint(retry_after: Duration) -> Duration {
        retry_hint(true, SHORT, retry_after, LEASE)
    }

    /// A 60 s lease is extended every 20 s: `retry_after` (which counts the skew margin) falls from
    /// 61 s to 41 s between two heartbeats, and below 40 s the claim is stalled.
    #[test]
    fn the_short_hint_until_a_heartbeat_is_overdue_then_the_lease() {
        assert_eq!(hint(Duration::from_secs(61)), SHORT);
        assert_eq!(hint(Duration::from_secs(40)), SHORT, "due, not overdue");
        assert_eq!(hint(Duration::from_millis(39_999)), Duration::from_secs(40));
        assert_eq!(
            hint(Duration::from_secs(39)),
            Duration::from_secs(40),
            "lapsed only once strictly past the lease's end"
        );
        assert_eq!(hint(Duration::from_millis(38_001)), Duration::from_secs(39));
        assert_eq!(hint(Duration::from_millis(1)), Duration::from_secs(1));
        // A PENDING record without a lease, or at its lease's very end: never zero.
        assert_eq!(hint(Duration::ZERO), Duration::from_secs(1));
    }

    #[test]
    fn without_heartbeats_a_lease_never_moves_and_the_hint_stays_short() {
        assert_eq!(
            retry_hint(false, SHORT, Duration::from_secs(5), LEASE),
            SHORT
        );
        assert_eq!(
            retry_hint(false, SHORT, Duration::from_millis(300), LEASE),
            Duration::from_millis(300),
            "never more than what is left"
        );
    }

    #[test]
    fn extreme_leases_neither_overflow_nor_stall_live_claims() {
        // The longest lease a handle accepts, nearly all of it left, long overdue by its heartbeat.
        let century = crate::MAX_DURATION;
        let left = century / 2;
        assert_eq!(
            retry_hint(true, SHORT, left, century),
            Duration::from_secs(left.as_secs() + 1)
        );
        // A `retry_after` as large as milliseconds go (a lease end far past any lease).
        let huge = Duration::from_millis(u64::MAX);
        assert_eq!(retry_hint(true, SHORT, huge, century), SHORT);
        assert_eq!(
            retry_hint(true, SHORT, huge, Duration::MAX),
            Duration::from_secs(u64::MAX / 1000 + 1)
        );
        // A lease too short to have a heartbeat interval below it is never stalled.
        assert_eq!(
            retry_hint(true, SHORT, Duration::ZERO, Duration::ZERO),
            Duration::ZERO
        );
        assert_eq!(
            retry_hint(true, SHORT, Duration::ZERO, Duration::from_millis(1)),
            Duration::ZERO
        );
    }
}
