//! [`Call`]: what the attribute says about one function, and [`MissingKey`], what a key that
//! serializes to `null` means. Read by the front door ([`Operation`](crate::Operation)), key derivation
//! and the state machine alike, so it depends on none of them.

use std::num::NonZeroU64;
use std::time::Duration;

/// What the attribute says about one function: its namespace and its durations (`None` = the handle's
/// default). Generated code keeps one in a `static`.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// The key namespace: `name = ".."`, or `module_path!()::fn_name`.
    pub namespace: &'static str,
    /// `ttl = ".."`.
    pub ttl: Option<Duration>,
    /// `lease = ".."`.
    pub lease: Option<Duration>,
    /// `wait = ".."`.
    pub wait: Option<Duration>,
    /// `missing_key = ".."`: what a key that serializes to `null` (or a tuple key with a `null` part) means.
    pub missing_key: MissingKey,
    /// The end of the time this process has for the call, in milliseconds of the handle's
    /// [`Clock`](crate::Clock), set by [`Operation::deadline`](crate::Operation::deadline): no claim
    /// and no heartbeat asks for a lease past it. `None` (the attribute's calls) bounds nothing.
    pub deadline_ms: Option<NonZeroU64>,
}

/// What to do with a *missing* key: one that serializes to `null` (an `Option` that is `None`), or a
/// top-level tuple or array key with a `null` element (`key = (tenant, order_id)` with no `order_id`).
///
/// Keyless calls must never share a record: the second would get the first one's response. So a missing
/// key is an error unless the function says otherwise. Empty strings, `0`, `false`, `[]` and `{}` are
/// values, never missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// [`Error::MissingKey`](crate::Error::MissingKey) before any I/O: no record, the body does not run (the default).
    #[default]
    Reject,
    /// `null` is a deliberate value: every call whose key is `null` shares one record.
    Allow,
    /// Run the body without idempotency (no record, no replay) and log a warning. Not with business
    /// writes (`transact`, `claim_with`): they commit only with a record, so such a call is rejected as
    /// with [`Reject`](Self::Reject) (the attribute refuses the combination at compile time).
    Skip,
}

impl Call {
    /// A call in `namespace` with every duration left to the handle's defaults.
    #[must_use]
    pub const fn new(namespace: &'static str) -> Self {
        Self {
            namespace,
            ttl: None,
            lease: None,
            wait: None,
            missing_key: MissingKey::Reject,
            deadline_ms: None,
        }
    }
}
