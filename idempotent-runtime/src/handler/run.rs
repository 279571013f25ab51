//! Running a claimed body: [`run()`] (the call's state machine from claim to outcome), the body in place
//! or on a task of its own ([`Runner`]), a panic caught and recorded, and [`finish`], which stores the
//! body's outcome.

#[allow(
    clippy::wildcard_imports,
    reason = "the state machine's parts share its vocabulary"
)]
use super::*;

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
    parts: Parts<I>,
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
        let plan = &parts.plan();
        // A detached call counts for `Idempotency::drain` from here, before its claim is sent, until
        // its body's task (tracked itself) is spawned: a drain while the claim is on its way waits
        // for the body it starts. Declared before `attempt`, so that a drop releases the claim (on a
        // tracked task) before the call stops counting.
        let tracked = R::track(idem.tasks());
        // Written into a buffer in the call's own future: a token lives exactly as long as its call.
        let mut token_buffer = uuid::Uuid::encode_buffer();
        let attempt = Attempt::new(idem, plan, new_token(&mut token_buffer));
        // Dropped with this future: what a drop must do depends on `attempt.stage`.
        let (lease_until_ms, took_over, lead) = match claim_phase(&attempt).await {
            Claimed::Held {
                lease_until_ms,
                took_over,
                lead,
            } => (lease_until_ms, took_over, lead),
            Claimed::Done(replay, outcome) => return replayed(idem, plan, replay, outcome),
            Claimed::Failed(e, outcome) => return (Err(e.into()), outcome),
        };
        let (token, lease, ttl) = (attempt.token, attempt.lease, attempt.ttl);
        // The lead goes with the claim into the boxed work (or the detached body's task): a call's
        // future does not carry it past its claim.
        let mut claim = Held {
            idem,
            plan,
            token,
            ttl,
            lead,
        };
        let finished = if R::DETACHED {
            let work = Work {
                body,
                describe,
                lease,
                lease_until_ms,
                took_over,
                // The body's task leads the flight from its spawn on: its caller may be dropped.
                lead: claim.hand_lead_over(),
            };
            let task = runner.spawn(&claim, work);
            drop(tracked);
            // From here on the body's end does not depend on the caller.
            attempt.stage.set(Stage::Done);
            task.await
        } else {
            // The heartbeat keeps the claim ours while the body runs and while its result is being
            // stored. Boxed: a replay (the common duplicate) never gets here, so its future need not
            // carry the body, the completion and the timer.
            let heartbeat = Heartbeat::of(idem, plan, token, lease, ttl, lease_until_ms);
            let work = finish(
                claim,
                heartbeat,
                body,
                describe,
                lease,
                lease_until_ms,
                took_over,
            );
            Box::pin(work).await
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

/// How a call's claim phase ended ([`claim_phase`]).
#[allow(
    clippy::large_enum_variant,
    reason = "returned by value on every duplicate's path: boxing the record would allocate there"
)]
pub(super) enum Claimed<'a> {
    /// The call holds its claim until `lease_until_ms` (its stage is `Running`): the body runs.
    Held {
        lease_until_ms: u64,
        took_over: bool,
        lead: Option<flight::Lead<'a>>,
    },
    /// A stored answer, to decode.
    Done(Replay<'a>, Outcome),
    /// The call ends with this error, without running the body.
    Failed(Error, Outcome),
}

/// A new fencing token, written into `buffer`: a UUID of version 7, so that tokens sort in the order
/// they were made (by the millisecond, and within one process exactly), which a release that finds a
/// record's released tokens full relies on ([`Record::released_through`](crate::Record::released_through)).
#[inline(never)]
fn new_token(buffer: &mut [u8]) -> &str {
    uuid::Uuid::now_v7().hyphenated().encode_lower(buffer)
}

/// The claim phase of a call: claims the key (or finds its answer), releases a claim whose answer never
/// came, and starts the call's steps once it holds the claim. Not generic: compiled once for every
/// function; only the body and its value's and error's encoding are each function's own.
#[allow(
    clippy::manual_async_fn,
    reason = "an async block, like `run`'s: it adds nothing to the call's future but `acquire`'s"
)]
fn claim_phase<'a, 'b>(attempt: &'b Attempt<'a>) -> impl Future<Output = Claimed<'a>> + Send + 'b {
    async move {
        let acquired = acquire(attempt).await;
        // A claim whose answer never came (every attempt lost, or the store failed after applying
        // it) may have landed: released like a dropped call's, so that the key is not held for a
        // whole lease by a call that has given up.
        if let Err(error) = &acquired
            && attempt.stage.get() == Stage::Claiming
            && decide::after_claim_error(error) == decide::AfterClaimError::Release
        {
            attempt.abandon();
        }
        attempt.stage.set(Stage::Done);
        held(attempt, acquired)
    }
}

/// What the claim phase came to ([`claim_phase`]): with the claim held, the call's steps begin and its stage
/// is `Running`.
#[inline(never)]
fn held<'a>(attempt: &Attempt<'a>, acquired: Result<Acquired<'a>, Error>) -> Claimed<'a> {
    let Attempt {
        idem,
        plan,
        token,
        lease,
        ..
    } = *attempt;
    match acquired {
        Ok(Acquired::Done(replay, outcome)) => Claimed::Done(replay, outcome),
        Ok(Acquired::Held {
            lease_until_ms,
            took_over,
            lead,
        }) => {
            if let Some(steps) = plan.steps {
                steps.begin(idem, plan.key, token, plan.fingerprint, lease, plan.staging);
            }
            tracing::debug!(namespace = plan.call.namespace, "claimed; running the body");
            attempt.stage.set(Stage::Running);
            Claimed::Held {
                lease_until_ms,
                took_over,
                lead,
            }
        }
        Err(e) => {
            if e.is_setup() {
                setup_error(&e);
            }
            let outcome = Outcome::of(&e);
            Claimed::Failed(e, outcome)
        }
    }
}

/// The answer of a call that found one stored: the response decoded, or why it does not decode. Only
/// parsing the JSON into `T` ([`Parsed`]) is made here for each function; [`replayed_with`] does the
/// rest.
fn replayed<T: DeserializeOwned, E: From<Error>>(
    idem: &Idempotency,
    plan: &Plan<'_>,
    replay: Replay<'_>,
    outcome: Outcome,
) -> (Result<T, E>, Outcome) {
    let mut value = Parsed(None);
    match (
        replayed_with(idem, plan, replay, outcome, &mut value),
        value.0,
    ) {
        (Ok(outcome), Some(value)) => (Ok(value), outcome),
        (Err((e, outcome)), _) => (Err(e.into()), outcome),
        (Ok(_), None) => unreachable!("a replay that decoded has its value"),
    }
}

/// A replayed value, once its JSON is parsed ([`codec::Parse`]).
struct Parsed<T>(Option<T>);

impl<T: DeserializeOwned> codec::Parse for Parsed<T> {
    fn parse(&mut self, json: &[u8]) -> Result<(), serde_json::Error> {
        self.0 = Some(serde_json::from_slice(json)?);
        Ok(())
    }
}

/// [`replayed`]'s part that is not generic: the response unpacked and handed to `parse`, then kept
/// (cache, flight) and counted; or the error and its outcome.
#[inline(never)]
fn replayed_with(
    idem: &Idempotency,
    plan: &Plan<'_>,
    replay: Replay<'_>,
    outcome: Outcome,
    parse: &mut dyn codec::Parse,
) -> Result<Outcome, (Error, Outcome)> {
    match replay.decode(idem, plan, parse) {
        Ok(()) => {
            crate::execution::record(crate::Execution::Replayed);
            Ok(outcome)
        }
        Err(e) => {
            let outcome = Outcome::of(&e);
            Err((e, outcome))
        }
    }
}

/// A panic's payload, as `catch_unwind` gives it and `resume_unwind` takes it back.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

/// How a body that holds its claim ended: its result and the call's outcome, or its panic (the record is
/// FAILED by then; COMPLETED when the body returned `Ok` and its value's `Serialize` panicked).
pub(crate) type Finished<T, E> = Result<(Result<T, E>, Outcome), Panic>;

/// The body of a call that holds its claim, with what storing its outcome needs.
pub(crate) struct Work<F, D> {
    pub(super) body: F,
    pub(super) describe: D,
    pub(super) lease: Duration,
    /// The claim's lease end (epoch milliseconds), and whether it took over a lapsed claim.
    pub(super) lease_until_ms: u64,
    pub(super) took_over: bool,
    /// The hold on the key's flight, for a detached body's task that leads it.
    pub(super) lead: Option<flight::OwnedLead>,
}

/// Where a call that holds its claim runs its body and the writes that store its outcome, with the
/// heartbeat beside them: in the caller's future ([`Inline`]) or on a task of its own ([`Detach`]).
/// Chosen at compile time (`DETACHED`), so that the inline path is the code it always was.
pub(crate) trait Runner<T, E, F, D> {
    /// Whether the body runs on a task of its own ([`spawn`](Self::spawn)) rather than in place.
    const DETACHED: bool;

    /// What a call holds from its start until its body's task is spawned, so that
    /// [`Idempotency::drain`] waits for it meanwhile (nothing for a body run in place, which a drain
    /// does not wait for).
    type Tracked;

    /// See [`Tracked`](Self::Tracked).
    fn track(tasks: &tokio_util::task::TaskTracker) -> Self::Tracked;

    /// What the caller of a detached body awaits: the body's task's end. A type of the runner's, so
    /// that a body run in place compiles no wait for a task (`Pending`, never awaited).
    type Join: Future<Output = Finished<T, E>>;

    /// Starts `work` for `claim` on a task of its own; only called when `DETACHED`.
    fn spawn(self, claim: &Held<'_>, work: Work<F, D>) -> Self::Join;

    /// The body of a call with no record (the kill switch is on, or a missing key under
    /// [`MissingKey::Skip`](crate::MissingKey::Skip)): in place, or on a task of its own (tracked by `tasks` when the handle is
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

    type Tracked = ();

    fn track(_: &tokio_util::task::TaskTracker) {}

    type Join = std::future::Pending<Finished<T, E>>;

    fn spawn(self, _: &Held<'_>, _: Work<F, D>) -> Self::Join {
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
    T: Serialize + DeserializeOwned + Send + 'static,
    E: From<Error> + Send + 'static,
    F: Future<Output = Result<T, E>> + Send + 'static,
    D: FnOnce(&E) -> String + Send + 'static,
{
    const DETACHED: bool = true;

    type Tracked = tokio_util::task::task_tracker::TaskTrackerToken;

    fn track(tasks: &tokio_util::task::TaskTracker) -> Self::Tracked {
        tasks.token()
    }

    /// Boxed: every call's future would carry the wait for the task otherwise.
    type Join = Pin<Box<Joined<T, E>>>;

    fn spawn(self, claim: &Held<'_>, work: Work<F, D>) -> Self::Join {
        use tracing::Instrument as _;
        let namespace = claim.plan.call.namespace;
        let owned = OwnedClaim::of(claim);
        let mut held_lead = work.lead;
        let task = async move {
            let plan = owned.plan();
            let claim = Held {
                idem: &owned.idem,
                plan: &plan,
                token: &owned.token,
                ttl: owned.ttl,
                lead: held_lead.as_mut().map(flight::OwnedLead::lead),
            };
            let lease = work.lease;
            let heartbeat = Heartbeat {
                idem: &owned.idem,
                key: &owned.key,
                token: &owned.token,
                lease,
                ttl: writes_lifetime(&owned.idem, &plan, owned.ttl),
                lease_until_ms: work.lease_until_ms,
            };
            finish(
                claim,
                heartbeat,
                work.body,
                work.describe,
                lease,
                work.lease_until_ms,
                work.took_over,
            )
            .await
        };
        // Panics outside a Tokio runtime, as `tokio::spawn` does (documented on `detach`).
        let task = claim
            .idem
            .tasks()
            .spawn(task.instrument(tracing::Span::current()));
        Box::pin(Joined { namespace, task })
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

/// The end of a detached body's task, for its caller ([`Detach`]'s `Join`).
pub(crate) struct Joined<T, E> {
    namespace: &'static str,
    task: tokio::task::JoinHandle<Finished<T, E>>,
}

impl<T, E: From<Error>> Future for Joined<T, E> {
    type Output = Finished<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Finished<T, E>> {
        let namespace = self.namespace;
        Poll::Ready(match std::task::ready!(Pin::new(&mut self.task).poll(cx)) {
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
        })
    }
}

/// What a detached body's task owns of its call (a [`Held`] borrows it).
pub(super) struct OwnedClaim {
    pub(super) idem: Idempotency,
    pub(super) call: Call,
    pub(super) key: String,
    pub(super) fingerprint: Option<String>,
    pub(super) staging: Option<Staged>,
    pub(super) claim_writes: Writes,
    pub(super) compensation: Writes,
    pub(super) steps: Option<Steps>,
    pub(super) token: String,
    pub(super) ttl: Duration,
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

/// What a call that holds its claim runs: the body, then its outcome stored (completed, or failed), with
/// the lease heartbeat beside both. `run` boxes it; `lease_until_ms` and `took_over` are the claim's.
///
/// A thin typed shim around a core that is not generic ([`Finishing`]): the shim holds the body's future
/// in place (so the call's future is `Send` exactly when the body is) and, at each poll, hands the core a
/// `&mut dyn` [`BodyEnd`] that polls the body and gives its end as stored. Only that part (polling the
/// body, its value's JSON ([`Held::encode`]) or its error's text, and handing back the value or the
/// error) is made for each function; the heartbeat and the storing of the outcome ([`store_ending`])
/// are compiled once.
pub(super) fn finish<'a, T, E, F, D>(
    claim: Held<'a>,
    heartbeat: Heartbeat<'a>,
    body: F,
    describe: D,
    lease: Duration,
    lease_until_ms: u64,
    took_over: bool,
) -> Finish<'a, F, D, T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
    D: FnOnce(&E) -> String,
{
    Finish {
        body,
        describe: Some(describe),
        kept: None,
        core: Finishing {
            claim: Some(claim),
            lease,
            lease_until_ms,
            took_over,
            storing: None,
            heartbeat,
            beat: None,
        },
    }
}

pin_project_lite::pin_project! {
    /// The future of [`finish`]: the body in place, beside the core that stores its end.
    pub(super) struct Finish<'a, F, D, T, E> {
        #[pin]
        body: F,
        describe: Option<D>,
        // The value or the error, kept for the caller while its end is stored.
        kept: Option<Result<T, E>>,
        core: Finishing<'a>,
    }
}

impl<F, D, T, E> Future for Finish<'_, F, D, T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
    D: FnOnce(&E) -> String,
{
    type Output = Finished<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Finished<T, E>> {
        let this = self.project();
        let mut body = Typed {
            body: this.body,
            describe: this.describe,
            kept: this.kept,
        };
        let settled = std::task::ready!(this.core.poll(cx, &mut body));
        Poll::Ready(match (settled, body.kept.take()) {
            (Settled::Own(outcome), Some(result)) => Ok((result, outcome)),
            (Settled::Instead(e), _) => {
                let outcome = Outcome::of(&e);
                Ok((Err(e.into()), outcome))
            }
            (Settled::Panic(panic), _) => Err(panic),
            (Settled::Own(_), None) => unreachable!("a panic's ending is stored as a panic"),
        })
    }
}

/// What [`Finishing`] needs of the body, at each poll: one method, so that its vtable carries no
/// `FnOnce` shim per type.
pub(super) trait BodyEnd {
    /// Polls the body (a panic caught); once it is done, its end as `claim` stores it, the value or the
    /// error kept for the caller. Not called again once it is ready.
    fn poll_end(&mut self, cx: &mut std::task::Context<'_>, claim: &Held<'_>) -> Poll<Ending>;
}

/// The body's part of [`Finish`], borrowed for one poll.
struct Typed<'p, F, D, T, E> {
    body: Pin<&'p mut F>,
    describe: &'p mut Option<D>,
    kept: &'p mut Option<Result<T, E>>,
}

impl<F, D, T, E> BodyEnd for Typed<'_, F, D, T, E>
where
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
    D: FnOnce(&E) -> String,
{
    fn poll_end(&mut self, cx: &mut std::task::Context<'_>, claim: &Held<'_>) -> Poll<Ending> {
        let body = self.body.as_mut();
        // Unwind safety: after a panic the body's future is never polled again, only dropped; what
        // the call does next (record FAILED, resume the panic) touches none of its state.
        let ended = match std::panic::catch_unwind(AssertUnwindSafe(|| body.poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(result)) => Ok(result),
            Err(panic) => Err(panic),
        };
        Poll::Ready(match ended {
            Ok(Ok(value)) => {
                let (encoded, thrown) = claim.encode(&value);
                *self.kept = Some(Ok(value));
                Ending::Value { encoded, thrown }
            }
            // A panic in the error's text (its `Display`) is a failure like a panicking body's:
            // recorded as one, then the panic goes on. Unwind safety: `describe` only reads `err`.
            Ok(Err(err)) => {
                let describe = self.describe.take().expect("a body ends once");
                match std::panic::catch_unwind(AssertUnwindSafe(|| describe(&err))) {
                    Ok(text) => {
                        *self.kept = Some(Err(err));
                        Ending::Failed(text)
                    }
                    Err(panic) => Ending::Panicked { panic, body: false },
                }
            }
            Err(panic) => Ending::Panicked { panic, body: true },
        })
    }
}

/// [`finish`]'s core, not generic: the body polled through its [`BodyEnd`] until it ends, then its end
/// stored ([`stored`]), with the lease heartbeat beside both (started when the body did not end at its
/// first poll, and stopped once the end is stored).
pub(super) struct Finishing<'a> {
    /// Taken when the storing of the body's end starts.
    claim: Option<Held<'a>>,
    lease: Duration,
    lease_until_ms: u64,
    took_over: bool,
    /// The storing of the body's end, once the body has ended.
    storing: Option<Pin<Box<dyn Future<Output = Settled> + Send + 'a>>>,
    heartbeat: Heartbeat<'a>,
    beat: Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
}

impl Finishing<'_> {
    /// Polls the body, then the storing of its end; beats while either is pending.
    #[inline(never)]
    fn poll(&mut self, cx: &mut std::task::Context<'_>, body: &mut dyn BodyEnd) -> Poll<Settled> {
        if self.storing.is_none() {
            let claim = self.claim.as_ref().expect("held until the body ends");
            let Poll::Ready(ending) = body.poll_end(cx, claim) else {
                beat(&mut self.beat, self.heartbeat, cx);
                return Poll::Pending;
            };
            let claim = self.claim.take().expect("held until the body ends");
            self.storing = Some(stored(
                claim,
                ending,
                self.lease,
                self.lease_until_ms,
                self.took_over,
            ));
        }
        let storing = self.storing.as_mut().expect("set above");
        if let Poll::Ready(settled) = storing.as_mut().poll(cx) {
            // The claim is settled: the heartbeat stops.
            self.beat = None;
            return Poll::Ready(settled);
        }
        beat(&mut self.beat, self.heartbeat, cx);
        Poll::Pending
    }
}

/// How a body that holds its claim ended, as its claim stores it; not generic ([`finish`] keeps the
/// value or the error for the caller).
pub(super) enum Ending {
    /// `Ok`: the value as stored; `thrown`, the panic of its `Serialize` (stored as not serialized,
    /// then the panic goes on).
    Value {
        encoded: Encoded,
        thrown: Option<Panic>,
    },
    /// `Err`: its text.
    Failed(String),
    /// A panic, of the body or (`body: false`) of the error's `Display`.
    Panicked { panic: Panic, body: bool },
}

/// What the caller of a body that held its claim gets, once the body's end is stored.
pub(super) enum Settled {
    /// The body's own result (its value, or its error), with the call's outcome.
    Own(Outcome),
    /// An error of the library's instead of the body's value (its result was not stored, or will not
    /// replay).
    Instead(Error),
    /// The panic goes on (the record is FAILED, or COMPLETED when the value's `Serialize` panicked).
    Panic(Panic),
}

/// [`store_ending`], boxed: built out of line, so that each function's [`finish`] only polls and drops
/// it through its vtable.
#[inline(never)]
fn stored<'a>(
    claim: Held<'a>,
    ending: Ending,
    lease: Duration,
    lease_until_ms: u64,
    took_over: bool,
) -> Pin<Box<dyn Future<Output = Settled> + Send + 'a>> {
    Box::pin(store_ending(
        claim,
        ending,
        lease,
        lease_until_ms,
        took_over,
    ))
}

/// Stores how the body ended: COMPLETED with its value, or FAILED with its error's text or its panic's
/// message, retried while the lease allows.
#[allow(
    clippy::manual_async_fn,
    reason = "an async block: as an `async fn`, its future would hold the ending twice (see `future_size`)"
)]
pub(super) fn store_ending(
    claim: Held<'_>,
    ending: Ending,
    lease: Duration,
    lease_until_ms: u64,
    took_over: bool,
) -> impl Future<Output = Settled> + Send + '_ {
    async move {
        let idem = claim.idem;
        // Retries of the writes that store the outcome: for as long as the lease allows (heartbeats
        // extend it, so a whole lease from now; without them, what is left of it).
        let window = if idem.heartbeat() {
            lease
        } else {
            Duration::from_millis(lease_until_ms.saturating_sub(idem.clock().now_ms()))
        };
        let mut persist = Persist::new(window);
        match ending {
            // Held in place: this future is boxed on its own ([`stored`]), and stays under the
            // allocator's small sizes with any one of them (see `future_size`).
            Ending::Value { encoded, thrown } => {
                let completed = claim.complete(encoded, &mut persist).await;
                // The value's `Serialize` panicked: the success is stored as final all the same
                // (duplicates get `ResponseNotSerialized`), and the panic goes on to the caller.
                if let Some(panic) = thrown {
                    return Settled::Panic(panic);
                }
                match completed {
                    Ok(()) if took_over => Settled::Own(Outcome::TakenOver),
                    Ok(()) => Settled::Own(Outcome::Executed),
                    Err(e) => Settled::Instead(e),
                }
            }
            Ending::Failed(text) => {
                claim.fail(&text, &mut persist).await;
                Settled::Own(Outcome::Failed)
            }
            // A panic is a failure: recorded as one, so that the key is free at once.
            Ending::Panicked { panic, body } => {
                if body {
                    tracing::warn!(
                        namespace = claim.namespace(),
                        "the body panicked; recording the failure"
                    );
                }
                claim.fail(&panicked(&*panic), &mut persist).await;
                Settled::Panic(panic)
            }
        }
    }
}

#[cfg(test)]
mod future_size {
    use super::*;

    /// A response of the bench's receipt's size.
    type Receipt = (String, u64, String, String);

    /// The parts of a call for `run`, with no writes.
    fn parts(idem: &Idempotency) -> Parts<&Idempotency> {
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
        let instrumented = crate::telemetry::InSpan::new(
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
            lead: None,
        };
        // A value of the bench's receipt's size (three strings and a number): the completion holds it.
        let receipt = || (String::new(), 0, String::new(), String::new());
        let (encoded, _) = held.encode(&receipt());
        // The boxed ending holds the completion or the failure in place.
        let ending = Ending::Value {
            encoded,
            thrown: None,
        };
        let complete = std::mem::size_of_val(&store_ending(
            Held { lead: None, ..held },
            ending,
            Duration::ZERO,
            0,
            false,
        ));
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
        let heartbeat = Heartbeat {
            idem: &idem,
            key: "k",
            token: "t",
            lease: Duration::ZERO,
            ttl: Duration::ZERO,
            lease_until_ms: 0,
        };
        let heartbeat = std::mem::size_of_val(&finish(
            held,
            heartbeat,
            body,
            |e: &Error| e.to_string(),
            Duration::ZERO,
            0,
            false,
        ));
        for (part, size) in [
            ("ending (completion or failure)", complete),
            ("body with its heartbeat", heartbeat),
        ] {
            assert!(size <= 1024, "the boxed {part} is {size} bytes");
        }
    }
}
