//! Claiming a key: the call's attempts and where it stands ([`Stage`]), what dropping it does, the
//! claim requests (plain, or with business writes), the release of a claim a call gives up, waiting on
//! another call's claim, and the answers found without running the body (the local cache, a replay).

#[allow(
    clippy::wildcard_imports,
    reason = "the state machine's parts share its vocabulary"
)]
use super::*;
use flight::{Followed, Joined, Landed, Lead};
use std::sync::Arc;

/// How a claim with claim-time writes ended ([`claim_with_writes`]).
pub(super) enum WithWrites {
    /// The claim and its writes committed together.
    Claimed,
    /// This record blocks the claim (boxed, as [`Claim::Blocked`] carries it on).
    Blocked(Box<Record>),
    /// The key is to be taken with a plain claim instead: its claim-time writes are still in effect,
    /// or (for a resume of steps) the record is gone.
    Plain,
}

/// First poll after this long, doubling up to [`MAX_POLL`], while waiting for an in-flight call.
pub(super) const FIRST_POLL: Duration = Duration::from_millis(25);
pub(super) const MAX_POLL: Duration = Duration::from_secs(1);

/// A claim with claim-time writes, as a transaction; [`WithWrites::Plain`] when the key is to be taken
/// with a plain claim instead. Boxed and out of line: most calls have no claim-time writes, and their claim's code
/// stays dense in the instruction cache.
#[cold]
pub(super) fn claim_with_writes<'a>(
    idem: &'a Idempotency,
    plan: &'a Plan<'_>,
    request: &'a ClaimRequest<'_>,
) -> Pin<Box<dyn Future<Output = Result<WithWrites, Error>> + Send + 'a>> {
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
            Ok(TransactOutcome::Committed) => Ok(WithWrites::Claimed),
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
                Ok(WithWrites::Plain)
            }
            Ok(TransactOutcome::Rejected(Some(record))) => {
                Ok(WithWrites::Blocked(Box::new(record)))
            }
            // A resume whose record is gone: the plain claim finds it gone too, and the call claims
            // afresh.
            Ok(TransactOutcome::Rejected(None))
                if matches!(request.steps, StepsClaim::Resume { .. }) =>
            {
                Ok(WithWrites::Plain)
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
pub(super) enum Acquired<'a> {
    /// We hold the claim until this instant (epoch milliseconds): run the body. `took_over`: the key was
    /// held by a lapsed claim when this call found it; `lead`: the call's hold on the key's flight in
    /// this process, when it leads one.
    Held {
        lease_until_ms: u64,
        took_over: bool,
        lead: Option<Lead<'a>>,
    },
    /// The answer is known without running the body: a replay from the store or from the local cache,
    /// as stored (the call's typed side decodes it, [`Replay::decode`]).
    Done(Replay<'a>, Outcome),
}

/// A stored response found by the claim phase, before it is decoded. Not generic, so that the claim
/// phase is compiled once for every function; decoding is what each value type needs of its own.
pub(crate) enum Replay<'a> {
    /// From the local cache, or passed on by the leader of the key's flight in this process.
    Shared(Arc<[u8]>),
    /// From the store: once it decodes, the cache keeps it and the call's followers (when it leads a
    /// flight) get it too.
    Record {
        record: Box<Record>,
        lead: Option<Lead<'a>>,
    },
}

impl Replay<'_> {
    /// The replay without its hold on the key's flight, which is owned instead: so that a call's core
    /// can hand the replay back with the parts it borrowed ([`core`]).
    pub(super) fn into_owned(
        self,
        idem: &Idempotency,
    ) -> (Replay<'static>, Option<flight::OwnedLead>) {
        match self {
            Replay::Shared(response) => (Replay::Shared(response), None),
            Replay::Record { record, lead } => {
                let lead = lead.and_then(|lead| Some(lead.into_owned(idem.flights()?)));
                (Replay::Record { record, lead: None }, lead)
            }
        }
    }

    /// The replay with `lead` as its hold on the key's flight (see [`into_owned`](Self::into_owned)).
    pub(super) fn with_lead(self, lead: Option<Lead<'_>>) -> Replay<'_> {
        match self {
            Replay::Shared(response) => Replay::Shared(response),
            Replay::Record { record, .. } => Replay::Record { record, lead },
        }
    }

    /// The response decoded (within the handle's `max_response_bytes`); a record's response then goes
    /// to the local cache and to the calls following this one. A response that does not decode goes to
    /// neither.
    ///
    /// `parse` makes the value from the response's JSON: the only part made for each value type.
    ///
    /// # Errors
    /// [`Error::Deserialize`], [`Error::CorruptRecord`] or [`Error::ResponseNotSerialized`].
    pub(crate) fn decode(
        self,
        idem: &Idempotency,
        plan: &Plan<'_>,
        parse: &mut dyn codec::Parse,
    ) -> Result<(), Error> {
        let namespace = plan.call.namespace;
        match self {
            Replay::Shared(response) => {
                replay(namespace, &response, idem.max_response_bytes(), parse)
            }
            Replay::Record { record, lead } => {
                let response = record.response.as_deref().unwrap_or_default();
                replay(namespace, response, idem.max_response_bytes(), parse)?;
                keep_replayed(idem, plan, record, lead.as_ref());
                Ok(())
            }
        }
    }
}

/// What a call's claim attempts need: the call, its fencing token and its durations; and where the call
/// is, for what dropping it must do (see its `Drop`).
pub(super) struct Attempt<'a> {
    pub(super) idem: &'a Idempotency,
    pub(super) plan: &'a Plan<'a>,
    pub(super) token: &'a str,
    pub(super) lease: Duration,
    pub(super) ttl: Duration,
    pub(super) stage: Where,
}

impl<'a> Attempt<'a> {
    /// The first claim attempt of a call under `token`, with the call's lease and time to live (its
    /// own, or the handle's defaults).
    pub(super) fn new(idem: &'a Idempotency, plan: &'a Plan<'a>, token: &'a str) -> Self {
        let call = plan.call;
        Self {
            idem,
            plan,
            token,
            lease: call_lease(idem, call),
            ttl: call.ttl.unwrap_or_else(|| idem.default_ttl()),
            stage: Where::new(Stage::Claiming),
        }
    }

    /// What the call does after `answer` to its `number`th claim attempt, read now
    /// ([`decide::after_claim`]), and the time (less the margin) it was judged at.
    fn next(&self, answer: decide::Answer<'_>, number: u32) -> (decide::AfterClaim, u64) {
        let now_ms = self.idem.clock().now_ms();
        let judged = judged_ms(now_ms, self.idem.clock_skew_margin());
        (decide::after_claim(answer, number, now_ms, judged), judged)
    }

    /// The call holds its claim until `lease_until_ms`: its steps are the ones `seen` (a resume), and
    /// the body runs.
    fn held(
        &self,
        seen: Option<Vec<u8>>,
        lease_until_ms: u64,
        took_over: bool,
        lead: Option<Lead<'a>>,
    ) -> Acquired<'a> {
        if let Some(steps) = self.plan.steps {
            steps.claimed(seen);
        }
        Acquired::Held {
            lease_until_ms,
            took_over,
            lead,
        }
    }

    /// How a flight's followers see this call's own claim, held until `lease_until_ms`: taken over from
    /// its lease's end plus the margin (as [`examine`] counts it).
    fn own_claim(&self, lease_until_ms: u64) -> flight::Busy {
        flight::Busy {
            until_ms: lease_until_ms.saturating_add(millis(self.idem.clock_skew_margin())),
            own: true,
        }
    }

    /// The claim request of attempt `number`, with its own times (a plain claim: it applies no
    /// claim-time writes and keeps none, and leaves steps alone until the caller sets them).
    fn request(&self, number: u32) -> ClaimRequest<'a> {
        let times = claim_times(
            self.idem.clock().now_ms(),
            self.idem.clock_skew_margin(),
            self.lease,
            writes_lifetime(self.idem, self.plan, self.ttl),
            self.plan.call.deadline_ms.map(u64::from),
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
            // Set by the caller, for an attempt that claims ([`Steps::claim`]): a renewal leaves the
            // call's steps remembering the claim it renews, which is the one on its way.
            steps: StepsClaim::Untouched,
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
    pub(super) fn new(stage: Stage) -> Self {
        Self(AtomicU8::new(stage as u8))
    }

    pub(super) fn get(&self) -> Stage {
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
        self.abandon();
    }
}

impl Attempt<'_> {
    /// Cleans up after a call that ends here without going on (its future was dropped, or its claim
    /// failed with an error that leaves the claim's fate unknown), by its [`Stage`]
    /// ([`decide::on_drop`]).
    pub(super) fn abandon(&self) {
        let namespace = self.plan.call.namespace;
        let releasable = self.plan.steps.is_none_or(Steps::releasable);
        match decide::on_drop(self.stage.get(), releasable) {
            decide::OnDrop::KeepClaim => telemetry::call_dropped(namespace, Dropped::Claim),
            decide::OnDrop::Release => {
                telemetry::call_dropped(namespace, Dropped::Claim);
                // A claim with claim-time writes leaves them in effect (a release sends no
                // compensation), so its record must live as long as a failure that keeps them.
                // So must a claim that may hold finished steps (a resume).
                let lifetime = failed_lifetime(
                    self.idem.failed_ttl(),
                    (!self.plan.claim_writes.is_empty() || self.plan.steps.is_some())
                        .then(|| writes_lifetime(self.idem, self.plan, self.ttl)),
                );
                let mark = decide::release_mark_lifetime(
                    self.lease,
                    writes_lifetime(self.idem, self.plan, self.ttl),
                );
                release(
                    self.idem,
                    namespace,
                    self.plan.key,
                    self.token,
                    self.lease,
                    lifetime,
                    mark,
                );
            }
            decide::OnDrop::KeepBody => telemetry::call_dropped(namespace, Dropped::Body),
            decide::OnDrop::Nothing => {}
        }
        // Done: a call is cleaned up once.
        self.stage.set(Stage::Done);
    }
}

/// The error text of a claim released because its call was dropped before the body started.
pub(crate) const RELEASED: &str = "released: the call was dropped before its body started";

/// Moves a claim that `token` may hold on `key` to FAILED ([`RELEASED`]), on a task of its own (a drop
/// cannot await): the key is claimable again at once, and the FAILED record shows why. Fenced like
/// every transition, so a claim that never landed, or was taken over since, is left alone. Outside a
/// Tokio runtime nothing can be sent, and the claim lapses with its lease.
#[cold]
pub(super) fn release(
    idem: &Idempotency,
    namespace: &'static str,
    key: &str,
    token: &str,
    lease: Duration,
    lifetime: Duration,
    mark_lifetime: Duration,
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
        // A fenced failure of the claim if it landed; where it has not (the claim still in flight), a
        // mark that the claim, landing later, respects: a FAILED record under the call's token where
        // there is none, else the token left on the record there ([`decide::after_release`]). Each
        // rejection means the record changed in between ([`decide::RELEASE_WRITES`]).
        let margin = idem.clock_skew_margin();
        let hold_until_ms = decide::release_hold_until(idem.clock().now_ms(), lease, margin);
        // The same end on the process's monotonic clock: a handle's clock that stands still (a test's
        // manual clock) never ends a release that an outage keeps failing.
        let retries_until = tokio::time::Instant::now() + lease + margin;
        let mut step = Some(decide::ReleaseStep::Fail);
        // The record the next mark is computed from: the one the last rejection returned.
        let mut seen = None;
        let (mut answered, mut failures) = (0, 0);
        while answered < decide::RELEASE_WRITES {
            let Some(sent) = step else { break };
            let now_ms = idem.clock().now_ms();
            let change = release_change(
                sent,
                now_ms,
                margin,
                Lifetimes {
                    lifetime,
                    mark_lifetime,
                    hold_until_ms,
                },
                seen,
            );
            let transition = Transition {
                key: &key,
                token: &token,
                change,
            };
            let (applied, found) = match telemetry::observe(
                "release",
                idem.store().transition(&transition),
            )
            .await
            {
                Ok(WriteOutcome::Applied) => (true, None),
                Ok(WriteOutcome::Rejected(record)) => (false, record),
                Err(error) => {
                    if let Some(pause) =
                        decide::release_retry(&error, failures, now_ms, hold_until_ms)
                            .filter(|_| tokio::time::Instant::now() < retries_until)
                    {
                        tracing::debug!(namespace, %error, ?pause, "a release's write failed; it is sent again");
                        failures += 1;
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                    tracing::warn!(
                        namespace,
                        %error,
                        "could not release the claim of a call that gave it up; it lapses with its lease"
                    );
                    return;
                }
            };
            (answered, failures) = (answered + 1, 0);
            seen = decide::seen_after(
                sent,
                applied,
                found.as_ref(),
                &token,
                expiry_s(now_ms, lifetime),
            );
            step = decide::after_release(
                sent,
                applied,
                found.as_ref(),
                &token,
                judged_ms(now_ms, margin),
                hold_until_ms,
            );
        }
        if step.is_some() {
            tracing::warn!(
                namespace,
                "the claim of a call that gave it up is not released after {} writes, each lost to \
                 another write on its record; it lapses with its lease",
                decide::RELEASE_WRITES
            );
        } else {
            tracing::debug!(namespace, "the claim of a call that gave it up is released");
        }
    };
    runtime.spawn(tasks.track_future(release));
}

/// How long what a release writes lives: its failure of a landed claim (`lifetime`), its mark where
/// there is no record (`mark_lifetime`, [`decide::release_mark_lifetime`]), and until when the claim
/// it gave up can hold the key (`hold_until_ms`, [`decide::release_hold_until`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lifetimes {
    pub(crate) lifetime: Duration,
    pub(crate) mark_lifetime: Duration,
    pub(crate) hold_until_ms: u64,
}

/// The write a release makes at `step` at `now_ms` (with the caller's clock-skew `margin`): a
/// failure, a mark, or the token left on the record it last read (`seen`; [`decide::mark`]).
pub(crate) fn release_change(
    step: decide::ReleaseStep,
    now_ms: u64,
    margin: Duration,
    lifetimes: Lifetimes,
    seen: Option<decide::Seen>,
) -> Change<'static> {
    match step {
        decide::ReleaseStep::Fail => Change::Fail {
            error: RELEASED,
            expires_at_s: expiry_s(now_ms, lifetimes.lifetime),
            release_claim_writes: false,
        },
        // No earlier than the claim's end, like every write of a record with released tokens
        // (`Record::outlives_released`): a `ttl` shorter than the clock-skew margin would make it so.
        decide::ReleaseStep::Mark => Change::Release {
            now_ms: judged_ms(now_ms, margin),
            error: RELEASED,
            expires_at_s: expiry_s(now_ms, lifetimes.mark_lifetime)
                .max(lifetimes.hold_until_ms.div_ceil(1000)),
            released_until_ms: lifetimes.hold_until_ms,
        },
        // Only ever after a write that told what the record holds; should one not have, a mark
        // computed from nothing is refused by any record, and the refusal says what it holds.
        decide::ReleaseStep::MarkRecord => decide::mark(
            seen.unwrap_or(decide::Seen::NOTHING),
            judged_ms(now_ms, margin),
            lifetimes.hold_until_ms,
        ),
    }
}

/// Claims the key, or finds the stored answer, or says why neither is possible; with `wait`, polls an
/// in-flight call until it finishes or the wait runs out.
#[allow(
    clippy::too_many_lines,
    reason = "one loop of claim, inspect and wait: split, its state would live across awaits in more futures, each part of every call's"
)]
pub(super) async fn acquire<'a>(attempt: &Attempt<'a>) -> Result<Acquired<'a>, Error> {
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

    if let Some(response) = cached(idem, plan)? {
        return Ok(Acquired::Done(Replay::Shared(response), Outcome::Cached));
    }

    // The key's flight in this process: a call that follows one makes no request. The lead, held
    // until the call ends, passes on what the store answers.
    let held_lead = match idem.flights() {
        None => None,
        Some(flights) => match flights.join(plan.key, plan.fingerprint) {
            Joined::Lead(lead) => Some(lead),
            Joined::Alone => None,
            Joined::Follow(flight) => match follow(attempt, flights, flight, wait_until).await? {
                Following::Done(response) => {
                    return Ok(Acquired::Done(Replay::Shared(response), Outcome::Replayed));
                }
                Following::Store(lead) => lead,
            },
        },
    };

    // Claim, or find out why not. Loops only when waiting, or when a record became claimable between
    // two reads; each pass is a new claim attempt, with its own times. (No record, and nothing decided
    // from one, is held across an await: this future is part of every call's, and stays small.)
    // The next pause, in milliseconds (a `u32`, not a `Duration`: this future stays small).
    let mut poll_ms = millis_u32(FIRST_POLL);
    let mut number = 0;
    let mut took_over = false;
    // With steps: the stored steps of a record to resume or restart after, as last seen (boxed: a
    // pointer in every call's future, where most calls have no steps).
    let mut seen: Option<Box<Vec<u8>>> = None;
    // The call's claim is in the store but was answered too late to use: renew it rather than claim.
    let mut renew = false;
    'claim: loop {
        number += 1;
        telemetry::record_attempt(number);
        let mut request = attempt.request(number);
        attempt.stage.set(Stage::Claiming);
        let renewing = std::mem::take(&mut renew);
        // A deadline that leaves too little for a lease: no claim (a renewal gives its claim up).
        let deadline_ms = plan.call.deadline_ms.map(u64::from);
        if let Some(left) = decide::too_close_to_deadline(deadline_ms, idem.clock().now_ms()) {
            if !renewing {
                // Nothing of the call's is in the store: nothing to release.
                attempt.stage.set(Stage::Waiting);
            }
            return Err(deadline_passed(plan.call.namespace, left));
        }
        if !renewing && let Some(steps) = plan.steps {
            request.steps = steps.claim(token, seen.as_deref().map(Vec::as_slice));
        }
        // The request is moved into the attempt's own future: this one then holds it only while
        // that future is awaited, and the record it may return can share its place. A renewal
        // (rare: only a late answer renews) is boxed, with what it needs of the request.
        let mut refused = match if renewing {
            Box::pin(renew_once(attempt, request)).await?
        } else {
            claim_once(idem, plan, request).await?
        } {
            Claim::Held { lease_until_ms } => {
                let landed = decide::Answer::Landed { lease_until_ms };
                match attempt.next(landed, number).0 {
                    decide::AfterClaim::Run { lease_until_ms } => {
                        if let Some(lead) = &held_lead {
                            lead.busy(attempt.own_claim(lease_until_ms));
                        }
                        let left = plan
                            .steps
                            .and_then(|steps| steps.landed(seen.map(|seen| *seen)));
                        return Ok(attempt.held(left, lease_until_ms, took_over, held_lead));
                    }
                    // Answered after its lease: renew it, if it is still ours.
                    decide::AfterClaim::Renew => {
                        renew = true;
                        continue 'claim;
                    }
                    _ => return Err(contended(plan.call.namespace, number)),
                }
            }
            Claim::Blocked(record) => record,
            // The record is gone (deleted since the transaction, or the claim that saw it): a new
            // operation, whose claim applies the writes, and starts its steps afresh.
            Claim::Vanished(_) if number <= CLAIMABLE_RETRIES => {
                seen = None;
                continue 'claim;
            }
            Claim::Vanished(e) => return Err(store_error(plan.call.namespace, e)),
        };
        // The claim was refused: the record is someone else's (or ours, which `examine` says).
        attempt.stage.set(Stage::Waiting);
        // Inspect the record; while waiting, keep re-reading it until it is done or claimable.
        loop {
            // Decided in a block of its own: nothing but the action outlives it (this future is part
            // of every call's, and what lives across the wait below makes it larger).
            // The record is moved in and out of it, so that only the block's binding is ever
            // borrowed: one that was borrowed would keep its room in this future across the wait
            // below even once dropped.
            let (action, judged, record) = {
                let record = refused;
                let judged = judged_ms(idem.clock().now_ms(), idem.clock_skew_margin());
                let found = match examine(plan.call, &record, token, plan.fingerprint, judged) {
                    Ok(found) => found,
                    Err(e) => {
                        // COMPLETED without its response (too large to store): what followers get too.
                        if let (Some(lead), Error::ResponseTooLarge { .. }) = (&held_lead, &e) {
                            lead.land(|| Landed {
                                response: None,
                                fingerprint: record.fingerprint.as_deref().map(Arc::from),
                            });
                        }
                        return Err(e);
                    }
                };
                let refused = decide::Answer::Refused {
                    record: &record,
                    found: &found,
                };
                let (action, judged) = attempt.next(refused, number);
                (action, judged, record)
            };
            let retry_after = match action {
                decide::AfterClaim::Run { lease_until_ms } => {
                    attempt.stage.set(Stage::Claiming);
                    if let Some(lead) = &held_lead {
                        lead.busy(attempt.own_claim(lease_until_ms));
                    }
                    return Ok(attempt.held(record.steps, lease_until_ms, took_over, held_lead));
                }
                decide::AfterClaim::Renew => {
                    attempt.stage.set(Stage::Claiming);
                    seen = plan.steps.and(record.steps).map(Box::new);
                    renew = true;
                    continue 'claim;
                }
                // Our claim, but never in time: given up (released) by the caller.
                decide::AfterClaim::GiveUp => {
                    attempt.stage.set(Stage::Claiming);
                    return Err(contended(plan.call.namespace, number));
                }
                decide::AfterClaim::Released => return Err(released(plan.call.namespace)),
                decide::AfterClaim::Replay => {
                    tracing::debug!(namespace = plan.call.namespace, "replaying stored response");
                    let replay = Replay::Record {
                        record,
                        lead: held_lead,
                    };
                    return Ok(Acquired::Done(replay, Outcome::Replayed));
                }
                decide::AfterClaim::Contended => {
                    return Err(contended(plan.call.namespace, number));
                }
                decide::AfterClaim::Reclaim { took_over: lapsed } => {
                    if let Some(lead) = &held_lead {
                        lead.claiming();
                    }
                    took_over = lapsed;
                    // Steps that live on are resumed, or restarted in place of (a claim that starts
                    // afresh is refused by them); code without steps leaves them to calls with steps.
                    if plan.steps.is_none() && decide::steps_held(&record, judged) {
                        return Err(steps_held(plan.call.namespace));
                    }
                    seen = plan
                        .steps
                        .filter(|steps| steps.builds_on(&record, judged))
                        .and(record.steps)
                        .map(Box::new);
                    continue 'claim;
                }
                decide::AfterClaim::InProgress(retry_after) => {
                    if let Some(lead) = &held_lead {
                        lead.busy(flight::Busy {
                            until_ms: idem.clock().now_ms().saturating_add(millis(retry_after)),
                            own: false,
                        });
                    }
                    retry_after
                }
            };
            let Some(pause) = next_poll(wait_until, &mut poll_ms) else {
                let namespace = plan.call.namespace;
                return Err(in_progress(idem, namespace, retry_after, attempt.lease));
            };
            // Not held while waiting: the re-read replaces it.
            drop(record);
            // Boxed: a timer and a read are large, and a call that finds no one in flight never waits.
            match Box::pin(reread(idem, plan.call.namespace, plan.key, pause)).await? {
                Some(next) => refused = Box::new(next),
                // Deleted (by TTL or by hand): the key is new.
                None => continue 'claim,
            }
        }
    }
}

/// What following a flight came to ([`follow`]).
pub(super) enum Following<'a> {
    /// The response its leader's stored record holds, as stored.
    Done(Arc<[u8]>),
    /// No stored record: the call goes on to the store, leading a new flight (or alone, when the
    /// flight there now has another payload).
    Store(Option<Lead<'a>>),
}

/// Follows the key's `flight` in this process ([`flight`]), making no request: the record its leader
/// passes on, `InProgress`, or (the flight ended without a record) the lead of a new one, one
/// follower at a time. Out of line and boxed: only a follower waits on a flight.
#[cold]
pub(super) fn follow<'a, 'b>(
    attempt: &'b Attempt<'a>,
    flights: &'a flight::Flights,
    mut flight: Arc<flight::Flight>,
    wait_until: Option<tokio::time::Instant>,
) -> Pin<Box<dyn Future<Output = Result<Following<'a>, Error>> + Send + 'b>> {
    Box::pin(async move {
        let Attempt { idem, plan, .. } = *attempt;
        // Nothing of this call's is in the store: a drop has nothing to release.
        attempt.stage.set(Stage::Waiting);
        loop {
            match flight::follow_flight(flight, wait_until).await {
                Followed::Landed(landed) => {
                    return take_landed(plan, &landed).map(Following::Done);
                }
                Followed::InProgress(busy) => {
                    let retry_after = follower_retry_after(idem, attempt.lease, busy);
                    return Err(in_progress(
                        idem,
                        plan.call.namespace,
                        retry_after,
                        attempt.lease,
                    ));
                }
                Followed::Rejoin => match flights.join(plan.key, plan.fingerprint) {
                    Joined::Lead(lead) => return Ok(Following::Store(Some(lead))),
                    Joined::Alone => return Ok(Following::Store(None)),
                    Joined::Follow(next) => flight = next,
                },
            }
        }
    })
}

/// What a follower that gets `InProgress` says is left before the claim holding the key may be taken
/// over: what a duplicate reading the record would find (its lease end less the caller's judged time).
/// A leader's own claim that this process renews (heartbeats on) counts as just renewed, a whole lease,
/// as it is live; so does a claim not answered yet.
fn follower_retry_after(
    idem: &Idempotency,
    lease: Duration,
    busy: Option<flight::Busy>,
) -> Duration {
    let renewed = lease.saturating_add(idem.clock_skew_margin());
    match busy {
        Some(busy) if !(busy.own && idem.heartbeat()) => {
            Duration::from_millis(busy.until_ms.saturating_sub(idem.clock().now_ms()))
        }
        _ => renewed,
    }
}

/// The answer of a follower from the COMPLETED record its leader passed on, as a duplicate reading
/// that record gets it: `PayloadMismatch` for another payload, `ResponseTooLarge` without a response,
/// else the response, to decode within the handle's bound ([`Replay::decode`]).
fn take_landed(plan: &Plan<'_>, landed: &Landed) -> Result<Arc<[u8]>, Error> {
    let namespace = plan.call.namespace;
    same_payload(namespace, landed.fingerprint.as_deref(), plan.fingerprint)?;
    let Some(response) = &landed.response else {
        return Err(response_too_large(namespace));
    };
    tracing::debug!(
        namespace,
        "replaying the response of a call in flight in this process"
    );
    Ok(response.clone())
}

/// When a call that may wait until `wait_until` reads the record it waits on again, or `None` once
/// its wait has run out; each pause is twice the last (`poll_ms`), up to [`MAX_POLL`].
/// `d` in whole milliseconds, for the poll's pauses (at most a second).
fn millis_u32(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

fn next_poll(
    wait_until: Option<tokio::time::Instant>,
    poll_ms: &mut u32,
) -> Option<tokio::time::Instant> {
    let deadline = wait_until.filter(|d| *d > tokio::time::Instant::now())?;
    let pause =
        deadline.min(tokio::time::Instant::now() + Duration::from_millis(u64::from(*poll_ms)));
    *poll_ms = poll_ms.saturating_mul(2).min(millis_u32(MAX_POLL));
    Some(pause)
}

/// A renewal of the call's own claim, answered too late to use: a fenced write under its token (a
/// heartbeat's) asking for the lease and expiry `request` would have. It lands only if no one took the key over
/// ([`Claim::Held`]); otherwise it shows the record that did ([`Claim::Blocked`]), or that there is none
/// ([`Claim::Vanished`]: the call claims afresh). Out of line and boxed: only a late answer renews.
#[cold]
async fn renew_once(attempt: &Attempt<'_>, request: ClaimRequest<'_>) -> Result<Claim, Error> {
    let transition = Transition {
        key: attempt.plan.key,
        token: attempt.token,
        change: Change::ExtendLease {
            lease_until_ms: request.lease_until_ms,
            expires_at_s: request.expires_at_s,
        },
    };
    let renewed = telemetry::observe("renew", attempt.idem.store().transition(&transition)).await;
    match renewed {
        Ok(WriteOutcome::Applied) => Ok(Claim::Held {
            lease_until_ms: request.lease_until_ms,
        }),
        Ok(WriteOutcome::Rejected(Some(record))) => Ok(Claim::Blocked(Box::new(record))),
        Ok(WriteOutcome::Rejected(None)) => Ok(Claim::Vanished(StoreError::Corrupt(
            "the record of a claim being renewed is gone".to_owned(),
        ))),
        Err(e) => Err(store_error(attempt.plan.call.namespace, e)),
    }
}

/// What one claim attempt found.
pub(super) enum Claim {
    /// The key is ours.
    Held {
        /// The lease end the request asked for (epoch milliseconds): carried back, so that the
        /// caller's future does not keep it across the request.
        lease_until_ms: u64,
    },
    /// Here is the record that blocked the claim. Boxed where the store's answer is taken apart: a
    /// duplicate's record goes on through the claim loop to its replay by value, and a record is
    /// about 300 bytes, copied at each step, where a box is a pointer.
    Blocked(Box<Record>),
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
pub(super) fn claim_once<'a>(
    idem: &'a Idempotency,
    plan: &'a Plan<'a>,
    mut request: ClaimRequest<'a>,
) -> impl Future<Output = Result<Claim, Error>> + 'a {
    async move {
        if !plan.claim_writes.is_empty() {
            match claim_with_writes(idem, plan, &request).await? {
                WithWrites::Claimed => {
                    return Ok(Claim::Held {
                        lease_until_ms: request.lease_until_ms,
                    });
                }
                WithWrites::Blocked(record) => return Ok(Claim::Blocked(record)),
                // The writes are in effect: a plain claim keeps them, conditioned on their mark still
                // being set, so that a decision made stale by another caller (who released them
                // meanwhile) never runs the body without them.
                WithWrites::Plain => request.keep_claim_writes = true,
            }
        }
        match telemetry::observe("claim", idem.store().claim(&request)).await {
            Ok(ClaimOutcome::Claimed) => Ok(Claim::Held {
                lease_until_ms: request.lease_until_ms,
            }),
            Ok(ClaimOutcome::Existing(record)) => Ok(Claim::Blocked(Box::new(record))),
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

/// The error of a call whose deadline left only `left` when it would have claimed.
#[cold]
fn deadline_passed(namespace: &str, left: Duration) -> Error {
    Error::DeadlinePassed {
        namespace: namespace.to_owned(),
        left,
    }
}

/// The error of a call whose claim was released (by itself, when it gave up on it) before it could
/// use it: the claim is lost.
#[cold]
pub(super) fn released(namespace: &str) -> Error {
    Error::LeaseLost {
        namespace: namespace.to_owned(),
    }
}

/// [`Error::StepsHeld`].
#[cold]
fn steps_held(namespace: &str) -> Error {
    Error::StepsHeld {
        namespace: namespace.to_owned(),
    }
}

/// [`Error::Contended`].
#[cold]
pub(super) fn contended(namespace: &str, attempts: u32) -> Error {
    Error::Contended {
        namespace: namespace.to_owned(),
        attempts,
    }
}

/// [`Error::InProgress`] for a call with `lease` that found the key held by a claim that may be taken
/// over once `retry_after` has passed (see [`Found::InProgress`]).
#[cold]
pub(super) fn in_progress(
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
/// [`decide::heartbeat_interval`]: just after a heartbeat `retry_after` is `lease` (plus the margin), and it
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
    let stalled = heartbeat
        && decide::heartbeat_interval(lease)
            .is_some_and(|every| retry_after < lease.saturating_sub(every));
    if stalled {
        // Lapsed once the judged clock is strictly past the lease's end: one millisecond after
        // `retry_after`.
        Duration::from_secs(millis(retry_after).saturating_add(1).div_ceil(1000).max(1))
    } else {
        retry_after.min(hint)
    }
}

/// Sleeps until `pause`, then reads the key's record again, for a call waiting on an in-flight one.
pub(super) async fn reread(
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

/// The local cache's answer, if it has one for the key: its response, to decode within the handle's
/// bound ([`Replay::decode`]).
pub(super) fn cached(idem: &Idempotency, plan: &Plan<'_>) -> Result<Option<Arc<[u8]>>, Error> {
    let namespace = plan.call.namespace;
    let Some(hit) = idem
        .cache()
        .and_then(|c| c.get(plan.key, idem.clock().now_ms()))
    else {
        return Ok(None);
    };
    same_payload(namespace, hit.fingerprint.as_deref(), plan.fingerprint)?;
    tracing::debug!(namespace, "replaying cached response");
    Ok(Some(hit.response))
}

/// A COMPLETED record whose response decoded: the local cache keeps it too, and the call's followers
/// (when it leads a flight) get it.
fn keep_replayed(
    idem: &Idempotency,
    plan: &Plan<'_>,
    record: Box<Record>,
    lead: Option<&Lead<'_>>,
) {
    let response = record.response.unwrap_or_default();
    if let Some(lead) = lead {
        lead.land(|| Landed {
            response: Some(Arc::from(&response[..])),
            fingerprint: record.fingerprint.as_deref().map(Arc::from),
        });
    }
    remember(
        idem,
        plan.key,
        response,
        record.fingerprint.as_deref(),
        record.replay_until_s.unwrap_or(record.expires_at_s),
    );
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

#[cfg(test)]
mod release_marks {
    use super::*;

    /// A release's mark where there is no record lives no shorter than the claim it keeps out, even
    /// with a lifetime shorter than the clock-skew margin.
    #[test]
    fn a_release_mark_outlives_its_claim_whatever_the_ttl() {
        let hold_until_ms = 10_500;
        let change = release_change(
            decide::ReleaseStep::Mark,
            1_000,
            Duration::from_secs(1),
            Lifetimes {
                lifetime: Duration::from_millis(100),
                mark_lifetime: Duration::from_millis(100),
                hold_until_ms,
            },
            None,
        );
        let Change::Release {
            expires_at_s,
            released_until_ms,
            ..
        } = change
        else {
            panic!("a mark: {change:?}")
        };
        assert_eq!((expires_at_s, released_until_ms), (11, hold_until_ms));
    }
}
