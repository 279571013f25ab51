//! An exhaustive model of the protocol, checked with `stateright`.
//!
//! Three workers call one operation on one key, held by one linearizable store (the memory store's
//! rules). Every interleaving of their steps is explored, together with the faults the protocol must
//! survive: a worker crashes at any step, a request is applied but its response is lost (and the SDK
//! sends it again), heartbeats stop, time passes (leases lapse, records expire and are purged), the
//! wait loop polls or gives up, a completion's writes keep failing until the worker gives up, and each
//! worker's clock is off by up to the configured skew margin.
//!
//! The model does not restate the protocol's rules: every decision goes through the runtime's own code.
//! What it takes from the runtime, exactly:
//!
//! - from the handler: the claim's times and the skew margin ([`handler::claim_times`],
//!   [`handler::judged_ms`]), what a returned record means ([`handler::examine`]), expiries
//!   ([`handler::expiry_s`], [`handler::failed_lifetime`], [`handler::failure_keeps_record`]), the
//!   release's text ([`handler::RELEASED`]), how many claimable records a call re-claims
//!   ([`CLAIMABLE_RETRIES`]), the store's error of a vanished record ([`handler::store_error`]), and
//!   the stages a call is in ([`Stage`]);
//! - from the handler's decisions (`handler/decide.rs`), every "what next": after a claim's answer
//!   ([`decide::after_claim`]: run, renew, released, replay, reclaim, in progress, contended), after a
//!   claim that failed with its fate unknown ([`decide::after_claim_error`]), what leaving a call does
//!   at each stage ([`decide::on_drop`]), after a rejected completion or failure
//!   ([`decide::after_rejected_complete`], [`decide::after_rejected_fail`], including the failure
//!   recorded again without its compensation), and a running body's heartbeats (when the next one goes,
//!   [`decide::heartbeat_interval`] and [`decide::next_heartbeat_ms`]; the lease it asks for,
//!   [`decide::heartbeat_lease_ms`]; what its answer means, [`decide::after_heartbeat`]), the writes
//!   of a release and their order ([`decide::after_release`], built by [`handler::release_change`]),
//!   through [`Steps`], what a claim does with stored steps ([`decide::steps_found`]) and whether
//!   a dropped claim with steps is released ([`decide::steps_releasable`]), and the write an
//!   operator's release makes ([`decide::operator_release`]);
//! - from the store: what it admits, the memory store's [`claimed`] and [`transitioned`] (which rest
//!   on [`Record::is_claimable`] and [`Record::released_token`], write a release's mark where there is
//!   no record and leave a released token on any other), whether a
//!   claim needs a record ([`needs_record`]) and the error when it is gone ([`vanished`]); the
//!   claim-with-writes fallback from [`Record::is_claimable_keeping_writes`];
//! - for steps, what [`Steps`] and its stored form decide (below), and the keys [`Steps::key`] derives
//!   ([`steps::step_key`]).
//!
//! Change one of them and the model checks the change. What the model still writes itself is the
//! plumbing between a decision and the I/O it names, as the handler's `acquire` does: which stage each
//! of its phases is (a detached body's caller holds nothing), that a renewal resumes the steps of the
//! record it renews and a reclaim those [`Steps::builds_on`] keeps, that a claim vanished within the
//! retries claims afresh, that the heartbeats start from the claim's send (its lease end less the
//! lease), and that a claim with writes refused for writes in effect is followed by one that keeps
//! them.
//!
//! What the model adds is bookkeeping the runtime does not have (who really holds the key, true time,
//! how often business writes were applied), against which the properties are stated.
//!
//! Time moves in whole seconds (lease 2 s, ttl 1 s, FAILED records kept 1 s, margin 1 s, clocks off by
//! -1, 0 or +1 s). The bounded run that `cargo test` makes explores 2 s of true time: enough for leases to
//! lapse, records to expire and be claimed again, and every fault above (the runs with waiting and with
//! interruptions, 1 s, where they find every witness already). `IDEMPOTENT_MODEL=deep` (or
//! `scripts/model --deep`) explores 5 s, and runs three callers with steps where `cargo test` runs two
//! and a call without steps; `IDEMPOTENT_MODEL_HORIZON=<seconds>` any other horizon.
//!
//! Claim-time writes: the decision to take a key with a claim that keeps its writes, and that
//! claim, are separate steps (another worker may fail and compensate between them), and the ledger of
//! the writes outlives their record's expiry: writes still in effect may be applied again only once
//! their record could have expired (`ttl` after their last use), never by a retry of a failure whose
//! record expired early. `claim_time_writes_outlive_a_failure` checks that with a `failed_ttl` shorter
//! than the `ttl`.
//!
//! Steps: with `steps`, every call's body runs two named steps, then completes. A step's effect and
//! its write are separate moves of the model (a crash between them runs that step again: the one the
//! design allows); the write ([`Change::SaveSteps`], every finished step's value) is fenced like any
//! transition, and may be applied with its response lost and then resent. What a claim does with the
//! record's steps (start afresh or resume those it saw) is [`Steps::claim`], whether to resume a
//! record found claimable [`Steps::builds_on`] (each call's [`Steps`] keeps what it remembers from one
//! claim attempt to the next, [`Remembered`]), whether the store admits it
//! [`Record::allows_steps_claim`] (in [`claimed`]), a resume that finds no record is refused
//! ([`needs_record`]) and the call claims afresh, and how long a failure's record lives
//! [`handler::failure_keeps_record`]. What a body does at each step (replay it, run it, or stop at a
//! step that must not run again) is [`Stored::prior`], and each write's steps are built as [`Steps`]
//! builds them ([`Stored::start`], [`Stored::finish`], [`Stored::finish_unstored`]). The runs also
//! explore, each with two callers:
//!
//! - the restart policy (`Steps::new(ns, true)`, [`Protocol::restart`]) with interruptions: calls
//!   dropped before their body (released, or left to lapse: [`decide::on_drop`] with
//!   [`Steps::releasable`]) and mid-body, bodies that panic (recorded as the handler records a panic,
//!   which resumes), a detached body (`steps_start_over_only_after_their_body_failed`);
//! - the restart policy with an operator's release of a claim whose worker is gone
//!   (`an_operator_release_never_starts_steps_over`);
//! - a step's value refused as it is stored (recorded as finished without a value, the body fails)
//!   and an at-most-once step ([`Steps::run_at_most_once`]: its start written before its effect)
//!   (`steps_that_must_not_run_again_never_do`);
//! - and, with a third caller, code without steps on the same key (`steps_are_resumed_never_run_again`).
//!
//! The ground truth counts each step's effects in the current *run* of the operation (a new
//! operation, or a start afresh after the body's own failure under the restart policy, begins one),
//! which steps finished (stored, or their value refused in the key's holder), which at-most-once steps
//! started, and the keys [`Steps::key`] gave. It checks that the key's holder never runs a finished
//! step, never replays one that did not finish in the same run, and runs an at-most-once step's effect
//! at most once; that no zombie stores a step; that a step's key is the same in every call of one run
//! and new in every operation another call started; and that a drop leaves no claim to lapse that
//! started its operation afresh. A zombie whose lease lapsed may still run its next step's effect:
//! that is the lease's promise, as for a whole body (and what `Steps::key` is for), not the steps'.
//!
//! Each fix that made a finished step final on every path, undone, is found (fail-fast, two threads:
//! figures vary a little from run to run):
//!
//! | fix undone | run | property that fails | counterexample | states explored |
//! |---|---|---|---|---|
//! | a value that cannot be stored is not recorded ([`Stored::finish_unstored`] marks nothing) | refused values, at most once | a finished step never runs again while its record lives | 11 moves | 15,029 |
//! | an operator's release fails a record with steps ([`decide::operator_release`] writes FAILED) | restart policy, operator | a finished step never runs again while its record lives | 10 moves | 14,262 |
//! | a claim that starts afresh after a resume keeps the call "resuming" ([`Steps::claim`] never clears it) | restart policy, interruptions | a drop leaves no claim to lapse that started its operation afresh | 11 moves | 49,363 |
//! | a claim without steps keeps an expired record's steps ([`claimed`]) | a call without steps | a replayed step finished in the same run of its operation (without that property: a step's key is new in every operation another call started, 16 moves, 423,238 states) | 16 moves | 424,957 |
//!
//! With the fixes, each run explores its whole space and finds nothing: 447,254 states (restart
//! policy, interruptions), 132,159 (restart policy, operator), 108,295 (refused values, at most once),
//! 1,871,557 (a call without steps).
//!
//! Two things the steps runs do not check, found while writing them. A run's keys derive from the
//! token of the call whose claim started it, so a call that starts two runs gives the same keys in
//! both: a call whose claim's answer was lost, taken over meanwhile (its lease lapsed, or released by
//! an operator) and then failed by the body of the call that took it over, restarts the operation
//! with the keys of the run that failed (13 moves, under the restart policy); and one whose claim's
//! resend comes after the operation expired starts the next operation with the old keys (15 moves).
//! Hence "new in every operation another call started". And the runs keep FAILED records as long as
//! any other (`failed_ttl` is the `ttl`), so they would not see a failure that resumes (a panic under
//! the restart policy, say) kept only for a short `failed_ttl`: the handler's own tests check that
//! ([`handler::failure_keeps_record`]).

//! Late step writes (`late_step_copies`): a step's write may also time out at its caller with its
//! first copy still on its way; the call sends it again, and the first copy lands at any later time.
//! A write is made only on the steps it extends ([`Change::SaveSteps`]'s `previous`, in
//! [`transitioned`]), and a resend refused because its first copy landed counts as stored
//! ([`decide::after_rejected_steps`]). `late_step_writes_never_move_steps_back` explores that with two
//! callers (86,196 unique states) and finds nothing; with a step's write made whatever steps it extends (a
//! plain overwrite under the token, as before), it finds in 14 moves (28,078 states) a late copy of the
//! first step's write landing after the second's, the holder stuck, and the next caller resuming from
//! the first step and running the second again.
//!
//! Requests in flight (`in_flight`): a claim's send, its application at the store and the reading of
//! its answer are separate moves, with time passing between them, so an answer may be read after the
//! lease it asked for; the SDK may resend a claim whose answer was lost, or give up on it; a claim sent
//! by a call that was dropped, gave up or crashed may land after that (after its release too). A
//! running body's heartbeats go on their own timer (time cannot pass a heartbeat that is due), and
//! each is sent, applied and answered in moves of its own, within `latency` ticks of its send. Polls,
//! and the writes that store an outcome or release a claim, are still applied and answered in one
//! move. These runs have two callers and none of claim-time writes, compensation, `transact` or
//! waiting, to reach the longer horizons that requests in flight need. What they check:
//!
//! - *a body starts only while its claim holds the key*: PENDING under its token, its lease not
//!   lapsed in true time;
//! - *a holder whose heartbeats land in time keeps its key*: no claim takes over a running body whose
//!   heartbeats are going, each answered within `latency`, and whose claim was answered within it too
//!   (checked where no two clocks differ by more than the margin, the design's assumption);
//! - *a call that returns before its body leaves no claim behind*: a call that never ran its body and
//!   returned holds no PENDING record (a crash may; a body cut off mid-way may);
//! - with interruptions, *a drop before the body never blocks the key* (as above), now with the
//!   dropped call's claim still in flight.
//!
//! On the handler before its decisions were taken apart (the first heartbeat an interval after the
//! body started and each next one an interval after the previous answer; a claim's answer run on
//! whatever its lease; a claim given up on left alone; a release that changes nothing where its claim
//! has not landed yet), each was found (moves from the initial state; states explored until found,
//! breadth first):
//!
//! | run | property that fails | counterexample | states explored |
//! |---|---|---|---|
//! | lease 2 s, clocks ±1 s, 3 s | a body starts only while its claim holds the key (a claim applied late and answered after its lease: the body starts on it) | 7 moves | 19,733 |
//! | lease 3 s, margin 1 s, exact clocks, heartbeats within 2 s, 7 s | a holder whose heartbeats land in time keeps its key (the next heartbeat an interval after each answer, the lease counted from the send: a duplicate takes the running body over at 5 s) | 13 moves | 209,624 |
//! | lease 2 s, 1 s | a call that returns before its body leaves no claim behind (a claim landed, its answer lost, the SDK gives up: the call errs, the claim stays PENDING) | 6 moves | 5,800 |
//! | with interruptions, 1 s | a drop before the body never blocks the key (the call is dropped with its claim in flight, the release finds nothing, then the claim lands) | 5 moves | 6,551 |
//!
//! On the decisions of `handler/decide.rs` (`requests_in_flight_keep_the_promises`, whole spaces:
//! 803,397 states explored, 213,616 unique, for late answers and heartbeats within 2 s on a 3 s lease
//! over 6 s, without claims given up; 351,489, 101,234 unique, for interruptions and claims given up,
//! lease 2 s, ttl 1 s, clocks ±1 s, over 1 s), all four hold (the last two since a record outlives
//! the released claims it keeps out, whatever its ttl:
//! `a_release_that_finds_another_record_leaves_its_token_there`). Undo either fix and the first run fails on the same property: a claim run
//! whatever its lease (`after_claim` always `Run`) on "a body starts only while its claim holds the
//! key"; heartbeats counted from each answer on "a holder whose heartbeats land in time keeps its key"
//! (6 s are needed for that: the second heartbeat's lateness shows at 6 s). The third held once a
//! claim answered too late is renewed by a fenced lease extension under its token (a renewal by claim
//! was refused by the call's own record within the margin, and the call returned `Contended` from its
//! waiting stage, unreleased: 17 to 24 moves, about 46,000 to 49,000 states; now
//! `a_claim_renewed_within_the_margin_is_not_left_pending` finds no counterexample), and a release's
//! mark lives as long as the claim it stands in for ([`decide::release_mark_lifetime`]). The last one
//! found (in the run where calls give up, 16 moves): a release wrote its mark only where there was no
//! record, so a claim in flight landed after its release when the release found another call's record
//! (`a_release_that_finds_another_record_leaves_its_token_there`, then 9 moves, 44,121 states); it
//! blocked the key for one lease. Now a release leaves its token on any record it finds
//! ([`Change::MarkReleased`]) and every claim under a released token is refused: both runs find
//! nothing. (Two threads explore breadth first: a counterexample need not be the shortest, and the
//! figures vary a little from run to run.)
//!
//! Coalescing (`coalescing_keeps_the_promises`): workers 0 and 1 are calls in one process through one
//! handle, worker 2 a process of its own. A call of the process joins the key's flight
//! ([`flight::join`]): it leads a new one, or follows, making no request; a follower reads its
//! flight with [`flight::follow`] (wait, `InProgress`, take the landed value, or join again). What
//! the model writes itself is the plumbing the handler has around them: a leader's flight is busy
//! while its claim holds the key (or it waits on another's), lands with the response of the
//! COMPLETED record it stored or read, and is handed over when its call ends any other way (a
//! failure, a lease lost, a crash, which is the whole process's). Beside every property of the
//! other runs (so: no body runs twice, no replay of a value the body did not produce), it checks
//! that a value passed on is the one the record holds as COMPLETED, and that no two bodies of the
//! process run at once; and it finds a follower getting its leader's value and one taking the lead
//! after its leader ended without a stored result. Clocks in step over 3 s, with waiting: 370,827
//! unique states (1,088,938 explored), about 20 s; failing fast: 139,451 (397,222), about 7 s.
//! Followers that always lead instead ([`flight::join`] never `Follow`, which is no coalescing at
//! all): two bodies of the process run at once after 6 moves (a lapsed lease taken over in the
//! process). A follower's answer is fixed when its flight lands: a first run that booked it when
//! the follower woke found it disagreeing with a later operation's (the record expired and was
//! claimed again in between), which is the follower's delivery, not a second result.
//!
//! What is not modelled: the DynamoDB store's condition expressions (the store conformance suite holds
//! them to the memory store's rules), payload fingerprints, the local cache, and retention; with steps,
//! claim-time writes, `transact` (and the writes a step stages), waiting, a step's own `Err` (an
//! at-most-once step's clears its start), a stored value that no longer reads as its type, and steps
//! run from several futures of one body.

use std::fmt;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Property};

use crate::error::Error;
use crate::handler::decide::{
    self, AfterClaim, AfterClaimError, AfterHeartbeat, AfterRejectedComplete, AfterRejectedFail,
    AfterRejectedSteps, OnDrop,
};
use crate::handler::{self, CLAIMABLE_RETRIES, Call, Stage, flight};
use crate::record::{Record, Status};
use crate::steps::{self, Prior, Remembered, Steps, Stored};
use crate::store::memory::{claimed, needs_record, transitioned, vanished};
use crate::store::{Change, ClaimRequest, StepsClaim, Transition};

/// One tick of true time; clocks and skews move in whole ticks.
const TICK_MS: u64 = 1000;
/// True time at the start (in ticks), far enough from zero that a slow clock never goes negative.
const START: u64 = 100;
const KEY: &str = "model#key";
const WORKERS: usize = 3;

/// What every worker's call is configured with, and the faults explored.
// Each switch is an independent feature of the call, as in the runtime's own configuration.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone)]
struct Protocol {
    /// The skew margin the runtime applies (`Idempotency::clock_skew_margin`).
    margin: Duration,
    /// How far (in ticks) each worker's clock may be off true time, either way.
    skew: u64,
    lease: Duration,
    ttl: Duration,
    failed_ttl: Duration,
    /// Duplicates that find the key PENDING wait for the result (`wait = ..`).
    wait: bool,
    /// Claims apply business writes (`claim_with`).
    claim_writes: bool,
    /// Failures commit compensating writes (`compensate_with`), which release the claim-time writes.
    compensate: bool,
    /// Completions commit the body's staged business writes (`transact`).
    transact: bool,
    /// Interruptions: a caller's future dropped before its body started (its claim released with a
    /// fenced FAILED write) or while its body runs (abandoned: the key stays PENDING until its lease), a
    /// body that panics (recorded as a failure), and worker 0's calls detached (its caller may leave at
    /// any time once the body runs; the body goes on).
    interruptions: bool,
    /// Bodies run with steps ([`Steps`]): each call's body runs [`STEPS`] in a row, storing each
    /// finished one's value, then completes; claims start afresh or resume.
    steps: bool,
    /// With steps: a step's write may time out at its caller while it is still on its way; the SDK
    /// sends it again, and the first copy lands at any later time (once per call).
    late_step_copies: bool,
    /// With steps: the operation starts over after its body fails
    /// ([`Operation::restart_steps_after_failure`](crate::Operation::restart_steps_after_failure)).
    restart: bool,
    /// With steps: a step's value may be refused when it is stored (it does not serialize, or does
    /// not fit): the step is recorded as finished without a value, and the body fails.
    refused_values: bool,
    /// With steps: the step [`AT_MOST_ONCE`] is run with [`Steps::run_at_most_once`] (its start is
    /// written before its effect).
    at_most_once: bool,
    /// With steps: the call of worker [`PLAIN`] runs code without steps on the same key (another
    /// deploy of the function).
    plain: bool,
    /// An operator may release the key's PENDING claim once its worker is gone (crashed, or its call
    /// returned), as the runbook says (`idempotent key release`, [`decide::operator_release`]).
    operator: bool,
    /// Requests in flight: a claim's send, its application at the store and the reading of its answer
    /// are separate moves, with time passing between them (an answer may come after the lease it asked
    /// for, the SDK may resend a claim whose answer was lost or give up on it, and a claim may land after
    /// its call moved on); so are a heartbeat's send, application and answer, on the heartbeat's own
    /// timer. Polls and the writes that store an outcome are still applied and answered in one move.
    in_flight: bool,
    /// With `in_flight`: within how many ticks of its send a request counts as on time. Heartbeats
    /// always land and are answered within it; a claim's answer may come later (the caller is then
    /// *late*, see [`Ghost::late`]).
    latency: u64,
    /// With `in_flight`: the SDK may give up on a claim in flight (its fate unknown), and the call
    /// returns an error.
    claims_given_up: bool,
    /// How many of the workers call (the others stay idle): a smaller space for the longer horizons
    /// that requests in flight need.
    callers: usize,
    /// Coalescing: workers below this index are calls in one process, through one handle, and join
    /// the key's flight there ([`flight::join`], [`flight::follow`]); the others are processes of their
    /// own. A crash of one of them is the process's: all of them crash. 0: no coalescing.
    in_process: usize,
    /// The last tick of true time explored.
    horizon: u64,
}

impl Protocol {
    /// The configuration with the runtime's default margin of one second, and clocks off by as much.
    fn new(horizon: u64) -> Self {
        Self {
            margin: crate::DEFAULT_CLOCK_SKEW_MARGIN,
            skew: 1,
            lease: Duration::from_secs(2),
            // Short enough that the bounded run sees COMPLETED records expire and be claimed again.
            ttl: Duration::from_secs(1),
            failed_ttl: Duration::from_secs(1),
            wait: true,
            claim_writes: true,
            compensate: true,
            transact: true,
            interruptions: false,
            steps: false,
            late_step_copies: false,
            restart: false,
            refused_values: false,
            at_most_once: false,
            plain: false,
            operator: false,
            in_flight: false,
            latency: 0,
            claims_given_up: false,
            callers: WORKERS,
            in_process: 0,
            horizon: START + horizon,
        }
    }
}

/// Where one worker's call is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    /// Not called yet.
    Idle,
    /// About to send claim attempt `attempt + 1`.
    Claiming,
    /// A claim was applied but its response was lost; the SDK sends the same request again.
    ClaimResent(Times),
    /// The key is PENDING under another claim; polling it (`wait`).
    Waiting,
    /// Holding the claim and running the body; `beating` while heartbeats extend the lease.
    Running { beating: bool },
    /// The body returned `Ok`; the completion (built once, resent as it is) is being stored.
    Completing { expires_at_s: u64 },
    /// The body returned `Err` (or panicked); the failure is being stored, with its compensation
    /// (`compensating`) or, once that was refused for want of the claim-time writes, without.
    Failing {
        expires_at_s: u64,
        panicked: bool,
        compensating: bool,
    },
    /// The call gave its claim up before the body started (its future was dropped, or it returns an
    /// error with the claim's fate unknown); the release ([`Change::Release`] with the call's token,
    /// sent from a task of its own) is on its way.
    Releasing,
    /// The call returned.
    Done(Outcome),
    /// Coalescing: the call follows the flight with this index in [`Flights::flown`], making no
    /// request.
    Following(usize),
    /// The process died.
    Crashed,
    // --- Claim-time writes: a decision and the claim that acts on it are separate moves.
    /// The claim with writes was refused because they are in effect: about to take the key with a plain
    /// claim that keeps them (with the refused attempt's times), while other workers go on.
    KeepingClaim(Times),
    // --- Steps.
    /// A step's effect happened: its value, with every step finished before it, is being stored (a
    /// fenced write); `resent`: the write was applied but its response lost, and the SDK sends it again.
    SavingStep { beating: bool, resent: bool },
    /// The body came to an at-most-once step: its start is being written, before its effect.
    MarkingStart { beating: bool },
    // --- Requests in flight.
    /// A claim request is out, sent at true tick `sent`; `answer`: what the store answered once it
    /// applied the request, not yet read.
    Awaiting {
        times: Times,
        sent: u64,
        answer: Option<Answer>,
    },
}

/// What the store answered a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Answer {
    /// The claim landed.
    Held,
    /// Refused, by this record.
    Blocked(Box<Record>),
    /// Refused for want of the record a resume of steps saw.
    Vanished,
}

impl Answer {
    fn of(result: Result<(), Option<Box<Record>>>) -> Self {
        match result {
            Ok(()) => Self::Held,
            Err(Some(blocking)) => Self::Blocked(blocking),
            Err(None) => Self::Vanished,
        }
    }
}

/// A running body's heartbeats, when requests are in flight, as its heartbeat task knows them (times
/// on the worker's clock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct Beat {
    /// When the last request that set the lease (the claim, then each heartbeat) was sent.
    sent_ms: u64,
    /// The lease's end as the holder knows it.
    lease_until_ms: u64,
    out: Option<BeatOut>,
}

impl Beat {
    /// The heartbeats of a worker now in `phase`: none unless its body runs and beats.
    fn while_in(self, phase: &Phase) -> Self {
        if *phase == (Phase::Running { beating: true }) {
            self
        } else {
            Self::default()
        }
    }
}

/// A heartbeat sent and not yet answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct BeatOut {
    /// The true tick it was sent at.
    sent: u64,
    lease_until_ms: u64,
    expires_at_s: u64,
    /// Once the store took it: whether it was applied.
    landed: Option<bool>,
}

/// The times of one claim request (what the SDK resends unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Times {
    now_ms: u64,
    lease_until_ms: u64,
    expires_at_s: u64,
}

/// How a call returned.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Outcome {
    /// The body ran and its response (this one) is stored.
    Ran(Vec<u8>),
    /// The body ran and returned `Err`.
    Failed,
    /// A stored response was returned without running the body.
    Replayed(Vec<u8>),
    /// `Error::InProgress`.
    InProgress,
    /// `Error::Contended`.
    Contended,
    /// `Error::LeaseLost`: the body ran, its result was not stored.
    LeaseLost,
    /// `Error::ResultNotStored`: the store stayed unavailable for the whole window.
    NotStored,
    /// Any other error of `examine`.
    Error,
    /// The body panicked; the caller got the panic.
    Panicked,
    /// The caller's future was dropped before the body started; its release was sent.
    Released,
    /// The caller's future was dropped while its (not detached) body ran: the body stopped.
    Abandoned,
    /// The caller's future was dropped before the body started, and its claim is left to lapse with
    /// its lease ([`OnDrop::KeepClaim`]).
    ClaimKept,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Worker {
    /// How far this worker's clock is off true time, in ticks (may be negative).
    skew: i64,
    phase: Phase,
    /// Claim attempts made so far (the handler's `attempt`).
    attempt: u32,
    /// A detached call whose caller has left: its body goes on, nobody hears of its outcome.
    caller_gone: bool,
    /// With steps: what the call knows of its operation's steps.
    steps: StepsCall,
    /// With requests in flight: a claim sent and not yet applied by the store. It may land after its
    /// call moved on (dropped, given up, crashed).
    flight: Option<Times>,
    /// With requests in flight: the running body's heartbeats.
    beat: Beat,
    /// The call's claim was answered too late to use: its next request renews it
    /// ([`decide::AfterClaim::Renew`]), a fenced write made in one move.
    renew: bool,
    /// With late step copies: the first copy of a step's write the call gave up on, still on its way
    /// (the steps it extends, and its own); it lands whatever the call does meanwhile.
    late_step: Option<(Vec<u8>, Vec<u8>)>,
    /// Coalescing: the flight this call leads, until it lands or is handed over.
    leads: Option<usize>,
}

/// Coalescing: the flights of the process's calls, as the handle's map and its flights know them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Flights {
    /// Every flight so far, by index: its phase, and the stored response it landed with.
    flown: Vec<(flight::Phase, Option<Vec<u8>>)>,
    /// The flight in the map, which a new call joins.
    current: Option<usize>,
}

/// What the model knows that no participant does: the ground truth the properties are stated against.
// Each flag is one property's independent witness.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Ghost {
    /// The worker whose claim was applied last, whatever the record's tokens say.
    owner: Option<usize>,
    /// Which workers' bodies started.
    ran: [bool; WORKERS],
    /// Claim-time writes in effect for the current operation (reset when a claim finds the record
    /// absent or truly expired).
    claim_writes: u8,
    /// Completions (and their business writes) that landed for the current operation.
    completions: u8,
    /// A claim took the key while the previous claim's lease had not truly expired and its holder was
    /// running the body (or storing its outcome): two bodies at once.
    took_live_claim: bool,
    /// A COMPLETED record changed before it expired.
    completed_changed: bool,
    /// A transition of a worker that did not hold the key landed.
    zombie_landed: bool,
    /// A replay returned something other than the response of the body that completed the record.
    bad_replay: bool,
    /// The worker whose body last returned `Ok` in the current operation (a success is final).
    returned_ok: Option<usize>,
    /// A claim of the same operation landed after a body had returned `Ok` and its caller was told the
    /// result was stored: the body would run again.
    rerun_after_success: bool,
    /// A COMPLETED record expired and the key was claimed again (a witness, not a fault).
    completed_expired: bool,
    /// Claim-time writes across expiry and stale decisions.
    writes: WritesLedger,
    /// Whose completions landed (each worker makes one call).
    applied: [bool; WORKERS],
    /// The value every success and replay of the current operation returned so far.
    answer: Option<Vec<u8>>,
    /// A success or replay returned another value than an earlier one of the same operation.
    disagreed: bool,
    /// Steps: their effects, which finished, and their keys.
    steps: StepsLedger,
    /// An operator released the key (once).
    operator_released: bool,
    /// With steps and interruptions: whose claim that landed last started its operation afresh.
    claimed_afresh: [bool; WORKERS],
    /// Requests in flight: which workers had a claim answered later than `latency` after its send.
    late: [bool; WORKERS],
    /// A body started on a claim that no longer held the key (not PENDING under its token, or its lease
    /// already lapsed in true time).
    started_lapsed: bool,
    /// A claim took the key over from a holder running its body whose heartbeats were going and whose
    /// requests all came on time.
    took_beating: bool,
    /// Coalescing: a leader passed on a response the record did not hold as COMPLETED.
    landed_unstored: bool,
    /// Coalescing: a follower got a value (a witness).
    followed: bool,
    /// Coalescing: a follower took the lead after its leader ended without a stored result (a
    /// witness).
    handed_over: bool,
}

// --- Claim-time writes: their lifetime across expiry, and stale decisions. ---

/// What the model knows about claim-time writes beyond how many are in effect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct WritesLedger {
    /// True time of the last write to the record while claim-time writes were in effect (a claim,
    /// heartbeat, completion or failure of their operation): their record must live `ttl` from it.
    touched_ms: u64,
    /// A claim applied the writes again while earlier ones were in effect and used within the `ttl`
    /// (less the skew a writer's clock may have): the FAILED record had expired too early.
    reapplied_early: bool,
    /// A completion of a call with claim-time writes landed while none were in effect.
    completed_without: bool,
    /// A compensation landed while no claim-time writes were in effect: undone twice.
    compensated_twice: bool,
}

impl Protocol {
    /// Books a claim that landed: whether it applies claim-time writes (`with_writes`), and the ground
    /// truth about the key it took.
    fn land_claim(
        &self,
        state: &mut State,
        worker: usize,
        old: Option<&Record>,
        with_writes: bool,
    ) {
        let token = token(worker);
        let new_operation = old.is_none_or(|o| state.truly_expired(o));
        if new_operation {
            state.ghost.completed_expired |= old.is_some_and(|o| o.status == Status::Completed);
            Self::new_operation(&mut state.ghost);
            // Writes in effect belong to the old operation until a claim applies them anew (a claim
            // that keeps them takes the old operation over).
            if with_writes {
                let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap();
                if state.ghost.claim_writes > 0
                    && state.true_ms() + self.skew * TICK_MS
                        < state.ghost.writes.touched_ms + ttl_ms
                {
                    state.ghost.writes.reapplied_early = true;
                }
                state.ghost.claim_writes = 0;
            }
        } else if let Some(o) = old
            && o.status == Status::Pending
            && o.lease_until_ms.is_some_and(|l| l >= state.true_ms())
            && o.token != token
            && state.ghost.owner.is_some_and(|holder| {
                // An abandoned body (its caller dropped mid-body) may have had effects: its lease
                // holds as if it still ran.
                matches!(
                    state.workers[holder].phase,
                    Phase::Running { .. }
                        | Phase::SavingStep { .. }
                        | Phase::MarkingStart { .. }
                        | Phase::Completing { .. }
                        | Phase::Failing { .. }
                        | Phase::Done(Outcome::Abandoned)
                )
            })
        {
            state.ghost.took_live_claim = true;
        }
        if self.in_flight
            && self.clocks_within_margin()
            && let Some(o) = old
            && o.status == Status::Pending
            && o.token != token
            && let Some(holder) = worker_of(&o.token)
            && state.workers[holder].phase == (Phase::Running { beating: true })
            && !state.ghost.late[holder]
        {
            state.ghost.took_beating = true;
        }
        if !new_operation
            && state
                .ghost
                .returned_ok
                .is_some_and(|w| matches!(state.workers[w].phase, Phase::Done(Outcome::Ran(_))))
        {
            state.ghost.rerun_after_success = true;
        }
        if with_writes {
            state.ghost.claim_writes += 1;
        }
        if state.ghost.claim_writes > 0 {
            state.ghost.writes.touched_ms = state.true_ms();
        }
        state.ghost.owner = Some(worker);
        state.ghost.steps.undone = false;
        if new_operation && self.steps {
            state.ghost.steps.starter = Some(worker);
        }
    }

    /// The key's record is gone: what follows is a new operation.
    fn new_operation(ghost: &mut Ghost) {
        ghost.completions = 0;
        ghost.answer = None;
        ghost.returned_ok = None;
        ghost.steps.new_run(true);
    }

    /// How long a FAILED record of `worker`'s call lives (the handler's rule): `failed_ttl`, or the
    /// operation's `ttl` when the failure leaves claim-time writes in effect, or steps a retry resumes
    /// (`panicked`: the body panicked).
    fn failed_lifetime(&self, state: &State, worker: usize, panicked: bool) -> Duration {
        let keeps = handler::failure_keeps_record(
            self.claim_writes && !self.compensate,
            self.handle(state, worker).as_ref(),
            panicked,
        );
        handler::failed_lifetime(self.failed_ttl, keeps.then_some(self.ttl))
    }

    /// Whether `worker`'s claim with writes, refused with `blocking`, is to be followed by a claim that
    /// keeps them (the handler's rule): then that claim is the worker's next step.
    fn keeps_writes(
        &self,
        state: &mut State,
        worker: usize,
        blocking: &Record,
        times: Times,
    ) -> bool {
        if !(self.claim_writes && blocking.is_claimable_keeping_writes(times.now_ms)) {
            return false;
        }
        state.workers[worker].phase = Phase::KeepingClaim(times);
        true
    }

    /// The claim that keeps claim-time writes, conditioned on their mark (the store's rule): it lands,
    /// or the worker examines the record that refused it, or (no record) claims with its writes again.
    fn keep_claim(&self, state: &mut State, worker: usize) -> bool {
        let Phase::KeepingClaim(times) = state.workers[worker].phase else {
            return false;
        };
        let token = token(worker);
        let handle = self.handle(state, worker);
        let seen = state.workers[worker].steps.resume.clone();
        let request = ClaimRequest {
            key: KEY,
            token: &token,
            attempt: state.workers[worker].attempt,
            now_ms: times.now_ms,
            lease_until_ms: times.lease_until_ms,
            expires_at_s: times.expires_at_s,
            fingerprint: None,
            keep_claim_writes: true,
            steps: steps_claim(handle.as_ref(), &token, seen.as_deref()),
        };
        Self::remember(state, worker, handle.as_ref());
        let old = state.record.clone();
        let Some(old) = old else {
            self.claim_afresh(state, worker);
            return true;
        };
        match claimed(Some(&old), &request, false) {
            Ok(new) => {
                self.land_claim(state, worker, Some(&old), false);
                state.record = Some(new);
                self.read_answer(state, worker, times, Answer::Held);
            }
            Err(blocking) => {
                let blocking = blocking.clone();
                self.examine(state, worker, &blocking);
            }
        }
        true
    }

    /// Books a transition that landed, for the claim-time writes.
    fn book_writes(&self, state: &mut State, change: &Change<'_>) {
        match change {
            Change::Complete { .. } if self.claim_writes && state.ghost.claim_writes == 0 => {
                state.ghost.writes.completed_without = true;
            }
            Change::Fail {
                release_claim_writes: true,
                ..
            } if state.ghost.claim_writes == 0 => state.ghost.writes.compensated_twice = true,
            Change::Fail {
                release_claim_writes: true,
                ..
            } => state.ghost.claim_writes -= 1,
            _ => {}
        }
        if state.ghost.claim_writes > 0 {
            state.ghost.writes.touched_ms = state.true_ms();
        }
    }

    /// The properties about claim-time writes.
    fn writes_properties() -> Vec<Property<Self>> {
        vec![
            Property::always(
                "claim-time writes are not applied again within the ttl of their last use",
                |_, s: &State| !s.ghost.writes.reapplied_early,
            ),
            Property::always(
                "a call with claim-time writes completes only with them in effect",
                |_, s: &State| !s.ghost.writes.completed_without,
            ),
            Property::always(
                "claim-time writes are never undone twice",
                |_, s: &State| !s.ghost.writes.compensated_twice,
            ),
        ]
    }
}

// --- End of the claim-time writes' part. ---

// --- Steps: a body that stores each finished step, and resumes where it stopped. ---

/// The steps of every call's body, in order; then it completes.
const STEPS: [&str; 2] = ["reserve", "charge"];
/// The step run at most once, where the model runs one so ([`Protocol::at_most_once`]).
const AT_MOST_ONCE: usize = 1;
/// The worker whose call runs code without steps, where the model runs one ([`Protocol::plain`]).
const PLAIN: usize = WORKERS - 1;

/// What a call knows of its operation's steps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct StepsCall {
    /// The steps of a record found claimable that the next claim resumes, as seen (the handler's
    /// `resume`); `None`: the claim starts afresh.
    resume: Option<Vec<u8>>,
    /// The steps as the body knows them, encoded as [`Steps`] holds them: those its claim left, and
    /// those it stored since.
    known: Vec<u8>,
    /// The index of the next step the body comes to.
    next: usize,
    /// What the call's [`Steps`] remembers from one claim attempt to the next (whether the claim
    /// last built resumes, whether the record last found is a failure it restarts after).
    remembered: Remembered,
}

/// What the model knows about steps: how often each one's effect happened, which finished, and the
/// keys [`Steps::key`] gave, in the current *run* of the operation (a new operation, or a start
/// afresh after the body failed under the restart policy, begins a new run).
// Each flag is one property's independent witness.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct StepsLedger {
    /// How many times each step's effect happened in the current run.
    effects: [u8; STEPS.len()],
    /// Which steps finished in the current run: their value stored by a step write, or their closure
    /// returned `Ok` in the key's holder and the value was refused.
    finished: [bool; STEPS.len()],
    /// Which steps finished without a value (refused) in the current run.
    unstored: [bool; STEPS.len()],
    /// Which at-most-once steps had their effect start in the current run and have not finished.
    started: [bool; STEPS.len()],
    /// The key the key's holder got for each step in the current run.
    keys: [Option<String>; STEPS.len()],
    /// The worker whose claim started the current operation, or last started its steps afresh.
    starter: Option<usize>,
    /// The keys of earlier operations, with the worker that had started each, sorted.
    spent: Vec<(String, usize)>,
    /// The FAILED record was last written by a body's own failure (its `Err`: not a panic, a release
    /// or an operator): under the restart policy, a claim that starts afresh on it begins a new run.
    undone: bool,
    /// The key's holder ran the effect of a finished step: a finished step ran again.
    rerun: bool,
    /// A step write landed under a token that was not the holder's (a zombie after a takeover).
    zombie_saved: bool,
    /// The effect of an at-most-once step happened twice in one run.
    twice: bool,
    /// The key's holder replayed a step that did not finish in the current run (an expired
    /// operation's, or one a restart dropped).
    stale_replay: bool,
    /// The key's holder got another key for a step than earlier in the same run.
    key_changed: bool,
    /// The key's holder got a key an earlier operation got, which another call had started.
    key_reused: bool,
    /// A body replayed a stored step instead of running it (a witness).
    replayed: bool,
    /// A step write was rejected and its body stopped with `LeaseLost` (a witness).
    fenced: bool,
    /// A body stopped at a step that must not run again (a witness).
    stopped: bool,
    /// A run began afresh after a failure (a witness).
    restarted: bool,
}

impl StepsLedger {
    /// A new run of the operation begins: no step ran or finished yet. `new_operation`: the key is a
    /// new operation, and every key given so far is spent (a restart after a failure begins a run of
    /// the same operation; see the header on its keys).
    fn new_run(&mut self, new_operation: bool) {
        self.effects = Default::default();
        self.finished = Default::default();
        self.unstored = Default::default();
        self.started = Default::default();
        if new_operation && let Some(starter) = self.starter {
            self.spent
                .extend(self.keys.iter().flatten().map(|key| (key.clone(), starter)));
            self.spent.sort();
            self.spent.dedup();
        }
        self.keys = Default::default();
        self.undone = false;
    }

    /// The key's holder comes to `step` (to run it or replay it) in an operation started by the claim
    /// `origin`: the key [`Steps::key`] gives it there.
    fn keyed(&mut self, step: usize, origin: &str) {
        let key = steps::step_key(KEY, origin, STEPS[step]);
        let starter = self.starter;
        self.key_reused |= self
            .spent
            .iter()
            .any(|(spent, by)| *spent == key && starter != Some(*by));
        match &self.keys[step] {
            Some(earlier) => self.key_changed |= *earlier != key,
            None => self.keys[step] = Some(key),
        }
    }

    /// Whether the run holds a step that must never run again and has nothing to replay.
    fn pinned(&self) -> bool {
        self.unstored.iter().chain(&self.started).any(|p| *p)
    }

    /// A step write of `steps` landed, by the key's holder or not.
    fn saved(&mut self, by_holder: bool, steps: &[u8]) {
        self.zombie_saved |= !by_holder;
        let stored = Stored::decode(steps).expect("the model's steps decode");
        for (i, name) in STEPS.iter().enumerate() {
            let done = stored.steps.contains_key(*name) || stored.unstored.contains_key(*name);
            self.finished[i] |= done;
            self.started[i] &= !done;
        }
    }
}

/// The steps part of a claim (the handler's choice, [`Steps::claim`]): none without steps.
fn steps_claim<'a>(
    handle: Option<&'a Steps>,
    token: &str,
    seen: Option<&'a [u8]>,
) -> StepsClaim<'a> {
    handle.map_or(StepsClaim::Untouched, |steps| steps.claim(token, seen))
}

/// The value `worker`'s body gets from step `step`: its own, so that a replay tells whose it is.
fn step_value(worker: usize, step: usize) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(&format!("{} by w{worker}", STEPS[step]))
        .expect("a string serializes")
}

impl Protocol {
    /// Whether `worker`'s call runs its body with steps.
    fn runs_steps(&self, worker: usize) -> bool {
        self.steps && !(self.plain && worker == PLAIN)
    }

    /// `worker`'s call's handle on its steps (remembering what it did at its last claim attempt),
    /// when it runs with steps.
    fn handle(&self, state: &State, worker: usize) -> Option<Steps> {
        self.runs_steps(worker).then(|| {
            Steps::recalling(
                CALL.namespace,
                self.restart,
                state.workers[worker].steps.remembered,
            )
        })
    }

    /// Keeps what `worker`'s handle remembers now, for its next claim attempt.
    fn remember(state: &mut State, worker: usize, handle: Option<&Steps>) {
        if let Some(handle) = handle {
            state.workers[worker].steps.remembered = handle.remembered();
        }
    }

    /// The steps `worker`'s claim is made on after finding `record` claimable at `judged_ms` (the
    /// handler's rule, [`Steps::builds_on`]): the record's, as seen (resumed, or restarted in place
    /// of); `None` to start afresh.
    fn resume(
        &self,
        state: &mut State,
        worker: usize,
        record: &Record,
        judged_ms: u64,
    ) -> Option<Vec<u8>> {
        let handle = self.handle(state, worker)?;
        let builds_on = handle.builds_on(record, judged_ms);
        Self::remember(state, worker, Some(&handle));
        if builds_on {
            record.steps.clone()
        } else {
            None
        }
    }

    /// `worker`'s claim landed (or was found ours) and [`decide::after_claim`] said run, on a lease
    /// until `lease_until_ms`: its body starts, from the steps the claim left (`stored`; `None`: the
    /// operation's initial steps, as [`Steps::begin`] takes them).
    fn begin(
        &self,
        state: &mut State,
        worker: usize,
        stored: Option<Vec<u8>>,
        lease_until_ms: u64,
    ) {
        state.ghost.ran[worker] = true;
        let now_ms = state.true_ms();
        let holds = state.record.as_ref().is_some_and(|r| {
            r.status == Status::Pending
                && r.token == token(worker)
                && r.lease_until_ms.is_some_and(|l| l >= now_ms)
        });
        // Booked only where the property is checked: a flag nobody reads would split states.
        state.ghost.started_lapsed |= self.in_flight && !holds;
        let handle = self.handle(state, worker);
        let w = &mut state.workers[worker];
        w.phase = Phase::Running { beating: true };
        if self.in_flight {
            // As the heartbeat task starts: the claim that set the lease was sent a lease before its end.
            w.beat = Beat {
                sent_ms: lease_until_ms.saturating_sub(millis(self.lease)),
                lease_until_ms,
                out: None,
            };
        }
        if let Some(handle) = handle {
            w.steps = StepsCall {
                resume: None,
                known: stored.unwrap_or_else(|| handle.initial(&token(worker)).to_vec()),
                next: 0,
                remembered: w.steps.remembered,
            };
        }
    }

    /// A resume found no record: the handler claims afresh, within its claimable retries; past them
    /// the call returns the store's error.
    fn claim_afresh(&self, state: &mut State, worker: usize) {
        let w = &mut state.workers[worker];
        w.steps.resume = None;
        if w.attempt <= CLAIMABLE_RETRIES {
            w.phase = Phase::Claiming;
        } else {
            let error = crate::handler::store_error(CALL.namespace, vanished());
            self.fail_claim(state, worker, &error, Outcome::Error);
        }
    }

    /// The body comes to its next step ([`Steps::run`]): what earlier calls left of each step
    /// ([`Stored::prior`]) says whether it is replayed, runs, or stops the body (a step that must not
    /// run again: the body returns the error). A step that runs at most once has its start written
    /// first ([`Steps::run_at_most_once`]); any other runs its effect, whose value is then stored.
    fn step(&self, state: &mut State, worker: usize) {
        let Phase::Running { beating } = state.workers[worker].phase else {
            return;
        };
        let w = &mut state.workers[worker];
        let known = Stored::decode(&w.steps.known).expect("the model's steps decode");
        while let Some(name) = STEPS.get(w.steps.next) {
            match known.prior(name) {
                Prior::Run => break,
                Prior::Replay(_) => {
                    let step = w.steps.next;
                    w.steps.next += 1;
                    let holder = state.ghost.owner == Some(worker);
                    let ledger = &mut state.ghost.steps;
                    ledger.replayed = true;
                    if holder {
                        ledger.stale_replay |= !ledger.finished[step];
                        ledger.keyed(step, &known.origin);
                    }
                }
                Prior::NotStored(_) | Prior::Interrupted | Prior::StagedWrites => {
                    state.ghost.steps.stopped = true;
                    self.body_returns(state, worker, false);
                    return;
                }
            }
        }
        match w.steps.next {
            step if step >= STEPS.len() => {}
            AT_MOST_ONCE if self.at_most_once => w.phase = Phase::MarkingStart { beating },
            _ => self.effect(state, worker, beating),
        }
    }

    /// The effect of `worker`'s next step happens, with the key [`Steps::key`] gives it; its value is
    /// then to be stored.
    fn effect(&self, state: &mut State, worker: usize, beating: bool) {
        let w = &mut state.workers[worker];
        let step = w.steps.next;
        w.phase = Phase::SavingStep {
            beating,
            resent: false,
        };
        let origin = Stored::decode(&w.steps.known)
            .expect("the model's steps decode")
            .origin;
        let holder = state.ghost.owner == Some(worker);
        let ledger = &mut state.ghost.steps;
        if self.at_most_once && step == AT_MOST_ONCE {
            ledger.twice |= ledger.effects[step] > 0;
            ledger.started[step] |= holder;
        }
        ledger.effects[step] += 1;
        // A zombie (its lease lapsed, the key taken over) may still run its next step: the lease's
        // promise, as for a whole body; what it may not do is store it.
        if !holder {
            return;
        }
        ledger.rerun |= ledger.finished[step];
        ledger.keyed(step, &origin);
    }

    /// The start of an at-most-once step is written ([`Stored::start`], fenced as any step write);
    /// once stored, its effect happens. Rejected: `LeaseLost`, the step does not run.
    fn mark_start(&self, state: &mut State, worker: usize) -> bool {
        let Phase::MarkingStart { beating } = state.workers[worker].phase else {
            return false;
        };
        let (previous, bytes) = Self::step_write(state, worker, Stored::start);
        if self.write_steps(state, worker, &previous, &bytes) {
            state.workers[worker].steps.known = bytes;
            self.effect(state, worker, beating);
        } else {
            state.ghost.steps.fenced = true;
            state.workers[worker].phase = Phase::Done(Outcome::LeaseLost);
        }
        true
    }

    /// A fenced step write of `bytes` over `previous` by `worker`: whether it is stored (applied, or
    /// refused because an earlier copy landed: [`decide::after_rejected_steps`]).
    fn write_steps(&self, state: &mut State, worker: usize, previous: &[u8], bytes: &[u8]) -> bool {
        let change = Change::SaveSteps {
            steps: bytes,
            previous,
        };
        self.transition(state, worker, change)
            || decide::after_rejected_steps(state.record.as_ref(), &token(worker), bytes)
                == AfterRejectedSteps::Stored
    }

    /// The step's write ([`Change::SaveSteps`]: every step the body knows finished, and this one),
    /// fenced by the call's claim. Rejected: `LeaseLost`, the body stops at its step.
    fn save_step(&self, state: &mut State, worker: usize, lost: bool) -> bool {
        let Phase::SavingStep { beating, .. } = state.workers[worker].phase else {
            return false;
        };
        let (previous, bytes) = Self::value_write(state, worker);
        let change = Change::SaveSteps {
            steps: &bytes,
            previous: &previous,
        };
        let applied = self.transition(state, worker, change);
        // Refused, it may still be stored: the request's earlier copy landed (the handler's rule).
        let stored = applied
            || decide::after_rejected_steps(state.record.as_ref(), &token(worker), &bytes)
                == AfterRejectedSteps::Stored;
        let w = &mut state.workers[worker];
        match (stored, lost) {
            // The SDK sends the same request again.
            (true, true) if applied => {
                w.phase = Phase::SavingStep {
                    beating,
                    resent: true,
                };
            }
            (true, false) => {
                w.steps.known = bytes;
                w.steps.next += 1;
                w.phase = Phase::Running { beating };
            }
            (_, true) => return false,
            (false, false) => {
                state.ghost.steps.fenced = true;
                w.phase = Phase::Done(Outcome::LeaseLost);
            }
        }
        true
    }

    /// The step's value is refused as it is stored (it does not serialize, or does not fit): the
    /// step finished, so it is recorded as finished without a value ([`Stored::finish_unstored`], a
    /// fenced write whose failure is only logged), and the body gets the error and returns it.
    fn refuse_value(&self, state: &mut State, worker: usize) -> bool {
        let Phase::SavingStep { resent: false, .. } = state.workers[worker].phase else {
            return false;
        };
        let step = state.workers[worker].steps.next;
        if state.ghost.owner == Some(worker) {
            let ledger = &mut state.ghost.steps;
            ledger.finished[step] = true;
            ledger.unstored[step] = true;
            ledger.started[step] = false;
        }
        let (previous, bytes) = Self::step_write(state, worker, |stored, name| {
            stored.finish_unstored(name, "the value does not serialize".to_owned());
        });
        self.write_steps(state, worker, &previous, &bytes);
        self.body_returns(state, worker, false);
        true
    }

    /// A step write `worker`'s body sends for its next step, as [`Steps`] builds it: the steps it
    /// extends (those the body knows), and those it stores (those, with `change` made for the step).
    fn step_write(
        state: &State,
        worker: usize,
        change: impl FnOnce(&mut Stored, &str),
    ) -> (Vec<u8>, Vec<u8>) {
        let w = &state.workers[worker];
        let name = STEPS[w.steps.next];
        let bytes = Stored::decode(&w.steps.known)
            .expect("the model's steps decode")
            .rewritten(|stored| change(stored, name))
            .encode();
        (w.steps.known.clone(), bytes)
    }

    /// The write that stores the value of `worker`'s next step ([`Stored::finish`]).
    fn value_write(state: &State, worker: usize) -> (Vec<u8>, Vec<u8>) {
        let value = step_value(worker, state.workers[worker].steps.next);
        Self::step_write(state, worker, |stored, name| {
            stored.finish(name, value, false);
        })
    }

    /// The step's write times out at the caller (an error the handler retries) with its first copy
    /// still on its way: the call sends the same request again.
    fn delay_step(state: &mut State, worker: usize) {
        let Phase::SavingStep { beating, .. } = state.workers[worker].phase else {
            return;
        };
        let copy = Self::value_write(state, worker);
        let w = &mut state.workers[worker];
        w.late_step = Some(copy);
        w.phase = Phase::SavingStep {
            beating,
            resent: true,
        };
    }

    /// The first copy of a step's write lands, after whatever the call did since (stored later
    /// steps, crashed, lost the key): applied only if the record still holds the steps it extends.
    fn late_step_lands(&self, state: &mut State, worker: usize) {
        let Some((previous, steps)) = state.workers[worker].late_step.take() else {
            return;
        };
        let change = Change::SaveSteps {
            steps: &steps,
            previous: &previous,
        };
        self.transition(state, worker, change);
    }

    /// The moves of worker `i` (`w`) while its step's write is on its way; `resent`: the SDK sends it
    /// again.
    fn saving_step_actions(&self, i: usize, w: &Worker, resent: bool, actions: &mut Vec<Action>) {
        actions.extend([Action::SaveStep(i, false), Action::Crash(i)]);
        if !resent {
            actions.push(Action::SaveStep(i, true));
            if self.late_step_copies && w.late_step.is_none() {
                actions.push(Action::DelayStep(i));
            }
            if self.refused_values {
                actions.push(Action::RefuseValue(i));
            }
        }
    }

    /// Whether an operator may release the key's claim now: once, and, as the runbook has it, only
    /// the PENDING claim of a worker that is gone (crashed, or its call returned).
    fn operator_may_release(&self, state: &State) -> bool {
        self.operator
            && !state.ghost.operator_released
            && state.record.as_ref().is_some_and(|r| {
                r.status == Status::Pending
                    && worker_of(&r.token).is_none_or(|holder| {
                        matches!(state.workers[holder].phase, Phase::Crashed | Phase::Done(_))
                    })
            })
    }

    /// An operator releases the key's PENDING claim, as `idempotent key release` does
    /// ([`decide::operator_release`], fenced by the claim's own token).
    fn operator_release(&self, state: &mut State) -> bool {
        if !self.operator_may_release(state) {
            return false;
        }
        let Some(record) = state.record.clone() else {
            return false;
        };
        let change = decide::operator_release(&record, state.true_ms());
        let transition = Transition {
            key: KEY,
            token: &record.token,
            change,
        };
        let Some(new) = transitioned(Some(&record), &transition) else {
            return false;
        };
        state.record = Some(new);
        state.ghost.operator_released = true;
        state.ghost.steps.undone = false;
        true
    }

    /// A claim of `worker` that starts its operation afresh (`fresh`) landed on `old`: where `old` is
    /// a live FAILED record that its body's own failure wrote, under the restart policy, and nothing
    /// in the run must never run again, a new run begins (its steps may run again, with new keys).
    fn restarts(&self, state: &mut State, old: Option<&Record>, fresh: bool, undone: bool) {
        if self.restart
            && fresh
            && undone
            && !state.ghost.steps.pinned()
            && old.is_some_and(|o| o.status == Status::Failed && !state.truly_expired(o))
        {
            state.ghost.steps.new_run(false);
            state.ghost.steps.restarted = true;
        }
    }

    /// What steps must not break, and witnesses that they are resumed and fenced.
    fn steps_properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "a finished step never runs again while its record lives",
                |_, s: &State| !s.ghost.steps.rerun,
            ),
            Property::always(
                "a zombie never stores a step after a takeover",
                |_, s: &State| !s.ghost.steps.zombie_saved,
            ),
            Property::always(
                "a replayed step finished in the same run of its operation",
                |_, s: &State| !s.ghost.steps.stale_replay,
            ),
            Property::always(
                "a step's key is the same in every call of one run of its operation",
                |_, s: &State| !s.ghost.steps.key_changed,
            ),
            Property::always(
                "a step's key is new in every operation another call started",
                |_, s: &State| !s.ghost.steps.key_reused,
            ),
            Property::sometimes("a stored step is replayed", |_, s: &State| {
                s.ghost.steps.replayed
            }),
            Property::sometimes("a zombie's step write is fenced", |_, s: &State| {
                s.ghost.steps.fenced
            }),
        ];
        if self.at_most_once {
            properties.push(Property::always(
                "an at-most-once step's effect happens at most once in a run",
                |_, s: &State| !s.ghost.steps.twice,
            ));
        }
        if self.at_most_once || self.refused_values {
            properties.push(Property::sometimes(
                "a body stops at a step that must not run again",
                |_, s: &State| s.ghost.steps.stopped,
            ));
        }
        if self.restart {
            properties.push(Property::sometimes(
                "an operation starts over after its body failed",
                |_, s: &State| s.ghost.steps.restarted,
            ));
        }
        if self.interruptions {
            properties.push(Property::always(
                "a drop leaves no claim to lapse that started its operation afresh",
                |_, s: &State| {
                    (0..WORKERS).all(|i| {
                        s.workers[i].phase != Phase::Done(Outcome::ClaimKept)
                            || !holds(s, i)
                            || !s.ghost.claimed_afresh[i]
                    })
                },
            ));
        }
        if self.operator {
            properties.push(Property::sometimes(
                "an operator releases a claim",
                |_, s: &State| s.ghost.operator_released,
            ));
        }
        properties
    }
}

// --- End of the steps' part. ---

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    /// True time, in ticks.
    now: u64,
    record: Option<Record>,
    workers: Vec<Worker>,
    ghost: Ghost,
    /// Coalescing: the process's flights.
    flights: Flights,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    /// True time advances one tick.
    Tick,
    /// The table's TTL deletes the expired record.
    Purge,
    Call(usize),
    /// Send a claim attempt; `lost`: its response is lost.
    Claim(usize, bool),
    /// The SDK resends a claim whose response was lost.
    Resend(usize),
    /// A consistent read while waiting.
    Poll(usize),
    /// The wait, or the window for storing the outcome, runs out.
    GiveUp(usize),
    /// The body returns `Ok` (`true`) or `Err`.
    Body(usize, bool),
    Heartbeat(usize),
    /// Send the completion or failure; `lost`: applied, but its response is lost (the SDK resends).
    Store(usize, bool),
    Crash(usize),
    // --- Claim-time writes.
    /// Send the claim that keeps claim-time writes in effect, decided on an earlier step.
    KeepClaim(usize),
    /// The caller's future is dropped (a client hung up, a timeout): before the body, the claim is to
    /// be released; while a detached body runs, the body goes on; while another body runs, it stops.
    Drop(usize),
    /// A dropped call's release is sent.
    Release(usize),
    // --- Requests in flight.
    /// Send a claim attempt.
    Send(usize),
    /// The store applies the worker's claim in flight.
    Land(usize),
    /// The worker reads its claim's answer.
    Answer(usize),
    /// The claim's answer is lost: the SDK sends the same request again.
    LoseAnswer(usize),
    /// A running body's heartbeat is sent.
    Beat(usize),
    /// The store applies the heartbeat out.
    BeatLands(usize),
    /// The heartbeat's answer is read.
    BeatAnswer(usize),
    /// The heartbeats stop (the worker hangs, or cannot reach the store).
    Stall(usize),
    /// The body panics.
    Panic(usize),
    // --- Steps.
    /// The body comes to its next step: replays the steps its claim found finished, then runs the
    /// first unfinished one's effect.
    Step(usize),
    /// Send the step's write; `lost`: applied, but its response is lost (the SDK resends).
    SaveStep(usize, bool),
    /// The step's write times out at its caller, its first copy still on its way; the SDK resends.
    DelayStep(usize),
    /// The first copy of a step's write the call gave up on lands, whatever happened since.
    LateStepLands(usize),
    /// Send the start of an at-most-once step.
    MarkStart(usize),
    /// The step's value is refused as it is stored (it does not serialize, or does not fit).
    RefuseValue(usize),
    /// An operator releases the key's PENDING claim.
    Operator,
    // --- Coalescing.
    /// A follower wakes and reads its flight.
    Follow(usize),
}

/// The worker whose calls are detached when the model explores interruptions.
const DETACHED: usize = 0;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).expect("the model's durations fit")
}

fn token(worker: usize) -> String {
    format!("w{worker}")
}

/// The response a worker's body produces: its own, so that a replay tells whose it is.
fn response(worker: usize) -> Vec<u8> {
    format!("\"response of w{worker}\"").into_bytes()
}

fn worker_of(token: &str) -> Option<usize> {
    token.strip_prefix('w')?.parse().ok()
}

impl State {
    fn true_ms(&self) -> u64 {
        self.now * TICK_MS
    }

    fn clock_ms(&self, worker: usize) -> u64 {
        self.true_ms()
            .saturating_add_signed(self.workers[worker].skew * i64::try_from(TICK_MS).unwrap())
    }

    /// Whether `record` counts as absent in true time.
    fn truly_expired(&self, record: &Record) -> bool {
        record.is_expired(self.true_ms())
    }
}

/// What the workers' calls say about themselves (the durations are the model's own).
const CALL: Call = Call::new("model");

impl Protocol {
    /// A claim attempt by `worker` with `times`: the store's rule (with writes when the call has them).
    /// Records who holds the key. `Err`: refused, by the record that blocked it, or (`None`) for want of
    /// the record a resume of steps saw.
    fn claim(
        &self,
        state: &mut State,
        worker: usize,
        times: Times,
    ) -> Result<(), Option<Box<Record>>> {
        let token = token(worker);
        let handle = self.handle(state, worker);
        let seen = state.workers[worker].steps.resume.clone();
        let request = ClaimRequest {
            key: KEY,
            token: &token,
            attempt: state.workers[worker].attempt,
            now_ms: times.now_ms,
            lease_until_ms: times.lease_until_ms,
            expires_at_s: times.expires_at_s,
            fingerprint: None,
            keep_claim_writes: false,
            steps: steps_claim(handle.as_ref(), &token, seen.as_deref()),
        };
        Self::remember(state, worker, handle.as_ref());
        let old = state.record.clone();
        if old.is_none() && needs_record(&request) {
            return Err(None);
        }
        let with_writes = self.claim_writes;
        // A refusal because the writes are in effect is followed by a claim that keeps them, as a
        // step of its own ([`Protocol::keep_claim`]).
        let new = match claimed(old.as_ref(), &request, with_writes) {
            Ok(new) => new,
            Err(blocking) => return Err(Some(Box::new(blocking.clone()))),
        };
        let undone = state.ghost.steps.undone;
        self.land_claim(state, worker, old.as_ref(), with_writes);
        let fresh = matches!(request.steps, StepsClaim::Fresh { .. });
        self.restarts(state, old.as_ref(), fresh, undone);
        if self.steps && self.interruptions {
            state.ghost.claimed_afresh[worker] = fresh;
        }
        if self.steps && fresh {
            state.ghost.steps.starter = Some(worker);
        }
        state.record = Some(new);
        Ok(())
    }

    /// A fenced transition by `worker`: whether it was applied (if not, the record that rejected it is
    /// `state.record`, unchanged).
    fn transition(&self, state: &mut State, worker: usize, change: Change<'_>) -> bool {
        let token = token(worker);
        let transition = Transition {
            key: KEY,
            token: &token,
            change,
        };
        let Some(new) = transitioned(state.record.as_ref(), &transition) else {
            return false;
        };
        // A release where there is no record, or an expired one (which counts as absent), writes its
        // mark there: no one's claim is overwritten, and the key (its record gone) is a new
        // operation.
        if matches!(change, Change::MarkReleased { .. }) {
            // A token left on another call's record: its owner and outcome stay as they are.
        } else if state.record.is_none() || matches!(change, Change::Release { .. }) {
            Self::new_operation(&mut state.ghost);
        } else if state.ghost.owner != Some(worker) {
            state.ghost.zombie_landed = true;
        }
        if let Change::Complete { .. } = change {
            state.ghost.completions += 1;
            state.ghost.applied[worker] = true;
        }
        if let Change::SaveSteps { steps, .. } = change {
            state
                .ghost
                .steps
                .saved(state.ghost.owner == Some(worker), steps);
        }
        if !matches!(change, Change::MarkReleased { .. }) {
            self.book_writes(state, &change);
            state.ghost.steps.undone = false;
        }
        state.record = Some(new);
        true
    }

    /// What `worker` does with a record that blocked its claim (or that it polled): what it means
    /// ([`handler::examine`]), then what to do about it ([`decide::after_claim`]).
    fn examine(&self, state: &mut State, worker: usize, record: &Record) {
        let clock_ms = state.clock_ms(worker);
        let judged = handler::judged_ms(clock_ms, self.margin);
        let Ok(found) = handler::examine(&CALL, record, &token(worker), None, judged) else {
            state.workers[worker].phase = Phase::Done(Outcome::Error);
            return;
        };
        let answer = decide::Answer::Refused {
            record,
            found: &found,
        };
        let attempt = state.workers[worker].attempt;
        match decide::after_claim(answer, attempt, clock_ms, judged) {
            // Our own claim (its response lost): the body goes on from the steps it left.
            AfterClaim::Run { lease_until_ms } => {
                self.begin(state, worker, record.steps.clone(), lease_until_ms);
            }
            AfterClaim::Renew => {
                let w = &mut state.workers[worker];
                w.steps.resume = self
                    .runs_steps(worker)
                    .then(|| record.steps.clone())
                    .flatten();
                w.renew = true;
                w.phase = Phase::Claiming;
            }
            // Our own claim, never in time: given up as a claim whose fate is unknown.
            AfterClaim::GiveUp => {
                state.workers[worker].phase = Phase::Claiming;
                let error = Error::Contended {
                    namespace: CALL.namespace.to_owned(),
                    attempts: attempt,
                };
                self.fail_claim(state, worker, &error, Outcome::Contended);
            }
            AfterClaim::Released => state.workers[worker].phase = Phase::Done(Outcome::Error),
            AfterClaim::Replay => {
                let bytes = record.response.clone().unwrap_or_default();
                let author = worker_of(&record.token);
                if record.status != Status::Completed
                    || author.is_none_or(|a| !state.ghost.ran[a] || response(a) != bytes)
                {
                    state.ghost.bad_replay = true;
                }
                State::answered(&mut state.ghost, &bytes);
                state.workers[worker].phase = Phase::Done(Outcome::Replayed(bytes));
            }
            // Code without steps leaves a record whose steps live on ([`Error::StepsHeld`]).
            AfterClaim::Reclaim { .. }
                if !self.runs_steps(worker) && decide::steps_held(record, judged) =>
            {
                state.workers[worker].phase = Phase::Done(Outcome::Error);
            }
            AfterClaim::Reclaim { .. } => {
                let resume = self.resume(state, worker, record, judged);
                let w = &mut state.workers[worker];
                w.steps.resume = resume;
                w.phase = Phase::Claiming;
            }
            AfterClaim::InProgress(_) if self.wait => state.workers[worker].phase = Phase::Waiting,
            AfterClaim::InProgress(_) => {
                state.workers[worker].phase = Phase::Done(Outcome::InProgress);
            }
            // The handler reads a refusal in its waiting stage: nothing of the call's to release.
            AfterClaim::Contended => state.workers[worker].phase = Phase::Done(Outcome::Contended),
        }
    }

    /// Where `worker`'s call is, as the handler's [`Stage`] says it, for what leaving it does.
    fn stage(&self, state: &State, worker: usize) -> Stage {
        match state.workers[worker].phase {
            Phase::Claiming
            | Phase::ClaimResent(_)
            | Phase::KeepingClaim(_)
            | Phase::Awaiting { .. } => Stage::Claiming,
            Phase::Waiting => Stage::Waiting,
            // A detached body runs on its own task: its caller's future holds nothing.
            Phase::Running { .. } | Phase::SavingStep { .. } | Phase::MarkingStart { .. }
                if self.interruptions && worker == DETACHED =>
            {
                Stage::Done
            }
            Phase::Running { .. } | Phase::SavingStep { .. } | Phase::MarkingStart { .. } => {
                Stage::Running
            }
            _ => Stage::Done,
        }
    }

    /// Whether a claim of `worker`'s call may be released ([`Steps::releasable`]; always without
    /// steps).
    fn releasable(&self, state: &State, worker: usize) -> bool {
        self.handle(state, worker)
            .as_ref()
            .is_none_or(Steps::releasable)
    }

    /// `worker`'s call is left where it is (its future dropped): what [`decide::on_drop`] says.
    fn abandon(&self, state: &mut State, worker: usize) {
        let at = self.stage(state, worker);
        let releasable = self.releasable(state, worker);
        let w = &mut state.workers[worker];
        match decide::on_drop(at, releasable) {
            OnDrop::Release => w.phase = Phase::Releasing,
            // The claim (or the body that may have had effects) stays until its lease runs out.
            OnDrop::KeepClaim => w.phase = Phase::Done(Outcome::ClaimKept),
            OnDrop::KeepBody => w.phase = Phase::Done(Outcome::Abandoned),
            // A detached body goes on without its caller.
            OnDrop::Nothing => w.caller_gone = true,
        }
    }

    /// `worker`'s call returns `error` (as `outcome`) from its claim: a claim whose fate is unknown is
    /// given up as a drop would ([`decide::after_claim_error`], then [`decide::on_drop`]).
    fn fail_claim(&self, state: &mut State, worker: usize, error: &Error, outcome: Outcome) {
        let at = self.stage(state, worker);
        let gives_up = at == Stage::Claiming
            && decide::after_claim_error(error) == AfterClaimError::Release
            && decide::on_drop(at, self.releasable(state, worker)) == OnDrop::Release;
        state.workers[worker].phase = if gives_up {
            Phase::Releasing
        } else {
            Phase::Done(outcome)
        };
    }

    fn send_claim(&self, state: &mut State, worker: usize, times: Times, lost: bool) -> bool {
        match self.claim(state, worker, times) {
            Ok(()) if lost => state.workers[worker].phase = Phase::ClaimResent(times),
            // A lost response to a rejected claim teaches nothing new: the resend is rejected alike.
            Err(_) if lost => return false,
            result => self.read_answer(state, worker, times, Answer::of(result)),
        }
        true
    }

    /// The times of a claim `worker` sends now ([`handler::claim_times`]).
    fn times(&self, state: &State, worker: usize) -> Times {
        let t = handler::claim_times(
            state.clock_ms(worker),
            self.margin,
            self.lease,
            self.ttl,
            None,
        );
        Times {
            now_ms: t.now_ms,
            lease_until_ms: t.lease_until_ms,
            expires_at_s: t.expires_at_s,
        }
    }

    /// What `worker` does with the answer to its claim sent with `times`, read now.
    fn read_answer(&self, state: &mut State, worker: usize, times: Times, answer: Answer) {
        match answer {
            Answer::Held => {
                let clock_ms = state.clock_ms(worker);
                let judged = handler::judged_ms(clock_ms, self.margin);
                let landed = decide::Answer::Landed {
                    lease_until_ms: times.lease_until_ms,
                };
                let attempt = state.workers[worker].attempt;
                match decide::after_claim(landed, attempt, clock_ms, judged) {
                    AfterClaim::Run { lease_until_ms } => {
                        let seen = state.workers[worker].steps.resume.clone();
                        let left = self
                            .handle(state, worker)
                            .and_then(|handle| handle.landed(seen));
                        self.begin(state, worker, left, lease_until_ms);
                    }
                    AfterClaim::Renew => {
                        let w = &mut state.workers[worker];
                        w.renew = true;
                        w.phase = Phase::Claiming;
                    }
                    _ => {
                        let error = Error::Contended {
                            namespace: CALL.namespace.to_owned(),
                            attempts: attempt,
                        };
                        self.fail_claim(state, worker, &error, Outcome::Contended);
                    }
                }
            }
            Answer::Vanished => self.claim_afresh(state, worker),
            Answer::Blocked(blocking) if self.keeps_writes(state, worker, &blocking, times) => {}
            Answer::Blocked(blocking) => self.examine(state, worker, &blocking),
        }
    }

    /// The store applies `worker`'s claim in flight, whatever its call does meanwhile; the answer waits
    /// for a call still awaiting it.
    fn land(&self, state: &mut State, worker: usize) -> bool {
        let Some(times) = state.workers[worker].flight.take() else {
            return false;
        };
        let result = self.claim(state, worker, times);
        if let Phase::Awaiting {
            times: awaited,
            answer: answer @ None,
            ..
        } = &mut state.workers[worker].phase
            && *awaited == times
        {
            *answer = Some(Answer::of(result));
        }
        true
    }

    /// `worker` reads its claim's answer, maybe long after the store applied it.
    fn answer(&self, state: &mut State, worker: usize) -> bool {
        let Phase::Awaiting {
            times,
            sent,
            answer: Some(answer),
        } = state.workers[worker].phase.clone()
        else {
            return false;
        };
        state.ghost.late[worker] |= state.now > sent + self.latency;
        self.read_answer(state, worker, times, answer);
        true
    }

    /// A running body's heartbeat is sent, lands, or is answered: when it goes and the lease it asks
    /// for are [`decide::next_heartbeat_ms`] and [`decide::heartbeat_lease_ms`], what its answer means
    /// [`decide::after_heartbeat`].
    fn beat(&self, state: &mut State, worker: usize, action: Action) -> bool {
        let clock_ms = state.clock_ms(worker);
        let now = state.now;
        let Phase::Running { beating: true } = state.workers[worker].phase else {
            return false;
        };
        let beat = state.workers[worker].beat;
        match (action, beat.out) {
            (Action::Beat(_), None) => {
                let w = &mut state.workers[worker];
                w.beat.sent_ms = clock_ms;
                w.beat.out = Some(BeatOut {
                    sent: now,
                    lease_until_ms: decide::heartbeat_lease_ms(clock_ms, self.lease),
                    expires_at_s: handler::expiry_s(clock_ms, self.lease + self.ttl),
                    landed: None,
                });
            }
            (Action::BeatLands(_), Some(out)) if out.landed.is_none() => {
                let change = Change::ExtendLease {
                    lease_until_ms: out.lease_until_ms,
                    expires_at_s: out.expires_at_s,
                };
                let applied = self.transition(state, worker, change);
                state.workers[worker].beat.out = Some(BeatOut {
                    landed: Some(applied),
                    ..out
                });
            }
            (Action::BeatAnswer(_), Some(out)) if out.landed.is_some() => {
                let w = &mut state.workers[worker];
                w.beat.out = None;
                match decide::after_heartbeat(out.landed, clock_ms, beat.lease_until_ms) {
                    AfterHeartbeat::Extended | AfterHeartbeat::ExtendedLate => {
                        w.beat.lease_until_ms = out.lease_until_ms;
                    }
                    AfterHeartbeat::Stop => w.phase = Phase::Running { beating: false },
                    AfterHeartbeat::Retry => {}
                }
            }
            _ => return false,
        }
        true
    }

    /// A heartbeat sent, applied and answered at once (without `in_flight`): the lease it asks for is
    /// [`decide::heartbeat_lease_ms`], what its answer means [`decide::after_heartbeat`] (never late:
    /// no time passed).
    fn heartbeat(&self, state: &mut State, worker: usize) {
        let clock_ms = state.clock_ms(worker);
        let held_until_ms = state
            .record
            .as_ref()
            .and_then(|r| r.lease_until_ms)
            .unwrap_or(0);
        let change = Change::ExtendLease {
            lease_until_ms: decide::heartbeat_lease_ms(clock_ms, self.lease),
            expires_at_s: handler::expiry_s(clock_ms, self.lease + self.ttl),
        };
        let applied = self.transition(state, worker, change);
        if decide::after_heartbeat(Some(applied), clock_ms, held_until_ms) == AfterHeartbeat::Stop {
            state.workers[worker].phase = Phase::Running { beating: false };
        }
    }

    /// `worker` gives up where it is: the wait runs out, or the window for storing the outcome, or
    /// the SDK's attempts at a claim in flight (its fate unknown: [`Error::Unavailable`]).
    fn give_up(&self, state: &mut State, worker: usize) {
        let w = &mut state.workers[worker];
        match w.phase {
            Phase::Waiting | Phase::Following(_) => w.phase = Phase::Done(Outcome::InProgress),
            Phase::Awaiting { .. } => {
                let error = Error::Unavailable {
                    namespace: CALL.namespace.to_owned(),
                    source: "every attempt timed out".into(),
                };
                self.fail_claim(state, worker, &error, Outcome::Error);
            }
            _ => w.phase = Phase::Done(Outcome::NotStored),
        }
    }

    /// Whether `worker`'s next heartbeat is due and not sent.
    fn beat_due(&self, state: &State, worker: usize) -> bool {
        let w = &state.workers[worker];
        w.phase == (Phase::Running { beating: true })
            && w.beat.out.is_none()
            && decide::heartbeat_interval(self.lease).is_some_and(|every| {
                state.clock_ms(worker) >= decide::next_heartbeat_ms(w.beat.sent_ms, every)
            })
    }

    /// Whether a running body's heartbeat timer holds time back: one is due and not sent, or one out
    /// has reached the latency bound without being answered.
    fn timer_due(&self, state: &State) -> bool {
        self.in_flight
            && (0..WORKERS).any(|i| {
                let w = &state.workers[i];
                self.beat_due(state, i)
                    || (w.phase == (Phase::Running { beating: true })
                        && w.beat
                            .out
                            .is_some_and(|out| state.now >= out.sent + self.latency))
            })
    }

    fn store_outcome(&self, state: &mut State, worker: usize, lost: bool) -> bool {
        let body = response(worker);
        // As the handler records a panic (what the restart policy reads as one).
        let panic = handler::panicked(&"the body panicked");
        let (change, status, done) = match state.workers[worker].phase {
            Phase::Completing { expires_at_s } => (
                Change::Complete {
                    response: Some(&body),
                    expires_at_s,
                    replay_until_s: None,
                },
                Status::Completed,
                Outcome::Ran(body.clone()),
            ),
            Phase::Failing {
                expires_at_s,
                panicked,
                compensating,
            } => (
                Change::Fail {
                    error: if panicked { &panic } else { "the body failed" },
                    expires_at_s,
                    release_claim_writes: compensating,
                },
                Status::Failed,
                if panicked {
                    Outcome::Panicked
                } else {
                    Outcome::Failed
                },
            ),
            _ => return false,
        };
        let applied = self.transition(state, worker, change);
        // The body's own failure: under the restart policy, its operation may start over.
        state.ghost.steps.undone |= applied && done == Outcome::Failed;
        match (applied, lost) {
            // Applied, but the response was lost: the resend finds the record already moved.
            (true, true) => {}
            (true, false) => state.workers[worker].phase = Phase::Done(done),
            (false, true) => return false,
            (false, false) => {
                let token = token(worker);
                let record = state.record.as_ref();
                let w = &mut state.workers[worker];
                w.phase = match (&w.phase, status) {
                    (_, Status::Completed) => match decide::after_rejected_complete(record, &token)
                    {
                        AfterRejectedComplete::Stored => Phase::Done(done),
                        AfterRejectedComplete::Lost => Phase::Done(Outcome::LeaseLost),
                    },
                    (
                        &Phase::Failing {
                            expires_at_s,
                            panicked,
                            compensating,
                        },
                        _,
                    ) => match decide::after_rejected_fail(record, &token, compensating) {
                        AfterRejectedFail::WithoutCompensation => Phase::Failing {
                            expires_at_s,
                            panicked,
                            compensating: false,
                        },
                        // Recorded, or not ours any more: the caller gets its own error.
                        AfterRejectedFail::Recorded | AfterRejectedFail::Lost => Phase::Done(done),
                    },
                    _ => return false,
                };
            }
        }
        if let Phase::Done(Outcome::Ran(value)) = &state.workers[worker].phase {
            let value = value.clone();
            State::answered(&mut state.ghost, &value);
        }
        true
    }

    /// `worker`'s body returns, `ok` or with an error: its outcome is to be stored.
    fn body_returns(&self, state: &mut State, worker: usize, ok: bool) {
        let now_ms = state.clock_ms(worker);
        if ok {
            state.ghost.returned_ok = Some(worker);
        }
        let lifetime = self.failed_lifetime(state, worker, false);
        state.workers[worker].phase = if ok {
            Phase::Completing {
                expires_at_s: handler::expiry_s(now_ms, self.ttl),
            }
        } else {
            Phase::Failing {
                expires_at_s: handler::expiry_s(now_ms, lifetime),
                panicked: false,
                compensating: self.claim_writes && self.compensate,
            }
        };
    }

    /// `worker` renews its own claim, answered too late to use ([`decide::AfterClaim::Renew`]): the
    /// handler's fenced lease extension, then what its answer means, as for a claim's.
    fn renew(&self, state: &mut State, worker: usize) {
        // A renewal leaves the call's steps remembering the claim it renews (the handler builds the
        // steps part of an attempt's request only for a claim).
        let w = &mut state.workers[worker];
        w.renew = false;
        w.attempt += 1;
        let times = self.times(state, worker);
        let change = Change::ExtendLease {
            lease_until_ms: times.lease_until_ms,
            expires_at_s: times.expires_at_s,
        };
        if self.transition(state, worker, change) {
            self.read_answer(state, worker, times, Answer::Held);
        } else if let Some(record) = state.record.clone() {
            self.examine(state, worker, &record);
        } else {
            self.claim_afresh(state, worker);
        }
    }

    /// The release of a call that gave its claim up (dropped before its body started, or its claim's
    /// fate unknown): the runtime's own writes, in the order [`decide::after_release`] says — a fenced
    /// FAILED write with the call's token (`handler::RELEASED`), then, where there is no record, the
    /// mark a late claim of the call respects. Made in one move.
    fn release(&self, state: &mut State, worker: usize) {
        let now_ms = state.clock_ms(worker);
        // A release sends no compensation: claim-time writes stay in effect; so may steps (the
        // handler's rule for a dropped claim).
        let lifetime = handler::failed_lifetime(
            self.failed_ttl,
            (self.claim_writes || self.runs_steps(worker)).then_some(self.ttl),
        );
        let lifetimes = handler::Lifetimes {
            lifetime,
            mark_lifetime: decide::release_mark_lifetime(self.lease, self.ttl),
            hold_until_ms: decide::release_hold_until(now_ms, self.lease, self.margin),
        };
        let token = token(worker);
        let judged = handler::judged_ms(now_ms, self.margin);
        let mut step = Some(decide::ReleaseStep::Fail);
        let mut seen = None;
        // As many writes as the handler's release makes at most.
        for _ in 0..decide::RELEASE_WRITES {
            let Some(sent) = step else { break };
            let change = handler::release_change(sent, now_ms, self.margin, lifetimes, seen);
            let applied = self.transition(state, worker, change);
            // A rejected write returns the record; an applied one returns nothing, and the
            // handler then knows only what its own failure wrote.
            let found = if applied { None } else { state.record.as_ref() };
            seen = decide::seen_after(
                sent,
                applied,
                found,
                &token,
                handler::expiry_s(now_ms, lifetime),
            );
            step = decide::after_release(
                sent,
                applied,
                found,
                &token,
                judged,
                lifetimes.hold_until_ms,
            );
        }
        state.workers[worker].phase = Phase::Done(Outcome::Released);
    }
}

impl State {
    /// Notes a value a caller got as the operation's result (run or replayed).
    fn answered(ghost: &mut Ghost, value: &[u8]) {
        match &ghost.answer {
            Some(earlier) if earlier.as_slice() != value => ghost.disagreed = true,
            Some(_) => {}
            None => ghost.answer = Some(value.to_vec()),
        }
    }
}

impl Protocol {
    /// A move of a request in flight (`in_flight`): whether it can be made.
    fn move_in_flight(&self, before: &State, state: &mut State, action: Action) -> bool {
        match action {
            Action::Send(i) if state.workers[i].renew => self.renew(state, i),
            Action::Send(i) => {
                let times = self.times(before, i);
                let w = &mut state.workers[i];
                w.attempt += 1;
                w.flight = Some(times);
                w.phase = Phase::Awaiting {
                    times,
                    sent: before.now,
                    answer: None,
                };
            }
            Action::Land(i) => {
                if !self.land(state, i) {
                    return false;
                }
            }
            Action::Answer(i) => {
                if !self.answer(state, i) {
                    return false;
                }
            }
            Action::LoseAnswer(i) => {
                let w = &mut state.workers[i];
                let Phase::Awaiting { times, answer, .. } = &mut w.phase else {
                    return false;
                };
                *answer = None;
                w.flight = Some(*times);
            }
            Action::Beat(i) | Action::BeatLands(i) | Action::BeatAnswer(i) => {
                if !self.beat(state, i, action) {
                    return false;
                }
            }
            Action::Stall(i) => state.workers[i].phase = Phase::Running { beating: false },
            _ => return false,
        }
        true
    }
}

// --- Coalescing: the calls of one process on one key. ---

impl Protocol {
    /// `worker`'s call joins the key's flight in its process ([`flight::join`]): it leads a new one,
    /// or follows the one in the map. (The model's calls all have one payload.)
    fn join(state: &mut State, worker: usize) {
        let current = state.flights.current;
        match flight::join(current.map(|_| true)) {
            flight::Join::Lead => {
                let index = state.flights.flown.len();
                state.flights.flown.push((flight::Phase::Claiming, None));
                state.flights.current = Some(index);
                state.workers[worker].leads = Some(index);
                state.workers[worker].phase = Phase::Claiming;
            }
            flight::Join::Follow => {
                state.workers[worker].phase = Phase::Following(current.unwrap_or_default());
            }
            flight::Join::Alone => state.workers[worker].phase = Phase::Claiming,
        }
    }

    /// What a follower may do: wake, crash with its process, or (waiting) give up when its own wait
    /// runs out.
    fn following_actions(&self, i: usize, actions: &mut Vec<Action>) {
        actions.extend([Action::Follow(i), Action::Crash(i)]);
        if self.wait {
            actions.push(Action::GiveUp(i));
        }
    }

    /// A process's crash ends every call in it.
    fn crash_process(&self, state: &mut State) {
        for w in &mut state.workers[..self.in_process] {
            if !matches!(w.phase, Phase::Done(_) | Phase::Idle) {
                w.phase = Phase::Crashed;
            }
        }
    }

    /// A follower reads its flight ([`flight::follow`]); `None` when it has nothing to do yet.
    fn follow(&self, state: &mut State, worker: usize) -> Option<()> {
        let Phase::Following(index) = state.workers[worker].phase else {
            return None;
        };
        let (phase, landed) = state.flights.flown[index].clone();
        match flight::follow(phase, self.wait) {
            flight::Follow::Wait => return None,
            flight::Follow::InProgress => {
                state.workers[worker].phase = Phase::Done(Outcome::InProgress);
            }
            flight::Follow::Take => {
                let value = landed.unwrap_or_default();
                if worker_of_response(&value).is_none_or(|a| !state.ghost.ran[a]) {
                    state.ghost.bad_replay = true;
                }
                // Its answer was fixed when the flight landed (and booked then, in `lead`): by now
                // the record may have expired and another operation begun.
                state.ghost.followed = true;
                state.workers[worker].phase = Phase::Done(Outcome::Replayed(value));
            }
            flight::Follow::Rejoin => {
                Self::join(state, worker);
                state.ghost.handed_over |= state.workers[worker].leads.is_some();
            }
        }
        Some(())
    }

    /// What each leader's flight shows of its call, as the handler tells it (`Lead::busy` when its
    /// claim holds the key or another's is in progress, `Lead::claiming` when it claims again,
    /// `Lead::land` with the COMPLETED record it stored or read, and the hand-over when its call ends
    /// any other way).
    fn lead(state: &mut State) {
        for worker in 0..state.workers.len() {
            let Some(index) = state.workers[worker].leads else {
                continue;
            };
            let phase = match &state.workers[worker].phase {
                Phase::Idle
                | Phase::Claiming
                | Phase::ClaimResent(_)
                | Phase::KeepingClaim(_)
                | Phase::Awaiting { .. } => flight::Phase::Claiming,
                Phase::Waiting
                | Phase::Running { .. }
                | Phase::Completing { .. }
                | Phase::Failing { .. }
                | Phase::SavingStep { .. }
                | Phase::MarkingStart { .. } => flight::Phase::Busy,
                Phase::Done(Outcome::Ran(value) | Outcome::Replayed(value)) => {
                    let stored = state.record.as_ref().is_some_and(|r| {
                        r.status == Status::Completed && r.response.as_ref() == Some(value)
                    });
                    state.ghost.landed_unstored |= !stored;
                    // What the followers get: the answer of this operation, from this move on.
                    let value = value.clone();
                    for follower in &state.workers {
                        if follower.phase == Phase::Following(index) {
                            State::answered(&mut state.ghost, &value);
                        }
                    }
                    state.flights.flown[index].1 = Some(value);
                    flight::Phase::Landed
                }
                Phase::Done(_) | Phase::Crashed | Phase::Releasing | Phase::Following(_) => {
                    flight::Phase::Vacant
                }
            };
            state.flights.flown[index].0 = phase;
            if matches!(phase, flight::Phase::Landed | flight::Phase::Vacant) {
                state.workers[worker].leads = None;
                if state.flights.current == Some(index) {
                    state.flights.current = None;
                }
            }
        }
    }

    fn coalescing_properties() -> Vec<Property<Self>> {
        vec![
            Property::always(
                "coalescing never passes on a value that was not stored",
                |_, s: &State| !s.ghost.landed_unstored,
            ),
            Property::always(
                "coalescing never runs two bodies of one process at once",
                |m: &Protocol, s: &State| {
                    s.workers[..m.in_process]
                        .iter()
                        .filter(|w| {
                            matches!(
                                w.phase,
                                Phase::Running { .. }
                                    | Phase::Completing { .. }
                                    | Phase::Failing { .. }
                            )
                        })
                        .count()
                        <= 1
                },
            ),
            Property::sometimes(
                "a follower gets its leader's stored value",
                |_, s: &State| s.ghost.followed,
            ),
            Property::sometimes(
                "a follower leads once its leader ended without a stored result",
                |_, s: &State| s.ghost.handed_over,
            ),
        ]
    }
}

/// The worker whose body returns `value` ([`response`]).
fn worker_of_response(value: &[u8]) -> Option<usize> {
    (0..WORKERS).find(|&a| response(a) == value)
}

/// Whether a move changed a live COMPLETED record: only its expiry may change, and only to a
/// later one (a release whose claim could land after it keeps it that much longer,
/// `Marking::KeepCompleted`).
fn completed_changed(before: &State, after: &State) -> bool {
    let Some(old) = &before.record else {
        return false;
    };
    old.status == Status::Completed
        && !before.truly_expired(old)
        && !after.record.as_ref().is_some_and(|new| {
            new.expires_at_s >= old.expires_at_s
                && Record {
                    expires_at_s: old.expires_at_s,
                    ..new.clone()
                } == *old
        })
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // Workers are interchangeable, so one ordering of their skews stands for all.
        let skews: Vec<i64> =
            (-i64::try_from(self.skew).unwrap()..=i64::try_from(self.skew).unwrap()).collect();
        let mut states = Vec::new();
        for (i, &a) in skews.iter().enumerate() {
            for (j, &b) in skews.iter().enumerate().skip(i) {
                for &c in &skews[j..] {
                    states.push(State {
                        now: START,
                        record: None,
                        workers: [a, b, c]
                            .into_iter()
                            .map(|skew| Worker {
                                skew,
                                phase: Phase::Idle,
                                attempt: 0,
                                caller_gone: false,
                                steps: StepsCall::default(),
                                flight: None,
                                beat: Beat::default(),
                                renew: false,
                                late_step: None,
                                leads: None,
                            })
                            .collect(),
                        ghost: Ghost::default(),
                        flights: Flights::default(),
                    });
                }
            }
        }
        states
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.horizon && !self.timer_due(state) {
            actions.push(Action::Tick);
        }
        actions.extend(self.operator_may_release(state).then_some(Action::Operator));
        if state
            .record
            .as_ref()
            .is_some_and(|r| state.truly_expired(r))
        {
            actions.push(Action::Purge);
        }
        for (i, w) in state.workers.iter().enumerate() {
            if w.flight.is_some() {
                actions.push(Action::Land(i));
            }
            if w.late_step.is_some() {
                actions.push(Action::LateStepLands(i));
            }
            match &w.phase {
                Phase::Idle if i < self.callers => actions.push(Action::Call(i)),
                Phase::Claiming if self.in_flight => {
                    actions.push(Action::Send(i));
                    if self.interruptions {
                        actions.push(Action::Drop(i));
                    }
                }
                Phase::Awaiting { answer, .. } => {
                    if let Some(answer) = answer {
                        actions.push(Action::Answer(i));
                        if *answer == Answer::Held {
                            actions.push(Action::LoseAnswer(i));
                        }
                    }
                    actions.push(Action::Crash(i));
                    if self.claims_given_up {
                        actions.push(Action::GiveUp(i));
                    }
                    if self.interruptions {
                        actions.push(Action::Drop(i));
                    }
                }
                Phase::Claiming => {
                    actions.extend([Action::Claim(i, false), Action::Claim(i, true)]);
                    if self.interruptions {
                        actions.push(Action::Drop(i));
                    }
                }
                Phase::ClaimResent(_) => {
                    actions.extend([Action::Resend(i), Action::Crash(i)]);
                    if self.interruptions {
                        actions.push(Action::Drop(i));
                    }
                }
                Phase::Waiting => actions.extend([Action::Poll(i), Action::GiveUp(i)]),
                Phase::Releasing => actions.extend([Action::Release(i), Action::Crash(i)]),
                Phase::Running { beating } => {
                    // With steps, the body completes once it came past its last step.
                    if self.runs_steps(i) && w.steps.next < STEPS.len() {
                        actions.push(Action::Step(i));
                    } else {
                        actions.push(Action::Body(i, true));
                    }
                    actions.push(Action::Body(i, false));
                    if *beating && self.in_flight {
                        actions.push(Action::Stall(i));
                        match w.beat.out {
                            None if self.beat_due(state, i) => actions.push(Action::Beat(i)),
                            None => {}
                            Some(BeatOut { landed: None, .. }) => {
                                actions.push(Action::BeatLands(i));
                            }
                            Some(_) => actions.push(Action::BeatAnswer(i)),
                        }
                    } else if *beating {
                        actions.push(Action::Heartbeat(i));
                    }
                    actions.push(Action::Crash(i));
                    if self.interruptions {
                        actions.push(Action::Panic(i));
                        if !w.caller_gone {
                            actions.push(Action::Drop(i));
                        }
                    }
                }
                Phase::Completing { .. } | Phase::Failing { .. } => actions.extend([
                    Action::Store(i, false),
                    Action::Store(i, true),
                    Action::GiveUp(i),
                    Action::Crash(i),
                ]),
                Phase::Idle | Phase::Done(_) | Phase::Crashed => {}
                Phase::Following(_) => self.following_actions(i, actions),
                Phase::KeepingClaim(_) => actions.extend([Action::KeepClaim(i), Action::Crash(i)]),
                Phase::SavingStep { resent, .. } => {
                    self.saving_step_actions(i, w, *resent, actions);
                }
                Phase::MarkingStart { .. } => {
                    actions.extend([Action::MarkStart(i), Action::Crash(i)]);
                }
            }
        }
    }

    fn next_state(&self, before: &State, action: Action) -> Option<State> {
        let mut state = before.clone();
        match action {
            Action::Tick => state.now += 1,
            Action::Purge => state.record = None,
            Action::Call(i) if i < self.in_process => Self::join(&mut state, i),
            Action::Call(i) => state.workers[i].phase = Phase::Claiming,
            Action::Follow(i) => self.follow(&mut state, i)?,
            Action::Crash(i) if i < self.in_process => self.crash_process(&mut state),
            Action::Claim(i, lost) if state.workers[i].renew => {
                // A renewal is one move: a lost answer to it is not modelled.
                if lost {
                    return None;
                }
                self.renew(&mut state, i);
            }
            Action::Claim(i, lost) => {
                state.workers[i].attempt += 1;
                let times = self.times(&state, i);
                if !self.send_claim(&mut state, i, times, lost) {
                    return None;
                }
            }
            Action::Resend(i) => {
                let Phase::ClaimResent(times) = state.workers[i].phase else {
                    return None;
                };
                self.send_claim(&mut state, i, times, false);
            }
            Action::Poll(i) => match state.record.clone() {
                Some(record) => self.examine(&mut state, i, &record),
                // Deleted by TTL: the key is new.
                None => state.workers[i].phase = Phase::Claiming,
            },
            Action::GiveUp(i) => self.give_up(&mut state, i),
            Action::Body(i, ok) => self.body_returns(&mut state, i, ok),
            Action::Panic(i) => {
                let now_ms = state.clock_ms(i);
                state.workers[i].phase = Phase::Failing {
                    expires_at_s: handler::expiry_s(now_ms, self.failed_lifetime(&state, i, true)),
                    panicked: true,
                    compensating: self.claim_writes && self.compensate,
                };
            }
            Action::Drop(i) => self.abandon(&mut state, i),
            Action::Release(i) => self.release(&mut state, i),
            Action::Heartbeat(i) => self.heartbeat(&mut state, i),
            Action::Store(i, lost) => {
                if !self.store_outcome(&mut state, i, lost) {
                    return None;
                }
            }
            Action::Crash(i) => state.workers[i].phase = Phase::Crashed,
            Action::KeepClaim(i) => {
                if !self.keep_claim(&mut state, i) {
                    return None;
                }
            }
            Action::Step(i) => self.step(&mut state, i),
            Action::MarkStart(i) => {
                if !self.mark_start(&mut state, i) {
                    return None;
                }
            }
            Action::RefuseValue(i) => {
                if !self.refuse_value(&mut state, i) {
                    return None;
                }
            }
            Action::Operator => {
                if !self.operator_release(&mut state) {
                    return None;
                }
            }
            Action::SaveStep(i, lost) => {
                if !self.save_step(&mut state, i, lost) {
                    return None;
                }
            }
            Action::DelayStep(i) => Self::delay_step(&mut state, i),
            Action::LateStepLands(i) => self.late_step_lands(&mut state, i),
            // The moves of requests in flight.
            _ => {
                if !self.move_in_flight(before, &mut state, action) {
                    return None;
                }
            }
        }
        // Heartbeats stop with the body's run.
        for w in &mut state.workers {
            w.beat = w.beat.while_in(&w.phase);
        }
        Self::lead(&mut state);
        if completed_changed(before, &state) {
            state.ghost.completed_changed = true;
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = Self::writes_properties();
        properties.extend([
            Property::always("no second body while a claim is live", |_, s: &State| {
                !s.ghost.took_live_claim
            }),
            Property::always(
                "a COMPLETED record never changes before it expires, but to live longer",
                |_, s: &State| !s.ghost.completed_changed,
            ),
            Property::always(
                "a replay returns the response of the body that completed it",
                |_, s: &State| !s.ghost.bad_replay,
            ),
            Property::always(
                "a fenced (zombie) transition never lands",
                |_, s: &State| !s.ghost.zombie_landed,
            ),
            Property::always(
                "a body whose success was stored never runs again while its record lives",
                |_, s: &State| !s.ghost.rerun_after_success,
            ),
            Property::always("at most one completion per operation", |_, s: &State| {
                s.ghost.completions <= 1
            }),
            Property::always(
                "claim-time writes are in effect at most once",
                |_, s: &State| s.ghost.claim_writes <= 1,
            ),
            Property::always(
                "business writes are committed iff the record is COMPLETED",
                |m: &Protocol, s: &State| {
                    !m.transact
                        || s.record.as_ref().is_none_or(|r| {
                            s.truly_expired(r)
                                || (r.status == Status::Completed) == (s.ghost.completions == 1)
                        })
                },
            ),
            Property::always(
                "once every worker stopped, the key is claimable after lease + margin + skew",
                |m: &Protocol, s: &State| m.claimable_after_everyone_stopped(s),
            ),
            Property::always(
                "a caller told its result is stored had its completion applied",
                |_, s: &State| {
                    s.workers.iter().enumerate().all(|(i, w)| {
                        !matches!(w.phase, Phase::Done(Outcome::Ran(_))) || s.ghost.applied[i]
                    })
                },
            ),
            Property::always(
                "every success and every replay of one operation agree",
                |_, s: &State| !s.ghost.disagreed,
            ),
            // Witnesses that the faults are really reached, so that the properties are not vacuous.
            Property::sometimes("a stored response is replayed", |_, s: &State| {
                s.workers
                    .iter()
                    .any(|w| matches!(w.phase, Phase::Done(Outcome::Replayed(_))))
            }),
            Property::sometimes("a zombie completion is fenced", |_, s: &State| {
                s.workers
                    .iter()
                    .any(|w| w.phase == Phase::Done(Outcome::LeaseLost))
            }),
            Property::sometimes(
                "a COMPLETED record expires and its key is claimed again",
                |_, s: &State| s.ghost.completed_expired,
            ),
            Property::sometimes("a crashed claim is taken over", |_, s: &State| {
                s.ghost.ran.iter().filter(|r| **r).count() >= 2
                    && s.workers.iter().any(|w| w.phase == Phase::Crashed)
            }),
        ]);
        if self.interruptions {
            properties.extend(Self::interruption_properties());
        }
        if self.steps {
            properties.extend(self.steps_properties());
        }
        if self.in_flight {
            properties.extend(Self::in_flight_properties());
        }
        if self.in_process > 0 {
            properties.extend(Self::coalescing_properties());
        }
        properties
    }
}

/// Whether worker `i`'s claim still holds the key PENDING.
fn holds(s: &State, i: usize) -> bool {
    s.record
        .as_ref()
        .is_some_and(|r| r.status == Status::Pending && r.token == token(i))
}

impl Protocol {
    /// Whether no two workers' clocks differ by more than the margin: the design's assumption, under
    /// which a live holder is never taken over (with clocks off by up to the margin *each way*, two may
    /// differ by twice it, and a holder whose clock runs behind loses that much of its lease).
    fn clocks_within_margin(&self) -> bool {
        2 * self.skew * TICK_MS <= millis(self.margin)
    }

    /// What time passing while requests are in flight must not break.
    fn in_flight_properties() -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a body starts only while its claim holds the key",
                |_, s: &State| !s.ghost.started_lapsed,
            ),
            Property::always(
                "a holder whose heartbeats land in time keeps its key",
                |_, s: &State| !s.ghost.took_beating,
            ),
            Property::always(
                "a call that returns before its body leaves no claim behind",
                |_, s: &State| {
                    (0..WORKERS).all(|i| {
                        !matches!(s.workers[i].phase, Phase::Done(_))
                            || s.ghost.ran[i]
                            || !holds(s, i)
                    })
                },
            ),
        ]
    }

    /// What interruptions must not break, and witnesses that they happen.
    fn interruption_properties() -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a drop before the body never blocks the key",
                |_, s: &State| {
                    (0..WORKERS).all(|i| {
                        s.workers[i].phase != Phase::Done(Outcome::Released) || !holds(s, i)
                    })
                },
            ),
            Property::always(
                "a panic never blocks the key past the FAILED write",
                |_, s: &State| {
                    (0..WORKERS).all(|i| {
                        s.workers[i].phase != Phase::Done(Outcome::Panicked) || !holds(s, i)
                    })
                },
            ),
            Property::sometimes(
                "a dropped call's landed claim is released",
                |_, s: &State| {
                    s.record
                        .as_ref()
                        .is_some_and(|r| r.error.as_deref() == Some(handler::RELEASED))
                },
            ),
            Property::sometimes(
                "a detached body stores its result after its caller left",
                |_, s: &State| {
                    let w = &s.workers[DETACHED];
                    w.caller_gone
                        && matches!(w.phase, Phase::Done(Outcome::Ran(_)))
                        && s.ghost.applied[DETACHED]
                },
            ),
            Property::sometimes("a panicked key is claimed again", |_, s: &State| {
                s.workers
                    .iter()
                    .any(|w| w.phase == Phase::Done(Outcome::Panicked))
                    && s.ghost.ran.iter().filter(|r| **r).count() >= 2
            }),
            Property::sometimes("an abandoned body blocks its key", |_, s: &State| {
                s.workers
                    .iter()
                    .enumerate()
                    .any(|(i, w)| w.phase == Phase::Done(Outcome::Abandoned) && holds(s, i))
            }),
        ]
    }

    /// With every worker stopped, a PENDING record must be claimable by a fresh caller, whatever its
    /// skew, once the lease plus the margin plus the skew has passed.
    fn claimable_after_everyone_stopped(&self, state: &State) -> bool {
        let stopped = state
            .workers
            .iter()
            .all(|w| matches!(w.phase, Phase::Done(_) | Phase::Crashed));
        let Some(record) = state
            .record
            .as_ref()
            .filter(|r| r.status == Status::Pending)
        else {
            return true;
        };
        if !stopped {
            return true;
        }
        let margin = u64::try_from(self.margin.as_millis()).unwrap();
        let skew = self.skew * TICK_MS;
        let at = record.lease_until_ms.unwrap_or(0) + margin + skew + 1;
        [at - skew, at, at + skew].into_iter().all(|clock_ms| {
            let t = handler::claim_times(clock_ms, self.margin, self.lease, self.ttl, None);
            let request = ClaimRequest {
                key: KEY,
                token: "fresh",
                attempt: 1,
                now_ms: t.now_ms,
                lease_until_ms: t.lease_until_ms,
                expires_at_s: t.expires_at_s,
                fingerprint: None,
                keep_claim_writes: false,
                // A record with steps is for a call with steps, which resumes them (code without
                // steps never takes it over: `Error::StepsHeld`).
                steps: record
                    .steps
                    .as_deref()
                    .map_or(StepsClaim::Untouched, |steps| StepsClaim::Resume {
                        steps,
                        restart_failed: false,
                    }),
            };
            claimed(Some(record), &request, false).is_ok()
        })
    }
}

/// One line per state, for counterexample traces.
impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}ms record=", self.true_ms())?;
        match &self.record {
            None => f.write_str("none")?,
            Some(r) => write!(
                f,
                "{} token={} lease_until={:?} expires_at={}s",
                r.status, r.token, r.lease_until_ms, r.expires_at_s
            )?,
        }
        if let Some(steps) = self.record.as_ref().and_then(|r| r.steps.as_deref()) {
            write!(f, " steps={}", shown(steps))?;
        }
        if self.ghost.steps.effects.iter().any(|e| *e > 0) {
            write!(f, " step effects={:?}", self.ghost.steps.effects)?;
        }
        for (i, w) in self.workers.iter().enumerate() {
            write!(f, " | w{i} (clock {:+}s): {:?}", w.skew, w.phase)?;
            if let Some(times) = w.flight {
                write!(f, " claim in flight (lease until {})", times.lease_until_ms)?;
            }
            if let Some(out) = w.beat.out {
                write!(f, " heartbeat out {out:?}")?;
            } else if w.beat.lease_until_ms > 0 {
                write!(
                    f,
                    " last heartbeat sent at {}ms, lease until {}ms",
                    w.beat.sent_ms, w.beat.lease_until_ms
                )?;
            }
            if !w.steps.known.is_empty() {
                write!(f, " knows {} next {}", shown(&w.steps.known), w.steps.next)?;
            }
            if let Some(seen) = &w.steps.resume {
                write!(f, " resumes {}", shown(seen))?;
            }
        }
        Ok(())
    }
}

/// Stored steps as a trace shows them: their origin and values.
fn shown(steps: &[u8]) -> String {
    match Stored::decode(steps) {
        Ok(s) => format!(
            "{}:{:?} unstored {:?} started {:?}",
            s.origin,
            s.steps.values().collect::<Vec<_>>(),
            s.unstored.keys().collect::<Vec<_>>(),
            s.started
        ),
        Err(e) => format!("undecodable ({e})"),
    }
}

/// Explores `protocol` until an "always" property fails (see [`check`]), and asserts that none does
/// and that every "sometimes" one was found; a property that fails is named with its
/// counterexample's length and the states explored, and its counterexample printed.
fn check_all(name: &str, protocol: &Protocol) {
    let (run, checker) = check(protocol.clone(), HasDiscoveries::AnyFailures);
    println!("model [{name}]: {run}");
    for property in protocol.properties() {
        if property.expectation != Expectation::Always {
            continue;
        }
        if let Some(path) = checker.discovery(property.name) {
            let steps = path.into_vec();
            println!("counterexample:");
            for (state, action) in &steps {
                println!("  {state}");
                if let Some(action) = action {
                    println!("    -> {action:?}");
                }
            }
            panic!(
                "[{name}] `{}` fails after {} moves; {run}",
                property.name,
                steps.len() - 1
            );
        }
    }
    checker.assert_properties();
}

/// What one run of the checker found.
struct Run {
    states: usize,
    unique: usize,
    depth: usize,
    elapsed: Duration,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states explored ({} unique), max depth {}, in {:.1?}",
            self.states, self.unique, self.depth, self.elapsed
        )
    }
}

fn deep() -> bool {
    std::env::var("IDEMPOTENT_MODEL").is_ok_and(|v| v == "deep")
}

fn check(protocol: Protocol, until: HasDiscoveries) -> (Run, impl Checker<Protocol>) {
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let checker = protocol
        .checker()
        .threads(threads)
        .finish_when(until)
        .spawn_bfs()
        .join();
    let run = Run {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed: started.elapsed(),
    };
    (run, checker)
}

/// The bounded horizon for CI, and the deeper one of `scripts/model --deep`.
fn horizon() -> u64 {
    std::env::var("IDEMPOTENT_MODEL_HORIZON")
        .ok()
        .and_then(|h| h.parse().ok())
        .unwrap_or(if deep() { 5 } else { 2 })
}

#[test]
fn the_protocol_keeps_its_promises() {
    // Bounded for `cargo test`: the run with waiting explores 1 s of model time (at 2 s it is
    // 11.3 M states, some 80 s of CPU; every witness below is found at 1 s, with clocks +-1 s and a
    // 2 s lease); `scripts/model --deep` or `IDEMPOTENT_MODEL_HORIZON` explore more.
    let long = deep() || std::env::var("IDEMPOTENT_MODEL_HORIZON").is_ok();
    for (name, protocol) in [
        (
            "claim_with + compensate_with + transact, wait",
            Protocol::new(if long { horizon() } else { 1 }),
        ),
        (
            "claim_with without compensation, fail fast",
            Protocol {
                compensate: false,
                wait: false,
                ..Protocol::new(horizon())
            },
        ),
    ] {
        // Fail-fast: the run stops at the first "always" property that fails (a run that waits for
        // every property's discovery explores the whole space when a broken rule makes a "sometimes"
        // witness unreachable); one that finds none has explored the whole space, and then every
        // "sometimes" witness must have been found.
        let (run, checker) = check(protocol, HasDiscoveries::AnyFailures);
        println!("model [{name}]: {run}");
        checker.assert_properties();
    }
}

/// Interruptions: callers dropped before the body (claims released) and mid-body (abandoned), bodies
/// that panic, and a detached worker whose caller leaves while its body runs.
#[test]
fn interruptions_keep_the_promises() {
    // Bounded for `cargo test`: 1 s of model time and fail-fast duplicates (with `wait` and 2 s it is
    // 61.8 M states, over 20 minutes); `scripts/model --deep` or `IDEMPOTENT_MODEL_HORIZON` explore more,
    // with waiting.
    let long = deep() || std::env::var("IDEMPOTENT_MODEL_HORIZON").is_ok();
    let protocol = Protocol {
        interruptions: true,
        claim_writes: false,
        compensate: false,
        transact: false,
        wait: long,
        ..Protocol::new(if long { horizon() } else { 1 })
    };
    let (run, checker) = check(protocol, HasDiscoveries::AnyFailures);
    println!("model [interruptions: drop, panic, detach]: {run}");
    checker.assert_properties();
}

/// Coalescing: workers 0 and 1 are calls in one process, through one handle, worker 2 a process of
/// its own. A follower makes no request; it gets the value its leader passes on, `InProgress`, or the
/// lead. With waiting and without, with crashes (of the whole process), failures, lapsing leases and
/// lost responses, the properties of the other runs hold, and: a value passed on is the stored
/// record's, and no two bodies of the process run at once.
#[test]
fn coalescing_keeps_the_promises() {
    // Bounded for `cargo test`: clocks in step (skew is the other runs' subject, and it triples the
    // space) over 3 s, the least at which every witness is found (a zombie completion needs a lease to
    // lapse, an expired record a completion 1 s before); `scripts/model --deep` or
    // `IDEMPOTENT_MODEL_HORIZON` explore more, with clocks off by a second.
    let long = deep() || std::env::var("IDEMPOTENT_MODEL_HORIZON").is_ok();
    for (name, wait) in [("coalescing, wait", true), ("coalescing, fail fast", false)] {
        let protocol = Protocol {
            in_process: 2,
            skew: u64::from(long),
            claim_writes: false,
            compensate: false,
            transact: false,
            wait,
            ..Protocol::new(if long { horizon() } else { 3 })
        };
        check_all(name, &protocol);
    }
}

/// The hole the skew margin closes, re-opened: with clocks off by a second and no margin, a worker
/// whose clock runs ahead takes over a claim whose lease has not expired, and two bodies run at once.
#[test]
fn without_the_skew_margin_a_live_claim_is_taken_over() {
    let protocol = Protocol {
        margin: Duration::ZERO,
        ..Protocol::new(3)
    };
    let (run, checker) = check(protocol, HasDiscoveries::AnyFailures);
    println!("model [no skew margin]: {run}");
    let trace = checker
        .discovery("no second body while a claim is live")
        .expect("without the margin, a live claim must be taken over");
    println!("counterexample:");
    let steps = trace.into_vec();
    for (state, action) in &steps {
        println!("  {state}");
        if let Some(action) = action {
            println!("    -> {action:?}");
        }
    }
    let last = &steps.last().expect("a trace has a state").0;
    assert!(last.ghost.took_live_claim);
}

// --- Claim-time writes. ---

/// A failure without compensation keeps its claim-time writes in effect: its record must outlive the
/// short `failed_ttl` (here 1 s against a 3 s `ttl`), or a retry after it expired applies them again.
/// Run without `wait` and `transact`, which this does not concern, to keep the run short.
#[test]
fn claim_time_writes_outlive_a_failure() {
    let protocol = Protocol {
        ttl: Duration::from_secs(3),
        failed_ttl: Duration::from_secs(1),
        compensate: false,
        wait: false,
        transact: false,
        ..Protocol::new(horizon())
    };
    let (run, checker) = check(protocol, HasDiscoveries::AnyFailures);
    println!("model [claim_with without compensation, ttl 3 s, failed_ttl 1 s]: {run}");
    for property in Protocol::writes_properties() {
        assert!(
            checker.discovery(property.name).is_none(),
            "{}",
            property.name
        );
    }
    checker.assert_no_discovery("no second body while a claim is live");
}

// --- Steps. ---

/// Bodies of two steps: a step stored is never run again by a call holding the key (across crashes,
/// lost responses and their resends, takeovers, failures retried and records expiring), a zombie never
/// stores one, a body does resume, and a step's key is the same in every call of one operation and
/// new in the next. The third caller runs code without steps on the same key (another deploy of the
/// function): once the record expired its claim starts a new operation, and a later call with steps
/// starts afresh rather than resuming the expired operation's steps. `scripts/model --deep` runs three
/// callers with steps instead (takeovers of takeovers).
#[test]
fn steps_are_resumed_never_run_again() {
    let protocol = Protocol {
        plain: !deep(),
        ..with_steps(horizon())
    };
    check_all("steps, a third call without steps", &protocol);
}

/// Bodies of two steps whose writes may land late: a step's write times out at its caller while its
/// first copy is still on its way, the SDK sends it again, and the first copy lands at any later
/// time (after the next step's write, after a crash, after a takeover). A step stored is still never
/// run again by a call holding the key: a write is made only on the steps it extends, so a late copy
/// never moves the steps back, and a resend refused because its first copy landed counts as stored
/// ([`decide::after_rejected_steps`]). Two callers (a crashed one and the one that resumes), as in
/// [`steps_are_resumed_never_run_again`] otherwise.
#[test]
fn late_step_writes_never_move_steps_back() {
    let protocol = Protocol {
        late_step_copies: true,
        callers: 2,
        ..with_steps(horizon())
    };
    check_all("late step writes", &protocol);
}

/// The steps runs' common ground: bodies of two steps, clocks exact (skews are the other runs'
/// concern; no margin is then needed) and a lease of 1 s, so that leases lapse within the bounded
/// horizon; without `wait`, claim-time writes and `transact`, which steps do not concern.
fn with_steps(horizon: u64) -> Protocol {
    Protocol {
        steps: true,
        skew: 0,
        margin: Duration::ZERO,
        lease: Duration::from_secs(1),
        wait: false,
        claim_writes: false,
        compensate: false,
        transact: false,
        ..Protocol::new(horizon)
    }
}

/// The restart policy with interruptions: calls dropped before their body (a claim that starts
/// afresh is released, one that resumes is left to lapse) and mid-body, bodies that panic (which
/// resume, not restart), a detached body. An operation starts over only after its body's own
/// failure, so a finished step runs again only then. Two callers.
#[test]
fn steps_start_over_only_after_their_body_failed() {
    let protocol = Protocol {
        restart: true,
        interruptions: true,
        callers: 2,
        ..with_steps(horizon())
    };
    check_all("steps: restart policy, interruptions", &protocol);
}

/// The restart policy with an operator's release of a claim (`idempotent key release`): the next
/// call resumes after the finished steps, never starts over. Two callers.
#[test]
fn an_operator_release_never_starts_steps_over() {
    let protocol = Protocol {
        restart: true,
        operator: true,
        callers: 2,
        ..with_steps(horizon())
    };
    check_all("steps: restart policy, operator", &protocol);
}

/// Steps that must never run again with nothing to replay: a value refused as it is stored (the
/// step is recorded as finished without a value) and an at-most-once step that started and did not
/// finish. A resume stops at them and never runs their effect again. Two callers.
#[test]
fn steps_that_must_not_run_again_never_do() {
    let protocol = Protocol {
        refused_values: true,
        at_most_once: true,
        callers: 2,
        ..with_steps(horizon())
    };
    check_all("steps: refused values, at most once", &protocol);
}

// --- Requests in flight: time passes between a request's send, its application and its answer. ---

/// Claims and heartbeats in flight, with two callers and none of the features these runs do not
/// concern (claim-time writes, compensation, `transact`, waiting), so that longer horizons stay small.
fn in_flight(horizon: u64) -> Protocol {
    Protocol {
        in_flight: true,
        latency: 2,
        claims_given_up: true,
        callers: 2,
        claim_writes: false,
        compensate: false,
        transact: false,
        wait: false,
        ..Protocol::new(horizon)
    }
}

/// Explores `protocol` for a counterexample to `property` and asserts there is none; when there is
/// one (a fix undone, say), prints it and fails with its length in moves.
fn never_found(name: &str, protocol: Protocol, property: &'static str) {
    let (run, checker) = check(protocol, HasDiscoveries::AnyOf([property].into()));
    if let Some(trace) = checker.discovery(property) {
        let steps = trace.into_vec();
        println!("counterexample:");
        for (state, action) in &steps {
            println!("  {state}");
            if let Some(action) = action {
                println!("    -> {action:?}");
            }
        }
        panic!(
            "[{name}] `{property}` fails after {} moves; {run}",
            steps.len() - 1
        );
    }
    println!("model [{name}]: `{property}` holds; {run}");
}

/// Explores the whole space of `protocol`: every property holds and every witness is found, except
/// the `open` ones, which are found broken (their counterexamples' lengths are printed).
fn check_whole(name: &str, protocol: &Protocol, open: &[&str]) {
    let (run, checker) = check(protocol.clone(), HasDiscoveries::AllFailures);
    println!("model [{name}]: {run}");
    for property in protocol.properties() {
        let found = checker.discovery(property.name);
        match property.expectation {
            Expectation::Always if open.contains(&property.name) => {
                let path = found.unwrap_or_else(|| {
                    panic!(
                        "[{name}] `{}` now holds: take it off the open list",
                        property.name
                    )
                });
                println!(
                    "  still broken: `{}` fails after {} moves",
                    property.name,
                    path.into_vec().len() - 1
                );
            }
            Expectation::Always | Expectation::Eventually => {
                assert!(found.is_none(), "[{name}] `{}` fails", property.name);
            }
            Expectation::Sometimes => {
                assert!(
                    found.is_some(),
                    "[{name}] `{}` never happens",
                    property.name
                );
            }
        }
    }
}

/// Requests in flight, on the handler's own decisions: claims answered after their lease (a slow
/// answer, or a resent claim found ours), heartbeats slow enough to eat most of the lease, claims the
/// SDK gives up on, and calls dropped with their claim in flight. Each run explores its whole space.
/// FAILED records live as long as a claim's record (`lease + ttl`), so that a release's mark outlives
/// the claim it stands in for (see `a_release_mark_outlives_a_short_failed_ttl`).
#[test]
fn requests_in_flight_keep_the_promises() {
    check_whole(
        "in flight: late answers, heartbeats within 2 s, lease 3 s, exact clocks, 6 s",
        &Protocol {
            skew: 0,
            lease: Duration::from_secs(3),
            failed_ttl: Duration::from_secs(4),
            claims_given_up: false,
            ..in_flight(6)
        },
        &[],
    );
    check_whole(
        "in flight: interruptions and claims given up, lease 2 s, clocks +-1 s, 1 s",
        &Protocol {
            interruptions: true,
            failed_ttl: Duration::from_secs(3),
            ..in_flight(1)
        },
        &[],
    );
}

/// A call gives its claim up while it is in flight, and its release finds another call's record
/// (another caller's release mark, or a live claim that completes later, say): it leaves its token on
/// that record ([`Change::MarkReleased`]), and its claim, landing later, is refused. (Before, a release
/// marked only an absent record, and this run found the claim landing under a call that had returned:
/// 9 moves, 44,121 states.) With a 1 s ttl, shorter than the lease, the record the mark is on could
/// complete (or a COMPLETED record the release found could live on), expire and be purged while the
/// claim was still on its way, which then landed on no record and held the key for its lease: found in
/// 12 moves (about 70,000 unique states) on both "a drop before the body never blocks the key" and "a
/// call that returns before its body leaves no claim behind" with transitions free to set an expiry
/// before the released tokens' end ([`Record::outlives_released`] undone), and in 13 moves (about
/// 81,000) with a release leaving a live COMPLETED record as it is ([`decide::after_release`]'s
/// `Marking::KeepCompleted` undone). With both, `requests_in_flight_keep_the_promises` runs that ttl
/// and finds nothing.
#[test]
fn a_release_that_finds_another_record_leaves_its_token_there() {
    never_found(
        "in flight: a release that finds another call's record",
        Protocol {
            ttl: Duration::from_secs(2),
            failed_ttl: Duration::from_secs(3),
            ..in_flight(1)
        },
        "a call that returns before its body leaves no claim behind",
    );
}

/// A claim answered at the end of its lease is renewed with a fenced lease extension under its
/// token, which its own record never refuses (a renewal by claim was refused within the margin, and
/// the call returned `Contended` with its claim left PENDING): no counterexample.
#[test]
fn a_claim_renewed_within_the_margin_is_not_left_pending() {
    never_found(
        "in flight: renewals refused by the call's own record",
        Protocol {
            skew: 0,
            lease: Duration::from_secs(3),
            failed_ttl: Duration::from_secs(4),
            claims_given_up: false,
            ..in_flight(3)
        },
        "a call that returns before its body leaves no claim behind",
    );
}

/// A release's mark on a record whose failure then gives it an expiry before the claim the mark stands
/// in for can land (a `failed_ttl` of 1 s under a 2 s lease, and the claim still in flight when the
/// record is purged) no longer lets the claim land under a call that returned long ago: a failure
/// never sets an expiry before the released tokens' end ([`Record::outlives_released`]). With that
/// undone, the run finds it in 13 moves (45,362 unique states).
#[test]
fn a_release_mark_outlives_a_short_failed_ttl() {
    never_found(
        "in flight: failed_ttl 1 s under a 2 s lease",
        in_flight(1),
        "a call that returns before its body leaves no claim behind",
    );
}
