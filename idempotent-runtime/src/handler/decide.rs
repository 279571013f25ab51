//! Every "what next" of a call, as pure, synchronous functions that return named actions: what the
//! answer to a claim means, what a rejected transition means, what dropping a call does at each stage,
//! what a claim that failed with an error leaves behind, and when the next heartbeat goes and what
//! lease it asks for.
//!
//! The handler does the I/O each action names and nothing else; the protocol model (`model.rs`)
//! drives the same functions, so that it checks these decisions as written rather than a copy of them
//! (as tokio's task `state.rs` keeps its transitions apart from `harness.rs`, which only matches on
//! them). Being synchronous, none of them can enlarge a call's future.
//!
//! Time passes while a request is in flight: a claim's answer can arrive after the lease it asked
//! for, a heartbeat's round trip eats into the lease it renews. So every decision that starts or keeps
//! a body running is taken with the caller's clock as read *when the answer is read*, never with the
//! time the request was sent.

use std::time::Duration;

use crate::error::Error;
use crate::record::{Record, Status};
#[cfg(any(test, feature = "cli"))]
use crate::store::Change;

// The decisions about an operation's stored steps live with the steps' format; named here with the
// others (the model drives them all from here).
#[cfg(test)]
pub(crate) use super::steps::{StepsFound, steps_found, steps_releasable};
use super::{CLAIMABLE_RETRIES, Found, Stage, millis};

/// The shortest lease a call may ask for: a lease is renewed by heartbeats every third of it, and a
/// heartbeat's round trip eats into it, so a shorter one lapses under ordinary store latency (and costs
/// hundreds of heartbeat writes a second).
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// What a call does next, once it has read the answer to a claim attempt (see [`after_claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterClaim {
    /// The claim is ours and its lease still ahead of the caller's clock: run the body.
    Run {
        /// The claim's lease end (epoch milliseconds).
        lease_until_ms: u64,
    },
    /// The claim is ours, but its lease had run out by the time its answer was read (a slow answer,
    /// or the SDK's retry of a lost one): another caller may have taken the key over meanwhile, so the
    /// body must not start on it. Renew it with a fenced write under the call's token (a heartbeat's):
    /// it lands only if nobody took over, and otherwise shows the record that did.
    Renew,
    /// The claim is ours, but every answer (the claim's and its renewals') came too late to use, on
    /// every attempt the call may make: give the claim up ([`OnDrop::Release`]'s release) and report
    /// [`Error::Contended`].
    GiveUp,
    /// The record is ours but no longer PENDING: the claim was released (the call gave up on it and
    /// marked it so), and the call must not use it.
    Released,
    /// The key is claimable (FAILED, expired, or a lapsed claim of another call): claim again.
    /// `took_over`: the key was held by another call's lapsed claim.
    Reclaim {
        /// Whether the claim taken next takes over a lapsed one.
        took_over: bool,
    },
    /// The record holds the answer: replay it without running the body.
    Replay,
    /// Another call holds the key; its lease (plus the skew margin) ends in this long. Wait and read
    /// again (when the call may wait), or report [`Error::InProgress`].
    InProgress(Duration),
    /// The key changed hands (or the answers came too late) on every attempt the call may make:
    /// [`Error::Contended`].
    Contended,
}

/// What the answer to a claim attempt said.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer<'r> {
    /// The claim landed; it asked for a lease until `lease_until_ms`.
    Landed {
        /// The lease end the request asked for (epoch milliseconds).
        lease_until_ms: u64,
    },
    /// The claim was refused by `record`, which means `found` for this call ([`examine`](super::examine)).
    Refused {
        /// The record that blocked the claim.
        record: &'r Record,
        /// What it means for this call.
        found: &'r Found,
    },
}

/// What a call does after the answer to its `number`th claim attempt, read when the caller's clock says
/// `now_ms` (not less the margin: a holder's lease is at risk only once its own clock has passed the
/// lease end, since others take over only once theirs, less the margin, has).
pub(crate) fn after_claim(
    answer: Answer<'_>,
    number: u32,
    now_ms: u64,
    judged_ms: u64,
) -> AfterClaim {
    let exhausted = number > CLAIMABLE_RETRIES;
    let ours = |lease_until_ms: u64| {
        if now_ms < lease_until_ms {
            AfterClaim::Run { lease_until_ms }
        } else if exhausted {
            AfterClaim::GiveUp
        } else {
            AfterClaim::Renew
        }
    };
    match answer {
        Answer::Landed { lease_until_ms } => ours(lease_until_ms),
        Answer::Refused { record, found } => match *found {
            // Our own claim, recognised in a retried request's answer: only a PENDING one is a claim
            // (a released one is a mark that the call gave it up).
            Found::Ours if record.status == Status::Pending => {
                ours(record.lease_until_ms.unwrap_or(0))
            }
            Found::Ours => AfterClaim::Released,
            Found::Replay => AfterClaim::Replay,
            Found::Claimable if exhausted => AfterClaim::Contended,
            Found::Claimable => AfterClaim::Reclaim {
                took_over: record.status == Status::Pending && !record.is_expired(judged_ms),
            },
            Found::InProgress(retry_after) => AfterClaim::InProgress(retry_after),
        },
    }
}

/// Whether a claim *without* steps that found `record` claimable at `judged_ms` must leave it: the
/// record holds the steps of an operation run with steps that lives on (not expired). The store
/// refuses such a claim ([`StepsClaim::Untouched`](crate::store::StepsClaim::Untouched)): code without
/// steps would run the finished steps again; the call reports [`Error::StepsHeld`] rather than
/// claiming again.
pub(crate) fn steps_held(record: &Record, judged_ms: u64) -> bool {
    record.steps.is_some() && !record.is_expired(judged_ms)
}

/// What a claim attempt that failed with `error` leaves behind, for a call that now gives up while its
/// claim's fate is unknown ([`Stage::Claiming`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterClaimError {
    /// The request may have landed (its answer was lost, or the store failed after applying it):
    /// release it, so that the key is not held for a whole lease by a call that is gone.
    Release,
    /// Nothing was written (the store refused the request, or it was never sent).
    Nothing,
}

/// See [`AfterClaimError`].
pub(crate) fn after_claim_error(error: &Error) -> AfterClaimError {
    match error {
        Error::Throttled { .. }
        | Error::Unavailable { .. }
        | Error::RegionUnavailable { .. }
        | Error::Store { .. }
        // Every claim answered too late to use: the last one may still be ours.
        | Error::Contended { .. }
        // A claim answered too late to use, and no time left to renew it (a call that sent no
        // claim returns this from the waiting stage, which releases nothing).
        | Error::DeadlinePassed { .. } => AfterClaimError::Release,
        _ => AfterClaimError::Nothing,
    }
}

/// What dropping a call's future does, by the [`Stage`] it was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDrop {
    /// A claim may have landed and no body ran: release it (fenced by the call's token), and count the
    /// dropped claim.
    Release,
    /// A claim may have landed, but releasing it would let the operation start over (a resume of
    /// steps under a policy that restarts a failed operation): leave it to lapse with its lease, and
    /// count the dropped claim.
    KeepClaim,
    /// The body was cut off mid-way: it may have had effects, so the claim stays until its lease runs
    /// out; count the dropped body.
    KeepBody,
    /// Nothing of the call's is held (it was waiting on another call, or is done).
    Nothing,
}

/// See [`OnDrop`]. `releasable`: whether a claim of this call may be released (see
/// [`Steps::releasable`](super::steps::Steps::releasable); always for a call without steps).
pub(crate) fn on_drop(stage: Stage, releasable: bool) -> OnDrop {
    match stage {
        Stage::Claiming if releasable => OnDrop::Release,
        Stage::Claiming => OnDrop::KeepClaim,
        Stage::Running => OnDrop::KeepBody,
        Stage::Waiting | Stage::Done => OnDrop::Nothing,
    }
}

/// The writes of a release, in the order they are tried: first a fenced failure of the claim (which
/// holds the key if it landed); where there is no record at all (the claim still in flight), a FAILED
/// mark under the call's token ([`Change::Release`](crate::store::Change::Release)); where there is
/// another record, the call's token left on it
/// ([`Change::MarkReleased`](crate::store::Change::MarkReleased)). Either way the claim, landing later,
/// is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseStep {
    /// PENDING under the call's token → FAILED.
    Fail,
    /// No record → a FAILED mark under the call's token, living as long as the claim it stands in for
    /// would ([`release_mark_lifetime`]).
    Mark,
    /// Another record → the call's token among its released ones.
    MarkRecord,
}

/// The most writes a release makes. Each rejection means the record changed since the release last
/// read it: six cover every order in which its own claim can land and the record appear or vanish,
/// and the rest the marks of other calls' releases landing in between (a burst of callers giving up
/// at once on a slow store), two for each call whose token a record can hold.
pub(crate) const RELEASE_WRITES: usize = 6 + 2 * crate::MAX_RELEASED;

/// What a release under `token` does after `step` was `applied`, or rejected with the record it
/// `found` (`None`: no record), judged at `now_ms` (the caller's clock less its margin), for a claim
/// that can hold the key until `hold_until_ms`. A release ends with the token among the record's
/// released ones (a mark where there was no record holds it too), or no greater than its
/// [`released_through`](Record::released_through), and with the record's released tokens' end and
/// expiry no earlier than the claim's end: a FAILED record under the token alone does not keep the
/// claim out once another call has claimed and failed it, and a record that TTL deletes does not keep
/// it out at all. Each rejection means the record changed since the last write (or refuses every
/// mark): the next write is the one that record calls for, and none on a record that refuses every
/// mark ([`markable`]).
pub(crate) fn after_release(
    step: ReleaseStep,
    applied: bool,
    found: Option<&Record>,
    token: &str,
    now_ms: u64,
    hold_until_ms: u64,
) -> Option<ReleaseStep> {
    if applied {
        return (step == ReleaseStep::Fail).then_some(ReleaseStep::MarkRecord);
    }
    match found {
        // The claim landed (between two writes): fail it.
        Some(record)
            if step != ReleaseStep::Fail
                && record.status == Status::Pending
                && record.token == token =>
        {
            Some(ReleaseStep::Fail)
        }
        // No record, or an expired one (which counts as absent, and which a mark must not bring
        // back: a new operation would find the old one's response, steps or claim-time writes): the
        // claim has not landed (or never will); leave the mark it must respect in its place.
        None => Some(ReleaseStep::Mark),
        Some(record) if record.is_expired(now_ms) => Some(ReleaseStep::Mark),
        // Already refuses the claim (our token is on it, or no greater than its `released_through`)
        // until the claim's end: done. Not until then: the end and the expiry are raised.
        Some(record) if record.marks_released(token) => {
            (!holds_until(record, hold_until_ms)).then_some(ReleaseStep::MarkRecord)
        }
        // Another call's record, which the claim may still land on once it is claimable (or one whose
        // end or expiry changed since the mark was computed).
        Some(record) if markable(record, now_ms) => Some(ReleaseStep::MarkRecord),
        // A live COMPLETED record: no claim lands on it while it lives. One that expires before the
        // claim's end is kept until then (its expiry raised, `Marking::KeepCompleted`): once expired,
        // or deleted by TTL, it would let the claim land and hold the key with no body running.
        Some(record) => {
            (record.expires_at_s < hold_until_ms.div_ceil(1000)).then_some(ReleaseStep::MarkRecord)
        }
    }
}

/// How long a release waits before it sends again a write that failed with `error` at `now_ms`
/// (its `failures`th failure in a row), or `None` when it stops: the error is one that does not pass
/// (a setup error, a corrupt record, ...; a region's outage through a routed store passes), or the
/// claim it gave up can no longer hold the key
/// (`hold_until_ms`). An outage that outlasts the store client's own retries must not leave the
/// claim free to land: the release keeps trying, with a pause that doubles from 50 ms up to 2 s,
/// until the claim it stands in for is over. The store's answers, not these attempts, count against
/// [`RELEASE_WRITES`].
pub(crate) fn release_retry(
    error: &crate::StoreError,
    failures: u32,
    now_ms: u64,
    hold_until_ms: u64,
) -> Option<Duration> {
    use crate::StoreError;
    let passes = matches!(
        error,
        StoreError::Throttled(_)
            | StoreError::Unavailable(_)
            | StoreError::RegionUnavailable { .. }
    );
    (passes && now_ms < hold_until_ms).then(|| {
        Duration::from_millis(50)
            .saturating_mul(1 << failures.min(6))
            .min(Duration::from_secs(2))
    })
}

/// Whether `record`'s release marks last until `hold_until_ms`: their end is no earlier, and TTL
/// deletes the record no earlier.
fn holds_until(record: &Record, hold_until_ms: u64) -> bool {
    record
        .released_until_ms
        .is_some_and(|until| until >= hold_until_ms)
        && record.expires_at_s >= hold_until_ms.div_ceil(1000)
}

/// Whether a release may leave its token on `record` at `now_ms`: any live record but a COMPLETED
/// one (final: no claim lands on it before it expires). One holding
/// [`MAX_RELEASED`](crate::MAX_RELEASED) tokens takes the mark too ([`mark`]). An expired record
/// takes none: a release's mark replaces it ([`ReleaseStep::Mark`]).
pub(crate) fn markable(record: &Record, now_ms: u64) -> bool {
    record.status != Status::Completed && !record.is_expired(now_ms)
}

/// What a release read of the record it marks: until when its released tokens hold, its expiry,
/// whether it holds all the released tokens it may, and whether it already refuses the release's
/// token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// [`Record::released_until_ms`].
    pub(crate) until_ms: Option<u64>,
    /// [`Record::expires_at_s`].
    pub(crate) expires_at_s: u64,
    /// [`MAX_RELEASED`](crate::MAX_RELEASED) tokens.
    pub(crate) full: bool,
    /// [`Record::marks_released`] the token.
    pub(crate) refuses: bool,
    /// COMPLETED: it refuses every claim while it lives, and takes no token.
    pub(crate) completed: bool,
}

impl Seen {
    /// Nothing read: a mark computed from it is refused by any record (none has expiry 0 under a
    /// live mark), and the refusal returns what the record holds.
    pub(crate) const NOTHING: Self = Self {
        until_ms: None,
        expires_at_s: 0,
        full: false,
        refuses: false,
        completed: false,
    };

    /// What `record` says to a release under `token`.
    pub(crate) fn of(record: &Record, token: &str) -> Self {
        Self {
            until_ms: record.released_until_ms,
            expires_at_s: record.expires_at_s,
            full: record.released.len() >= crate::MAX_RELEASED,
            refuses: record.marks_released(token),
            completed: record.status == Status::Completed,
        }
    }
}

/// What a release knows of the record after `step` was `applied` or rejected with the record it
/// `found`: that record; after its own failure, what that failure wrote (`failed_expires_at_s`; the
/// record's end of released tokens, if any, is not known: a mark computed without it is refused, and
/// the record that refusal returns tells it); otherwise nothing.
pub(crate) fn seen_after(
    step: ReleaseStep,
    applied: bool,
    found: Option<&Record>,
    token: &str,
    failed_expires_at_s: u64,
) -> Option<Seen> {
    match found {
        Some(record) => Some(Seen::of(record, token)),
        None if applied && step == ReleaseStep::Fail => Some(Seen {
            until_ms: None,
            expires_at_s: failed_expires_at_s,
            full: false,
            refuses: false,
            completed: false,
        }),
        None => None,
    }
}

/// The mark a release makes at `now_ms` (judged) on the record it read (`seen`), for a claim that can
/// hold the key until `hold_until_ms` at most: on a COMPLETED record (which refuses every claim while
/// it lives) only the expiry is raised; on a record that refuses the token already, only the end
/// and the expiry are raised; otherwise its token joins the released ones; when the set is
/// full, it replaces them if every one is stale, and otherwise becomes the record's
/// [`released_through`](Record::released_through) (every token up to it refused: tokens are ordered by
/// when they were made). The released tokens' end and the record's expiry become no earlier than the
/// claim's end, so that the mark outlives the claim it keeps out (TTL deletes no record before its
/// expiry).
pub(crate) fn mark(seen: Seen, now_ms: u64, hold_until_ms: u64) -> crate::store::Change<'static> {
    use crate::store::Marking;
    let marking = match (seen.full, seen.until_ms) {
        _ if seen.completed => Marking::KeepCompleted,
        _ if seen.refuses => Marking::Extend,
        (false, _) => Marking::Join,
        (true, Some(until)) if until < now_ms => Marking::Replace,
        (true, _) => Marking::Through,
    };
    let until_ms = match seen.until_ms {
        Some(until) if marking != Marking::Replace => until.max(hold_until_ms),
        _ => hold_until_ms,
    };
    crate::store::Change::MarkReleased {
        now_ms,
        released_until_ms: until_ms,
        expires_at_s: seen.expires_at_s.max(hold_until_ms.div_ceil(1000)),
        seen_until_ms: seen.until_ms,
        seen_expires_at_s: seen.expires_at_s,
        marking,
    }
}

/// Until when a claim sent before a release that starts at `now_ms` (the caller's clock) can hold the
/// key: its lease ends within `lease` of now, and others take it over once their clocks, less the
/// `margin`, have passed that end.
pub(crate) fn release_hold_until(now_ms: u64, lease: Duration, margin: Duration) -> u64 {
    now_ms
        .saturating_add(millis(lease))
        .saturating_add(millis(margin))
}

/// How long a release's mark lives: at least as long as the claim it stands in for (its `lease` and
/// the operation's `lifetime` past it), so that the mark is not purged before a claim that lands late
/// would have expired anyway.
pub(crate) fn release_mark_lifetime(lease: Duration, lifetime: Duration) -> Duration {
    lease.saturating_add(lifetime)
}

/// The write an operator's release of the PENDING `record` makes at `now_ms`
/// (`admin::release`, fenced by the record's token): a record with steps
/// has its lease lapse (a FAILED one would be read as a failure of the body, after which an
/// operation with the restart policy starts over and runs its finished steps again); any other is
/// moved to FAILED.
#[cfg(any(test, feature = "cli"))]
pub(crate) fn operator_release(record: &Record, now_ms: u64) -> Change<'static> {
    // A claim whose claim-time writes are in effect keeps its expiry (the operation's ttl, counted
    // from the claim): the FAILED record must remember the writes as long as the claim would have, or
    // a retry after it expired would apply them again.
    let released_for = now_ms.div_ceil(1000) + 3600;
    if record.steps.is_some() {
        // The steps live as long as the operation would: a retry after they expired would be a new
        // operation, and run them again.
        Change::ExtendLease {
            lease_until_ms: 0,
            expires_at_s: released_for.max(record.expires_at_s),
        }
    } else {
        let expires_at_s = if record.claim_writes_in_effect {
            released_for.max(record.expires_at_s)
        } else {
            released_for
        };
        Change::Fail {
            error: "released by an operator (`idempotent key release`)",
            expires_at_s,
            release_claim_writes: false,
        }
    }
}

/// What a rejected completion means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRejectedComplete {
    /// Our own earlier attempt landed (its answer was lost): the result is stored.
    Stored,
    /// The claim is no longer ours: [`Error::LeaseLost`], the result is not stored.
    Lost,
}

/// What a completion rejected with `record` (the record as the store returned it) means for the
/// claim `token` holds.
pub(crate) fn after_rejected_complete(
    record: Option<&Record>,
    token: &str,
) -> AfterRejectedComplete {
    if super::landed(record, token, Status::Completed) {
        AfterRejectedComplete::Stored
    } else {
        AfterRejectedComplete::Lost
    }
}

/// What a call recording its body's failure does after the failure was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRejectedFail {
    /// Our own earlier attempt landed (its answer was lost): the failure is recorded.
    Recorded,
    /// The claim is still ours, but its claim-time writes are not in effect (the compensation is
    /// conditioned on them): record the failure again without the compensation, which would undo
    /// another caller's writes.
    WithoutCompensation,
    /// The claim is no longer ours: nothing to record.
    Lost,
}

/// What a failure rejected with `record` means for the claim `token` holds; `compensating`: whether
/// the rejected request carried compensating writes.
pub(crate) fn after_rejected_fail(
    record: Option<&Record>,
    token: &str,
    compensating: bool,
) -> AfterRejectedFail {
    match record {
        _ if super::landed(record, token, Status::Failed) => AfterRejectedFail::Recorded,
        Some(record)
            if compensating && record.status == Status::Pending && record.token == token =>
        {
            AfterRejectedFail::WithoutCompensation
        }
        _ => AfterRejectedFail::Lost,
    }
}

/// What a rejected step write ([`Change::SaveSteps`](crate::store::Change::SaveSteps)) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRejectedSteps {
    /// Our own earlier copy of this write landed (its answer was lost, and the copy sent again found
    /// the steps it extends gone): the steps are stored, the body goes on.
    Stored,
    /// The claim is no longer ours, or the record's steps are neither the ones the write extends nor
    /// the ones it writes: [`Error::LeaseLost`], the step's value is not stored and the body stops.
    Lost,
}

/// What a step write of `steps` rejected with `record` (as the store returned it) means for the claim
/// `token` holds: stored if the record is still PENDING under the token and holds exactly `steps`.
/// (A call's step writes are each unlike every earlier one, so only this write can have put them
/// there.)
pub(crate) fn after_rejected_steps(
    record: Option<&Record>,
    token: &str,
    steps: &[u8],
) -> AfterRejectedSteps {
    if super::landed(record, token, Status::Pending)
        && record.and_then(|r| r.steps.as_deref()) == Some(steps)
    {
        AfterRejectedSteps::Stored
    } else {
        AfterRejectedSteps::Lost
    }
}

/// How often a running body's heartbeat extends its lease: every third of the lease, counted from when
/// the previous request (the claim, or the last heartbeat) was *sent*; `None` for a lease too short to
/// renew (below [`MIN_LEASE`], which only a deadline-bound operation may have), whose claim is not
/// renewed at all.
pub(crate) fn heartbeat_interval(lease: Duration) -> Option<Duration> {
    (lease >= MIN_LEASE).then(|| lease / 3)
}

/// When the next heartbeat goes (epoch milliseconds of the caller's clock): one interval after the
/// previous request that set the lease was sent (`sent_ms`), so that a slow answer never delays the
/// next renewal. A heartbeat already due goes at once.
pub(crate) fn next_heartbeat_ms(sent_ms: u64, interval: Duration) -> u64 {
    sent_ms.saturating_add(millis(interval))
}

/// The lease end a heartbeat sent at `sent_ms` asks for: a whole lease from its send (the time the
/// request spends in flight is the holder's, never added to the lease). Past the call's deadline too:
/// a heartbeat is sent only while the body runs, and a running body is never to be taken over.
pub(crate) fn heartbeat_lease_ms(sent_ms: u64, lease: Duration) -> u64 {
    sent_ms.saturating_add(millis(lease))
}

/// The lease of a call bound by a deadline ([`Call::deadline_ms`](crate::call::Call::deadline_ms)) that
/// starts at `now_ms`: the operation's `lease`, or what is left until the deadline if that is shorter.
/// Its heartbeats renew it by this much.
pub(crate) fn deadline_lease(lease: Duration, deadline_ms: Option<u64>, now_ms: u64) -> Duration {
    match deadline_ms {
        Some(deadline_ms) => lease.min(Duration::from_millis(deadline_ms.saturating_sub(now_ms))),
        None => lease,
    }
}

/// Whether a call bound by a deadline ([`Call::deadline_ms`](crate::call::Call::deadline_ms)) must not
/// claim at `now_ms`: `Some(left)` when less than [`MIN_LEASE`] is left (a body started now could be
/// running past its lease, beside another caller's); `None` otherwise, or with no deadline.
pub(crate) fn too_close_to_deadline(deadline_ms: Option<u64>, now_ms: u64) -> Option<Duration> {
    let left = Duration::from_millis(deadline_ms?.saturating_sub(now_ms));
    (left < MIN_LEASE).then_some(left)
}

/// What a heartbeat's answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterHeartbeat {
    /// The lease was extended to the end the heartbeat asked for.
    Extended,
    /// The lease was extended, but the answer came after the lease it renewed had run out: while the
    /// request was in flight the claim looked lapsed, and only the fence kept another caller out. The
    /// store latency is close to what the lease allows; said loudly.
    ExtendedLate,
    /// The claim is no longer ours (taken over, or the outcome already stored): stop beating; the
    /// completion's fence says which.
    Stop,
    /// The request failed: try again at the next interval (the lease is not extended meanwhile).
    Retry,
}

/// What a heartbeat whose request was `applied` (`None`: it failed) means, read when the caller's
/// clock says `answered_ms`, for a claim whose lease ran until `lease_until_ms` before it.
pub(crate) fn after_heartbeat(
    applied: Option<bool>,
    answered_ms: u64,
    lease_until_ms: u64,
) -> AfterHeartbeat {
    match applied {
        Some(true) if answered_ms >= lease_until_ms => AfterHeartbeat::ExtendedLate,
        Some(true) => AfterHeartbeat::Extended,
        Some(false) => AfterHeartbeat::Stop,
        None => AfterHeartbeat::Retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::Found;

    fn record(status: Status, lease_until_ms: Option<u64>) -> Record {
        Record {
            key: "k".into(),
            status,
            token: "t".into(),
            attempt: 1,
            lease_until_ms,
            expires_at_s: 1_000_000,
            fingerprint: None,
            response: None,
            error: None,
            replay_until_s: None,
            claim_writes_in_effect: false,
            completed_in: None,
            steps: None,
            released: Vec::new(),
            released_until_ms: None,
            released_through: None,
        }
    }

    #[test]
    fn a_claim_answered_after_its_lease_is_renewed_never_run() {
        let landed = Answer::Landed {
            lease_until_ms: 2_000,
        };
        assert_eq!(
            after_claim(landed, 1, 1_999, 999),
            AfterClaim::Run {
                lease_until_ms: 2_000
            }
        );
        assert_eq!(after_claim(landed, 1, 2_000, 1_000), AfterClaim::Renew);
        assert_eq!(
            after_claim(landed, CLAIMABLE_RETRIES + 1, 2_000, 1_000),
            AfterClaim::GiveUp
        );
        // A retried claim recognised as ours: the record's lease, not the request's.
        let ours = record(Status::Pending, Some(5_000));
        let found = Found::Ours;
        let refused = Answer::Refused {
            record: &ours,
            found: &found,
        };
        assert_eq!(
            after_claim(refused, 1, 4_999, 3_999),
            AfterClaim::Run {
                lease_until_ms: 5_000
            }
        );
        assert_eq!(after_claim(refused, 1, 5_000, 4_000), AfterClaim::Renew);
    }

    /// A call re-claims a claimable record up to `CLAIMABLE_RETRIES` times, and renews a late
    /// answer as often; the next time it gives up.
    #[test]
    fn retries_stop_after_the_last_allowed_attempt() {
        let failed = record(Status::Failed, None);
        let found = Found::Claimable;
        let refused = Answer::Refused {
            record: &failed,
            found: &found,
        };
        assert_eq!(
            after_claim(refused, CLAIMABLE_RETRIES, 0, 0),
            AfterClaim::Reclaim { took_over: false }
        );
        assert_eq!(
            after_claim(refused, CLAIMABLE_RETRIES + 1, 0, 0),
            AfterClaim::Contended
        );
        let landed = Answer::Landed {
            lease_until_ms: 2_000,
        };
        assert_eq!(
            after_claim(landed, CLAIMABLE_RETRIES, 2_000, 1_000),
            AfterClaim::Renew
        );
    }

    /// A claim that failed with its fate unknown (the request may have landed) is released; one the
    /// store refused, or that never left, leaves nothing to release.
    #[test]
    fn only_a_claim_that_may_have_landed_is_released() {
        let source = || -> crate::error::BoxError { "lost".into() };
        let namespace = || "ns".to_owned();
        for may_have_landed in [
            Error::Throttled {
                namespace: namespace(),
                source: source(),
            },
            Error::Unavailable {
                namespace: namespace(),
                source: source(),
            },
            Error::RegionUnavailable {
                namespace: namespace(),
                region: "eu-west-1".to_owned(),
                source: source(),
            },
            Error::Store {
                namespace: namespace(),
                source: source(),
            },
            Error::Contended {
                namespace: namespace(),
                attempts: 4,
            },
        ] {
            assert_eq!(
                after_claim_error(&may_have_landed),
                AfterClaimError::Release,
                "{may_have_landed:?}"
            );
        }
        for nothing_written in [
            Error::PayloadMismatch {
                namespace: namespace(),
            },
            Error::InProgress {
                namespace: namespace(),
                retry_after: Duration::from_secs(1),
                retry_hint: Duration::from_secs(1),
            },
        ] {
            assert_eq!(
                after_claim_error(&nothing_written),
                AfterClaimError::Nothing,
                "{nothing_written:?}"
            );
        }
    }

    #[test]
    fn our_released_record_is_never_a_claim() {
        let released = record(Status::Failed, None);
        let found = Found::Ours;
        let answer = Answer::Refused {
            record: &released,
            found: &found,
        };
        assert_eq!(after_claim(answer, 1, 0, 0), AfterClaim::Released);
    }

    #[test]
    fn only_a_lapsed_live_claim_is_taken_over() {
        let found = Found::Claimable;
        let lapsed = record(Status::Pending, Some(10));
        let failed = record(Status::Failed, None);
        for (record, took_over) in [(&lapsed, true), (&failed, false)] {
            let answer = Answer::Refused {
                record,
                found: &found,
            };
            assert_eq!(
                after_claim(answer, 1, 100, 100),
                AfterClaim::Reclaim { took_over }
            );
        }
        // Expired: a new operation, not a takeover.
        let answer = Answer::Refused {
            record: &lapsed,
            found: &found,
        };
        assert_eq!(
            after_claim(answer, 1, 2_000_000_000, 2_000_000_000),
            AfterClaim::Reclaim { took_over: false }
        );
    }

    #[test]
    fn a_rejected_step_write_is_stored_only_if_its_own_steps_are_there() {
        let with_steps = |status, token: &str, steps: &[u8]| Record {
            token: token.into(),
            steps: Some(steps.to_vec()),
            ..record(status, Some(5_000))
        };
        let ours = with_steps(Status::Pending, "t", b"two");
        assert_eq!(
            after_rejected_steps(Some(&ours), "t", b"two"),
            AfterRejectedSteps::Stored
        );
        // Later steps than ours (a stale copy's view), or earlier ones: not this write's.
        for steps in [&b"one"[..], b"three"] {
            let record = with_steps(Status::Pending, "t", steps);
            assert_eq!(
                after_rejected_steps(Some(&record), "t", b"two"),
                AfterRejectedSteps::Lost
            );
        }
        // Our steps, but another token's claim, or no longer PENDING.
        let taken = with_steps(Status::Pending, "u", b"two");
        let failed = with_steps(Status::Failed, "t", b"two");
        for record in [Some(&taken), Some(&failed), None] {
            assert_eq!(
                after_rejected_steps(record, "t", b"two"),
                AfterRejectedSteps::Lost
            );
        }
    }

    #[test]
    fn a_rejected_failure_is_sent_again_only_on_our_pending_claim_with_compensation() {
        let ours = record(Status::Pending, Some(5_000));
        let other = Record {
            token: "u".into(),
            ..ours.clone()
        };
        let failed = record(Status::Failed, None);
        let completed = record(Status::Completed, None);
        // Our claim, its claim-time writes gone: once more, without the compensation.
        assert_eq!(
            after_rejected_fail(Some(&ours), "t", true),
            AfterRejectedFail::WithoutCompensation
        );
        // Without compensation there is nothing to drop: a rejected plain failure lost its claim.
        assert_eq!(
            after_rejected_fail(Some(&ours), "t", false),
            AfterRejectedFail::Lost
        );
        // Another caller's claim, or our token on a record that is not PENDING: never sent again.
        for (record, compensating) in [(&other, true), (&other, false), (&completed, true)] {
            assert_eq!(
                after_rejected_fail(Some(record), "t", compensating),
                AfterRejectedFail::Lost,
                "{record:?}"
            );
        }
        // Our own earlier failure landed; another's FAILED record is not ours.
        assert_eq!(
            after_rejected_fail(Some(&failed), "t", true),
            AfterRejectedFail::Recorded
        );
        assert_eq!(
            after_rejected_fail(Some(&failed), "u", true),
            AfterRejectedFail::Lost
        );
        assert_eq!(
            after_rejected_fail(None, "t", true),
            AfterRejectedFail::Lost
        );
    }

    #[test]
    fn heartbeats_are_counted_from_their_send() {
        let lease = Duration::from_secs(3);
        let every = heartbeat_interval(lease).unwrap();
        assert_eq!(every, Duration::from_secs(1));
        assert_eq!(next_heartbeat_ms(10_000, every), 11_000);
        assert_eq!(heartbeat_lease_ms(11_000, lease), 14_000);
        assert_eq!(heartbeat_interval(Duration::from_millis(999)), None);
        assert_eq!(
            after_heartbeat(Some(true), 13_999, 14_000),
            AfterHeartbeat::Extended
        );
        assert_eq!(
            after_heartbeat(Some(true), 14_000, 14_000),
            AfterHeartbeat::ExtendedLate
        );
        assert_eq!(after_heartbeat(Some(false), 0, 0), AfterHeartbeat::Stop);
        assert_eq!(after_heartbeat(None, 0, 0), AfterHeartbeat::Retry);
    }

    #[test]
    fn steps_are_resumed_unless_new_or_restarted_after_a_failure() {
        let steps = super::super::steps::Stored::default().encode();
        let live = |status| Record {
            steps: Some(steps.clone()),
            ..record(status, Some(10))
        };
        let now = 1_000;
        for restart in [false, true] {
            assert_eq!(
                steps_found(&record(Status::Failed, None), now, restart),
                StepsFound::Fresh,
                "no steps"
            );
            let expired = live(Status::Failed);
            assert_eq!(
                steps_found(&expired, (expired.expires_at_s + 1) * 1000, restart),
                StepsFound::Fresh,
                "expired: a new operation"
            );
            assert_eq!(
                steps_found(&live(Status::Pending), now, restart),
                StepsFound::Resume
            );
        }
        assert_eq!(
            steps_found(&live(Status::Failed), now, false),
            StepsFound::Resume
        );
        assert_eq!(
            steps_found(&live(Status::Failed), now, true),
            StepsFound::Restart
        );
        let panicked = Record {
            error: Some("panicked: boom".into()),
            ..live(Status::Failed)
        };
        assert_eq!(steps_found(&panicked, now, true), StepsFound::ResumeFailure);
        let unreadable = Record {
            steps: Some(b"not steps".to_vec()),
            ..live(Status::Failed)
        };
        assert_eq!(
            steps_found(&unreadable, now, true),
            StepsFound::ResumeFailure,
            "steps this version cannot read pin the operation"
        );
        assert!(steps_releasable(false, false));
        assert!(steps_releasable(false, true));
        assert!(steps_releasable(true, false));
        assert!(!steps_releasable(true, true));
    }

    #[test]
    fn a_release_fails_a_landed_claim_and_marks_any_other_record() {
        use ReleaseStep::{Fail, Mark, MarkRecord};
        // `record` is under token "t": ours here.
        let ours = record(Status::Pending, Some(10));
        let released = Record {
            released: vec!["t".into()],
            released_until_ms: Some(5_000),
            released_through: None,
            ..record(Status::Failed, None)
        };
        // Failed by our release but without our token among the released ones: marked next.
        let failed = record(Status::Failed, None);
        let theirs = Record {
            token: "other".into(),
            ..record(Status::Failed, None)
        };
        let lapsed = Record {
            token: "other".into(),
            ..record(Status::Pending, Some(10))
        };
        let marked = Record {
            released: vec!["t".into()],
            released_until_ms: Some(5_000),
            released_through: None,
            ..theirs.clone()
        };
        assert_eq!(after_release(Fail, true, None, "t", 0, 0), Some(MarkRecord));
        assert_eq!(
            after_release(Fail, false, Some(&failed), "t", 0, 0),
            Some(MarkRecord)
        );
        for step in [Mark, MarkRecord] {
            assert_eq!(after_release(step, true, None, "t", 0, 0), None, "{step:?}");
        }
        for step in [Fail, Mark, MarkRecord] {
            // Our token on our released record, or on another record: the claim is refused already.
            assert_eq!(after_release(step, false, Some(&released), "t", 0, 0), None);
            assert_eq!(after_release(step, false, Some(&marked), "t", 0, 0), None);
        }
        assert_eq!(after_release(Fail, false, None, "t", 0, 0), Some(Mark));
        assert_eq!(
            after_release(MarkRecord, false, None, "t", 0, 0),
            Some(Mark)
        );
        assert_eq!(
            after_release(Mark, false, Some(&ours), "t", 0, 0),
            Some(Fail)
        );
        assert_eq!(
            after_release(MarkRecord, false, Some(&ours), "t", 0, 0),
            Some(Fail)
        );
        for other in [&theirs, &lapsed] {
            assert_eq!(
                after_release(Fail, false, Some(other), "t", 0, 0),
                Some(MarkRecord)
            );
            assert_eq!(
                after_release(Mark, false, Some(other), "t", 0, 0),
                Some(MarkRecord)
            );
            // Rejected by a record that changed since it was read: marked again from the new one.
            assert_eq!(
                after_release(MarkRecord, false, Some(other), "t", 0, 0),
                Some(MarkRecord)
            );
        }
        assert_eq!(
            release_mark_lifetime(Duration::from_mins(1), Duration::from_hours(24)),
            Duration::from_mins(60 * 24 + 1)
        );
    }

    #[test]
    fn a_deadline_shortens_the_lease_and_refuses_a_claim_with_less_than_the_floor_left() {
        let lease = Duration::from_mins(1);
        assert_eq!(deadline_lease(lease, None, 10_000), lease);
        assert_eq!(
            deadline_lease(lease, Some(13_000), 10_000),
            Duration::from_secs(3)
        );
        assert_eq!(deadline_lease(lease, Some(100_000), 10_000), lease);
        assert_eq!(too_close_to_deadline(None, 10_000), None);
        assert_eq!(too_close_to_deadline(Some(11_000), 10_000), None);
        assert_eq!(
            too_close_to_deadline(Some(10_999), 10_000),
            Some(Duration::from_millis(999))
        );
        assert_eq!(
            too_close_to_deadline(Some(5_000), 10_000),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn only_a_live_completed_record_takes_no_mark() {
        use ReleaseStep::{Fail, Mark, MarkRecord};
        let full = Record {
            token: "other".into(),
            released: (0..crate::MAX_RELEASED).map(|i| format!("r{i}")).collect(),
            released_until_ms: Some(5_000),
            released_through: None,
            ..record(Status::Failed, None)
        };
        let completed = Record {
            token: "other".into(),
            expires_at_s: 10,
            ..record(Status::Completed, None)
        };
        let through = Record {
            released_through: Some("t5".into()),
            ..full.clone()
        };
        for step in [Fail, Mark, MarkRecord] {
            // Full, some of them can still land, or all stale: marked (through, or replaced).
            for now_ms in [5_000, 5_001] {
                assert_eq!(
                    after_release(step, false, Some(&full), "t", now_ms, 0),
                    Some(MarkRecord)
                );
            }
            // Already refused by its `released_through`; a greater token is not.
            assert_eq!(after_release(step, false, Some(&through), "t4", 0, 0), None);
            assert_eq!(after_release(step, false, Some(&through), "t5", 0, 0), None);
            assert_eq!(
                after_release(step, false, Some(&through), "t6", 0, 0),
                Some(MarkRecord)
            );
            // ... until the claim's end: past it, the end and the expiry are raised.
            assert_eq!(
                after_release(step, false, Some(&through), "t4", 0, 5_001),
                Some(MarkRecord)
            );
            // Live COMPLETED: final while it outlives the claim; kept until the claim's end when it
            // would expire before (its expiry raised); expired: replaced by a mark.
            assert_eq!(
                after_release(step, false, Some(&completed), "t", 9_999, 10_000),
                None
            );
            assert_eq!(
                after_release(step, false, Some(&completed), "t", 9_999, 10_001),
                Some(MarkRecord)
            );
            assert_eq!(
                after_release(step, false, Some(&completed), "t", 11_000, 0),
                Some(Mark)
            );
        }
    }

    #[test]
    fn a_release_sends_again_what_failed_until_its_claim_is_over() {
        use crate::StoreError;
        let unavailable = StoreError::Unavailable("a brief outage".into());
        let throttled = StoreError::Throttled("slow down".into());
        assert_eq!(
            release_retry(&unavailable, 0, 1_000, 2_000),
            Some(Duration::from_millis(50))
        );
        assert_eq!(
            release_retry(&throttled, 1, 1_999, 2_000),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            release_retry(&unavailable, 5, 1_000, 2_000),
            Some(Duration::from_millis(1_600))
        );
        for failures in [6, 40, u32::MAX] {
            assert_eq!(
                release_retry(&unavailable, failures, 1_000, 2_000),
                Some(Duration::from_secs(2))
            );
        }
        // A region's outage, as a routed store reports it, passes too.
        let region = StoreError::RegionUnavailable {
            region: "home".to_owned(),
            source: "a brief outage".into(),
        };
        assert_eq!(
            release_retry(&region, 0, 1_000, 2_000),
            Some(Duration::from_millis(50))
        );
        // The claim is over: nothing to keep out.
        assert_eq!(release_retry(&unavailable, 0, 2_000, 2_000), None);
        // An error that does not pass.
        let corrupt = StoreError::Corrupt("not a record".into());
        assert_eq!(release_retry(&corrupt, 0, 1_000, 2_000), None);
    }

    #[test]
    fn a_mark_outlives_the_claim_it_keeps_out_and_replaces_only_stale_tokens() {
        use crate::store::Marking;
        let hold = release_hold_until(10_000, Duration::from_secs(3), Duration::from_secs(1));
        assert_eq!(hold, 14_000);
        let seen = Seen {
            until_ms: Some(12_000),
            expires_at_s: 11,
            full: false,
            refuses: false,
            completed: false,
        };
        let crate::store::Change::MarkReleased {
            released_until_ms,
            expires_at_s,
            seen_until_ms,
            seen_expires_at_s,
            marking,
            ..
        } = mark(seen, 10_000, hold)
        else {
            panic!("a mark")
        };
        assert_eq!((released_until_ms, expires_at_s), (14_000, 14));
        assert_eq!(
            (seen_until_ms, seen_expires_at_s, marking),
            (Some(12_000), 11, Marking::Join)
        );
        // Never earlier than what the record holds.
        let later = Seen {
            until_ms: Some(20_000),
            expires_at_s: 30,
            full: false,
            refuses: false,
            completed: false,
        };
        assert!(matches!(
            mark(later, 10_000, hold),
            crate::store::Change::MarkReleased {
                released_until_ms: 20_000,
                expires_at_s: 30,
                marking: Marking::Join,
                ..
            }
        ));
        // Full: raised through the token while any can still hold the key (the end never earlier);
        // replaced once stale, and then the end is the new claim's alone.
        let full = Seen {
            full: true,
            ..later
        };
        assert!(matches!(
            mark(full, 20_000, hold),
            crate::store::Change::MarkReleased {
                released_until_ms: 20_000,
                marking: Marking::Through,
                ..
            }
        ));
        // Tokens whose end was never kept are never judged stale.
        let unknown = Seen {
            until_ms: None,
            ..full
        };
        assert!(matches!(
            mark(unknown, u64::MAX, hold),
            crate::store::Change::MarkReleased {
                marking: Marking::Through,
                ..
            }
        ));
        assert!(matches!(
            mark(full, 20_001, 25_000),
            crate::store::Change::MarkReleased {
                released_until_ms: 25_000,
                marking: Marking::Replace,
                ..
            }
        ));
        // A COMPLETED record only has its expiry raised to the claim's end.
        let completed = Seen {
            until_ms: None,
            expires_at_s: 11,
            full: false,
            refuses: false,
            completed: true,
        };
        assert!(matches!(
            mark(completed, 10_000, hold),
            crate::store::Change::MarkReleased {
                expires_at_s: 14,
                seen_expires_at_s: 11,
                marking: Marking::KeepCompleted,
                ..
            }
        ));
    }

    #[test]
    fn a_drop_releases_only_a_claim_that_no_body_used() {
        assert_eq!(on_drop(Stage::Claiming, true), OnDrop::Release);
        assert_eq!(on_drop(Stage::Claiming, false), OnDrop::KeepClaim);
        assert_eq!(on_drop(Stage::Running, true), OnDrop::KeepBody);
        assert_eq!(on_drop(Stage::Waiting, true), OnDrop::Nothing);
        assert_eq!(on_drop(Stage::Done, true), OnDrop::Nothing);
    }
}
