//! The state machine: claim → execute → complete or fail. Every request it makes, with its exact
//! condition, is listed in the docs of [`DynamoDbStore`](crate::store::dynamodb::DynamoDbStore)'s module.
//!
//! | file | what it holds |
//! |---|---|
//! | `decide.rs` | every "what next", as pure sync functions returning named actions (the model drives them) |
//! | `mod.rs` | what a record means ([`examine`]), the claim's times, lifetimes, a call's [`Plan`] |
//! | `claim.rs` | a call's attempts and [`Stage`], what a drop does, the claim requests, the release, waiting, the cache and replays |
//! | `run.rs` | a call's [`core`] from claim to outcome (compiled once), the typed shims that hold its body ([`InPlace`], [`Detaching`]), panics, storing the body's end |
//! | `settle.rs` | the fenced writes that store an outcome or a step, retried while the lease allows |
//! | `heartbeat.rs` | the lease heartbeat beside a running body |
//! | `flight.rs` | coalescing: one flight per key and handle, its leader's hold ([`flight::Lead`]) and what a follower does (pure decisions the model drives) |
//! | `steps.rs` | [`Steps`]: a body's steps, their stored form, what a claim does with them (the decisions about stored steps, which `decide.rs` names with the others) |
//!
//! What dropping a call's future does, by the stage it is in ([`decide::on_drop`]):
//!
//! | stage | what a drop does | set by |
//! |---|---|---|
//! | `Claiming` | releases the claim that may have landed ([`Change::Release`]: a tombstone if it has not landed yet); with steps that must not restart, leaves it to lapse | `acquire`, before each claim request and when its answer means the claim is ours |
//! | `Waiting` | nothing: the key is another call's | `acquire`, when a claim was refused |
//! | `Running` | nothing is sent: the body may have had effects, so the claim lapses with its lease (counted) | `claim_phase`, once the claim is held |
//! | `Done` | nothing: the body runs on its own task, or the call is over | `claim_phase`, after `acquire`; `core`, once a detached call hands its claim over and once the body's end is stored |
//!
//! A claim whose answer never came (the call ends with a store error while `Claiming`) is released
//! the same way ([`decide::after_claim_error`]).

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
use crate::store::writes::Staged;
use crate::store::{
    Change, ClaimOutcome, ClaimRequest, StepsClaim, StoreError, TransactOutcome, Transition,
    WriteOutcome, Writes,
};
use crate::telemetry::{self, Dropped, Outcome};
use steps::Steps;

mod claim;
pub(crate) mod decide;
pub(crate) mod flight;
mod heartbeat;
mod run;
mod settle;
pub(crate) mod steps;

pub(crate) use claim::RELEASED;
pub(crate) use claim::Stage;
#[cfg(test)]
pub(crate) use claim::{Lifetimes, release_change};
pub use decide::MIN_LEASE;
pub(crate) use run::{Detaching, Ended, InPlace, Started, alone, core, panicked};
pub(crate) use settle::save_steps;
#[allow(
    clippy::wildcard_imports,
    reason = "the state machine's parts share its vocabulary"
)]
use {claim::*, heartbeat::*, run::*, settle::*};

// What the attribute says about a function is the operation's, not the state machine's; named here
// too for the state machine's parts.
pub(crate) use crate::call::Call;

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

pub(crate) fn millis(d: Duration) -> u64 {
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

/// The lease a call's claims ask for and its heartbeats renew by: the operation's (or the handle's
/// default), shortened to what is left of the call's deadline, if it has one.
pub(crate) fn call_lease(idem: &Idempotency, call: &Call) -> Duration {
    let lease = call.lease.unwrap_or_else(|| idem.default_lease());
    match call.deadline_ms {
        None => lease,
        Some(deadline_ms) => {
            decide::deadline_lease(lease, Some(deadline_ms.get()), idem.clock().now_ms())
        }
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
/// lease is never shortened by the margin). A call bound by a deadline ([`Call::deadline_ms`]) asks
/// for no lease past it ([`lease_end_ms`]).
pub(crate) fn claim_times(
    now_ms: u64,
    margin: Duration,
    lease: Duration,
    ttl: Duration,
    deadline_ms: Option<u64>,
) -> ClaimTimes {
    ClaimTimes {
        now_ms: judged_ms(now_ms, margin),
        lease_until_ms: lease_end_ms(now_ms, lease, deadline_ms),
        expires_at_s: expiry_s(now_ms, lease.saturating_add(ttl)),
    }
}

/// The end of a lease asked for at `now_ms`: a whole `lease` later, but not past the call's deadline,
/// and never already over (a call claims only with at least [`MIN_LEASE`] left,
/// [`decide::too_close_to_deadline`]; the floor keeps the function total).
pub(crate) fn lease_end_ms(now_ms: u64, lease: Duration, deadline_ms: Option<u64>) -> u64 {
    let end = now_ms.saturating_add(millis(lease));
    match deadline_ms {
        Some(deadline_ms) => end.min(deadline_ms).max(now_ms.saturating_add(1)),
        None => end,
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
/// claim-time writes in effect (`keeps_claim_writes`), or its body's steps are resumed by a retry (the
/// operation does not restart after failures, or is pinned, or the failure is a panic: `panicked`).
pub(crate) fn failure_keeps_record(
    keeps_claim_writes: bool,
    steps: Option<&Steps>,
    panicked: bool,
) -> bool {
    keeps_claim_writes || steps.is_some_and(|steps| panicked || !steps.restart_failed())
}

/// Whether a fenced transition that was rejected with `record` had landed after all: our own earlier
/// attempt (its response lost) already moved the record to `status` under our `token`.
pub(crate) fn landed(record: Option<&Record>, token: &str, status: Status) -> bool {
    record.is_some_and(|r| r.token == token && r.status == status)
}

/// How often a call re-claims a key it found claimable, before it reports [`Error::Contended`].
pub(crate) const CLAIMABLE_RETRIES: u32 = 3;
pub(crate) use crate::size::MAX_ERROR_BYTES;

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
pub(crate) struct Parts<I> {
    /// The handle (`I` is a `Cow` or a reference).
    pub(crate) idem: I,
    pub(crate) call: Call,
    pub(crate) key: String,
    pub(crate) fingerprint: Option<String>,
    pub(crate) staging: Option<Staged>,
    pub(crate) claim_writes: Writes,
    pub(crate) compensation: Writes,
    pub(crate) steps: Option<Steps>,
}

impl<I> Parts<I> {
    /// What the call's [`Plan`] borrows of them.
    pub(crate) fn plan(&self) -> Plan<'_> {
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

/// Decodes a stored response with `parse` (the value's own type's part), inflating at most `limit`
/// bytes (the handle's `max_response_bytes`).
fn replay(
    namespace: &str,
    response: &[u8],
    limit: usize,
    parse: &mut dyn codec::Parse,
) -> Result<(), Error> {
    codec::decode_with(response, limit, parse).map_err(|e| undecodable(namespace, e))
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
            released: Vec::new(),
            released_until_ms: None,
            released_through: None,
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
            released: Vec::new(),
            released_until_ms: None,
            steps: None,
            released_through: None,
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
            None,
        );
        assert_eq!(times.now_ms, NOW_MS - 1_000);
        assert_eq!(times.lease_until_ms, NOW_MS + 30_000);
        assert_eq!(times.expires_at_s, NOW_S + 90);
    }

    #[test]
    fn a_deadline_caps_every_lease_and_a_past_one_leaves_a_millisecond() {
        let lease = Duration::from_secs(3);
        assert_eq!(lease_end_ms(NOW_MS, lease, None), NOW_MS + 3_000);
        let deadline = Some(NOW_MS + 2_000);
        assert_eq!(lease_end_ms(NOW_MS, lease, deadline), NOW_MS + 2_000);
        assert_eq!(
            lease_end_ms(NOW_MS - 5_000, lease, deadline),
            NOW_MS - 2_000
        );
        assert_eq!(
            lease_end_ms(NOW_MS + 2_000, lease, deadline),
            NOW_MS + 2_001
        );
        assert_eq!(
            lease_end_ms(NOW_MS + 9_000, lease, deadline),
            NOW_MS + 9_001
        );
        let times = claim_times(NOW_MS + 1_500, Duration::ZERO, lease, lease, deadline);
        assert_eq!(
            times.lease_until_ms,
            NOW_MS + 2_000,
            "what is left, not a whole lease"
        );
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
