//! Where records live: the [`Store`] trait, its two implementations ([`memory`], [`dynamodb`]) and the
//! [`routed`] store that pins each key to a home region.
//!
//! A store is thin: it performs one conditional write or read per call and reports what it found. All
//! decisions (replay, in progress, lease lost, payload mismatch) are taken by the caller, so every store
//! behaves the same way. The contract is published as a suite any store runs with one call:
//! `conformance::check` (feature `conformance`), which both built-in stores pass.

use crate::error::BoxError;
use crate::record::Record;
// Defined beside the rule that decides it ([`Record::allows_steps_claim`]); a claim's part, named here.
pub use crate::record::StepsClaim;

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
#[cfg(any(test, feature = "conformance"))]
#[doc(hidden)]
pub mod delegating;
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb;
pub mod memory;
pub mod routed;
pub mod writes;

pub use writes::Writes;

/// A new claim on a key.
///
/// The state machine builds one per claim attempt and a store reads its public fields. Outside this
/// crate (a test of a store, a tool), build one with [`ClaimRequest::new`] and set the other fields on
/// the result. `#[non_exhaustive]`: a struct expression cannot build it outside this crate, so a field
/// the claim gains later (as `steps` was added) breaks no caller.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ClaimRequest<'a> {
    /// The derived key.
    pub key: &'a str,
    /// This call's fresh fencing token (the same for every claim attempt of one call).
    pub token: &'a str,
    /// Which claim attempt of the call this is (1, 2, ...): each attempt carries its own times, so a
    /// store that sends idempotency tokens (DynamoDB's `ClientRequestToken`) derives a distinct one per
    /// attempt, while the SDK's retries of one attempt keep it.
    pub attempt: u32,
    /// The time the claim condition is evaluated at (epoch milliseconds): the caller's clock *less its
    /// clock-skew margin*, so that a caller whose clock runs ahead by less than the margin never sees a
    /// live lease as lapsed, nor a live record as expired.
    pub now_ms: u64,
    /// Until when the claim blocks other callers (epoch milliseconds).
    pub lease_until_ms: u64,
    /// When the PENDING record counts as absent (epoch seconds).
    pub expires_at_s: u64,
    /// The payload's fingerprint, if any.
    pub fingerprint: Option<&'a str>,
    /// A plain [`Store::claim`] that takes over a record whose claim-time writes are in effect and keeps
    /// them (the caller's [`Store::claim_transaction`] was refused for that reason): it is made only if
    /// the record is still claimable, not expired, and its writes still in effect
    /// ([`Record::is_claimable_keeping_writes`]) — never on a record whose writes were released
    /// meanwhile (it would run without them), nor on an expired or absent one (a new operation, whose
    /// claim applies them). Ignored by [`Store::claim_transaction`].
    pub keep_claim_writes: bool,
    /// What the claim does with the steps a record stores ([`Record::steps`]): nothing, for an operation
    /// without steps; otherwise it starts afresh or resumes ([`StepsClaim`]).
    pub steps: StepsClaim<'a>,
}

impl<'a> ClaimRequest<'a> {
    /// The first claim attempt (`attempt` 1) on `key` under `token`, evaluated at `now_ms`, holding the
    /// key until `lease_until_ms` and counting as absent after `expires_at_s`; no fingerprint, not
    /// keeping claim-time writes, and no steps ([`StepsClaim::Untouched`]).
    #[must_use]
    pub const fn new(
        key: &'a str,
        token: &'a str,
        now_ms: u64,
        lease_until_ms: u64,
        expires_at_s: u64,
    ) -> Self {
        ClaimRequest {
            key,
            token,
            attempt: 1,
            now_ms,
            lease_until_ms,
            expires_at_s,
            fingerprint: None,
            keep_claim_writes: false,
            steps: StepsClaim::Untouched,
        }
    }
}

/// What a claim found.
///
/// A store returns one; the state machine (and a store that wraps another) reads it.
/// `#[non_exhaustive]`: a store never has to produce an outcome it does not know, and a caller that
/// matches it keeps a `_` arm (pass an unknown outcome on as it came), so an outcome added later
/// breaks no one.
#[allow(
    clippy::large_enum_variant,
    reason = "returned by value on every duplicate's path: boxing the record would allocate there"
)]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The key was absent or claimable; it is now PENDING under the request's token.
    Claimed,
    /// The key was held; here is the record that blocked the claim, read in the same round trip.
    Existing(Record),
}

/// A fenced transition of a PENDING record: only the claim holding `token` may make it.
///
/// Outside this crate, build one with [`Transition::new`]. `#[non_exhaustive]`: a struct expression
/// cannot build it outside this crate, so a field added later breaks no caller.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Transition<'a> {
    /// The derived key.
    pub key: &'a str,
    /// The token of the claim that must still hold the key.
    pub token: &'a str,
    /// What to write.
    pub change: Change<'a>,
}

impl<'a> Transition<'a> {
    /// The transition of `key`'s record held under `token` that writes `change`.
    #[must_use]
    pub const fn new(key: &'a str, token: &'a str, change: Change<'a>) -> Self {
        Transition { key, token, change }
    }
}

/// The write of a [`Transition`].
///
/// Exhaustive on purpose, variants and fields alike: a store must apply every change exactly as
/// written here, so a store whose `match` names every variant and every field is one that keeps the
/// contract. A new kind of change, or a new field of one (a value the store must now write), is a new
/// obligation of every store; it comes with a new major version, and a store that does not apply it
/// fails to compile rather than dropping it behind a `_` arm.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// PENDING → COMPLETED with the encoded response (`None` when too large to store); any stored steps
    /// are removed.
    Complete {
        /// The encoded response (`None`: too large to store; duplicates get
        /// [`Error::ResponseTooLarge`](crate::Error::ResponseTooLarge)).
        response: Option<&'a [u8]>,
        /// New expiry (epoch seconds).
        expires_at_s: u64,
        /// With retention: the end of the replay window (epoch seconds), before `expires_at_s`.
        replay_until_s: Option<u64>,
    },
    /// PENDING → FAILED with the error's text.
    Fail {
        /// The body's error, for operators.
        error: &'a str,
        /// New expiry (epoch seconds).
        expires_at_s: u64,
        /// Whether the record's claim-time writes stop being in effect (compensating writes commit with
        /// this transition), so that the next claim applies them again. Such a failure is made only
        /// while they are in effect ([`Record::claim_writes_in_effect`]), so that they are never undone
        /// twice; otherwise it is rejected like a lost claim, with the record as it is.
        release_claim_writes: bool,
    },
    /// PENDING stays PENDING with the values of the steps finished so far (all of them, encoded): a step
    /// of an operation run with steps has finished ([`Steps::run`](crate::Steps::run)).
    ///
    /// Ordered: made only while the record holds exactly `previous`, the steps this write extends (as
    /// the claim left them, or as the call's last step write stored them). A copy of an earlier write
    /// that lands late (the first copy of a request the SDK sent again) finds later steps there and is
    /// rejected, so a record's steps never move back. A write rejected with the record holding exactly
    /// its `steps` under its token is its own earlier copy, which landed: the caller counts it as
    /// applied. Each write's steps differ from every earlier write's of the call (they count the
    /// writes), so no earlier write's `previous` is ever there again.
    SaveSteps {
        /// Every finished step's value, encoded.
        steps: &'a [u8],
        /// The steps the record holds before this write, as stored.
        previous: &'a [u8],
    },
    /// Where there is **no record, or one expired at `now_ms`**, a FAILED record under the token (a
    /// mark) whose only [`released`](Record::released) token is that one, and nothing else (an expired
    /// record's response, steps, claim-time writes and release marks are gone with it, as a new
    /// operation finds them): the call holding the token gave up a claim whose request is still in
    /// flight (dropped, or its answer never came), and that claim, if it lands later, finds the mark
    /// and does not overwrite it (every claim is refused under a released token; another call's claim
    /// of the mark keeps it). Any live record rejects it, returned as it is. (A claim that has landed is given up with a [`Fail`](Self::Fail) first, and its token then
    /// left on the record with a [`MarkReleased`](Self::MarkReleased).)
    Release {
        /// The caller's time, less its clock-skew margin, as a claim's
        /// ([`ClaimRequest::now_ms`]): whether the record there has expired.
        now_ms: u64,
        /// Why, for operators.
        error: &'a str,
        /// The record's new expiry (epoch seconds).
        expires_at_s: u64,
        /// Until when the call's claim can hold the key (the mark's
        /// [`released_until_ms`](Record::released_until_ms)).
        released_until_ms: u64,
    },
    /// On a **live** record (not expired at `now_ms`) that is **not PENDING under the token** nor
    /// COMPLETED, the token is added to the record's [`released`](Record::released) ones: the call holding
    /// the token gave up a claim whose request is still in flight and found another record there (a
    /// FAILED one, a lapsed or live claim of another call, an expired one), and that claim, if it lands
    /// later, is refused by it (every claim is refused under a released token). The record's
    /// [`released_until_ms`](Record::released_until_ms) and expiry become the ones given (the caller
    /// never makes either earlier), so that the mark outlives the claim it keeps out; the rest is left
    /// as it is.
    ///
    /// The caller computed both from the record it read: the mark is made only on a record that still
    /// holds `seen_until_ms` and `seen_expires_at_s`. How the token is marked is the `marking`'s
    /// ([`Marking`]): it joins the released tokens on a record holding fewer than
    /// [`MAX_RELEASED`](crate::MAX_RELEASED), replaces them on a record whose `released_until_ms` is
    /// before `now_ms` (every one of them stale), or, on a record holding
    /// [`MAX_RELEASED`](crate::MAX_RELEASED), becomes its
    /// [`released_through`](Record::released_through) if greater than it (or it has none); on a
    /// record that already refuses the token, only the end and the expiry change.
    /// Any other record, one PENDING under the token (the claim landed: it is given up with a
    /// [`Fail`](Self::Fail)), a COMPLETED one (final: no claim lands on it before it expires; but
    /// see [`Marking::KeepCompleted`]), an expired one and no record at all (a
    /// [`Release`](Self::Release) marks those) reject it, returned as they are.
    ///
    /// [`Marking::KeepCompleted`] is the exception: it is made only on a live COMPLETED record still
    /// holding the expiry the caller read, and raises that expiry alone, so that the record (which
    /// refuses every claim) outlives the claim the call gave up.
    MarkReleased {
        /// The caller's time, less its clock-skew margin, as a claim's
        /// ([`ClaimRequest::now_ms`]): whether the record has expired, and whether the released tokens
        /// are stale.
        now_ms: u64,
        /// The record's new [`released_until_ms`](Record::released_until_ms).
        released_until_ms: u64,
        /// The record's new expiry (epoch seconds).
        expires_at_s: u64,
        /// The record's `released_until_ms` as the caller read it.
        seen_until_ms: Option<u64>,
        /// The record's expiry as the caller read it.
        seen_expires_at_s: u64,
        /// How the token is marked.
        marking: Marking,
    },
    /// PENDING stays PENDING with a later lease (a heartbeat).
    ExtendLease {
        /// New lease end (epoch milliseconds).
        lease_until_ms: u64,
        /// New expiry (epoch seconds).
        expires_at_s: u64,
    },
}

/// How a [`Change::MarkReleased`] marks its token on a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marking {
    /// The token joins the record's [`released`](Record::released) tokens: the record holds fewer
    /// than [`MAX_RELEASED`](crate::MAX_RELEASED).
    Join,
    /// The token replaces the released tokens, and removes the record's
    /// [`released_through`](Record::released_through): every one of them is stale (the record's
    /// `released_until_ms` is before the change's `now_ms`).
    Replace,
    /// The record's [`released_through`](Record::released_through) becomes the token: the record
    /// holds [`MAX_RELEASED`](crate::MAX_RELEASED) tokens, and its `released_through`, if any, is less
    /// than the token.
    Through,
    /// Only the record's `released_until_ms` and expiry change: the record already refuses the token
    /// (among its [`released`](Record::released) tokens, or no greater than its
    /// [`released_through`](Record::released_through)) but not until the token's claim's end.
    Extend,
    /// Only the record's expiry changes: the record is a live COMPLETED one, which refuses every
    /// claim while it lives (no token is kept on it, and its `released_until_ms` is left as it is),
    /// and would expire before the token's claim's end. Its response is replayed that much longer.
    KeepCompleted,
}

impl Change<'_> {
    /// This change with its expiry raised to outlive `record`'s released tokens
    /// ([`Record::outlives_released`]), when it is a transition out of (or within) PENDING whose expiry
    /// is earlier than that: `None` for any other change, or one that already outlives them.
    #[cfg(feature = "dynamodb")]
    pub(crate) fn outliving_released(&self, record: &Record) -> Option<Self> {
        let mut raised = *self;
        let (Change::Complete { expires_at_s, .. }
        | Change::Fail { expires_at_s, .. }
        | Change::ExtendLease { expires_at_s, .. }) = &mut raised
        else {
            return None;
        };
        let outliving = record.outlives_released(*expires_at_s);
        if outliving == *expires_at_s {
            return None;
        }
        *expires_at_s = outliving;
        Some(raised)
    }

    /// The request's name, for telemetry and request tokens: `complete`, `fail`, `step`, `release` or `heartbeat`, with
    /// `_transaction` when it goes in one transaction with business writes.
    pub(crate) fn op(&self, transactional: bool) -> &'static str {
        match (self, transactional) {
            (Change::Complete { .. }, false) => "complete",
            (Change::Complete { .. }, true) => "complete_transaction",
            (Change::Fail { .. }, false) => "fail",
            (Change::Fail { .. }, true) => "fail_transaction",
            (Change::SaveSteps { .. }, _) => "step",
            (Change::ExtendLease { .. }, _) => "heartbeat",
            (Change::Release { .. } | Change::MarkReleased { .. }, _) => "release",
        }
    }
}

/// What a fenced write found.
///
/// `#[non_exhaustive]`, for the reasons of [`ClaimOutcome`].
#[allow(
    clippy::large_enum_variant,
    reason = "returned by value on every duplicate's path: boxing the record would allocate there"
)]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOutcome {
    /// The record was PENDING under our token; the write was applied.
    Applied,
    /// The condition failed; here is the record as it was (`None` if there was none).
    Rejected(Option<Record>),
}

/// What a transaction of a record's claim or transition with business [`Writes`] found.
///
/// `#[non_exhaustive]`, for the reasons of [`ClaimOutcome`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
#[allow(
    clippy::large_enum_variant,
    reason = "returned by value on every rejected transaction: boxing the record would allocate there"
)]
pub enum TransactOutcome {
    /// The record and every staged write committed together.
    Committed,
    /// The record was not PENDING under our token (nothing was written); here it is as it was.
    Rejected(Option<Record>),
    /// A staged write's condition (or another action) failed; nothing was written.
    Canceled(Vec<crate::CancellationReason>),
}

/// Why a store call failed (as opposed to a condition that did not hold, which is an outcome).
///
/// `#[non_exhaustive]`: a kind of failure added later breaks no store (which never has to return it)
/// and no caller (which keeps a `_` arm). A store builds the variants itself, so their fields are
/// frozen: a variant never gains a field; what a new failure needs to say comes as a new variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend kept throttling after its retries.
    #[error("throttled: {0}")]
    Throttled(#[source] BoxError),
    /// The table does not exist.
    #[error("table `{0}` does not exist")]
    TableNotFound(String),
    /// The request was refused as invalid (a malformed expression, a table in a transaction that does
    /// not exist, an expression the memory store does not model); nothing was written.
    #[error("invalid request, nothing was written: {}", crate::error::chain(.0.as_ref()))]
    Invalid(#[source] BoxError),
    /// The table exists but does not fit the store (another key schema, TTL on another attribute, not
    /// `ACTIVE`); nothing was changed.
    #[error("table does not fit the store: {0}")]
    Schema(String),
    /// An item that is not a record of this library.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The backend did not answer or failed in a way that may pass (HTTP 5xx, a timeout, a broken
    /// connection, a conflict with a transaction), after its own retries. The request may or may not
    /// have been applied.
    #[error("unavailable: {}", crate::error::chain(.0.as_ref()))]
    Unavailable(#[source] BoxError),
    /// The store does not offer what was asked of it (transactions with business writes, say); nothing
    /// was written.
    ///
    /// The trait's defaults for [`Store::claim_transaction`] and [`Store::transact_transition`] return
    /// it, so a store without transactions needs no code for them. The state machine never retries it and
    /// reports it as [`Error::Unsupported`](crate::Error::Unsupported): a claim with business writes
    /// fails before the body runs, a completion with staged writes after it. A store supports both
    /// transactional calls or neither; the conformance suite checks that, and skips (and reports) its
    /// transaction cases for a store that refuses both.
    #[error("the {store} store does not support {capability}")]
    Unsupported {
        /// The store's [`kind`](Store::kind).
        store: &'static str,
        /// What it does not support.
        capability: &'static str,
    },
    /// Anything else (a misconfigured client).
    #[error("{}", crate::error::chain(.0.as_ref()))]
    Other(#[source] BoxError),
    /// The backend refused the credentials or their permissions on the table (DynamoDB's
    /// `AccessDeniedException`, `UnrecognizedClientException`, an invalid signature, an expired token).
    #[error("access to table `{table}` was refused: {}", crate::error::chain(source.as_ref()))]
    AccessDenied {
        /// The table's name.
        table: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The region serving a key (its home region, or the region holding a failed-over claim) is
    /// unavailable: a [`RoutedStore`](routed::RoutedStore) got [`Unavailable`](StoreError::Unavailable)
    /// from the region's store (see the [`routed`] module for exactly which errors count). The request
    /// may or may not have been applied there.
    #[error("region `{region}` is unavailable: {}", crate::error::chain(source.as_ref()))]
    RegionUnavailable {
        /// The region's name.
        region: String,
        /// The region's store's error.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// DynamoDB's error code behind this error (`ThrottlingException`, `ValidationException`, ...), when
    /// there is one: what separates throttling from other failures in logs.
    #[must_use]
    pub fn code(&self) -> Option<&str> {
        match self {
            StoreError::TableNotFound(_) => Some("ResourceNotFoundException"),
            // A backend reports its service's code by boxing a `CodedError`; other errors have none.
            StoreError::Throttled(e)
            | StoreError::Unavailable(e)
            | StoreError::Invalid(e)
            | StoreError::Other(e)
            | StoreError::AccessDenied { source: e, .. } => {
                e.downcast_ref::<CodedError>().map(CodedError::code)
            }
            StoreError::RegionUnavailable { source, .. } => source
                .downcast_ref::<StoreError>()
                .and_then(StoreError::code),
            _ => None,
        }
    }
}

/// A backend's error together with its service's error code (`ThrottlingException`, ...): what
/// [`StoreError::code`] reports. A backend boxes it in a [`StoreError`] for the errors that have a code,
/// so the contract reads the code without knowing the backend.
///
/// It reads as the error it wraps: the same `Display`, `Debug` and sources, so messages and error chains
/// are the wrapped error's. [`get_ref`](Self::get_ref) and [`into_inner`](Self::into_inner) reach that
/// error (to downcast it to the backend's own type).
pub struct CodedError {
    code: String,
    error: BoxError,
}

impl CodedError {
    /// Wraps `error`, whose service reported `code`.
    pub fn new(code: impl Into<String>, error: BoxError) -> Self {
        CodedError {
            code: code.into(),
            error,
        }
    }

    /// The service's error code.
    #[must_use]
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The wrapped error.
    #[must_use]
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.error.as_ref()
    }

    /// The wrapped error, unwrapped.
    #[must_use]
    pub fn into_inner(self) -> BoxError {
        self.error
    }
}

impl std::fmt::Debug for CodedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.error, f)
    }
}

impl std::fmt::Display for CodedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for CodedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// A backend for idempotency records.
///
/// Implementations must make `claim` and `transition` linearizable per key: of concurrent claims on one
/// key, exactly one may see [`ClaimOutcome::Claimed`]. Conditions are evaluated against the times in the
/// request, never against the store's own clock, so the caller's injectable clock decides expiry.
#[async_trait::async_trait]
pub trait Store: std::fmt::Debug + Send + Sync + 'static {
    /// Claims the key if it is absent or claimable ([`Record::is_claimable`] at the request's `now_ms`);
    /// otherwise returns the record that blocked it. A claim keeps the record's
    /// [`claim_writes_in_effect`](Record::claim_writes_in_effect) as it was.
    ///
    /// With [`steps`](ClaimRequest::steps) other than [`StepsClaim::Untouched`], the record must also
    /// [`allow`](Record::allows_steps_claim) the claim; a [`StepsClaim::Resume`] that finds no record
    /// is [`StoreError::Corrupt`] (as below: nothing was written, and the caller claims afresh).
    ///
    /// With [`keep_claim_writes`](ClaimRequest::keep_claim_writes), only a record that
    /// [`is_claimable_keeping_writes`](Record::is_claimable_keeping_writes) is claimed; any other record
    /// is returned as blocking, and an absent one is [`StoreError::Corrupt`] (DynamoDB reports a failed
    /// condition without an item; nothing was written, and the caller claims again with its writes).
    ///
    /// A record that [`released the request's token`](Record::released_token) is never claimed: it is
    /// the mark its call left when it gave the claim up ([`Change::Release`], [`Change::MarkReleased`]),
    /// and this request is that call's, landing late.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// Applies `transition` if the record is PENDING under its token; otherwise returns the record as it was.
    /// A [`Change::SaveSteps`] also needs the record's steps to be exactly its `previous`. A
    /// [`Change::Release`] instead is applied only where there is no record at all, writing a FAILED
    /// one under its token.
    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError>;

    /// Applies `transition` together with the staged `writes`, atomically: all or nothing. Used for a
    /// completion with the body's business writes (`transact`), and for a failure with compensating
    /// writes ([`Operation::compensate_with`](crate::Operation::compensate_with)).
    /// [`TransactOutcome::Rejected`] means the record was not PENDING under the transition's token;
    /// [`TransactOutcome::Canceled`] carries one reason per action (index 0 is the record), whether a
    /// write's condition failed or the transaction collided with another write
    /// ([`CancellationReason::is_transient`](crate::CancellationReason::is_transient)).
    ///
    /// Retrying the same `transition` with the same `writes` must be safe: a store that may apply a
    /// request twice (a retry after a lost response) must recognise the second one (DynamoDB: the same
    /// `ClientRequestToken`, derived from the key, the token and the change).
    ///
    /// The default returns [`StoreError::Unsupported`]: a store without transactions.
    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let _ = (transition, writes);
        Err(StoreError::Unsupported {
            store: self.kind(),
            capability: "transactions with business writes (`transact`, `compensate_with`)",
        })
    }

    /// Claims the key together with the staged `writes`, atomically: the claim and every write land
    /// together or not at all, and the record remembers that its claim-time writes are in effect
    /// ([`Record::claim_writes_in_effect`]).
    ///
    /// Stricter than [`claim`](Store::claim): a record that is claimable but still has its claim-time
    /// writes in effect (FAILED without compensation, or a lapsed PENDING claim) is refused, so that the
    /// writes are never applied twice; the caller then claims it with a plain [`claim`](Store::claim),
    /// which keeps them in effect. An absent or expired record is a new operation and is claimed.
    /// [`TransactOutcome::Rejected`] carries the record that blocked the claim;
    /// [`TransactOutcome::Canceled`] says which write failed.
    ///
    /// The default returns [`StoreError::Unsupported`]: a store without transactions.
    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let _ = (request, writes);
        Err(StoreError::Unsupported {
            store: self.kind(),
            capability: "claims with business writes (`claim_with`)",
        })
    }

    /// Reads the record with a strongly consistent read.
    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError>;

    /// The most bytes a stored response may have for `key`, so that its record fits in one item. The
    /// default is DynamoDB's 400 KB limit with the default attribute names, so that every store accepts
    /// and refuses the same responses.
    fn response_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        // Built once: this is asked for on every completion.
        static DEFAULT_NAMES: std::sync::LazyLock<crate::record::AttributeNames> =
            std::sync::LazyLock::new(crate::record::AttributeNames::default);
        crate::size::response_budget(&DEFAULT_NAMES, key, fingerprint)
    }

    /// The most bytes the encoded steps of an operation run with steps may have for `key`, so that its
    /// PENDING or FAILED record (a lease, a failure's error text, released tokens beside them) fits in
    /// one item. The default is DynamoDB's 400 KB limit with the default attribute names, like
    /// [`response_budget`](Self::response_budget)'s.
    fn steps_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        static DEFAULT_NAMES: std::sync::LazyLock<crate::record::AttributeNames> =
            std::sync::LazyLock::new(crate::record::AttributeNames::default);
        crate::size::steps_budget(&DEFAULT_NAMES, key, fingerprint)
    }

    /// A short name for logs and `Debug` (`"memory"`, `"dynamodb"`).
    fn kind(&self) -> &'static str;
}

#[cfg(all(test, feature = "dynamodb"))]
mod tests {
    use super::*;
    use crate::record::Status;

    /// A record PENDING under `t` whose released tokens end at `until_ms`.
    fn marked(until_ms: Option<u64>) -> Record {
        let mut record = Record::new("ns#k", Status::Pending, "t", 100);
        record.lease_until_ms = Some(61_000);
        record.released_until_ms = until_ms;
        record
    }

    /// The expiry of a transition out of (or within) PENDING is raised to the released tokens' end,
    /// rounded up to the second; any other change, or one that already outlives them, is left alone.
    #[test]
    fn only_a_transition_expiring_before_the_released_tokens_end_is_raised() {
        let record = marked(Some(200_001));
        for change in [
            Change::Complete {
                response: None,
                expires_at_s: 150,
                replay_until_s: None,
            },
            Change::Fail {
                error: "declined",
                expires_at_s: 150,
                release_claim_writes: false,
            },
            Change::ExtendLease {
                lease_until_ms: 70_000,
                expires_at_s: 150,
            },
        ] {
            let raised = change.outliving_released(&record).expect("raised");
            let (Change::Complete { expires_at_s, .. }
            | Change::Fail { expires_at_s, .. }
            | Change::ExtendLease { expires_at_s, .. }) = raised
            else {
                panic!("{raised:?}")
            };
            assert_eq!(expires_at_s, 201, "{change:?}");
        }
        let later = Change::Complete {
            response: None,
            expires_at_s: 201,
            replay_until_s: None,
        };
        assert!(later.outliving_released(&record).is_none());
        assert!(later.outliving_released(&marked(None)).is_none());
        let step = Change::SaveSteps {
            steps: b"[]",
            previous: b"",
        };
        assert!(step.outliving_released(&record).is_none());
    }
}
