//! [`Steps`]: a body of several effects that resumes where it stopped
//! ([`Operation::steps`](crate::Operation::steps)).
//!
//! Each finished step's `Ok` value is stored in the operation's own record (a fenced write under the
//! call's token, the record staying PENDING) before the body goes on. A call that takes the key over
//! after a crash or a lapsed lease, or claims it again after a failure, gets the stored values back
//! without running their steps, and runs the first unfinished one. The record holds, beside the
//! values, the operation's *origin* (the token of the claim that started it), from which
//! [`Steps::key`] derives the keys a body passes to downstream APIs: the same in every run of the
//! operation, new once its record expired and the key is a new operation.
//!
//! Beside the values, the record marks the steps that must never run again although they have no
//! value to replay: a step that finished but whose value could not be stored ([`Error::StepNotStored`]
//! on a resume), and an at-most-once step ([`Steps::run_at_most_once`]) that started and did not
//! finish ([`Error::StepInterrupted`]). An operation holding such a mark is *pinned*: it resumes,
//! and never starts over, not even with the restart policy.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::store::StepsClaim;
use crate::store::writes::Staged;
use crate::{Error, Idempotency, Record, Status, codec};

/// The steps of one call of an operation run with [`Operation::steps`](crate::Operation::steps):
/// the body runs each effect through [`run`](Self::run), under a name.
///
/// A step's `Ok` value is stored before [`run`](Self::run) returns it, so that after a crash, a lapsed
/// lease or a failure, the next call with the key gets it back without running the step again, and
/// goes on from the first step that had not finished. What a crash can run twice is only the step that
/// was running when it happened, and not even that when the step passes [`key`](Self::key) to a
/// downstream API that honours idempotency keys.
///
/// Cloning gives another handle on the same steps (for a body that runs steps from several futures).
///
/// With the attribute, `steps = s` binds the call's `Steps` to `s` in the body, and
/// `on_failure = "restart"` is [`Operation::restart_steps_after_failure`](crate::Operation::restart_steps_after_failure):
///
/// ```
/// use idempotent_runtime::{Error, Idempotency, idempotent};
///
/// #[idempotent(key = order_id, store = idem, steps = s)]
/// async fn checkout(idem: &Idempotency, order_id: u64) -> Result<(u32, String), Error> {
///     let hold = s.run("reserve", || async { Ok::<_, Error>(17) }).await?;
///     let gateway_key = s.key("charge"); // the gateway's `Idempotency-Key`
///     let charge = s
///         .run("charge", || async { Ok::<_, Error>(format!("ch_{}", &gateway_key[..8])) })
///         .await?;
///     Ok((hold, charge))
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let idem = Idempotency::in_memory();
/// assert_eq!(checkout(&idem, 7).await?, checkout(&idem, 7).await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Steps {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("namespace", &self.shared.namespace)
            .field("restart_failed", &self.shared.restart_failed)
            .finish_non_exhaustive()
    }
}

struct Shared {
    namespace: &'static str,
    /// The operation starts over after a failure, rather than resuming.
    restart_failed: bool,
    /// The steps of a new operation (no step finished, this call's token as origin), encoded: what a
    /// claim that starts afresh stores.
    initial: OnceLock<Vec<u8>>,
    state: Mutex<State>,
    /// Step writes go one at a time, each with every step finished before it.
    writing: tokio::sync::Mutex<()>,
    /// The claim last built for this call resumes stored steps (it may be on its way).
    resuming: AtomicBool,
    /// The record last found claimable is a failure this call restarts after: its next claim starts
    /// afresh in place of that record's steps (and only then takes a FAILED record with steps, so that
    /// a blind first claim never restarts a pinned operation).
    restarting: AtomicBool,
    /// The record last found claimable is a failure this call resumes although the operation restarts
    /// after failures: a pinned operation, or a panic ([`builds_on`](Steps::builds_on)).
    resuming_failure: AtomicBool,
    /// A step of this call came to an error of the library's rather than its own (a step write that
    /// failed in the store, a value that does not read back or cannot be stored, no room left, a step
    /// that must not run again): the body's failure may be that, not its own
    /// ([`lapses_after_failure`](Steps::lapses_after_failure)).
    faulted: AtomicBool,
    /// A step write of this call was sent and its fate is unknown (the step's future was dropped while
    /// it was on its way, or the write failed): the record may hold the steps before it or after it,
    /// so what the call knows of them does not say whether the operation is pinned.
    in_doubt: AtomicBool,
}

#[derive(Default)]
struct State {
    /// The call holding the key, once its claim landed; `None` while the body runs without a record
    /// (the kill switch, or a missing key under `MissingKey::Skip`): steps then just run.
    call: Option<Call>,
    /// The names this call's body asked for.
    used: HashSet<String>,
    /// The room (bytes) kept in the record for the marks of the steps running now
    /// ([`Steps::reserve`]).
    reserved: usize,
    /// A stand-in origin for a body that runs without a record.
    alone_origin: Option<String>,
    /// The record's steps as the call's claim left them (`None`: it started afresh), until the body
    /// begins.
    claimed: Option<Vec<u8>>,
}

/// Whether `record` is FAILED by a panic (the error text the handler stores for one).
pub(crate) fn panicked(record: &Record) -> bool {
    record.error.as_deref().is_some_and(is_panic)
}

/// Whether `record` is FAILED by the release of a call that gave its claim up before its body started
/// ([`handler::RELEASED`](crate::handler::RELEASED)): no failure of a body, so never one the restart
/// policy starts over after (a call without the policy releases a claim that resumes steps).
pub(crate) fn released(record: &Record) -> bool {
    record.error.as_deref() == Some(crate::handler::RELEASED)
}

/// Whether a failure's error text is the one the handler records for a panic
/// ([`handler::panicked`](crate::handler::panicked)).
pub(crate) fn is_panic(error: &str) -> bool {
    error.starts_with("panicked: ")
}

/// What a claim that found a claimable record does with the operation's steps
/// ([`steps_found`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepsFound {
    /// The record holds no steps, or it expired (a new operation): start afresh.
    Fresh,
    /// The record's steps live on: resume them.
    Resume,
    /// A FAILED record the restart policy would start over after, but whose steps pin the operation
    /// (a step that must never run again) or whose failure is a panic or a release (no failure that undid
    /// the steps): resume them all the same.
    ResumeFailure,
    /// A FAILED record under the restart policy: start the operation over.
    Restart,
}

/// What a claim of an operation with steps does with the steps of a claimable `record` it found at
/// `now_ms`; `restart_policy`: the operation starts over after a failure
/// (`on_failure = "restart"`).
pub(crate) fn steps_found(record: &Record, now_ms: u64, restart_policy: bool) -> StepsFound {
    let Some(steps) = record.steps.as_deref() else {
        return StepsFound::Fresh;
    };
    if record.is_expired(now_ms) {
        return StepsFound::Fresh;
    }
    if !(restart_policy && record.status == Status::Failed) {
        return StepsFound::Resume;
    }
    if Stored::pinned(steps) || panicked(record) || released(record) {
        StepsFound::ResumeFailure
    } else {
        StepsFound::Restart
    }
}

/// Whether a dropped call of an operation with steps may release its claim (a fenced FAILED
/// write): not when the operation restarts after a failure (`restart_policy`) and the claim on its
/// way is `resuming` stored steps, whose effects a release is no failure of (the next call would
/// start over and run them again); such a claim lapses with its lease. A claim that starts afresh is
/// released.
pub(crate) fn steps_releasable(restart_policy: bool, resuming: bool) -> bool {
    !(restart_policy && resuming)
}

/// The most bytes of why a step's value could not be stored, as recorded.
const MAX_DETAIL_BYTES: usize = 512;

/// The most bytes the mark of the step `name` adds to the stored steps: its name and why its value
/// could not be stored ([`Stored::finish_unstored`], with a detail of [`MAX_DETAIL_BYTES`] that JSON
/// does not escape, [`mark_detail`]), the JSON around them, a longer write count, and the slack of
/// compression. Kept free while the step runs, so that the mark always fits.
fn mark_room(name: &str) -> usize {
    const AROUND: usize = 128;
    serde_json::to_string(name).map_or(6 * name.len() + 2, |json| json.len())
        + MAX_DETAIL_BYTES
        + AROUND
}

/// Why a step's value could not be stored, as its mark records it: at most [`MAX_DETAIL_BYTES`]
/// bytes, none of which JSON escapes (quotes, backslashes and control characters become others), so
/// that the mark's size is bounded ([`mark_room`]).
fn mark_detail(detail: &str) -> String {
    let plain: String = detail
        .chars()
        .map(|c| match c {
            '"' => '\'',
            '\\' => '/',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    truncate(&plain, MAX_DETAIL_BYTES)
}

/// `text`, cut on a character boundary to at most `max` bytes.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let cut = text.floor_char_boundary(max.saturating_sub(3));
    format!("{}...", &text[..cut])
}

/// What storing a step needs of the call holding the key.
struct Call {
    idem: Idempotency,
    key: String,
    token: String,
    fingerprint: Option<String>,
    lease: Duration,
    /// The stored steps as this call knows them (decoded), or why they do not decode.
    stored: Result<Stored, String>,
    /// The same, as the record holds them (encoded): what the call's next step write extends.
    written: Vec<u8>,
    /// The writes the body stages ([`steps`](crate::Operation::steps) and [`transact`](crate::Operation::transact)).
    staging: Option<Staged>,
}

/// The stored form of an operation's steps (JSON, compressed as responses are).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Stored {
    /// The token of the claim that started the operation.
    pub(crate) origin: String,
    /// Each finished step's value, by name: its JSON as the value serialized it (not through
    /// `serde_json::Value`, which would turn a 128-bit integer into a float).
    #[serde(default)]
    pub(crate) steps: BTreeMap<String, Box<serde_json::value::RawValue>>,
    /// The steps that finished (their closure returned `Ok`) but whose value could not be stored, by
    /// name, with why: never run again ([`Error::StepNotStored`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) unstored: BTreeMap<String, String>,
    /// The at-most-once steps that started and have not finished: never run again
    /// ([`Error::StepInterrupted`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) started: BTreeSet<String>,
    /// The steps that staged business writes when they ran: a replay cannot stage them again
    /// ([`Error::StepStagedWrites`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) staged: BTreeSet<String>,
    /// How many step writes the operation made: each write stores one more, so that its steps differ
    /// from every earlier write's, even where it undoes the one before (an at-most-once step that
    /// returned `Err` clears the mark its start set). A write is made only on the steps it extends
    /// ([`Change::SaveSteps`](crate::store::Change::SaveSteps)'s `previous`): without the count, a
    /// late copy of the mark's write would find its `previous` there again, and land.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) writes: u64,
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's `skip_serializing_if` passes a reference"
)]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Stored {
    /// Whether the operation holds a step that must never run again and has no value to replay: it
    /// resumes, and never starts over (not even with the restart policy).
    pub(crate) fn pins(&self) -> bool {
        !self.unstored.is_empty() || !self.started.is_empty()
    }

    /// Whether the encoded steps `bytes` pin their operation ([`pins`](Self::pins)); steps that do
    /// not decode do too, so that nothing is run again on a record this version cannot read.
    pub(crate) fn pinned(bytes: &[u8]) -> bool {
        Self::decode(bytes).map_or(true, |stored| stored.pins())
    }

    /// The steps a write making `change` stores: these, changed, with one more write counted.
    pub(crate) fn rewritten(&self, change: impl FnOnce(&mut Self)) -> Self {
        let mut next = self.clone();
        change(&mut next);
        next.writes += 1;
        next
    }

    /// What a body asking for the step `name` gets of what earlier calls of the operation left
    /// ([`Prior`]): the rule behind [`Steps::run`] and [`Steps::run_at_most_once`], which the protocol
    /// model drives too.
    pub(crate) fn prior(&self, name: &str) -> Prior<'_> {
        if self.staged.contains(name) {
            Prior::StagedWrites
        } else if let Some(value) = self.steps.get(name) {
            Prior::Replay(value)
        } else if let Some(detail) = self.unstored.get(name) {
            Prior::NotStored(detail)
        } else if self.started.contains(name) {
            Prior::Interrupted
        } else {
            Prior::Run
        }
    }

    /// The at-most-once step `name` starts: marked so, until it finishes.
    pub(crate) fn start(&mut self, name: &str) {
        self.started.insert(name.to_owned());
    }

    /// The at-most-once step `name` returned `Err` (its effect did not happen): it may run again.
    pub(crate) fn unstart(&mut self, name: &str) {
        self.started.remove(name);
    }

    /// The step `name` finished with `value` (stored); `staged`: it staged business writes.
    pub(crate) fn finish(
        &mut self,
        name: &str,
        value: Box<serde_json::value::RawValue>,
        staged: bool,
    ) {
        self.started.remove(name);
        if staged {
            self.staged.insert(name.to_owned());
        }
        self.steps.insert(name.to_owned(), value);
    }

    /// The step `name` finished, but its value cannot be stored (`detail` says why): recorded as
    /// finished without a value, never run again.
    pub(crate) fn finish_unstored(&mut self, name: &str, detail: String) {
        self.started.remove(name);
        self.unstored.insert(name.to_owned(), detail);
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        // A map of JSON values with string keys always serializes.
        codec::pack(serde_json::to_vec(self).expect("steps serialize"))
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        codec::decode(bytes).map_err(|e| match e {
            codec::DecodeError::Json(e) => e.to_string(),
            codec::DecodeError::Compression(e) => e.to_string(),
            codec::DecodeError::NotSerialized(detail) => detail,
        })
    }
}

/// What a body asking for a step gets of what earlier calls of its operation left
/// ([`Stored::prior`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Prior<'s> {
    /// Nothing: the step runs.
    Run,
    /// The step finished before: its stored value is replayed, the step does not run.
    Replay(&'s serde_json::value::RawValue),
    /// The step staged business writes in a call that did not complete: it cannot be replayed
    /// without them ([`Error::StepStagedWrites`]).
    StagedWrites,
    /// The step finished before, but its value could not be stored (why): it never runs again
    /// ([`Error::StepNotStored`]).
    NotStored(&'s str),
    /// The at-most-once step started before and did not finish: it never runs again
    /// ([`Error::StepInterrupted`]).
    Interrupted,
}

/// What a call's [`Steps`] remembers from one claim attempt to the next: the facts behind
/// [`Steps::claim`] and [`Steps::releasable`], for the protocol model, whose states must hold them.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct Remembered {
    resuming: bool,
    restarting: bool,
    resuming_failure: bool,
}

/// The key [`Steps::key`] gives for the step `name` of the operation stored under `record_key`
/// and started by the claim `origin`.
pub(crate) fn step_key(record_key: &str, origin: &str, name: &str) -> String {
    let mut hash = Sha256::new();
    for part in [record_key.as_bytes(), origin.as_bytes(), name.as_bytes()] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hex::encode(hash.finalize())
}

impl Steps {
    /// A call's handle that remembers what `remembered` says (see [`Remembered`]).
    #[cfg(test)]
    pub(crate) fn recalling(
        namespace: &'static str,
        restart_failed: bool,
        remembered: Remembered,
    ) -> Self {
        let steps = Self::new(namespace, restart_failed);
        let shared = &steps.shared;
        shared
            .resuming
            .store(remembered.resuming, Ordering::Relaxed);
        shared
            .restarting
            .store(remembered.restarting, Ordering::Relaxed);
        shared
            .resuming_failure
            .store(remembered.resuming_failure, Ordering::Relaxed);
        steps
    }

    /// What the handle remembers now (see [`Remembered`]).
    #[cfg(test)]
    pub(crate) fn remembered(&self) -> Remembered {
        let shared = &self.shared;
        Remembered {
            resuming: shared.resuming.load(Ordering::Relaxed),
            restarting: shared.restarting.load(Ordering::Relaxed),
            resuming_failure: shared.resuming_failure.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn new(namespace: &'static str, restart_failed: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                namespace,
                restart_failed,
                initial: OnceLock::new(),
                state: Mutex::new(State::default()),
                writing: tokio::sync::Mutex::new(()),
                resuming: AtomicBool::new(false),
                restarting: AtomicBool::new(false),
                resuming_failure: AtomicBool::new(false),
                faulted: AtomicBool::new(false),
                in_doubt: AtomicBool::new(false),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A step's user code never runs under the lock: a poisoned lock only means a panic elsewhere.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the operation starts over after a failure: with the restart policy, unless it is
    /// pinned (a step that must never run again has no value to replay, [`Stored::pins`]) as far as
    /// this call knows.
    pub(crate) fn restart_failed(&self) -> bool {
        self.shared.restart_failed
            && !self.shared.in_doubt.load(Ordering::Relaxed)
            && !self
                .state()
                .call
                .as_ref()
                .is_some_and(|call| call.stored.as_ref().map_or(true, Stored::pins))
    }

    /// The steps a claim that starts the operation afresh stores: none finished, `token` as origin.
    /// Built once per call (a call's claim attempts share its token).
    pub(crate) fn initial(&self, token: &str) -> &[u8] {
        self.shared.initial.get_or_init(|| {
            Stored {
                origin: token.to_owned(),
                ..Stored::default()
            }
            .encode()
        })
    }

    /// What a claim attempt of the call holding `token` does with the record's steps, given `seen`:
    /// the steps of a record that refused an earlier attempt and that the call
    /// [`builds on`](Self::builds_on). It resumes them, or (a failure the operation restarts after)
    /// starts the operation afresh in place of exactly them; without `seen`, it starts afresh where no
    /// steps live. Remembers which, for [`releasable`](Self::releasable): the claim last built is the
    /// one that may be on its way.
    ///
    /// A fresh claim takes a FAILED record with steps only once this call found it to be a failure the
    /// operation restarts after, and only while the record holds the steps it judged so: a blind first
    /// claim never does, nor does a late one after another call restarted or pinned the operation. A
    /// resume of pinned steps is made whatever the record's status: such an operation never starts
    /// over.
    pub(crate) fn claim<'a>(&'a self, token: &str, seen: Option<&'a [u8]>) -> StepsClaim<'a> {
        let restarting = self.restarting();
        self.shared
            .resuming
            .store(seen.is_some() && !restarting, Ordering::Relaxed);
        match seen {
            Some(steps) if !restarting => StepsClaim::Resume {
                steps,
                restart_failed: self.shared.restart_failed
                    && !Stored::pinned(steps)
                    && !self.shared.resuming_failure.load(Ordering::Relaxed),
            },
            _ => StepsClaim::Fresh {
                initial: self.initial(token),
                restarts: seen.filter(|_| restarting),
            },
        }
    }

    /// Whether the record last found claimable is a failure this call restarts the operation after.
    fn restarting(&self) -> bool {
        self.shared.restart_failed && self.shared.restarting.load(Ordering::Relaxed)
    }

    /// The steps the record holds once this call's claim, made with `seen` ([`claim`](Self::claim)),
    /// landed: `seen` for a resume; `None` (the call's initial steps) for a start afresh.
    pub(crate) fn landed(&self, seen: Option<Vec<u8>>) -> Option<Vec<u8>> {
        seen.filter(|_| !self.restarting())
    }

    /// Whether a claim that found `record` claimable is made on its steps rather than starting afresh
    /// where none live: it holds steps that live on (not expired), which the call resumes, or which
    /// record a failure the operation restarts after (the claim then replaces exactly them).
    ///
    /// With the restart policy, a FAILED record is restarted after, unless its steps pin the operation
    /// ([`Stored::pins`]) or the failure is a panic (`panicked: ..`, as the handler records one): a
    /// panic is a bug, not a failure the body undid what its steps did, so the operation resumes (and
    /// the bug, once fixed, goes on from the first unfinished step).
    pub(crate) fn builds_on(&self, record: &Record, now_ms: u64) -> bool {
        let found = steps_found(record, now_ms, self.shared.restart_failed);
        self.shared
            .restarting
            .store(found == StepsFound::Restart, Ordering::Relaxed);
        self.shared
            .resuming_failure
            .store(found == StepsFound::ResumeFailure, Ordering::Relaxed);
        found != StepsFound::Fresh
    }

    /// Whether a dropped call may release its claim (a fenced FAILED write): not when the operation
    /// restarts after a failure and the claim on its way resumes stored steps, whose effects a
    /// release is no failure of (the next call would start over and run them again). Such a claim
    /// lapses with its lease instead. A claim that starts afresh (the call's last) is released.
    pub(crate) fn releasable(&self) -> bool {
        steps_releasable(
            self.shared.restart_failed,
            self.shared.resuming.load(Ordering::Relaxed),
        )
    }

    /// The call's claim landed, leaving the record's steps as `stored` (`None`: it started afresh).
    pub(crate) fn claimed(&self, stored: Option<Vec<u8>>) {
        self.state().claimed = stored;
    }

    /// The body runs as `token`, with the steps the claim left ([`claimed`](Self::claimed)).
    pub(crate) fn begin(
        &self,
        idem: &Idempotency,
        key: &str,
        token: &str,
        fingerprint: Option<&str>,
        lease: Duration,
        staging: Option<&Staged>,
    ) {
        let written = self
            .state()
            .claimed
            .take()
            .unwrap_or_else(|| self.initial(token).to_vec());
        let stored = Stored::decode(&written);
        let resumed = stored.as_ref().map_or(0, |s| s.steps.len());
        if resumed > 0 {
            tracing::debug!(
                namespace = self.shared.namespace,
                steps = resumed,
                "resuming: finished steps are replayed"
            );
        }
        self.state().call = Some(Call {
            idem: idem.clone(),
            key: key.to_owned(),
            token: token.to_owned(),
            fingerprint: fingerprint.map(ToOwned::to_owned),
            lease,
            stored,
            written,
            staging: staging.cloned(),
        });
    }

    /// Runs the step `name` once for the operation: returns its stored value when an earlier call of
    /// the operation finished it (without running `step`), and otherwise runs `step` and, when it
    /// returns `Ok`, stores its value in the record before returning it. A step's `Err` is not stored:
    /// it is returned as it is, and the body ends with it as usual.
    ///
    /// A crash (or a lapsed lease, a dropped call, a panic) while `step` runs leaves it unfinished:
    /// the next call runs it again, which is safe when it passes [`key`](Self::key) to a downstream
    /// API that honours idempotency keys. A step that must never run twice (an email, a legacy
    /// payment API without keys) is for [`run_at_most_once`](Self::run_at_most_once).
    ///
    /// With [`steps`](crate::Operation::steps) and [`transact`](crate::Operation::transact), stage business writes in the
    /// body, not inside a step: a replayed step does not run, so what it staged cannot be staged again.
    /// Such a step is recorded as having staged writes, and a call that would replay it (after a call
    /// that did not complete) stops there with [`Error::StepStagedWrites`] rather than completing the
    /// operation without them. (Writes staged by the body's other futures while the step runs count as
    /// the step's.)
    ///
    /// The value must serialize to JSON and deserialize back (as a call's response must); it counts
    /// toward the record's 400 KB with the values of the steps before it (compressed above
    /// [`COMPRESS_ABOVE`](crate::COMPRESS_ABOVE) bytes), so keep it small: an id, not a whole object.
    /// A value that cannot be stored (it does not serialize, its `Serialize` panics, or it does not
    /// fit) does not undo the step's effect: the step is recorded as finished without a value, this
    /// call gets why (or the panic), and every later call of the operation gets
    /// [`Error::StepNotStored`] at this step, which never runs again.
    ///
    /// Costs one conditional `UpdateItem` per step that runs (none for a replayed one), fenced by the
    /// call's claim: a call that lost its claim (a lease that lapsed, and another call took over)
    /// stores nothing and stops at the step with [`Error::LeaseLost`]. A body run without a record (the
    /// kill switch, or a missing key under [`MissingKey::Skip`](crate::MissingKey::Skip)) just runs
    /// its steps.
    ///
    /// # Errors
    /// `step`'s own error; or, converted into `E`: [`Error::StepRepeated`] for a name this call asked
    /// for before, [`Error::StepValue`] for a stored value that does not deserialize into `T`,
    /// [`Error::StepNotStored`] for a step that finished before without a stored value,
    /// [`Error::StepInterrupted`] for an at-most-once step of the same name that was interrupted,
    /// [`Error::Serialize`] for a value that does not serialize, [`Error::StepTooLarge`] for one that
    /// does not fit, [`Error::LeaseLost`], and the store's errors when the value could not be stored
    /// ([`Error::ResultNotStored`] once transient faults outlasted the lease).
    pub async fn run<T, E, F, Fut>(&self, name: &str, step: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        if let Some(prior) = self.prior::<T, E>(name)? {
            return prior;
        }
        let _room = self.reserve(name)?;
        let before = self.staged_writes();
        let value = step().await?;
        self.save(name, &value, self.staged_writes() > before)
            .await?;
        Ok(value)
    }

    /// Keeps room in the record for the mark of the step `name`, which is about to run, until the
    /// returned guard is dropped: should its value not fit, the mark that it finished without one
    /// ([`Stored::finish_unstored`]) must, or the next call would run the step again.
    /// [`Error::StepTooLarge`], before the step runs, when the record has no such room left. Nothing
    /// without a record.
    fn reserve(&self, name: &str) -> Result<Room<'_>, Error> {
        let mut state = self.state();
        let reserved = state.reserved;
        let Some(call) = state.call.as_ref() else {
            return Ok(Room {
                steps: self,
                bytes: 0,
            });
        };
        let bytes = mark_room(name);
        let needed = call.written.len() + reserved + bytes;
        let budget = call
            .idem
            .store()
            .steps_budget(&call.key, call.fingerprint.as_deref());
        if needed > budget {
            drop(state);
            self.fault();
            tracing::warn!(
                namespace = self.shared.namespace,
                step = name,
                "no room left in the record for the step; it does not run"
            );
            return Err(Error::StepTooLarge {
                namespace: self.shared.namespace.to_owned(),
                step: name.to_owned(),
                bytes: needed,
                budget,
            });
        }
        state.reserved += bytes;
        Ok(Room { steps: self, bytes })
    }

    /// How many business writes the body has staged so far (none without a transaction).
    fn staged_writes(&self) -> usize {
        self.state()
            .call
            .as_ref()
            .and_then(|call| call.staging.as_ref())
            .map_or(0, |staging| staging.lock().len())
    }

    /// Runs the step `name` at most once for the operation, even across crashes: as
    /// [`run`](Self::run), except that before `step` runs, one more fenced write records that it
    /// started. If the call ends before the step finished (a crash, a lapsed lease that another call
    /// took over, a dropped call, a panic in `step`), the step is never run again while the record
    /// lives: every later call of the operation stops at it with [`Error::StepInterrupted`], the
    /// record's steps say so, and an operator settles the key (see the runbook's "A step that cannot be
    /// resumed"). This is what a downstream without idempotency keys needs (an SMTP server, a legacy
    /// payment API): a person decides, rather than a retry sending it twice.
    ///
    /// A step that returns `Err` has finished (it says its effect did not happen): the mark is removed
    /// (one more write), and the next call of the operation runs it again. A value that cannot be
    /// stored is handled as with [`run`](Self::run).
    ///
    /// Costs two conditional `UpdateItem`s per step that runs (the start, then the value), one more
    /// than [`run`](Self::run); none for a replayed one. With the restart policy
    /// ([`Operation::restart_steps_after_failure`](crate::Operation::restart_steps_after_failure)), an
    /// operation holding an interrupted step does not start over after a failure: it stays where it is.
    ///
    /// # Errors
    /// As [`run`](Self::run); and [`Error::StepInterrupted`] when an earlier call started this step and
    /// did not finish it. When the start cannot be recorded ([`Error::LeaseLost`], the store's
    /// errors), `step` does not run.
    ///
    /// ```
    /// use idempotent_runtime::{Error, Idempotency, Steps};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Error> {
    /// let idem = Idempotency::in_memory();
    /// let sent = idem
    ///     .operation("shop::confirm", "order-7")
    ///     .steps()
    ///     .run(|cx| async move {
    ///         let steps = cx.steps();
    ///         // An SMTP server has no idempotency keys: never send twice, even after a crash.
    ///         steps
    ///             .run_at_most_once("email", || async { Ok::<_, Error>("queued 250 OK".to_owned()) })
    ///             .await
    ///     })
    ///     .await?;
    /// assert_eq!(sent, "queued 250 OK");
    /// # Ok(()) }
    /// ```
    pub async fn run_at_most_once<T, E, F, Fut>(&self, name: &str, step: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        if let Some(prior) = self.prior::<T, E>(name)? {
            return prior;
        }
        let _room = self.reserve(name)?;
        self.write(name, |stored| stored.start(name)).await?;
        let before = self.staged_writes();
        match step().await {
            Ok(value) => {
                self.save(name, &value, self.staged_writes() > before)
                    .await?;
                Ok(value)
            }
            Err(e) => {
                // The step says its effect did not happen: it may run again. Should the mark stay
                // (the write failed), the next call stops at the step instead: the safe side.
                if let Err(error) = self.write(name, |stored| stored.unstart(name)).await {
                    tracing::warn!(
                        namespace = self.shared.namespace,
                        step = name,
                        %error,
                        "an at-most-once step failed, and its start could not be cleared; the next call stops at it"
                    );
                }
                Err(e)
            }
        }
    }

    /// What an earlier call of the operation left of the step `name`, for a body asking for it: its
    /// value (replayed), or why it must not run again; `None` when it is to run. An error for a name
    /// this call asked for before, or steps that do not decode.
    fn prior<T, E>(&self, name: &str) -> Result<Option<Result<T, E>>, E>
    where
        T: DeserializeOwned,
        E: From<Error>,
    {
        let prior = self.look_up::<T, E>(name);
        if matches!(prior, Err(_) | Ok(Some(Err(_)))) {
            self.fault();
        }
        prior
    }

    /// [`prior`](Self::prior), before it notes an error as the library's.
    fn look_up<T, E>(&self, name: &str) -> Result<Option<Result<T, E>>, E>
    where
        T: DeserializeOwned,
        E: From<Error>,
    {
        let namespace = self.shared.namespace;
        let mut state = self.state();
        if !state.used.insert(name.to_owned()) {
            return Err(Error::StepRepeated {
                namespace: namespace.to_owned(),
                step: name.to_owned(),
            }
            .into());
        }
        let stored = match state.call.as_ref().map(|call| &call.stored) {
            None => return Ok(None),
            Some(Ok(stored)) => stored,
            Some(Err(detail)) => {
                return Err(Error::CorruptRecord {
                    namespace: namespace.to_owned(),
                    detail: format!("its stored steps do not decode: {detail}"),
                }
                .into());
            }
        };
        let error = match stored.prior(name) {
            Prior::Run => return Ok(None),
            Prior::Replay(value) => {
                tracing::debug!(
                    namespace,
                    step = name,
                    "step finished before; replaying its value"
                );
                crate::telemetry::step(namespace, "replayed");
                return Ok(Some(serde_json::from_str::<T>(value.get()).map_err(
                    |source| {
                        Error::StepValue {
                            namespace: namespace.to_owned(),
                            step: name.to_owned(),
                            source,
                        }
                        .into()
                    },
                )));
            }
            Prior::StagedWrites => {
                tracing::warn!(
                    namespace,
                    step = name,
                    "step staged business writes in a call that did not complete; refusing to replay it without them"
                );
                Error::StepStagedWrites {
                    namespace: namespace.to_owned(),
                    step: name.to_owned(),
                }
            }
            Prior::NotStored(detail) => {
                tracing::warn!(
                    namespace,
                    step = name,
                    "step finished before without a stored value; it is not run again"
                );
                Error::StepNotStored {
                    namespace: namespace.to_owned(),
                    step: name.to_owned(),
                    detail: detail.to_owned(),
                }
            }
            Prior::Interrupted => {
                tracing::warn!(
                    namespace,
                    step = name,
                    "at-most-once step was interrupted before; it is not run again"
                );
                Error::StepInterrupted {
                    namespace: namespace.to_owned(),
                    step: name.to_owned(),
                }
            }
        };
        Ok(Some(Err(error.into())))
    }

    /// Stores `value` as the step `name`'s, with every step finished before it. A value that cannot
    /// be stored is recorded as such ([`Stored::unstored`]), and its error returned (or its panic
    /// resumed).
    async fn save<T: Serialize + DeserializeOwned>(
        &self,
        name: &str,
        value: &T,
        staged: bool,
    ) -> Result<(), Error> {
        if self.state().call.is_none() {
            // No record: nothing to store, and the value goes back as it is.
            return Ok(());
        }
        // Unwind safety: after a panic only the value's reference was touched, and the value is
        // handed back (or dropped) untouched by this call.
        let encoded = match std::panic::catch_unwind(AssertUnwindSafe(|| self.encode(value))) {
            Ok(Ok(value)) => value,
            Ok(Err(error)) => {
                let detail = error.to_string();
                self.fault();
                self.unstorable(name, &detail).await;
                return Err(error);
            }
            Err(panic) => {
                self.fault();
                self.unstorable(name, &crate::handler::panicked(&*panic))
                    .await;
                std::panic::resume_unwind(panic);
            }
        };
        let saved = self
            .write(name, |stored| stored.finish(name, encoded, staged))
            .await;
        match saved {
            Err(error @ Error::StepTooLarge { .. }) => {
                self.unstorable(name, &error.to_string()).await;
                Err(error)
            }
            Err(error) => Err(error),
            Ok(()) => {
                crate::telemetry::step(self.shared.namespace, "stored");
                Ok(())
            }
        }
    }

    /// `value` as a step's stored JSON; an error for a value that does not serialize, or whose JSON
    /// would not read back as it (a non-finite float).
    fn encode<T: Serialize + DeserializeOwned>(
        &self,
        value: &T,
    ) -> Result<Box<serde_json::value::RawValue>, Error> {
        let serialize_error = |source| Error::Serialize {
            namespace: self.shared.namespace.to_owned(),
            what: "step",
            source,
        };
        let json = codec::to_json(value).map_err(serialize_error)?;
        if let Some(source) = codec::non_finite(value, &json) {
            return Err(serialize_error(source));
        }
        // What is stored must read back as the value: refused now, not at the replay, where every
        // retry would fail the same way.
        if let Err(source) = serde_json::from_slice::<T>(&json) {
            return Err(serialize_error(
                <serde_json::Error as serde::ser::Error>::custom(format!(
                    "it does not read back from JSON ({source})"
                )),
            ));
        }
        serde_json::value::RawValue::from_string(
            String::from_utf8(json).expect("serde_json writes UTF-8"),
        )
        .map_err(serialize_error)
    }

    /// Records that the step `name` finished (its effect happened) but its value cannot be stored
    /// (`detail` says why): it is never run again. A record that cannot take even the mark, or a
    /// write that fails, is logged: the caller's error goes back all the same.
    async fn unstorable(&self, name: &str, detail: &str) {
        let namespace = self.shared.namespace;
        let mut marked = self
            .write(name, |stored| {
                stored.finish_unstored(name, mark_detail(detail));
            })
            .await;
        if let Err(Error::StepTooLarge { .. }) = marked {
            // The room kept for the mark bounds it; should compression still not fit it, the fact
            // alone is what matters.
            marked = self
                .write(name, |stored| stored.finish_unstored(name, String::new()))
                .await;
        }
        match marked {
            Ok(()) => {
                tracing::warn!(
                    namespace,
                    step = name,
                    "step finished but its value cannot be stored; recorded as finished without a value"
                );
                crate::telemetry::step(namespace, "not_stored");
            }
            Err(error) => tracing::warn!(
                namespace,
                step = name,
                %error,
                "step finished but neither its value nor the fact could be stored"
            ),
        }
    }

    /// Applies `change` to the stored steps and writes them all, fenced by the call's claim and made
    /// only on the steps the call's last write stored (or its claim left); one write at a time, so
    /// that each carries every change before it. Nothing without a record.
    /// [`Error::StepTooLarge`] (for the step `name`), with nothing written or changed, when the
    /// steps would not fit.
    async fn write(&self, name: &str, change: impl FnOnce(&mut Stored)) -> Result<(), Error> {
        let namespace = self.shared.namespace;
        let _writing = self.shared.writing.lock().await;
        let (idem, key, token, lease, previous, bytes) = {
            let mut state = self.state();
            let others = state.reserved.saturating_sub(mark_room(name));
            let Some(call) = state.call.as_mut() else {
                // No record: nothing to store.
                return Ok(());
            };
            let Ok(stored) = call.stored.as_mut() else {
                unreachable!("a step runs only when the stored steps decoded");
            };
            let next = stored.rewritten(change);
            let bytes = next.encode();
            // The record must still take a failure's error text and released tokens beside the
            // steps (a FAILED record keeps them), or the failure could not be written.
            // Less the room kept for the marks of the other steps running now ([`Steps::reserve`]).
            let budget = call
                .idem
                .store()
                .steps_budget(&call.key, call.fingerprint.as_deref())
                .saturating_sub(others);
            if bytes.len() > budget {
                return Err(Error::StepTooLarge {
                    namespace: namespace.to_owned(),
                    step: name.to_owned(),
                    bytes: bytes.len(),
                    budget,
                });
            }
            *stored = next;
            // From now on the record holds either (the write's fate may stay unknown): the next
            // write extends this one's, and is refused if this one never landed.
            let previous = std::mem::replace(&mut call.written, bytes.clone());
            (
                call.idem.clone(),
                call.key.clone(),
                call.token.clone(),
                call.lease,
                previous,
                bytes,
            )
        };
        // In doubt until the write's answer says it landed: a step's future dropped here (a
        // `select!` or `try_join!` in the body) leaves the call not knowing which steps the record
        // holds.
        self.shared.in_doubt.store(true, Ordering::Relaxed);
        let saved =
            crate::handler::save_steps(&idem, namespace, &key, &token, &previous, &bytes, lease)
                .await;
        match saved {
            Ok(()) => self.shared.in_doubt.store(false, Ordering::Relaxed),
            Err(_) => self.fault(),
        }
        saved
    }

    /// A step came to an error of the library's ([`Shared::faulted`]).
    fn fault(&self) {
        self.shared.faulted.store(true, Ordering::Relaxed);
    }

    /// Whether a failure of the call is to leave its claim to lapse rather than record a FAILED record
    /// that the restart policy starts over after: under the restart policy (and not pinned), when the
    /// failure is not the body's own `Err` — the body returned `Ok` and its completion failed
    /// (`completing`), or a step of this call came to an error of the library's (a step write that
    /// failed in the store, a value that does not read back, no room left, a step that must not run
    /// again), which the body may have passed up with `?`. Such a failure is no more one the body undid
    /// its steps after than a crash is: the next call resumes (as after a crash) rather than starting
    /// over and running the finished steps again.
    ///
    /// Not for an operation this call knows to be pinned (a FAILED record of it resumes whatever the
    /// policy); but with a step write in doubt, the record may hold a pin the call does not know of,
    /// or lack one it does, and the claim lapses.
    pub(crate) fn lapses_after_failure(&self, completing: bool) -> bool {
        let in_doubt = self.shared.in_doubt.load(Ordering::Relaxed);
        self.shared.restart_failed
            && (in_doubt
                || ((completing || self.shared.faulted.load(Ordering::Relaxed))
                    && self.restart_failed()))
    }

    /// A key for a downstream API's own idempotency (a payment gateway's `Idempotency-Key` header) for
    /// the step `name`: 64 hex digits, the same in every call of this operation (a retry after a
    /// crash, a lapsed lease or a failure gets the same one), different for every step and every
    /// operation, and new once the operation's record expired and the key is a new operation.
    ///
    /// Passing it to the downstream call makes a crash *inside* a step safe too: the next call runs
    /// the unfinished step again with the same key, and the downstream API answers it as the same
    /// request.
    #[must_use]
    pub fn key(&self, name: &str) -> String {
        let mut state = self.state();
        let (record_key, origin) = match state.call.as_ref() {
            Some(call) => (
                call.key.clone(),
                call.stored
                    .as_ref()
                    .map_or_else(|_| call.token.clone(), |s| s.origin.clone()),
            ),
            // Without a record there is no operation to be the same across calls: a key of this call.
            None => (
                self.shared.namespace.to_owned(),
                state
                    .alone_origin
                    .get_or_insert_with(|| uuid::Uuid::new_v4().to_string())
                    .clone(),
            ),
        };
        drop(state);
        step_key(&record_key, &origin, name)
    }
}

/// The room a running step keeps in the record for its mark ([`Steps::reserve`]), given back when
/// the step ends.
struct Room<'s> {
    steps: &'s Steps,
    bytes: usize,
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let mut state = self.steps.state();
            state.reserved = state.reserved.saturating_sub(self.bytes);
        }
    }
}

/// What a record's steps say ([`Record::steps_report`]): for an operator deciding what to do with a
/// key whose operation cannot resume ([`Error::StepNotStored`], [`Error::StepInterrupted`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StepsReport {
    /// The steps that finished with their value stored (replayed by the next call).
    pub finished: Vec<String>,
    /// The steps that finished but whose value could not be stored, with why: never run again.
    pub not_stored: Vec<(String, String)>,
    /// The at-most-once steps ([`Steps::run_at_most_once`]) that started and did not finish: their
    /// effect may or may not have happened, and they are never run again.
    pub interrupted: Vec<String>,
}

impl StepsReport {
    /// Whether the operation cannot go past one of its steps without an operator: a step was
    /// interrupted, or its value could not be stored.
    #[must_use]
    pub fn needs_operator(&self) -> bool {
        !self.not_stored.is_empty() || !self.interrupted.is_empty()
    }
}

impl Record {
    /// What the record's steps say (an operation run with [`Steps`], while PENDING or FAILED): `None`
    /// without steps.
    ///
    /// # Errors
    /// Why the stored steps do not decode.
    #[must_use]
    pub fn steps_report(&self) -> Option<Result<StepsReport, String>> {
        let bytes = self.steps.as_deref()?;
        Some(Stored::decode(bytes).map(|stored| StepsReport {
            finished: stored.steps.into_keys().collect(),
            not_stored: stored.unstored.into_iter().collect(),
            interrupted: stored.started.into_iter().collect(),
        }))
    }
}
