//! Running a call: its state machine from claim to outcome as one core compiled once for every function
//! ([`core`]), beside a thin typed shim that holds the body ([`InPlace`], or [`Detaching`] for a body
//! on a task of its own); a panic caught and recorded; the body's end stored ([`store_ending`]).
//!
//! The core is an `async` block that is not generic. It owns the call's parts and claims; with the
//! claim held, it asks for the body's end, stores it and beats the lease meanwhile (or, for a detached
//! call, hands its claim over to a task that does); a stored answer it hands back, with its parts, to
//! be decoded. The shim holds the body's future in place (so that a call's future is `Send` exactly
//! when its body, value and error are) and, at each poll, lends [`drive_core`] a `&mut dyn Body` over
//! it: the only code made for each function is that trait's methods (the body's poll, its value's
//! JSON, its error's text, a replay's parse into the slot the body's result is kept in). Polling the
//! core and the body, catching their panics, entering the call's span and decoding a stored answer
//! ([`Over::end`]) are compiled once.
//!
//! The core asks through a slot of the thread that polls it ([`EXCHANGE`]), which [`drive_core`] fills
//! around each poll of the core: an `async` block cannot be handed anything at each poll, and the shim
//! cannot lend the core its body for longer than one poll without boxing it as a `dyn` (which would
//! make every call's future `Send` only if every body is). The slot holds owned values only, and is
//! left as it was found, so that a call polled inside another's core (a store that makes a call of its
//! own) leaves the outer call's exchange as it was.

#[allow(
    clippy::wildcard_imports,
    reason = "the state machine's parts share its vocabulary"
)]
use super::*;

use std::borrow::Cow;
use std::cell::Cell;

/// A call's state machine from claim to outcome, compiled once: see the module's docs. Built before
/// anything awaits it, so that a caller's future holds it in place. A `detached` call hands its claim
/// over ([`Over::Spawn`]) once it holds it, and counts for [`Idempotency::drain`] from its start until
/// its body's task is spawned.
#[allow(
    clippy::manual_async_fn,
    reason = "an async block: as an `async fn`, its future would hold its parts twice (see `future_size`)"
)]
pub(crate) fn core(
    parts: Parts<Cow<'_, Idempotency>>,
    detached: bool,
) -> impl Future<Output = Ended<'_>> + Send + '_ {
    async move {
        let (replay, lead, outcome) = 'claim: {
            let idem: &Idempotency = &parts.idem;
            // Borrowed where the block keeps them, not moved out: a moved field would be held twice.
            let plan = &parts.plan();
            // A detached call counts for `Idempotency::drain` from here, before its claim is sent,
            // until its body's task (tracked itself) is spawned: a drain while the claim is on its way
            // waits for the body it starts. Declared before `attempt`, so that a drop releases the
            // claim (on a tracked task) before the call stops counting.
            let tracked = detached.then(|| idem.tasks().token());
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
                Claimed::Done(replay, outcome) => {
                    let (replay, lead) = replay.into_owned(idem);
                    break 'claim (replay, lead, outcome);
                }
                Claimed::Failed(e, outcome) => {
                    return (Over::Instead(e, outcome), parts.call.namespace);
                }
            };
            let (token, lease, ttl) = (attempt.token, attempt.lease, attempt.ttl);
            let mut claim = Held {
                idem,
                plan,
                token,
                ttl,
                lead,
            };
            if detached {
                let handover = Handover {
                    owned: OwnedClaim::of(&claim),
                    lease,
                    lease_until_ms,
                    took_over,
                    // The body's task leads the flight from its spawn on: its caller may be dropped.
                    lead: claim.hand_lead_over(),
                    tracked,
                };
                // From here on the body's end does not depend on the caller.
                attempt.stage.set(Stage::Done);
                return (Over::Spawn(Box::new(handover)), parts.call.namespace);
            }
            // The heartbeat keeps the claim ours while the body runs and while its result is being
            // stored. Boxed: a replay (the common duplicate) never gets here, so its future need not
            // carry the completion and the timer.
            let heartbeat = Heartbeat::of(idem, plan, token, lease, ttl, lease_until_ms);
            let settled = Box::pin(ended(claim, heartbeat, lease, lease_until_ms, took_over)).await;
            attempt.stage.set(Stage::Done);
            if !matches!(settled, Settled::Panic(..)) {
                // Recorded once the body and its bookkeeping are done, so that an idempotent call
                // nested in the body (which records first) does not mask the outer one.
                crate::execution::record(crate::Execution::Executed);
            }
            return (Over::of(settled), parts.call.namespace);
        };
        let namespace = parts.call.namespace;
        let replayable = Replayable {
            parts,
            replay,
            lead,
            outcome,
        };
        (Over::Replay(replayable), namespace)
    }
}

/// How a call's core ended ([`Over`]), with the call's namespace, for its end to be recorded where the
/// core is polled ([`recorded`]). Kept out of the call's future (which is at its size bound), since
/// the core has it.
pub(crate) type Ended<'a> = (Over<'a>, &'static str);

/// How a call's core ended.
#[allow(
    clippy::large_enum_variant,
    reason = "returned once per call, by value: boxing a replay's parts would allocate on every duplicate"
)]
pub(crate) enum Over<'a> {
    /// The body's own result, which the shim kept, with the call's outcome.
    Own(Outcome),
    /// An error of the library's instead of the body's result (the body did not run, or its result was
    /// not stored, or will not replay), with the call's outcome.
    Instead(Error, Outcome),
    /// A stored answer, for the shim to decode, with the parts it is kept with.
    Replay(Replayable<'a>),
    /// The body panicked (the record is FAILED, `failed`; COMPLETED when its value's `Serialize`
    /// panicked, `error`): the call's outcome is recorded, then the panic goes on.
    Panic(Panic, Outcome),
    /// A detached call holds its claim: the shim spawns its body's task with it.
    Spawn(Box<Handover>),
}

impl Over<'_> {
    /// How a call that ran its body ended, once its end is stored.
    fn of(settled: Settled) -> Self {
        match settled {
            Settled::Own(outcome) => Over::Own(outcome),
            Settled::Instead(e) => {
                let outcome = Outcome::of(&e);
                Over::Instead(e, outcome)
            }
            Settled::Panic(panic, outcome) => Over::Panic(panic, outcome),
        }
    }

    /// How the call ended, not generic: a replay decoded (its value handed to `parse`), its parts
    /// dropped; a panic goes on. `Ok` when the result is the one kept ([`returned`] gives the call's
    /// result from it).
    #[inline(never)]
    fn end(self, parse: &mut dyn codec::Parse) -> Result<Outcome, (Error, Outcome)> {
        match self {
            Over::Own(outcome) => Ok(outcome),
            Over::Instead(e, outcome) => Err((e, outcome)),
            Over::Replay(replayable) => {
                let Replayable {
                    parts,
                    replay,
                    mut lead,
                    outcome,
                } = replayable;
                let replay = replay.with_lead(lead.as_mut().map(flight::OwnedLead::lead));
                replayed_with(&parts.idem, &parts.plan(), replay, outcome, parse)
            }
            Over::Panic(panic, _) => std::panic::resume_unwind(panic),
            Over::Spawn(_) => unreachable!("only a detached call's core hands its claim over"),
        }
    }
}

/// A stored answer the core found, with the call's parts: what decoding it needs.
pub(crate) struct Replayable<'a> {
    parts: Parts<Cow<'a, Idempotency>>,
    replay: Replay<'static>,
    lead: Option<flight::OwnedLead>,
    outcome: Outcome,
}

/// What a detached call's core hands its body's task ([`Over::Spawn`]).
pub(crate) struct Handover {
    owned: OwnedClaim,
    lease: Duration,
    /// The claim's lease end (epoch milliseconds), and whether it took over a lapsed claim.
    lease_until_ms: u64,
    took_over: bool,
    lead: Option<flight::OwnedLead>,
    /// The call's count for [`Idempotency::drain`], dropped once the task (tracked itself) is spawned.
    tracked: Option<tokio_util::task::task_tracker::TaskTrackerToken>,
}

/// The core of a detached body's task: the body's end, asked of the task's shim, then stored; compiled
/// once.
async fn handed_over(mut handover: Handover) -> Ended<'static> {
    let Handover {
        ref owned,
        lease,
        lease_until_ms,
        took_over,
        ref mut lead,
        tracked: _,
    } = handover;
    let plan = owned.plan();
    let claim = Held {
        idem: &owned.idem,
        plan: &plan,
        token: &owned.token,
        ttl: owned.ttl,
        lead: lead.as_mut().map(flight::OwnedLead::lead),
    };
    let heartbeat = Heartbeat::of(
        &owned.idem,
        &plan,
        &owned.token,
        lease,
        owned.ttl,
        lease_until_ms,
    );
    let settled = ended(claim, heartbeat, lease, lease_until_ms, took_over).await;
    (Over::of(settled), owned.call.namespace)
}

/// The body's end, asked of the shim, then stored, with the lease heartbeat beside both (started when
/// the body did not end at once, and stopped once its end is stored). Held in place by the call's core
/// while it waits for the body; the storing, which a replay never needs, is boxed on its own
/// ([`stored`]).
#[allow(
    clippy::manual_async_fn,
    reason = "an async block: as an `async fn`, its future would hold the claim twice (see `future_size`)"
)]
fn ended<'a>(
    claim: Held<'a>,
    heartbeat: Heartbeat<'a>,
    lease: Duration,
    lease_until_ms: u64,
    took_over: bool,
) -> impl Future<Output = Settled> + Send + 'a {
    async move {
        let mut beat = None;
        let ended = WaitEnd {
            beat: &mut beat,
            heartbeat,
        }
        .await;
        let ending = ended.ending(&claim);
        Beating {
            future: stored(claim, ending, lease, lease_until_ms, took_over),
            beat: &mut beat,
            heartbeat,
        }
        .await
    }
}

/// `future`, with the heartbeat polled beside it while it is pending ([`beat`]).
struct Beating<'b, 'a, F> {
    future: F,
    beat: &'b mut Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
    heartbeat: Heartbeat<'a>,
}

impl<F: Future + Unpin> Future for Beating<'_, '_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        if let Poll::Ready(output) = Pin::new(&mut this.future).poll(cx) {
            return Poll::Ready(output);
        }
        beat(this.beat, this.heartbeat, cx);
        Poll::Pending
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
pub(super) fn new_token(buffer: &mut [u8]) -> &str {
    uuid::Uuid::now_v7().hyphenated().encode_lower(buffer)
}

/// The claim phase of a call: claims the key (or finds its answer), releases a claim whose answer never
/// came, and starts the call's steps once it holds the claim. Not generic: compiled once for every
/// function; only the body and its value's and error's encoding are each function's own.
#[allow(
    clippy::manual_async_fn,
    reason = "an async block, like `run`'s: it adds nothing to the call's future but `acquire`'s"
)]
pub(super) fn claim_phase<'a, 'b>(
    attempt: &'b Attempt<'a>,
) -> impl Future<Output = Claimed<'a>> + Send + 'b {
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

/// How a call ended ([`Over::end`]: a replay decoded into `parse`), recorded in its span (its
/// `outcome`) and counted ([`telemetry::finish`]) before anything of the caller's types runs after it
/// (the error's conversion may panic). A replay whose `Deserialize` panics is recorded as `error`, then
/// its panic goes on. Not for a body's panic ([`Over::Panic`]), which [`drive_core`] records with the
/// outcome its storing gave it.
#[inline(never)]
fn recorded(
    over: Over<'_>,
    parse: &mut dyn codec::Parse,
    span: &tracing::Span,
    namespace: &'static str,
) -> Result<Outcome, (Error, Outcome)> {
    // Unwind safety: a panic here is a replay's `Deserialize`, whose value was not put in `parse`'s
    // slot (it is put there once whole), and the panic goes on to the caller.
    let ended = match std::panic::catch_unwind(AssertUnwindSafe(|| over.end(parse))) {
        Ok(ended) => ended,
        Err(panic) => {
            telemetry::finish(span, namespace, Outcome::Error);
            std::panic::resume_unwind(panic)
        }
    };
    let (Ok(outcome) | Err((_, outcome))) = &ended;
    telemetry::finish(span, namespace, *outcome);
    ended
}

/// What a call returns once its core has ended ([`Over::end`]): the result kept in `kept` (the body's
/// own, or a replay decoded into it), or the library's error.
fn returned<T, E: From<Error>>(
    ended: Result<Outcome, (Error, Outcome)>,
    kept: &mut Option<Result<T, E>>,
) -> (Result<T, E>, Outcome) {
    match ended {
        Ok(outcome) => (kept.take().unwrap_or_else(|| out_of_turn()), outcome),
        Err((e, outcome)) => (Err(e.into()), outcome),
    }
}

/// The slot a call's result is kept in, as a replayed value's JSON is parsed into it
/// ([`codec::Parse`]).
impl<T: DeserializeOwned, E> codec::Parse for Option<Result<T, E>> {
    fn parse(&mut self, json: &[u8]) -> Result<(), serde_json::Error> {
        parse_into(self, json)
    }
}

/// `json` parsed into `slot`: one copy for each value type, which decodes a replay and checks that a
/// value's JSON reads back ([`Body::json`]).
#[inline(never)]
fn parse_into<T: DeserializeOwned, E>(
    slot: &mut Option<Result<T, E>>,
    json: &[u8],
) -> Result<(), serde_json::Error> {
    *slot = Some(Ok(serde_json::from_slice(json)?));
    Ok(())
}

/// A replay's part that is not generic ([`Over::end`]): the response unpacked and handed to `parse`, then kept
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

thread_local! {
    /// What a core polled on this thread asked of its shim, or the shim's answer for it.
    static EXCHANGE: Cell<Exchange> = const { Cell::new(Exchange::Empty) };
}

/// The slot between a core and its shim during one poll of the core.
enum Exchange {
    /// Nothing asked or answered.
    Empty,
    /// The core waits for the body's end.
    Asked,
    /// The body was polled, and is pending: the core beats the lease meanwhile.
    Pending,
    /// The body's end, for the core that asked for it.
    Answered(BodyEnded),
}

/// How a body ended, as its shim hands it to the core (not yet encoded: the core encodes a value's JSON
/// with its claim's settings).
pub(super) enum BodyEnded {
    /// `Ok`: the value's JSON, or why there is none (its `Serialize` failed, or panicked).
    Value(std::thread::Result<Result<Vec<u8>, serde_json::Error>>),
    /// `Err`: its text.
    Failed(String),
    /// A panic, of the body or (`body: false`) of the error's `Display`.
    Panicked { panic: Panic, body: bool },
}

impl BodyEnded {
    /// The end as `claim` stores it.
    fn ending(self, claim: &Held<'_>) -> Ending {
        match self {
            BodyEnded::Value(json) => {
                let (encoded, thrown) = claim.encoded(json);
                Ending::Value { encoded, thrown }
            }
            BodyEnded::Failed(text) => Ending::Failed(text),
            BodyEnded::Panicked { panic, body } => Ending::Panicked { panic, body },
        }
    }
}

/// The core's wait for the body's end: asks the shim for it, and is ready once it answers; while the
/// shim says the body is pending, the lease heartbeat runs beside it ([`beat`]; started when the body
/// did not end at its first poll, so that a body that ends at once never starts it).
struct WaitEnd<'b, 'a> {
    beat: &'b mut Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
    heartbeat: Heartbeat<'a>,
}

impl Future for WaitEnd<'_, '_> {
    type Output = BodyEnded;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<BodyEnded> {
        // No waker of its own to register: the shim polls the body in the same poll of the call, and
        // the core again when the body (or the heartbeat) wakes the call.
        match EXCHANGE.replace(Exchange::Asked) {
            Exchange::Answered(ended) => {
                EXCHANGE.set(Exchange::Empty);
                Poll::Ready(ended)
            }
            Exchange::Pending => {
                let this = &mut *self;
                beat(this.beat, this.heartbeat, cx);
                Poll::Pending
            }
            Exchange::Empty | Exchange::Asked => Poll::Pending,
        }
    }
}

/// Polls a call's `core` with `given` in the exchange (nothing, or what its shim has to say of the
/// body it asked for); says whether it asks for the body's end. The exchange is left as it was found,
/// also when the poll panics: a call whose core panics inside another call's poll (a store that
/// catches the panic of a call it makes) must not leave the other call its own question.
#[inline(never)]
fn poll_core<C: Future>(
    core: Pin<&mut C>,
    cx: &mut std::task::Context<'_>,
    given: Exchange,
) -> (Poll<C::Output>, bool) {
    /// Puts back what the exchange held before this poll, if the poll unwinds.
    struct Restore(Option<Exchange>);

    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(found) = self.0.take() {
                EXCHANGE.set(found);
            }
        }
    }

    let mut restore = Restore(Some(EXCHANGE.replace(given)));
    let polled = core.poll(cx);
    let found = restore.0.take().expect("taken only here");
    match EXCHANGE.replace(found) {
        Exchange::Asked => (polled, true),
        Exchange::Empty | Exchange::Pending => (polled, false),
        // A core asks for the body's end only where it waits for it ([`WaitEnd`]), which is the first
        // thing it polls when polled again.
        Exchange::Answered(_) => unreachable!("a call's core takes the body's end it asked for"),
    }
}

/// A body's future as the core's shim polls it, without its types: each function's own code is only
/// this trait's methods and [`codec::Parse`]'s ([`Shim`]), in one vtable; the polling around them, the
/// panics caught, the call's span entered and a replay decoded, is compiled once ([`poll_body`],
/// [`drive_core`]). `parse` makes a stored answer's value the one kept.
trait Body: codec::Parse {
    /// Polls the body once; when it has ended, keeps its result for the caller and says whether it is
    /// `Ok`.
    fn poll_end(&mut self, cx: &mut std::task::Context<'_>) -> Poll<bool>;

    /// The kept value's JSON; an error for a value that does not serialize, or whose JSON would not
    /// decode back into it (a non-finite float, a value nested deeper than `serde_json` reads, a
    /// 128-bit integer inside an untagged or internally tagged enum, a `Serialize` that writes what
    /// its `Deserialize` refuses): a duplicate could never be given such a value, so it is recorded
    /// as not serialized.
    fn json(&mut self) -> Result<Vec<u8>, serde_json::Error>;

    /// The kept error's text, as stored.
    fn describe(&mut self) -> String;

    /// Drops what is kept (the caller will not get it: a panic goes on instead).
    fn discard(&mut self);
}

/// A body's shim asked for what it does not keep: a value's JSON or an error's text before the body
/// returned it (or twice), the result kept when none is. A bug of this module's. Out of line and not
/// generic, so that each function's code only calls it (48 B less per function in release than a
/// panic at each of its three places, measured with `scripts/bench-size`).
#[cold]
#[inline(never)]
fn out_of_turn() -> ! {
    unreachable!("a call's kept value or error is asked for once, after its body returned it")
}

/// A typed body and where its result is kept, lent to [`drive_core`] for one poll of the call.
struct Shim<'p, F, D, T, E> {
    body: Pin<&'p mut F>,
    describe: &'p mut Option<D>,
    kept: &'p mut Option<Result<T, E>>,
}

impl<F, D, T, E> Body for Shim<'_, F, D, T, E>
where
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
    D: FnOnce(&E) -> String,
{
    fn poll_end(&mut self, cx: &mut std::task::Context<'_>) -> Poll<bool> {
        let result = std::task::ready!(self.body.as_mut().poll(cx));
        let ok = result.is_ok();
        *self.kept = Some(result);
        Poll::Ready(ok)
    }

    fn json(&mut self) -> Result<Vec<u8>, serde_json::Error> {
        let Some(Ok(value)) = &*self.kept else {
            out_of_turn()
        };
        let json = codec::to_json(value)?;
        if let Some(e) = codec::non_finite(value, &json) {
            return Err(e);
        }
        // Read back as a duplicate will read it, beside the value (which the caller gets as it is).
        parse_into::<T, E>(&mut None, &json).map_err(|e| codec::not_read_back(&e))?;
        Ok(json)
    }

    fn describe(&mut self) -> String {
        let (Some(describe), Some(Err(err))) = (self.describe.take(), &*self.kept) else {
            out_of_turn()
        };
        describe(err)
    }

    fn discard(&mut self) {
        *self.kept = None;
    }
}

impl<F, D, T: DeserializeOwned, E> codec::Parse for Shim<'_, F, D, T, E> {
    fn parse(&mut self, json: &[u8]) -> Result<(), serde_json::Error> {
        parse_into(self.kept, json)
    }
}

/// A body's future polled once in `span` (a panic caught): its end as the core stores it once it is
/// done, the value or the error kept for the caller. Not generic: compiled once.
#[inline(never)]
fn poll_body(
    body: &mut dyn Body,
    span: &tracing::Span,
    cx: &mut std::task::Context<'_>,
) -> Exchange {
    let entered = telemetry::enter(span);
    // Unwind safety: after a panic the body's future is never polled again, only dropped; what the
    // call does next (record FAILED, resume the panic) touches none of its state.
    let ended = match std::panic::catch_unwind(AssertUnwindSafe(|| body.poll_end(cx))) {
        Ok(Poll::Pending) => return Exchange::Pending,
        Ok(Poll::Ready(ok)) => Ok(ok),
        Err(panic) => Err(panic),
    };
    let ended = match ended {
        // Unwind safety: after a panic only the value's reference was touched, and the value is
        // handed back (or dropped) untouched by this call.
        Ok(true) => BodyEnded::Value(std::panic::catch_unwind(AssertUnwindSafe(|| body.json()))),
        // A panic in the error's text (its `Display`) is a failure like a panicking body's: recorded
        // as one, then the panic goes on. Unwind safety: `describe` only reads the error.
        Ok(false) => match std::panic::catch_unwind(AssertUnwindSafe(|| body.describe())) {
            Ok(text) => BodyEnded::Failed(text),
            Err(panic) => BodyEnded::Panicked { panic, body: false },
        },
        Err(panic) => BodyEnded::Panicked { panic, body: true },
    };
    drop(entered);
    Exchange::Answered(ended)
}

/// Drops what `body` keeps before its call's panic goes on (a value whose `Serialize` panicked, an error
/// whose `Display` did), so that nothing of the body's is dropped while the panic unwinds: a `Drop` that
/// panics then would abort the process, and a guard dropped then would be poisoned. A panic of that
/// drop is dropped too, and a panic of that panic's payload's drop forgotten: the call's own panic is
/// the one that goes on.
#[inline(never)]
fn discard(body: &mut dyn Body) {
    // Unwind safety: what is kept is dropped, and nothing reads it again.
    if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| body.discard()))
        && let Err(again) = std::panic::catch_unwind(AssertUnwindSafe(move || drop(panic)))
    {
        std::mem::forget(again);
    }
}

pin_project_lite::pin_project! {
    /// A call whose body runs in place: its [`core`] in the call's span, and the body beside it. The
    /// body is dropped first (it was started last), then the core, in the call's span, which cleans up
    /// by the call's stage. (The body in the span too, entered for its polls and its drop, costs each
    /// function about 4 KB more in release, measured.)
    pub(crate) struct InPlace<C, F, D, T, E> {
        #[pin]
        body: F,
        #[pin]
        course: Started<C>,
        describe: Option<D>,
        // The value or the error, kept for the caller while its end is stored.
        kept: Option<Result<T, E>>,
        // Whether the core waits for the body's end: the body is polled first, then the core told.
        waiting: bool,
    }
}

impl<C, F, D, T, E> InPlace<C, F, D, T, E> {
    /// The call around `body`, as its checks started it (`course`).
    pub(crate) fn new(course: Started<C>, body: F, describe: D) -> Self {
        Self {
            body,
            course,
            describe: Some(describe),
            kept: None,
            waiting: false,
        }
    }
}

impl<'a, C, F, D, T, E> Future for InPlace<C, F, D, T, E>
where
    C: Future<Output = Ended<'a>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
    D: FnOnce(&E) -> String,
{
    type Output = (Result<T, E>, Outcome);

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut body = Shim {
            body: this.body,
            describe: this.describe,
            kept: this.kept,
        };
        let ended = std::task::ready!(drive_core(this.course, this.waiting, &mut body, cx));
        Poll::Ready(returned(ended, body.kept))
    }
}

/// One poll of a call, as its checks started it (`course`): its core polled, and `body` polled whenever
/// the core waits for its end, until the core is ready or both are pending; once it is ready, how it
/// ended ([`Over::end`]: `Ok` when the result is the one `body` keeps), recorded in the call's span
/// ([`recorded`]; a body's panic, with the outcome its storing gave it). A call that could not start
/// ends with its error; a body that runs alone is polled alone. `waiting` says whether the core waited for the body at the end of the last poll.
/// Generic only over the core (a call's, or a detached body's task's): compiled once for each.
#[inline(never)]
fn drive_core<'a, C: Future<Output = Ended<'a>>>(
    course: Pin<&mut Started<C>>,
    waiting: &mut bool,
    body: &mut dyn Body,
    cx: &mut std::task::Context<'_>,
) -> Poll<Result<Outcome, (Error, Outcome)>> {
    let mut core = match course.project() {
        StartedProj::Run { core } => core,
        // Switched off, or a missing key under `MissingKey::Skip`: the body alone.
        StartedProj::Alone { .. } => {
            return body.poll_end(cx).map(|_| Ok(Outcome::Skipped));
        }
        StartedProj::Failed { error } => {
            let e = *error
                .take()
                .expect("a call that could not start is polled once");
            let outcome = Outcome::of(&e);
            return Poll::Ready(Err((e, outcome)));
        }
    };
    let mut given = if *waiting {
        poll_body(body, core.as_mut().span(), cx)
    } else {
        Exchange::Empty
    };
    loop {
        let body_polled = !matches!(given, Exchange::Empty);
        let (polled, asked) = poll_core(core.as_mut(), cx, given);
        *waiting = asked;
        match polled {
            Poll::Ready((over, namespace)) => {
                if let Over::Panic(_, outcome) = over {
                    // Recorded on the call's own span (not the thread's current one, which is
                    // another's when this one is disabled or made under another subscriber), then
                    // what is kept dropped; the panic goes on.
                    telemetry::finish(core.as_mut().span(), namespace, outcome);
                    discard(body);
                    return Poll::Ready(over.end(body));
                }
                return Poll::Ready(recorded(over, body, core.as_mut().span(), namespace));
            }
            // Claiming or storing; or waiting for a body polled this time.
            Poll::Pending if !asked || body_polled => return Poll::Pending,
            // The core has just asked for the body's end: the body's first poll.
            Poll::Pending => {}
        }
        given = poll_body(body, core.as_mut().span(), cx);
    }
}

pin_project_lite::pin_project! {
    /// How a call starts, once its checks are made (`operation::start`): what [`drive_core`] polls.
    #[project = StartedProj]
    pub(crate) enum Started<C> {
        /// The call's core (built by [`core`], or a detached body's task's), in the call's span.
        Run {
            #[pin]
            core: telemetry::InSpan<C>,
        },
        /// Switched off, or a missing key under `MissingKey::Skip`: the body alone (for a detached
        /// body, on a task tracked by the handle's tasks, when known).
        Alone {
            namespace: &'static str,
            tasks: Option<tokio_util::task::TaskTracker>,
        },
        /// The call could not start (the handle, the key or the payload): its error, taken once.
        Failed {
            error: Option<Box<Error>>,
        },
    }
}

pin_project_lite::pin_project! {
    /// A detached call: its [`core`] in the call's span until it holds the claim, then its body's task,
    /// which runs the body and stores its end ([`InPlace`] around [`handed_over`]), awaited.
    pub(crate) struct Detaching<C, F, D, T, E> {
        #[pin]
        core: telemetry::InSpan<C>,
        // Moved into the body's task once the claim is held; never polled here.
        body: Option<(F, D)>,
        task: Option<Joined<T, E>>,
    }
}

impl<C, F, D, T, E> Detaching<C, F, D, T, E> {
    /// The call of `core` (built by [`core`], detached, in the call's span), around `body`.
    pub(crate) fn new(core: telemetry::InSpan<C>, body: F, describe: D) -> Self {
        Self {
            core,
            body: Some((body, describe)),
            task: None,
        }
    }
}

impl<'a, C, F, D, T, E> Future for Detaching<C, F, D, T, E>
where
    C: Future<Output = Ended<'a>>,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: From<Error> + Send + 'static,
    F: Future<Output = Result<T, E>> + Send + 'static,
    D: FnOnce(&E) -> String + Send + 'static,
{
    type Output = (Result<T, E>, Outcome);

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if this.task.is_none() {
            // Its body's task is spawned on the Tokio runtime the call runs in: outside one, the
            // call panics (documented on `detach`) before its claim is sent, not once it holds the
            // key.
            assert!(
                tokio::runtime::Handle::try_current().is_ok(),
                "a detached idempotent call must be polled inside a Tokio runtime: its body runs on \
                 a task of its own"
            );
            let mut handover = match std::task::ready!(this.core.as_mut().poll(cx)) {
                (Over::Spawn(handover), _) => handover,
                // A replay, or the library's error: recorded here. A body's end is recorded by its
                // task, also when this caller has left.
                (over, namespace) => {
                    let mut kept = None;
                    let ended = recorded(over, &mut kept, this.core.as_mut().span(), namespace);
                    return Poll::Ready(returned(ended, &mut kept));
                }
            };
            let (body, describe) = this.body.take().expect("a claim is handed over once");
            let namespace = handover.owned.call.namespace;
            let tasks = handover.owned.idem.tasks().clone();
            let tracked = handover.tracked.take();
            let span = this.core.as_mut().span().clone();
            let course = Started::Run {
                core: telemetry::InSpan::new(handed_over(*handover), span.clone()),
            };
            let work = InPlace::new(course, body, describe);
            // In the call's runtime (checked above).
            let task = tasks.spawn(work);
            drop(tracked);
            *this.task = Some(Joined {
                namespace,
                span,
                task,
            });
        }
        let task = this.task.as_mut().expect("spawned above");
        Poll::Ready(match std::task::ready!(Pin::new(task).poll(cx)) {
            Ok(ended) => {
                crate::execution::record(crate::Execution::Executed);
                ended
            }
            // The record is FAILED (`panicked: ..`); the panic goes on to the caller as it was.
            Err(panic) => std::panic::resume_unwind(panic),
        })
    }
}

/// The body of a detached call with no record (the kill switch is on, or a missing key under
/// [`MissingKey::Skip`](crate::MissingKey::Skip)), on a task of its own (tracked by `tasks` when the
/// handle is known), so that a detached call keeps its promise that a caller who gives up stops the
/// waiting, not the work. Lazy: nothing starts before the returned future is first polled.
pub(crate) fn alone<T, E, F>(
    namespace: &'static str,
    tasks: Option<&tokio_util::task::TaskTracker>,
    body: F,
) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send>>
where
    T: Send + 'static,
    E: From<Error> + Send + 'static,
    F: Future<Output = Result<T, E>> + Send + 'static,
{
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

/// The end of a detached body's task, for its caller ([`Detaching`]). The task records the call's end
/// in the call's `span`; a task the runtime dropped before its end is recorded here.
pub(crate) struct Joined<T, E> {
    namespace: &'static str,
    span: tracing::Span,
    task: tokio::task::JoinHandle<(Result<T, E>, Outcome)>,
}

impl<T, E: From<Error>> Future for Joined<T, E> {
    type Output = Finished<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Finished<T, E>> {
        let namespace = self.namespace;
        Poll::Ready(match std::task::ready!(Pin::new(&mut self.task).poll(cx)) {
            Ok(finished) => Ok(finished),
            Err(e) if e.is_panic() => Err(e.into_panic()),
            // The runtime shut down under the task: like a crash, the claim lapses with its lease.
            Err(_) => {
                let error = Error::ResultNotStored {
                    namespace: namespace.to_owned(),
                    source: "the runtime shut down before the detached body finished".into(),
                };
                let outcome = Outcome::of(&error);
                telemetry::finish(&self.span, namespace, outcome);
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

/// How a body that holds its claim ended, as its claim stores it; not generic (its [`Shim`] keeps the
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
    /// The panic goes on (the record is FAILED, `failed`; or COMPLETED when the value's `Serialize`
    /// panicked, `error`), with the call's outcome.
    Panic(Panic, Outcome),
}

/// [`store_ending`], boxed: a replay (the common duplicate) never stores anything, so a call's future
/// need not carry the completion.
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
                    return Settled::Panic(panic, Outcome::Error);
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
                Settled::Panic(panic, Outcome::Failed)
            }
        }
    }
}

#[cfg(test)]
mod future_size {
    use super::*;

    /// The parts of a call, with no writes.
    fn parts(idem: &Idempotency) -> Parts<Cow<'_, Idempotency>> {
        Parts {
            idem: Cow::Borrowed(idem),
            call: Call::new("bench::charge"),
            key: "k".to_owned(),
            fingerprint: None,
            staging: None,
            claim_writes: Writes::new(),
            compensation: Writes::new(),
            steps: None,
        }
    }

    fn in_place<F: Future<Output = Result<u32, Error>>>(
        idem: &Idempotency,
        body: F,
    ) -> InPlace<impl Future<Output = Ended<'_>>, F, impl FnOnce(&Error) -> String, u32, Error>
    {
        let course = Started::Run {
            core: telemetry::InSpan::new(core(parts(idem), false), tracing::Span::none()),
        };
        InPlace::new(course, body, |e: &Error| e.to_string())
    }

    /// A call's state machine is held in place by every caller's future (not boxed: a box per call
    /// costs a duplicate about 1% of its CPU on the null DynamoDB), so it stays small: the parts only
    /// a call that runs its body needs (the storing of its end, the heartbeat) and only a waiting call
    /// needs (the timer, the re-read) are boxed on their own paths, and a replay never allocates them.
    #[test]
    fn a_calls_state_machine_stays_under_a_kilobyte() {
        let idem =
            crate::Idempotency::builder_arc(std::sync::Arc::new(crate::MemoryStore::new())).build();
        // A body holding a request of about the bench's size.
        let request = [7_u8; 96];
        let call = in_place(
            &idem,
            async move { Ok::<u32, Error>(u32::from(request[0])) },
        );
        let size = std::mem::size_of_val(&call);
        assert!(
            size <= 1024,
            "the state machine is {size} bytes: box the new part on its own path"
        );
        // The body is in it once: a body 512 bytes larger makes it 512 bytes larger, not 1,024.
        let large = [7_u8; 96 + 512];
        let larger = std::mem::size_of_val(&in_place(&idem, async move {
            Ok::<u32, Error>(u32::from(large[0]))
        }));
        assert!(
            larger - size <= 512 + 16,
            "a body 512 bytes larger made the state machine {} bytes larger",
            larger - size
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
        let held = || Held {
            idem: &idem,
            plan: &plan,
            token: "t",
            ttl: Duration::ZERO,
            lead: None,
        };
        // What a call that runs its body boxes: the storing of its end (the completion or the
        // failure, held in place), under the allocator's small sizes.
        let (encoded, _) = held().encoded(Ok(Ok(b"[\"\",0,\"\",\"\"]".to_vec())));
        let ending = Ending::Value {
            encoded,
            thrown: None,
        };
        let boxed = std::mem::size_of_val(&store_ending(held(), ending, Duration::ZERO, 0, false));
        assert!(
            boxed <= 1024,
            "the boxed storing of a body's end is {boxed} bytes"
        );
    }
}
