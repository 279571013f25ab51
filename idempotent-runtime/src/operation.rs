//! [`Operation`]: the one front door to the state machine. Users build one for closures, dynamic
//! namespaces of static lifetime and claim-time business writes ([`Operation::claim_with`]); the code
//! `#[idempotent]` generates builds one too (through the hidden `__private` glue), so both take the same
//! path: kill switch, key and payload checks, the missing-key policy, then the call's core
//! ([`handler::core`]).

use std::borrow::Cow;
use std::fmt::Display;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::call::{Call, MissingKey};
use crate::handler;
use crate::handler::Started;
use crate::key::DerivedKey;
use crate::store::Writes;
use crate::store::writes::Staged;
use crate::telemetry::{self, Outcome};
use crate::{Error, Idempotency, Steps};

/// One idempotent call, configured step by step; start with [`Idempotency::operation`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idempotent_runtime::Error> {
/// use std::time::Duration;
/// let idem = idempotent_runtime::Idempotency::in_memory();
/// let order = ("acme", 42);
/// let total: u64 = idem
///     .operation("shop::checkout", &order)
///     .ttl(Duration::from_secs(3600))
///     .run(|_| async { Ok::<_, idempotent_runtime::Error>(1_250) })
///     .await?;
/// assert_eq!(total, 1_250);
/// # Ok(()) }
/// ```
///
/// Each option is one call on the chain, and every chain ends in the one [`run`](Self::run). The
/// options that give the body something ([`steps`](Self::steps), [`transact`](Self::transact)) and the
/// one that moves it ([`detach`](Self::detach)) change the operation's type, so that the body gets
/// exactly what was asked for, through its [`Context`]:
///
/// | parameter | what it is | default | set by |
/// |---|---|---|---|
/// | `H` | what a replayed value goes through before `run` returns it | [`Unchanged`] | [`on_replay`](Self::on_replay) |
/// | `S` | what the body's context has for steps | `()` | [`steps`](Self::steps): [`Steps`] |
/// | `W` | what the body's context has for business writes | `()` | [`transact`](Self::transact): [`Transaction`](crate::Transaction) |
/// | `P` | where the body runs | [`InPlace`] | [`detach`](Self::detach): [`Detached`] |
#[derive(Debug)]
#[must_use = "an operation does nothing until `run` is awaited"]
pub struct Operation<'a, H = Unchanged, S = (), W = (), P = InPlace> {
    /// The handle, or why there is none (the attribute's `store = ..` or installed default): reported
    /// by `run` with the key's and payload's errors, after the kill switch.
    idem: Early<Cow<'a, Idempotency>>,
    call: Call,
    key: Early<DerivedKey>,
    fingerprint: Option<Early<String>>,
    claim_writes: Writes,
    compensation: Writes,
    /// The operation starts over after a failure ([`restart_steps_after_failure`](Self::restart_steps_after_failure)).
    restart_steps: bool,
    /// The body's steps, when it runs with them.
    steps: Option<Steps>,
    /// The writes the body stages, when it runs with them.
    staging: Option<Staged>,
    on_replay: H,
    options: Marker<S, W, P>,
}

/// The options' types, held by an operation without holding values of them.
type Marker<S, W, P> = PhantomData<fn() -> (S, W, P)>;

/// [`Error::LeaseTooShort`] for a call that asks for a lease under [`MIN_LEASE`](crate::MIN_LEASE)
/// (a [`deadline`](Operation::deadline) never asks for one: a call it leaves less does not claim).
fn check_lease(call: &Call) -> Result<(), Box<Error>> {
    match call.lease {
        Some(lease) if lease < crate::MIN_LEASE => Err(Box::new(Error::LeaseTooShort {
            namespace: call.namespace.to_owned(),
            lease,
        })),
        _ => Ok(()),
    }
}

/// What a call evaluates before it starts (its handle, key and payload fingerprint), or the error that
/// `run` reports for it. The error is boxed: an [`Error`] is 64 bytes, and a call moves these values
/// through several layers, where the boxed error keeps each move a word or two.
pub type Early<T> = Result<T, Box<Error>>;

/// What an [`Operation`] does to a value it replays, before returning it: any `FnOnce(T) -> T`, or
/// [`Unchanged`].
pub trait OnReplay<T> {
    /// The value to return instead of `replayed`.
    fn on_replay(self, replayed: T) -> T;

    /// Whether [`on_replay`](Self::on_replay) may change the value; `false` lets `run` skip telling
    /// replays apart.
    #[doc(hidden)]
    const CHANGES: bool = true;
}

/// Returns replayed values as they were stored (the default [`OnReplay`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unchanged;

impl<T> OnReplay<T> for Unchanged {
    fn on_replay(self, replayed: T) -> T {
        replayed
    }

    const CHANGES: bool = false;
}

impl<T, F: FnOnce(T) -> T> OnReplay<T> for F {
    fn on_replay(self, replayed: T) -> T {
        self(replayed)
    }
}

impl Idempotency {
    /// An idempotent call of `namespace` with `key` (any `Serialize` value; hashed as the attribute's
    /// `key = ..`). A key that does not serialize, or a missing one (see
    /// [`Operation::missing_key`]), is reported by `run`, before anything is sent.
    pub fn operation<K: Serialize + ?Sized>(
        &self,
        namespace: &'static str,
        key: &K,
    ) -> Operation<'_> {
        let call = Call::new(namespace);
        let key = DerivedKey::for_call(&call, key).map_err(Box::new);
        Operation::from_parts(Ok(Cow::Borrowed(self)), call, key, None)
    }
}

impl<'a> Operation<'a> {
    /// An operation from what the attribute's generated code evaluated: the handle (or why there is
    /// none), the call's settings, the key and the payload's fingerprint.
    pub(crate) fn from_parts(
        idem: Early<Cow<'a, Idempotency>>,
        call: Call,
        key: Early<DerivedKey>,
        fingerprint: Option<Early<String>>,
    ) -> Self {
        Operation {
            idem,
            call,
            key,
            fingerprint,
            claim_writes: Writes::new(),
            compensation: Writes::new(),
            restart_steps: false,
            steps: None,
            staging: None,
            on_replay: Unchanged,
            options: PhantomData,
        }
    }
}

impl<'a, H, S, W, P> Operation<'a, H, S, W, P> {
    /// How long the response is replayed (default: the handle's). At least that long: a record is
    /// kept until no claim of a call that gave up can still land on it, so a `ttl` shorter than the
    /// lease may be replayed for up to a lease and the clock-skew margin more.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.call.ttl = Some(ttl);
        self
    }

    /// How long the claim blocks others if its worker dies (default: the handle's).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.call.lease = Some(lease);
        self
    }

    /// The most bytes of JSON this call's response may have, stored or replayed (default: the
    /// handle's [`max_response_bytes`](crate::Builder::max_response_bytes)): for a call whose
    /// responses are known to be bounded more tightly (or to need more), so that a record written by
    /// someone else is refused as soon as it inflates past what this call could have stored. Every call
    /// on the key needs the same bound.
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        if let Ok(idem) = &mut self.idem
            && idem.max_response_bytes() != limit
        {
            *idem = Cow::Owned(idem.with_max_response_bytes(limit));
        }
        self
    }

    /// Bounds the claim by a deadline after which this process will not be running the body any more,
    /// such as an AWS Lambda invocation's (`lambda_runtime::Context::deadline()`): no claim asks for a
    /// lease past it (the lease is the operation's, or what is left of the deadline when the claim is
    /// sent, whichever is shorter), so a claim whose worker was killed at the deadline is free again
    /// right after it (plus the handle's clock-skew margin), instead of a whole lease later.
    ///
    /// A call that would claim with less than [`MIN_LEASE`](crate::MIN_LEASE) left (the deadline has
    /// passed, or the call waited for another until it nearly had) does not claim and does not run its
    /// body: it returns [`Error::DeadlinePassed`]. A body started so late could still be running when
    /// its lease ends, beside another caller's.
    ///
    /// Heartbeats (when the handle has them) renew a running body's claim by the same lease, past the
    /// deadline too: a body that is still running is never taken over, whatever the deadline said. A
    /// handle for Lambda work is best built with
    /// [`Builder::heartbeat(false)`](crate::Builder::heartbeat): the lease already covers all the time
    /// the invocation has, and the claim of an invocation killed at its deadline then ends exactly
    /// there. The deadline is read against the handle's [`Clock`](crate::Clock) when this is called.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idempotent_runtime::Error> {
    /// use std::time::{Duration, SystemTime};
    /// use idempotent_runtime::{Error, Idempotency};
    /// let idem = Idempotency::builder_in_memory().heartbeat(false).build();
    /// let deadline = SystemTime::now() + Duration::from_secs(3); // `context.deadline()` in a Lambda
    /// let receipt = idem
    ///     .operation("billing::charge", "order-1")
    ///     .deadline(deadline)
    ///     .run(|_| async { Ok::<_, Error>(String::from("ch_1")) })
    ///     .await?;
    /// # assert_eq!(receipt, "ch_1");
    /// # Ok(()) }
    /// ```
    pub fn deadline(mut self, deadline: std::time::SystemTime) -> Self {
        let left = deadline
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        // On the handle's clock, which every lease is counted on.
        let now_ms = match &self.idem {
            Ok(idem) => idem.clock().now_ms(),
            Err(_) => crate::Clock::now_ms(&crate::SystemClock),
        };
        self.call.deadline_ms =
            std::num::NonZeroU64::new(now_ms.saturating_add(crate::handler::millis(left)).max(1));
        self
    }

    /// How long a duplicate waits for an in-flight call before [`Error::InProgress`] (default: none).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.call.wait = Some(wait);
        self
    }

    /// What a missing key means: one that serializes to `null`, or a tuple or array key with a `null`
    /// element (default: [`MissingKey::Reject`], `run` returns [`Error::MissingKey`]).
    ///
    /// With [`MissingKey::Skip`], `run` calls the body alone, without the store. Business writes only
    /// commit together with a record, so an operation that has them ([`transact`](Self::transact),
    /// [`claim_with`](Self::claim_with)) rejects a missing key under `Skip` rather than drop them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idempotent_runtime::Error> {
    /// use idempotent_runtime::{Error, Idempotency, MissingKey};
    /// let idem = Idempotency::in_memory();
    /// let order_id: Option<&str> = None;
    /// let rejected = idem
    ///     .operation("shop::checkout", &order_id)
    ///     .run(|_| async { Ok::<_, Error>(1) })
    ///     .await;
    /// assert!(matches!(rejected, Err(Error::MissingKey { .. })));
    /// let unprotected = idem
    ///     .operation("shop::checkout", &order_id)
    ///     .missing_key(MissingKey::Skip)
    ///     .run(|_| async { Ok::<_, Error>(2) })
    ///     .await?;
    /// assert_eq!(unprotected, 2);
    /// # Ok(()) }
    /// ```
    pub fn missing_key(mut self, missing_key: MissingKey) -> Self {
        self.call.missing_key = missing_key;
        self
    }

    /// Passes a replayed value through `hook` before `run` returns it (values produced by the body are
    /// returned as they are): to mark it, or to refresh what must not be served stale. The stored value
    /// stays as it was. To only *tell* a replay from an execution, see [`observe`](crate::observe).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idempotent_runtime::Error> {
    /// use idempotent_runtime::{Error, Idempotency};
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Receipt { id: u32, replayed: bool }
    ///
    /// let idem = Idempotency::in_memory();
    /// let charge = || {
    ///     idem.operation("billing::charge", "order-1")
    ///         .on_replay(|r: Receipt| Receipt { replayed: true, ..r })
    ///         .run(|_| async { Ok::<_, Error>(Receipt { id: 7, replayed: false }) })
    /// };
    /// assert!(!charge().await?.replayed);
    /// assert!(charge().await?.replayed);
    /// # Ok(()) }
    /// ```
    pub fn on_replay<G>(self, hook: G) -> Operation<'a, G, S, W, P> {
        self.with(|_| hook)
    }

    /// The same operation with other options (`S2`, `W2`, `P2`), its `on_replay` hook made by `hook`.
    fn with<G, S2, W2, P2>(self, hook: impl FnOnce(H) -> G) -> Operation<'a, G, S2, W2, P2> {
        Operation {
            idem: self.idem,
            call: self.call,
            key: self.key,
            fingerprint: self.fingerprint,
            claim_writes: self.claim_writes,
            compensation: self.compensation,
            restart_steps: self.restart_steps,
            steps: self.steps,
            staging: self.staging,
            on_replay: hook(self.on_replay),
            options: PhantomData,
        }
    }

    /// Rejects the key with another payload ([`Error::PayloadMismatch`]).
    pub fn payload<Q: Serialize + ?Sized>(mut self, payload: &Q) -> Self {
        self.fingerprint = Some(crate::key::fingerprint_for(&self.call, payload).map_err(Box::new));
        self
    }

    /// Business writes that commit in one transaction with the claim ("claim and reserve"): the claim
    /// and the writes land together or not at all. When a write's condition fails, nothing is written,
    /// no record is left behind, the body does not run, and `run` returns
    /// [`Error::TransactionCanceled`].
    ///
    /// The writes are in effect **at most once per key**: duplicates of a claimed key do not apply them
    /// again, and neither does a retry after the body failed, nor a caller that takes over a lapsed
    /// claim — they run the body with the writes already in effect. Only a failure that commits
    /// [`compensate_with`](Self::compensate_with) writes releases them, and then the next claim applies
    /// them again. Once the record expires (its `ttl` after completion), the key is a new operation and
    /// its claim applies them again.
    ///
    /// The record remembers the writes for as long as they are in effect: a FAILED record that keeps
    /// them (no compensation, or one whose condition failed) expires after the operation's `ttl` and the
    /// handle's [`retain`](crate::Builder::retain), not after the short
    /// [`failed_ttl`](crate::Builder::failed_ttl); a claim with writes lives its lease, `ttl` and
    /// `retain` (a heartbeat renews it for the lease and `ttl`); an operator's `key release` keeps the
    /// claim's expiry. So a retry within that time (Lambda retries an asynchronous invocation after 1 and
    /// 2 minutes) finds the writes in effect and does not apply them again.
    ///
    /// Every claim that keeps the writes is conditioned on the mark that they are in effect, and every
    /// compensation on the same mark, inside its transaction: a decision taken on a record that another
    /// caller changed meanwhile never completes without the writes, nor undoes them twice.
    ///
    /// A claim with writes is a `TransactWriteItems` (twice the write capacity of a plain claim); a
    /// re-claim of a key whose writes are in effect costs one more round trip (the transaction is
    /// refused, and a plain claim follows).
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    pub fn claim_with(
        mut self,
        writes: impl IntoIterator<Item = aws_sdk_dynamodb::types::TransactWriteItem>,
    ) -> Self {
        self.claim_writes.extend(writes);
        self
    }

    /// Writes that undo the [`claim_with`](Self::claim_with) writes, committed in one transaction with
    /// the FAILED record when the body returns `Err` (an inventory decrement's increment, say). Once
    /// they commit, the claim-time writes are no longer in effect, and the next call's claim applies
    /// them again. If they cannot commit (a condition fails), the failure is recorded without them and
    /// the claim-time writes stay in effect. Without `claim_with`, they are never sent.
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    pub fn compensate_with(
        mut self,
        writes: impl IntoIterator<Item = aws_sdk_dynamodb::types::TransactWriteItem>,
    ) -> Self {
        self.compensation.extend(writes);
        self
    }

    /// Runs the body on a task of its own once the claim has landed, so that it runs to its end and its
    /// result is stored even if this call's future is dropped: a client that hangs up, a `timeout` or
    /// `select!` that gives up on the call, stop the *waiting*, not the work. A later call with the key
    /// gets the stored result, or (while the body still runs) waits for it or gets
    /// [`Error::InProgress`], as for any call in flight. Set it last: it returns a [`Detached`].
    ///
    /// Without it, a call dropped while its body runs stops the body where it is, and the key stays
    /// PENDING until its lease runs out (the body may have had effects, so it is not run again
    /// earlier). Detach bodies whose effects must not be left half-done by a caller that gave up
    /// (a charge, an order); keep the default for work that should stop with its caller.
    ///
    /// The body must be `Send + 'static` (it moves to another task: it owns what it uses), and so must
    /// its value and error. A panicking body's panic still reaches the caller. The task is spawned on
    /// the current Tokio runtime (a call polled outside one panics, as `tokio::spawn` does, before it
    /// claims its key); a graceful
    /// shutdown waits for such bodies with [`Idempotency::drain`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idempotent_runtime::Error> {
    /// use std::time::Duration;
    /// use idempotent_runtime::{Error, Idempotency};
    /// let idem = Idempotency::in_memory();
    /// let charge = || {
    ///     idem.operation("billing::charge", "order-1").detach().run(|_| async {
    ///         tokio::time::sleep(Duration::from_millis(50)).await; // the payment gateway
    ///         Ok::<_, Error>(String::from("ch_1"))
    ///     })
    /// };
    /// // The caller gives up after 10 ms; the charge goes on and is stored.
    /// assert!(tokio::time::timeout(Duration::from_millis(10), charge()).await.is_err());
    /// idem.drain(Duration::from_secs(5)).await;
    /// assert_eq!(charge().await?, "ch_1"); // replayed: the body ran once
    /// # Ok(()) }
    /// ```
    pub fn detach(self) -> Operation<'a, H, S, W, Detached> {
        self.with(|hook| hook)
    }

    /// Gives the body the call's [`Steps`] ([`Context::steps`]): a body of several effects that
    /// resumes where it stopped, running each effect through [`Steps::run`], under a name. Each step's
    /// `Ok` value is stored in the record before the body goes on (one fenced `UpdateItem` per step),
    /// so a call that takes the key over after a crash or a lapsed lease, or claims it again after a
    /// failure, replays the finished steps' values without running them and goes on from the first
    /// unfinished one.
    ///
    /// What runs again after a crash is at most the step that was running, and not even that when the
    /// step passes [`Steps::key`] to a downstream API that honours idempotency keys. Once the body
    /// returns `Ok`, its value is stored and replayed as without steps, and the steps are removed; once
    /// the record expires, the key is a new operation, whose steps start afresh. After the body returns
    /// `Err`, a retry resumes too (its finished steps are not run again), unless the operation
    /// [restarts from scratch after a failure](Self::restart_steps_after_failure).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idempotent_runtime::Error> {
    /// use idempotent_runtime::{Error, Idempotency};
    /// let idem = Idempotency::in_memory();
    /// let receipt = idem
    ///     .operation("shop::checkout", "order-7")
    ///     .steps()
    ///     .run(|cx| async move {
    ///         let steps = cx.steps();
    ///         let hold: u32 = steps.run("reserve", || async { Ok::<_, Error>(17) }).await?;
    ///         let gateway_key = steps.key("charge"); // the gateway's `Idempotency-Key`
    ///         let charge = steps
    ///             .run("charge", || async move { Ok::<_, Error>(format!("ch_{}", &gateway_key[..8])) })
    ///             .await?;
    ///         steps.run("email", || async { Ok::<_, Error>(()) }).await?;
    ///         Ok::<_, Error>((hold, charge))
    ///     })
    ///     .await?;
    /// assert_eq!(receipt.0, 17);
    /// # Ok(()) }
    /// ```
    pub fn steps(self) -> Operation<'a, H, Steps, W, P> {
        self.with(|hook| hook)
    }

    /// Gives the body a [`Transaction`](crate::Transaction) ([`Context::transaction`]): the business
    /// writes it stages commit in one `TransactWriteItems` with the COMPLETED record, so that they and
    /// the stored result land together or not at all. With [`steps`](Self::steps), the steps' values
    /// are stored as they finish, as without it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idempotent_runtime::Error> {
    /// use idempotent_runtime::aws_sdk_dynamodb::types::{AttributeValue, Put};
    /// use idempotent_runtime::{Error, Idempotency, MemoryStore};
    /// let store = MemoryStore::new();
    /// store.create_table("orders", "pk", None).expect("a new table");
    /// let idem = Idempotency::builder(store).build();
    /// let id = idem
    ///     .operation("shop::place", "order-9")
    ///     .transact()
    ///     .run(|cx| async move {
    ///         let order = Put::builder()
    ///             .table_name("orders")
    ///             .item("pk", AttributeValue::S("order-9".into()))
    ///             .build()
    ///             .expect("a table and an item");
    ///         cx.transaction().put(order);
    ///         Ok::<_, Error>(9)
    ///     })
    ///     .await?;
    /// assert_eq!(id, 9);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    pub fn transact(self) -> Operation<'a, H, S, crate::Transaction, P> {
        self.with(|hook| hook)
    }

    /// For an operation run with [`steps`](Self::steps): after the body returns `Err`, the next call
    /// starts over from the first step (its stored steps are dropped, and [`Steps::key`] gives new
    /// keys) instead of resuming. For bodies whose failure undoes what the finished steps did (a refund
    /// after a declined shipment), so that their steps must run again. A crash or a lapsed lease still
    /// resumes.
    pub fn restart_steps_after_failure(mut self) -> Self {
        self.restart_steps = true;
        self
    }

    /// Runs `body` at most once per key while its record lives, and returns its (possibly replayed)
    /// result. The body gets a [`Context`] with what the options give it (the [`steps`](Self::steps),
    /// the [`transact`](Self::transact)ion; nothing without them: `|_| async { .. }`). The error's
    /// `Display` text is stored on FAILED records.
    ///
    /// The call is prepared when `run` is called (its checks made, the body's future made), and starts
    /// when the future returned is first polled.
    ///
    /// A [`detach`](Self::detach)ed body runs on a task of its own, so it must be `Send + 'static`, and
    /// so must its value and error.
    ///
    /// # Errors
    /// The body's own error, or an [`Error`] converted into `E` (those of [`Steps::run`] included).
    ///
    /// # Panics
    /// When the body panics (after its record is FAILED), with the body's panic; a detached call,
    /// when polled outside a Tokio runtime (before it claims its key).
    pub fn run<T, E, F, Fut>(self, body: F) -> impl Future<Output = Result<T, E>>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error> + Display,
        F: FnOnce(Context<S, W>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        H: OnReplay<T>,
        S: Given,
        W: Given,
        P: Placement<T, E, Fut, H>,
    {
        self.launch(<E as ToString>::to_string, body)
    }

    /// The one path from the options to the state machine, for [`run`](Self::run) and the attribute's
    /// generated code: the body gets its context, then runs in place or, detached, on a task of its
    /// own. `describe` gives the text stored for the body's error.
    pub(crate) fn launch<T, E, F, Fut>(
        mut self,
        describe: fn(&E) -> String,
        body: F,
    ) -> impl Future<Output = Result<T, E>>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(Context<S, W>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        H: OnReplay<T>,
        S: Given,
        W: Given,
        P: Placement<T, E, Fut, H>,
    {
        let mut given = Options::default();
        if S::STEPS {
            let steps = Steps::new(self.call.namespace, self.restart_steps);
            self.steps = Some(steps.clone());
            given.steps = Some(steps);
        }
        #[cfg(feature = "dynamodb")]
        if W::WRITES {
            let transaction = crate::Transaction::new();
            self.staging = Some(transaction.staged().clone());
            given.transaction = Some(transaction);
        }
        let context = Context {
            steps: S::given(&mut given),
            transaction: W::given(&mut given),
        };
        let body = body(context);
        Operation::drive(P::detached(self, describe, body), describe)
    }

    /// The operation without its options' types, for a detached call's task, once
    /// [`launch`](Self::launch) has used them.
    fn plain(self) -> Operation<'a, H> {
        self.with(|hook| hook)
    }

    /// The path into the state machine, for [`launch`](Self::launch): a detached call as
    /// [`Placement::detached`] boxed it; a body run in place through the checks ([`start`]: the
    /// kill switch, then the handle, key and payload (the first error among them; the body does not
    /// run), the missing-key policy), then the call's core ([`handler::core`], compiled once) with
    /// the body beside it ([`handler::InPlace`]).
    /// `describe` gives the text stored for the body's error.
    ///
    /// The checks are made here, and the state machine built, when the call's future is built: the
    /// future is a [`Drive`], which holds the state machine in place, with the body's future once,
    /// and allocates no box of its own on a call's path (every caller's future holds this one).
    pub(crate) fn drive<T, E, Fut, D, X>(
        placed: Result<X, (Self, Fut)>,
        describe: D,
    ) -> impl Future<Output = Result<T, E>>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        Fut: Future<Output = Result<T, E>>,
        D: FnOnce(&E) -> String,
        H: OnReplay<T>,
        X: Future<Output = Result<T, E>>,
    {
        let (operation, body) = match placed {
            Ok(detached) => return Drive::Other { run: detached },
            Err(in_place) => in_place,
        };
        let (unchecked, on_replay) = operation.unchecked();
        Drive::Run {
            run: handler::InPlace::new(start(unchecked, false), body, describe),
            on_replay: Some(on_replay),
        }
    }

    /// [`drive`](Self::drive) for a detached body: the state machine runs in the caller's future until
    /// the claim is held, then the body and the storing of its end on a task of its own
    /// ([`handler::Detaching`]). A body that runs alone runs on a task of its own too.
    pub(crate) fn drive_detached<T, E, Fut, D>(
        self,
        describe: D,
        body: Fut,
    ) -> impl Future<Output = Result<T, E>> + Send
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        D: FnOnce(&E) -> String + Send + 'static,
        H: OnReplay<T> + Send,
    {
        let (unchecked, on_replay) = self.unchecked();
        let other: DetachedCall<'static, T, E> = match start(unchecked, true) {
            Started::Run { core } => {
                return Drive::Run {
                    run: handler::Detaching::new(core, body, describe),
                    on_replay: Some(on_replay),
                };
            }
            // Switched off, or a missing key under `MissingKey::Skip`: the body alone, on a task of
            // its own.
            Started::Alone { namespace, tasks } => handler::alone(namespace, tasks.as_ref(), body),
            Started::Failed { error } => Box::pin(std::future::ready(Err((*error
                .expect("a call that could not start has its error"))
            .into()))),
        };
        Drive::Other { run: other }
    }

    /// The operation's parts for [`start`], and its replay hook.
    fn unchecked(self) -> (Unchecked<'a>, H) {
        let Operation {
            idem,
            call,
            key,
            fingerprint,
            claim_writes,
            compensation,
            restart_steps: _,
            steps,
            staging,
            on_replay,
            options: _,
        } = self;
        let unchecked = Unchecked {
            idem,
            call,
            key,
            fingerprint,
            claim_writes,
            compensation,
            steps,
            staging,
        };
        (unchecked, on_replay)
    }
}

/// An operation's parts before its checks, without its types ([`start`]).
struct Unchecked<'a> {
    idem: Early<Cow<'a, Idempotency>>,
    call: Call,
    key: Early<DerivedKey>,
    fingerprint: Option<Early<String>>,
    claim_writes: Writes,
    compensation: Writes,
    steps: Option<Steps>,
    staging: Option<Staged>,
}

/// The checks of a call, for [`Operation::drive`] and [`Operation::drive_detached`]: the kill switch,
/// then the handle, key and payload (the first error among them; the body does not run), the
/// missing-key policy; then the call's core ([`handler::core`]), built in the call's span. Not generic:
/// made once for every function, so that what a function's own code does to start a call is to place
/// the core beside its body.
#[inline(never)]
fn start(
    operation: Unchecked<'_>,
    detached: bool,
) -> Started<impl Future<Output = handler::Ended<'_>> + Send + '_> {
    let Unchecked {
        idem,
        call,
        key,
        fingerprint,
        claim_writes,
        compensation,
        steps,
        staging,
    } = operation;
    // Writes that can only commit together with a record: never run without one.
    let stages_writes = staging.is_some() || !claim_writes.is_empty();
    // Switched off: the body alone, unless its writes can only commit with the record. The handle's
    // tasks, for a detached body that runs alone (drained like any detached body).
    if !stages_writes && crate::config::disabled() {
        let tasks = idem.as_ref().ok().filter(|_| detached);
        return Started::Alone {
            namespace: call.namespace,
            tasks: tasks.map(|idem| idem.tasks().clone()),
        };
    }
    let checked = (|| {
        let idem = idem?;
        check_lease(&call)?;
        let key = key?;
        let fingerprint = fingerprint.transpose()?;
        Ok::<_, Box<Error>>((idem, key.resolve(&call, stages_writes)?, fingerprint))
    })();
    match checked {
        Ok((idem, Some(key), fingerprint)) => {
            let span = telemetry::call_span(call.namespace, &key);
            let parts = handler::Parts {
                idem,
                call,
                key,
                fingerprint,
                staging,
                claim_writes,
                compensation,
                steps,
            };
            Started::Run {
                core: telemetry::InSpan::new(handler::core(parts, detached), span),
            }
        }
        // A missing key under `MissingKey::Skip`.
        Ok((idem, None, _)) => Started::Alone {
            namespace: call.namespace,
            tasks: detached.then(|| idem.tasks().clone()),
        },
        Err(e) => Started::Failed { error: Some(e) },
    }
}

/// What a body gets from its operation's options: the [`Steps`] after
/// [`steps`](Operation::steps), the [`Transaction`](crate::Transaction) after
/// [`transact`](Operation::transact). An option that is off is `()`, which has nothing to offer, so a
/// body cannot reach steps or staged writes its operation did not ask for (the compiler says
/// "no method named `steps` found for struct `Context<(), ()>`").
#[derive(Debug)]
pub struct Context<S = (), W = ()> {
    steps: S,
    transaction: W,
}

impl<S, W> Context<S, W> {
    /// The context's parts: the steps (or `()`) and the transaction (or `()`), to move into the body's
    /// future.
    pub fn into_parts(self) -> (S, W) {
        (self.steps, self.transaction)
    }
}

impl<W> Context<Steps, W> {
    /// The call's steps ([`Operation::steps`]).
    pub fn steps(&self) -> &Steps {
        &self.steps
    }
}

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
impl<S> Context<S, crate::Transaction> {
    /// Where the body stages the business writes that commit with the COMPLETED record
    /// ([`Operation::transact`]).
    pub fn transaction(&self) -> &crate::Transaction {
        &self.transaction
    }
}

/// The body runs in the caller's future (the default): dropping the future stops it where it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct InPlace;

/// The body runs on a task of its own once the claim has landed ([`Operation::detach`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Detached;

mod sealed {
    /// Only this crate's option types.
    pub trait Sealed {}
    impl Sealed for () {}
    impl Sealed for crate::Steps {}
    #[cfg(feature = "dynamodb")]
    impl Sealed for crate::Transaction {}
    impl Sealed for super::InPlace {}
    impl Sealed for super::Detached {}
}

/// What an option puts in a body's [`Context`]: `()` (the option is off), [`Steps`], or a
/// [`Transaction`](crate::Transaction). Sealed.
pub trait Given: sealed::Sealed + Sized {
    /// Whether the operation runs with steps.
    #[doc(hidden)]
    const STEPS: bool = false;
    /// Whether the operation stages writes.
    #[doc(hidden)]
    const WRITES: bool = false;
    /// The value, from what the operation made for its options.
    #[doc(hidden)]
    fn given(options: &mut Options) -> Self;
}

/// What an operation made for the options its body gets.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct Options {
    steps: Option<Steps>,
    #[cfg(feature = "dynamodb")]
    transaction: Option<crate::Transaction>,
}

impl Given for () {
    fn given(_: &mut Options) {}
}

impl Given for Steps {
    const STEPS: bool = true;
    fn given(options: &mut Options) -> Self {
        options
            .steps
            .take()
            .expect("made for an operation with steps")
    }
}

#[cfg(feature = "dynamodb")]
impl Given for crate::Transaction {
    const WRITES: bool = true;
    fn given(options: &mut Options) -> Self {
        options
            .transaction
            .take()
            .expect("made for an operation with writes")
    }
}

/// A body that runs on a task of its own, boxed with its call's state machine.
#[doc(hidden)]
pub type DetachedCall<'a, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'a>>;

/// Where an operation's body runs: [`InPlace`] or [`Detached`]; for `Detached`, what it needs of the
/// body (`Send + 'static`, its value and error too). Sealed.
#[diagnostic::on_unimplemented(
    message = "a detached body runs on a task of its own: its future, value and error must be `Send + 'static`",
    label = "the body of this detached operation is not `Send + 'static`",
    note = "move what the body uses into it (`async move`), and keep no `Rc`, `RefCell` borrow or other non-`Send` value across an `.await`; or do not `detach`"
)]
pub trait Placement<T, E, Fut, H>: sealed::Sealed + Sized {
    /// The future of a detached call: boxed for [`Detached`], one that cannot be made for
    /// [`InPlace`], so that a call in place compiles no wait for a detached one.
    #[doc(hidden)]
    type Call<'a>: Future<Output = Result<T, E>>;

    /// The call, boxed to run detached; or the operation and the body back, to run in place.
    #[doc(hidden)]
    #[allow(
        clippy::type_complexity,
        clippy::result_large_err,
        reason = "hidden: the two ways out, the second given back as it came"
    )]
    fn detached<S, W>(
        operation: Operation<'_, H, S, W, Self>,
        describe: fn(&E) -> String,
        body: Fut,
    ) -> Result<Self::Call<'_>, (Operation<'_, H, S, W, Self>, Fut)>;
}

impl<T, E, Fut, H> Placement<T, E, Fut, H> for InPlace {
    type Call<'a> = NotDetached<T, E>;

    fn detached<S, W>(
        operation: Operation<'_, H, S, W, Self>,
        _: fn(&E) -> String,
        body: Fut,
    ) -> Result<NotDetached<T, E>, (Operation<'_, H, S, W, Self>, Fut)> {
        Err((operation, body))
    }
}

impl<T, E, Fut, H> Placement<T, E, Fut, H> for Detached
where
    T: Serialize + DeserializeOwned + Send + 'static,
    E: From<Error> + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    H: OnReplay<T> + Send + 'static,
{
    type Call<'a> = DetachedCall<'a, T, E>;

    fn detached<S, W>(
        operation: Operation<'_, H, S, W, Self>,
        describe: fn(&E) -> String,
        body: Fut,
    ) -> Result<DetachedCall<'_, T, E>, (Operation<'_, H, S, W, Self>, Fut)> {
        Ok(Box::pin(operation.plain().drive_detached(describe, body)))
    }
}

/// The detached call of an operation whose body runs in place: there is none (the type has no values).
#[doc(hidden)]
pub struct NotDetached<T, E> {
    never: std::convert::Infallible,
    _output: PhantomData<fn() -> (T, E)>,
}

impl<T, E> Future for NotDetached<T, E> {
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<T, E>> {
        match self.never {}
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Operation::drive`] and [`Operation::drive_detached`]: built whole before it is
    /// first polled, so that a caller's future holds the state machine (and the body's future in it)
    /// in place and once.
    #[project = DriveProj]
    pub(crate) enum Drive<R, H, X> {
        /// The call's course ([`handler::InPlace`], or [`handler::Detaching`]), which records its end
        /// in its span; its outcome says whether the value is a replay, for `on_replay`.
        Run {
            #[pin]
            run: R,
            on_replay: Option<H>,
        },
        /// A call that ends without a course of this `Drive`'s: in place, a detached call, boxed with
        /// its own `Drive` ([`Placement::Call`]: none for a body run in place, so that this variant
        /// and its poll are compiled only for detached calls); in that `Drive`, the body run alone on
        /// a task of its own, or the error of a call that could not start.
        Other {
            #[pin]
            run: X,
        },
    }
}

impl<R, H, T, E, X> Future for Drive<R, H, X>
where
    X: Future<Output = Result<T, E>>,
    R: Future<Output = (Result<T, E>, Outcome)>,
    H: OnReplay<T>,
{
    type Output = Result<T, E>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<T, E>> {
        use std::task::{Poll, ready};
        match self.project() {
            DriveProj::Run { run, on_replay } => {
                let (result, outcome) = ready!(run.poll(cx));
                Poll::Ready(hooked(result, outcome, on_replay))
            }
            DriveProj::Other { run } => run.poll(cx),
        }
    }
}

/// A call's result, a replayed value passed through `on_replay` (taken once). A value is a replay when
/// the call's outcome says so: the state machine returns `Ok` with `Replayed` or `Cached` only for a
/// stored value it decoded.
fn hooked<T, E, H: OnReplay<T>>(
    result: Result<T, E>,
    outcome: Outcome,
    on_replay: &mut Option<H>,
) -> Result<T, E> {
    match result {
        Ok(value) if H::CHANGES && matches!(outcome, Outcome::Replayed | Outcome::Cached) => {
            match on_replay.take() {
                Some(on_replay) => Ok(on_replay.on_replay(value)),
                None => Ok(value),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod detached_without_record {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::{Error, Idempotency, MissingKey};

    /// `detach` promises that a caller who gives up stops the waiting, not the work. A call that runs
    /// its body alone (a missing key under `MissingKey::Skip`, or the kill switch) must keep that
    /// promise too: a charge cut off half-way by a client that hung up is what `detach` is for.
    #[tokio::test]
    async fn a_detached_call_without_a_record_still_runs_to_its_end() {
        let idem = Idempotency::in_memory();
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        let call = idem
            .operation("tests::skip", &None::<String>)
            .missing_key(MissingKey::Skip)
            .detach()
            .run(move |_| async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                finished.store(true, Ordering::SeqCst);
                Ok::<_, Error>(1_u32)
            });
        assert!(
            tokio::time::timeout(Duration::from_millis(10), call)
                .await
                .is_err()
        );
        idem.drain(Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            done.load(Ordering::SeqCst),
            "the detached body was cut off with its caller"
        );
    }
}
