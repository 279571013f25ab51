//! The one error type of the crate.

use std::time::Duration;

/// Why an idempotent call did not produce the body's own result.
///
/// Every message is lowercase, names the key's namespace (by default `module::path::fn_name`, for a method
/// `module::path::Type::method`, or the attribute's `name = ".."`) and says what to do about it. The body's
/// own error type `E` receives it through `E: From<Error>`; the body's own errors are never wrapped in this
/// type.
///
/// `#[non_exhaustive]`: a `match` keeps a `_` arm, so a kind of error added later breaks no caller.
/// The variants' fields are frozen: callers build variants too (a test standing in for a failure, a
/// hand-written front door returning [`Error::NotInstalled`] when
/// [`Idempotency::installed`](crate::Idempotency::installed) is `None`), so a variant never gains a
/// field; what a new failure needs to say comes as a new variant. Patterns that read a few fields end
/// in `..`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another call holds the key and has not finished yet (and `wait` ran out, or was zero).
    #[error(
        "`{namespace}`: another call with this key is still in progress; retry in {retry_hint:?}"
    )]
    InProgress {
        /// The key's namespace.
        namespace: String,
        /// How long until the other call's lease runs out: the earliest the key could be taken over if
        /// that call died. While it lives, heartbeats keep extending its lease, so this is *not* when
        /// its result will be ready (that is usually much sooner).
        retry_after: Duration,
        /// How long a caller should wait before asking again; what an HTTP service puts in
        /// `Retry-After`. It follows the record:
        ///
        /// - while the other call's heartbeats keep extending its lease: the handle's
        ///   [`retry_hint`](crate::Builder::retry_hint) (1 s by default), never more than `retry_after`
        ///   — its result may come at any moment;
        /// - once its claim is *stalled* — heartbeats are on and its lease has not been extended for
        ///   longer than a heartbeat interval (a third of the lease) plus the
        ///   [clock-skew margin](crate::Builder::clock_skew_margin): its worker died, hangs or cannot
        ///   reach the store — the time until the key can be taken over: `retry_after` in whole
        ///   seconds, rounded up past the instant the lease counts as lapsed (so `21s` for exactly
        ///   20 s), never zero. Asking sooner would only find it held again.
        ///
        /// With heartbeats off a lease never moves, so a live call cannot be told from a dead one: the
        /// short hint. The call judges staleness with its own `lease`, so a holder that claimed with a
        /// longer lease looks live. A live holder whose heartbeat failed (the store was briefly
        /// unreachable) looks stalled until its next one lands: its duplicates are told to come back
        /// when its lease would end, by which time it has usually finished.
        retry_hint: Duration,
    },

    /// The key was used before with a different `payload`.
    #[error(
        "`{namespace}`: this idempotency key was already used with a different payload; use a new key for a different request"
    )]
    PayloadMismatch {
        /// The key's namespace.
        namespace: String,
    },

    /// This call's claim was taken over by another caller (its lease ran out) before the result was stored;
    /// the result was not stored and the other caller's record was left untouched.
    ///
    /// With heartbeats on (the default) a live call's lease is extended every third of it, so this
    /// means the heartbeats failed for a whole lease (the store was unreachable, or the process stalled);
    /// with heartbeats off, that the body ran longer than `lease`.
    #[error(
        "`{namespace}`: the claim on this key was lost (its lease ran out without a heartbeat getting through, and another call took over); the result was not stored and the other call's result stands — if heartbeats are off, raise `lease` above the body's running time"
    )]
    LeaseLost {
        /// The key's namespace.
        namespace: String,
    },

    /// A business write's condition failed (or DynamoDB canceled the transaction for a reason that does
    /// not pass with a retry); nothing of the transaction was written. At completion (`transact`), the
    /// record moved to FAILED, so the call may be retried; at claim time (`claim_with`), nothing was
    /// claimed and the body did not run.
    #[error(
        "`{namespace}`: the transaction was canceled: {}",
        display_reasons(reasons)
    )]
    TransactionCanceled {
        /// The key's namespace.
        namespace: String,
        /// One entry per action of the transaction, in order (index 0 is the idempotency record).
        reasons: Vec<CancellationReason>,
    },

    /// Too many writes were staged on one transaction, or they are too large, or two touch the same item.
    #[error("`{namespace}`: {detail}")]
    TooManyWrites {
        /// The key's namespace.
        namespace: String,
        /// What limit was exceeded.
        detail: String,
    },

    /// DynamoDB kept throttling after the configured retries.
    #[error(
        "`{namespace}`: the idempotency table is throttling requests and retries ran out; retry later or raise the table's capacity"
    )]
    Throttled {
        /// The key's namespace.
        namespace: String,
        /// The last SDK error.
        #[source]
        source: BoxError,
    },

    /// The idempotency table does not exist. Not retryable: every call fails the same way until the
    /// table is created.
    #[error(
        "`{namespace}`: the idempotency table `{table}` does not exist; create it at start-up with `DynamoDbStore::ensure_table` (it creates the table with the store's key schema and TTL, waits until it is ACTIVE, and does nothing if it is ready) or the `idempotent table create` command, or point the store at the right table"
    )]
    TableNotFound {
        /// The key's namespace.
        namespace: String,
        /// The table's name.
        table: String,
    },

    /// DynamoDB refused the request's credentials or their permissions (`AccessDeniedException`,
    /// `UnrecognizedClientException`, an invalid signature or an expired token). Not retryable: every
    /// call fails the same way until the credentials or the policy change.
    #[error(
        "`{namespace}`: access to the idempotency table `{table}` was refused ({}); give the service's credentials `dynamodb:UpdateItem` and `dynamodb:GetItem` on the table (the IAM table of the `idempotent_runtime::guide::operations` docs lists every action, business tables' included), or check which credentials, account and region it uses",
        chain(source.as_ref())
    )]
    AccessDenied {
        /// The key's namespace.
        namespace: String,
        /// The table's name.
        table: String,
        /// The SDK's error.
        #[source]
        source: BoxError,
    },

    /// The idempotency table exists but does not fit the store: another key schema (another partition
    /// key name or type, a sort key the store's layout does not have), TTL on another attribute, or not
    /// `ACTIVE`. Not retryable: every call fails the same way until the table or the store's settings
    /// change. The detail names the table and what differs.
    #[error("`{namespace}`: the idempotency table does not fit the store: {detail}")]
    TableMismatch {
        /// The key's namespace.
        namespace: String,
        /// What differs, and what to do.
        detail: String,
    },

    /// The store did not answer, or failed with an error that may pass (HTTP 5xx, a timeout, a broken
    /// connection, a transaction conflict), after the configured retries.
    #[error("`{namespace}`: the idempotency store is unavailable: {}", chain(source.as_ref()))]
    Unavailable {
        /// The key's namespace.
        namespace: String,
        /// The last error (for DynamoDB, the SDK's error).
        #[source]
        source: BoxError,
    },

    /// The region that serves the key did not answer (a [`RoutedStore`](crate::RoutedStore) over
    /// several regions; see the [`routed`](crate::store::routed) module for which store errors count).
    /// A key is served by its home region only, so that its body runs once: nothing was sent to
    /// another region, and a call that failed claiming did not run its body. Retry later; or, to trade
    /// exactly-once for availability during outages, see
    /// [`RoutedStore::failover`](crate::RoutedStore::failover) (with it, this error means that every
    /// region was unavailable, and names the home region; or, for a request after the claim, that
    /// the region holding the call's claim was: only claims fail over).
    #[error(
        "`{namespace}`: region `{region}`, which serves this key, is unavailable ({}); retry later (each key is served by one region, so that it runs once)",
        chain(source.as_ref())
    )]
    RegionUnavailable {
        /// The key's namespace.
        namespace: String,
        /// The region's name: the key's home region, or the region holding a failed-over claim.
        region: String,
        /// The region's store's error.
        #[source]
        source: BoxError,
    },

    /// The body ran and returned `Ok`, but storing its result kept failing with transient errors for as
    /// long as the claim's lease allowed. The result was not stored: the record stays PENDING until its
    /// lease runs out, and a retry after that runs the body again.
    #[error(
        "`{namespace}`: the call ran but its result could not be stored ({}); the key is claimable again once its lease runs out, and a retry will run the call again",
        chain(source.as_ref())
    )]
    ResultNotStored {
        /// The key's namespace.
        namespace: String,
        /// The last error.
        #[source]
        source: BoxError,
    },

    /// The key kept changing hands while this call tried to claim it: every time it read the record as
    /// claimable, another caller claimed it first.
    #[error(
        "`{namespace}`: the key changed hands {attempts} times while this call tried to claim it; retry"
    )]
    Contended {
        /// The key's namespace.
        namespace: String,
        /// Claims tried.
        attempts: u32,
    },

    /// The call asked for a lease shorter than [`MIN_LEASE`](crate::MIN_LEASE): heartbeats renew a
    /// lease every third of it and each renewal's round trip eats into it, so a shorter lease lapses
    /// under ordinary store latency and another caller runs the body too. Nothing was sent.
    #[error(
        "`{namespace}`: a lease of {lease:?} is too short to be kept alive; use at least 1 s (`lease = \"1s\"`)"
    )]
    LeaseTooShort {
        /// The key's namespace.
        namespace: String,
        /// The lease asked for.
        lease: std::time::Duration,
    },

    /// The call's [deadline](crate::Operation::deadline) leaves less than
    /// [`MIN_LEASE`](crate::MIN_LEASE) by the time it would claim the key (it already passed, or the
    /// call waited for another until then): the key was not claimed and the body did not run. A body
    /// started now could outlive the process that runs it, or its lease. Run the call again where
    /// there is time (in a Lambda, the next invocation).
    #[error(
        "`{namespace}`: the call's deadline leaves {left:?}, less than the shortest lease (1 s); the key was not claimed and nothing ran"
    )]
    DeadlinePassed {
        /// The key's namespace.
        namespace: String,
        /// What was left of the deadline when the call would have claimed the key.
        left: std::time::Duration,
    },

    /// DynamoDB refused the transaction's business writes as a whole before evaluating any condition (a
    /// table that does not exist, an invalid expression, a limit), so nothing was written. At completion,
    /// the record moved to FAILED; at claim time, nothing was claimed.
    #[error(
        "`{namespace}`: the staged business writes were refused and nothing was written: {}",
        chain(source.as_ref())
    )]
    WriteRejected {
        /// The key's namespace.
        namespace: String,
        /// DynamoDB's (or the memory store's) error.
        #[source]
        source: BoxError,
    },

    /// The store failed for another reason (a request it refused as invalid, a misconfigured client, ...).
    #[error("`{namespace}`: the idempotency store failed: {}", chain(source.as_ref()))]
    Store {
        /// The key's namespace.
        namespace: String,
        /// The underlying error (for DynamoDB, the SDK's error).
        #[source]
        source: BoxError,
    },

    /// The store does not offer what the call needs: business writes in a transaction (`transact`,
    /// [`claim_with`](crate::Operation::claim_with), [`compensate_with`](crate::Operation::compensate_with))
    /// on a store without transactions. No business write was applied: with `claim_with`, the body did
    /// not run and no record was written; with staged writes, the body ran but its result was not
    /// stored, and the record is FAILED (without the writes), so the key is free again at once.
    #[error("`{namespace}`: the {store} store does not support {capability}")]
    Unsupported {
        /// The key's namespace.
        namespace: String,
        /// The store's kind (`memory`, `dynamodb`, or a third-party store's).
        store: &'static str,
        /// What it does not support.
        capability: &'static str,
    },

    /// The key, the payload or the body's `Ok` value could not be serialized to JSON.
    #[error("`{namespace}`: could not serialize the {what} to JSON: {source}")]
    Serialize {
        /// The key's namespace.
        namespace: String,
        /// `key`, `payload`, `response` or `step`.
        what: &'static str,
        /// `serde_json`'s error.
        #[source]
        source: serde_json::Error,
    },

    /// A stored response no longer deserializes into the function's output type (the type changed in a deploy?).
    #[error(
        "`{namespace}`: the stored response does not deserialize into the function's output type ({source}); if the type changed, give the function a new `name = \"..\"` or wait for the records to expire"
    )]
    Deserialize {
        /// The key's namespace.
        namespace: String,
        /// `serde_json`'s error.
        #[source]
        source: serde_json::Error,
    },

    /// The stored item is not a record this library can read; it was left as it is.
    #[error(
        "`{namespace}`: the stored record for this key is unreadable ({detail}); it was left untouched — check that no other writer uses the table"
    )]
    CorruptRecord {
        /// The key's namespace.
        namespace: String,
        /// What is wrong with it.
        detail: String,
    },

    /// The body's response was too large to store even compressed; the body ran once, and its result cannot
    /// be replayed.
    #[error(
        "`{namespace}`: the call's response was too large to store in one DynamoDB item even compressed, so it cannot be replayed; the call ran once and will not run again for this key until the record expires"
    )]
    ResponseTooLarge {
        /// The key's namespace.
        namespace: String,
    },

    /// The call ran once and its body returned `Ok`, but the value could not be serialized (a map with
    /// non-string keys, a failing `Serialize`, a NaN or an infinity, which JSON cannot hold): the record
    /// is COMPLETED without a response. The first caller got [`Error::Serialize`]; a duplicate gets
    /// this, and the body does not run again for this key until the record expires. Unlike
    /// [`ResponseTooLarge`](Error::ResponseTooLarge), the value itself is at fault: fix its type.
    #[error(
        "`{namespace}`: the call ran once and completed, but its result was not stored because it did not serialize ({detail}), so it cannot be replayed; the call will not run again for this key until the record expires"
    )]
    ResponseNotSerialized {
        /// The key's namespace.
        namespace: String,
        /// Why the value did not serialize, as recorded when the call completed.
        detail: String,
    },

    /// The key's record expired, and only its tombstone (`retain`) remains: the call ran long ago.
    #[error(
        "`{namespace}`: this key was used and its stored response has expired; use a new key to run the call again"
    )]
    Expired {
        /// The key's namespace.
        namespace: String,
    },

    /// The key serialized to `null`, or a top-level tuple or array key has a `null` element: the call has
    /// no key. Nothing was sent and the body did not run (see [`MissingKey`](crate::MissingKey)).
    #[error(
        "`{namespace}`: the idempotency key is missing (it serialized to `null`, or a part of it did); pass a key, or declare that null is a deliberate value (`missing_key = \"allow\"`, `MissingKey::Allow`) or that such calls run without idempotency (`\"skip\"`, `MissingKey::Skip`; not with business writes)"
    )]
    MissingKey {
        /// The key's namespace.
        namespace: String,
    },

    /// A body run with steps ([`Operation::steps`](crate::Operation::steps)) asked for the same
    /// step name twice in one run: each step is stored under its name, so a second one would replay the
    /// first one's value. The body stops there; give each step its own name.
    #[error(
        "`{namespace}`: the step `{step}` was run twice in one call; give each step of a body its own name"
    )]
    StepRepeated {
        /// The key's namespace.
        namespace: String,
        /// The step's name.
        step: String,
    },

    /// A step's value, with the values of the steps before it, would not fit in the record (DynamoDB's
    /// 400 KB item, compressed as responses are). The step ran, so it is recorded as finished without
    /// a value, and the body stops there; later calls of the operation get [`Error::StepNotStored`]
    /// at this step, which never runs again. Return a smaller value from the step (an id rather than
    /// the whole object).
    #[error(
        "`{namespace}`: the value of step `{step}` does not fit in the record ({bytes} bytes with the steps before it, at most {budget}); return a smaller value from the step"
    )]
    StepTooLarge {
        /// The key's namespace.
        namespace: String,
        /// The step's name.
        step: String,
        /// The steps' stored size with this step's value.
        bytes: usize,
        /// The most the record has room for.
        budget: usize,
    },

    /// A step's stored value no longer deserializes into the step's type (the type changed in a
    /// deploy while a call was half-way?). The step is not run again; the body stops there, and so
    /// does every call of the operation until the code reads the stored value. Renaming the step would
    /// run its effect again for every operation in flight: instead, give the step a type that accepts
    /// both forms (`#[serde(default)]` on new fields, an `#[serde(untagged)]` enum of the old and the
    /// new shape) and convert the old one in the body.
    #[error(
        "`{namespace}`: the stored value of step `{step}` does not deserialize into the step's type ({source}); the step is not run again: if its type changed, read it as a type that accepts both the old and the new form (`#[serde(default)]` on new fields, an `#[serde(untagged)]` enum) rather than renaming the step, which would run it again for operations in flight"
    )]
    StepValue {
        /// The key's namespace.
        namespace: String,
        /// The step's name.
        step: String,
        /// `serde_json`'s error.
        #[source]
        source: serde_json::Error,
    },

    /// A step finished in an earlier call of the operation (its closure returned `Ok`: its effect
    /// happened), but its value could not be stored: it did not serialize (a `NaN`, a `Serialize` that
    /// failed or panicked) or did not fit in the record ([`Error::StepTooLarge`] for that call). The
    /// step is recorded as finished without a value and is never run again while the record lives, so
    /// the body cannot go past it: every call of the operation stops there with this error. Settle the
    /// key by hand (the runbook's "A step that cannot be resumed"), and make the step return a value
    /// that stores (an id rather than the whole object).
    #[error(
        "`{namespace}`: step `{step}` finished in an earlier call but its value could not be stored ({detail}); it is not run again, so the operation cannot resume past it: settle the key by hand (see the runbook) and make the step return a smaller, serializable value"
    )]
    StepNotStored {
        /// The key's namespace.
        namespace: String,
        /// The step's name.
        step: String,
        /// Why the value could not be stored, as recorded.
        detail: String,
    },

    /// A step run with [`Steps::run_at_most_once`](crate::Steps::run_at_most_once) started in an
    /// earlier call of the operation and did not finish (a crash, a lapsed lease taken over, a dropped
    /// call, a panic): its effect may or may not have happened, and it is never run again while the
    /// record lives. Every call of the operation stops there with this error until an operator settles
    /// the key (the runbook's "A step that cannot be resumed"): find out whether the effect happened,
    /// finish it by hand if needed, then complete or delete the record.
    #[error(
        "`{namespace}`: step `{step}` runs at most once and was interrupted in an earlier call before it finished; it is not run again: find out whether its effect happened and settle the key by hand (see the runbook)"
    )]
    StepInterrupted {
        /// The key's namespace.
        namespace: String,
        /// The step's name.
        step: String,
    },

    /// With [`steps`](crate::Operation::steps) and [`transact`](crate::Operation::transact), a step that staged business
    /// writes finished in an earlier call that did not complete: the step is replayed, not run, so
    /// its writes cannot be staged again, and the operation is refused rather than completed without
    /// them. Stage business writes in the body, outside steps; settle this key by hand (the runbook's
    /// "A step that cannot be resumed").
    #[error(
        "`{namespace}`: step `{step}` staged business writes in an earlier call that did not complete; a replayed step cannot stage them again, so the operation is not completed without them: stage writes in the body, outside steps, and settle the key by hand (see the runbook)"
    )]
    StepStagedWrites {
        /// The key's namespace.
        namespace: String,
        /// The step's name.
        step: String,
    },

    /// A call *without* steps found the key's record holding the steps of an unfinished operation run
    /// with steps ([`Operation::steps`](crate::Operation::steps)): it does not take the key
    /// over, since its body would run the finished steps again. Typical in a rolling deploy that adds
    /// steps to a function (the older code answers this until the newer one finishes the operation),
    /// or a job that runs the same key without `.steps()`. A call with
    /// steps resumes the operation; the record's steps lapse with the record.
    #[error(
        "`{namespace}`: the key's operation runs with steps and has not finished; a call without steps does not take it over (it would run finished steps again): retry it where the function runs with steps"
    )]
    StepsHeld {
        /// The key's namespace.
        namespace: String,
    },

    /// No `store = ..` was given and no default `Idempotency` was installed.
    #[error(
        "`{namespace}`: no idempotency store; call `Idempotency::install()` at startup or pass `store = ..` to #[idempotent]"
    )]
    NotInstalled {
        /// The key's namespace.
        namespace: String,
    },
}

/// For functions returning `std::io::Result<T>`: the error keeps this one as its inner error (kind
/// `WouldBlock` for [`Error::InProgress`], `TimedOut` for [`Error::Throttled`], `InvalidData` for unreadable
/// or mismatched data, `Other` otherwise).
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        use std::io::ErrorKind;
        let kind = match &e {
            Error::InProgress { .. } | Error::Contended { .. } | Error::StepsHeld { .. } => {
                ErrorKind::WouldBlock
            }
            Error::Throttled { .. }
            | Error::Unavailable { .. }
            | Error::RegionUnavailable { .. }
            | Error::ResultNotStored { .. }
            | Error::DeadlinePassed { .. } => ErrorKind::TimedOut,
            Error::LeaseTooShort { .. } => ErrorKind::InvalidInput,
            Error::PayloadMismatch { .. }
            | Error::Deserialize { .. }
            | Error::StepValue { .. }
            | Error::Serialize { .. }
            | Error::CorruptRecord { .. } => ErrorKind::InvalidData,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// A boxed error that keeps the original as `source()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why one action of a canceled transaction failed.
///
/// A store reports one per action in [`TransactOutcome::Canceled`](crate::store::TransactOutcome::Canceled):
/// build it with [`new`](Self::new) (and `with_item`, feature `dynamodb`).
/// `#[non_exhaustive]`: a struct expression cannot build it outside this crate, so a field added later
/// (as `item` is added by the `dynamodb` feature) breaks no store; its fields stay public to read and
/// to change.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CancellationReason {
    /// The action's index in the transaction (0 is the idempotency record).
    pub index: usize,
    /// DynamoDB's code, e.g. `ConditionalCheckFailed` or `None` for an action that was fine.
    pub code: String,
    /// DynamoDB's message, if any.
    pub message: Option<String>,
    /// The item as it was, when the action asked for `ALL_OLD` on a failed condition.
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    pub item: Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>,
}

impl CancellationReason {
    /// The reason of the action at `index` (0 is the idempotency record): DynamoDB's `code`
    /// (`"None"` for an action that was fine) and its `message`; no item.
    #[must_use]
    pub fn new(index: usize, code: impl Into<String>, message: Option<String>) -> Self {
        Self {
            index,
            code: code.into(),
            message,
            #[cfg(feature = "dynamodb")]
            item: None,
        }
    }

    /// The same reason with the item as it was (`ALL_OLD` on a failed condition).
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    #[must_use]
    pub fn with_item(
        mut self,
        item: Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>,
    ) -> Self {
        self.item = item;
        self
    }

    /// Cancellation codes that pass with a retry: a conflict with another write to the same item, or
    /// throttling.
    pub const TRANSIENT_CODES: [&'static str; 3] = [
        "TransactionConflict",
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
    ];

    /// Whether this action canceled the transaction (DynamoDB reports `None` for the actions that were
    /// fine).
    #[must_use]
    pub fn failed(&self) -> bool {
        self.code != "None"
    }

    /// Whether this action's reason passes with a retry ([`TRANSIENT_CODES`](Self::TRANSIENT_CODES)).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        Self::TRANSIENT_CODES.contains(&self.code.as_str())
    }
}

/// Whether a cancellation may pass with a retry: at least one action failed and every one that failed
/// did so for a transient reason.
pub(crate) fn transient_cancellation(reasons: &[CancellationReason]) -> bool {
    let mut failed = reasons.iter().filter(|r| r.failed()).peekable();
    failed.peek().is_some() && failed.all(CancellationReason::is_transient)
}

fn display_reasons(reasons: &[CancellationReason]) -> String {
    let failed: Vec<String> = reasons
        .iter()
        .filter(|r| r.code != "None")
        .map(|r| match &r.message {
            Some(m) => format!("action {} {} ({m})", r.index, r.code),
            None => format!("action {} {}", r.index, r.code),
        })
        .collect();
    if failed.is_empty() {
        "no reason given".to_owned()
    } else {
        failed.join(", ")
    }
}

impl Error {
    /// The namespace of the key the error is about.
    #[must_use]
    pub fn namespace(&self) -> &str {
        match self {
            Error::InProgress { namespace, .. }
            | Error::PayloadMismatch { namespace }
            | Error::LeaseLost { namespace }
            | Error::TransactionCanceled { namespace, .. }
            | Error::TooManyWrites { namespace, .. }
            | Error::Throttled { namespace, .. }
            | Error::TableNotFound { namespace, .. }
            | Error::AccessDenied { namespace, .. }
            | Error::TableMismatch { namespace, .. }
            | Error::Store { namespace, .. }
            | Error::Unsupported { namespace, .. }
            | Error::Unavailable { namespace, .. }
            | Error::RegionUnavailable { namespace, .. }
            | Error::ResultNotStored { namespace, .. }
            | Error::Contended { namespace, .. }
            | Error::LeaseTooShort { namespace, .. }
            | Error::DeadlinePassed { namespace, .. }
            | Error::WriteRejected { namespace, .. }
            | Error::Serialize { namespace, .. }
            | Error::Deserialize { namespace, .. }
            | Error::CorruptRecord { namespace, .. }
            | Error::ResponseTooLarge { namespace }
            | Error::ResponseNotSerialized { namespace, .. }
            | Error::Expired { namespace }
            | Error::MissingKey { namespace }
            | Error::StepRepeated { namespace, .. }
            | Error::StepTooLarge { namespace, .. }
            | Error::StepValue { namespace, .. }
            | Error::StepNotStored { namespace, .. }
            | Error::StepInterrupted { namespace, .. }
            | Error::StepStagedWrites { namespace, .. }
            | Error::StepsHeld { namespace }
            | Error::NotInstalled { namespace } => namespace,
        }
    }

    /// Whether retrying the same call later, unchanged, may succeed: another call (or an operation run
    /// with steps, for a call without) is in progress, the
    /// key was contended, the store (or the key's home region) throttled or was unavailable, a result was not stored, the claim was
    /// lost, or a business condition failed (it may hold later). Not for errors that need a change first:
    /// permissions, validation, a missing table, refused writes, bad data, a missing key.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::InProgress { .. }
                | Error::Contended { .. }
                | Error::StepsHeld { .. }
                | Error::LeaseLost { .. }
                | Error::TransactionCanceled { .. }
                | Error::Throttled { .. }
                | Error::Unavailable { .. }
                | Error::RegionUnavailable { .. }
                | Error::ResultNotStored { .. }
                | Error::DeadlinePassed { .. }
        )
    }
}

impl Error {
    /// Whether the error says the store is not set up for the service — the table is missing, refused
    /// the credentials, or has another shape — rather than anything about the call: every call fails
    /// the same way until an operator acts, so it is logged at `error` level with what to do.
    pub(crate) fn is_setup(&self) -> bool {
        matches!(
            self,
            Error::TableNotFound { .. } | Error::AccessDenied { .. } | Error::TableMismatch { .. }
        )
    }
}

/// An error and its sources, joined with `: ` (the SDK's own `Display` says little without them).
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}
