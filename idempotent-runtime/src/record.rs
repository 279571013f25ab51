//! The stored record: one item per key, and the rule that says when a key may be claimed.

use std::fmt;

/// Where a key is in its life.
///
/// Exhaustive on purpose: these three states are the protocol (every store's claim rule and every
/// decision of the state machine is written over exactly them, and a record holds one of them), so a
/// `match` over all three is how stores and tools are meant to read it. A fourth state would change
/// what every store must do and would come with a new major version, not hidden behind a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// A call holds the key and is running the body (until `lease_until`).
    Pending,
    /// The body returned `Ok`; its response is stored and replayed to duplicates.
    Completed,
    /// The body returned `Err`; the key may be claimed again at once.
    Failed,
}

impl Status {
    /// The value stored in the `status` attribute.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "PENDING",
            Status::Completed => "COMPLETED",
            Status::Failed => "FAILED",
        }
    }

    /// Parses the stored value; `None` for anything this library does not write.
    #[must_use]
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "PENDING" => Some(Status::Pending),
            "COMPLETED" => Some(Status::Completed),
            "FAILED" => Some(Status::Failed),
            _ => None,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One idempotency record, as stored.
///
/// A store builds the records it returns with [`Record::new`] (the fields every record has) and sets
/// the others, which are public, on the result:
///
/// ```
/// use idempotent_runtime::{Record, Status};
///
/// let mut record = Record::new("billing::charge#3f2a", Status::Pending, "token-1", 4_102_444_800);
/// record.lease_until_ms = Some(4_102_444_860_000);
/// record.fingerprint = Some("5d41402a".to_owned());
/// assert_eq!(record.attempt, 1);
/// assert!(record.response.is_none());
/// ```
///
/// `#[non_exhaustive]`: outside this crate a struct expression (also `Record { .., ..other }`) cannot
/// build it, so a field the record gains later (as `steps` and `released` were added) breaks no store:
///
/// ```compile_fail,E0639
/// use idempotent_runtime::{Record, Status};
///
/// let held = Record::new("billing::charge#3f2a", Status::Pending, "token-1", 4_102_444_800);
/// let taken = Record { token: "token-2".to_owned(), ..held };
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Record {
    /// The derived key: `"{namespace}#{hex(sha256(canonical_json(key)))}"`.
    pub key: String,
    /// The record's state.
    pub status: Status,
    /// The fencing token of the claim that wrote the record; unique per claim.
    pub token: String,
    /// How many claims were made on this key so far.
    pub attempt: u64,
    /// While PENDING: the claim is live until this instant (epoch milliseconds).
    pub lease_until_ms: Option<u64>,
    /// The record counts as absent after this instant (epoch seconds); also the table's TTL attribute.
    pub expires_at_s: u64,
    /// The payload's fingerprint, when the function declares a `payload`.
    pub fingerprint: Option<String>,
    /// When COMPLETED: the response's JSON, gzip-compressed above [`COMPRESS_ABOVE`](crate::COMPRESS_ABOVE)
    /// bytes. `None` when it was too large to store.
    pub response: Option<Vec<u8>>,
    /// When FAILED: the body's error, as text, for operators.
    pub error: Option<String>,
    /// With retention: the response is replayed until this instant (epoch seconds); after it, and until
    /// `expires_at`, duplicates get [`Error::Expired`](crate::Error::Expired).
    pub replay_until_s: Option<u64>,
    /// Whether the business writes of a claim with writes (`claim_with`) are in effect: set by such a
    /// claim, kept by every later claim, completion and failure of the same operation, and cleared only
    /// by a failure that commits compensating writes. While set, a re-claim does not apply them again.
    pub claim_writes_in_effect: bool,
    /// When COMPLETED by a store that knows its region (`DynamoDbStore::with_region`, set by
    /// `RoutedStore::dynamodb`): that region's name. On a global table, a record completed in another
    /// region than its key's home was claimed outside home-region routing.
    pub completed_in: Option<String>,
    /// While PENDING or FAILED, for an operation run with steps
    /// ([`Operation::steps`](crate::Operation::steps)): the values of the steps that finished,
    /// encoded ([`Steps`](crate::Steps) reads them), so that a call taking the key over replays them
    /// instead of running them again. Removed by a completion, and by a claim that starts the operation
    /// afresh.
    pub steps: Option<Vec<u8>>,
    /// The tokens of calls that gave up a claim before it landed, found this record there when they
    /// released it, and left their token on it ([`Change::MarkReleased`](crate::store::Change::MarkReleased)):
    /// a claim under any of them is refused, so that a claim still in flight when its call gave it up
    /// never lands afterwards. At most [`MAX_RELEASED`] of them (a release that finds them full raises
    /// [`released_through`](Self::released_through) instead); removed by a completion (the record is
    /// final until it expires).
    pub released: Vec<String>,
    /// Until when (epoch milliseconds) a claim under any of the [`released`](Self::released) tokens
    /// can still hold the key: the latest lease end any of their calls' claims may have asked for,
    /// plus the clock-skew margin. Once a caller's clock (less its margin) has passed it, every one of
    /// them is stale (a claim landing now would be taken over at once), and a release that finds the
    /// set full replaces them with its own token. `None` on a record never marked, or marked before
    /// it was kept (its tokens are never judged stale). Left as it is by a claim; removed with the
    /// tokens by a completion.
    pub released_until_ms: Option<u64>,
    /// Every token up to this one, in token order, is released: a claim under any of them is refused.
    /// Tokens are ordered by the time they were made (UUID version 7: milliseconds first, then a
    /// counter that keeps one process's tokens in order within a millisecond), so a release that
    /// finds [`MAX_RELEASED`] tokens on the record, some of which can still hold the key, refuses its
    /// own claim by raising this to its token instead of adding it (a claim made later, by any process
    /// whose clock is not behind, has a greater token). Its claims can hold the key until
    /// [`released_until_ms`](Self::released_until_ms), like the released tokens'. Removed with them.
    pub released_through: Option<String>,
}

/// How many [`Record::released`] tokens a record holds at most: a release that finds the record full,
/// with some of its tokens' claims still able to hold the key, raises
/// [`Record::released_through`] to its own token instead.
pub const MAX_RELEASED: usize = 16;

impl Record {
    /// A record of the first claim on `key` (`attempt` 1) in `status`, written under `token`, that
    /// counts as absent after `expires_at_s` (epoch seconds); every optional field empty: no lease, no
    /// fingerprint, response, error, retention, region or steps, no released tokens, and no claim-time
    /// writes in effect.
    #[must_use]
    pub fn new(
        key: impl Into<String>,
        status: Status,
        token: impl Into<String>,
        expires_at_s: u64,
    ) -> Self {
        Record {
            key: key.into(),
            status,
            token: token.into(),
            attempt: 1,
            lease_until_ms: None,
            expires_at_s,
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

    /// Whether a claim under `token` is refused because its call released it before it landed: the
    /// record is a FAILED one under that token (the call's release failed its landed claim, or marked
    /// the absent record), holds the token among its [`released`](Self::released) ones, or the token
    /// is no greater than its [`released_through`](Self::released_through).
    #[must_use]
    pub fn released_token(&self, token: &str) -> bool {
        (self.status == Status::Failed && self.token == token) || self.marks_released(token)
    }

    /// Whether the record's release marks refuse `token`: it is among the
    /// [`released`](Self::released) tokens, or no greater than
    /// [`released_through`](Self::released_through).
    #[must_use]
    pub fn marks_released(&self, token: &str) -> bool {
        self.released.iter().any(|t| t == token)
            || self
                .released_through
                .as_deref()
                .is_some_and(|through| token <= through)
    }

    /// The earliest expiry (epoch seconds), no earlier than `expires_at_s`, that a transition out of
    /// (or within) PENDING may give this record: no earlier than the end of its released tokens
    /// ([`released_until_ms`](Self::released_until_ms)), so that TTL never deletes the record, and
    /// with it the marks, while a claim they keep out could still land. A completion with a `ttl`
    /// shorter than that (or a failure with a short `failed_ttl`) keeps the record that much longer.
    #[must_use]
    pub fn outlives_released(&self, expires_at_s: u64) -> u64 {
        self.released_until_ms
            .map_or(expires_at_s, |until| expires_at_s.max(until.div_ceil(1000)))
    }

    /// Whether a new claim may take this key at `now_ms`: the record expired, failed, or is a PENDING claim
    /// whose lease ran out. This is the single rule behind the stores' claim conditions.
    #[must_use]
    pub fn is_claimable(&self, now_ms: u64) -> bool {
        self.is_expired(now_ms)
            || self.status == Status::Failed
            || (self.status == Status::Pending && self.lease_until_ms.is_some_and(|l| l < now_ms))
    }

    /// Whether a claim that applies claim-time writes may take this key at `now_ms`: the record expired
    /// (a new operation), or it is claimable and its earlier claim-time writes are not in effect. The
    /// rule behind the stores' `claim_transaction` conditions.
    #[must_use]
    pub fn is_claimable_with_writes(&self, now_ms: u64) -> bool {
        self.is_expired(now_ms) || (self.is_claimable(now_ms) && !self.claim_writes_in_effect)
    }

    /// Whether a plain claim that keeps the record's claim-time writes in effect may take this key at
    /// `now_ms`: it is claimable, not expired, and its writes are in effect — exactly the records a claim
    /// with writes is refused ([`is_claimable_with_writes`](Self::is_claimable_with_writes)) but a plain
    /// claim would take. The rule behind a claim with
    /// [`keep_claim_writes`](crate::store::ClaimRequest::keep_claim_writes).
    #[must_use]
    pub fn is_claimable_keeping_writes(&self, now_ms: u64) -> bool {
        self.is_claimable(now_ms) && !self.is_claimable_with_writes(now_ms)
    }

    /// Whether the record counts as absent at `now_ms` (its `expires_at` is in the past).
    #[must_use]
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_s < now_ms / 1000
    }

    /// Whether a claim of an operation with steps may take this key at `now_ms` as far as its stored
    /// steps go (the key must also be claimable by the claim's other rule): the rule behind the stores'
    /// step conditions ([`StepsClaim`]).
    #[must_use]
    pub fn allows_steps_claim(&self, now_ms: u64, claim: StepsClaim<'_>) -> bool {
        match claim {
            StepsClaim::Untouched => self.steps.is_none() || self.is_expired(now_ms),
            StepsClaim::Fresh { restarts, .. } => {
                self.steps.is_none()
                    || self.is_expired(now_ms)
                    || restarts.is_some_and(|seen| {
                        self.status == Status::Failed && self.steps.as_deref() == Some(seen)
                    })
            }
            StepsClaim::Resume {
                steps,
                restart_failed,
            } => {
                !self.is_expired(now_ms)
                    && self.steps.as_deref() == Some(steps)
                    && !(restart_failed && self.status == Status::Failed)
            }
        }
    }
}

/// What a claim of an operation run with steps ([`Operation::steps`](crate::Operation::steps))
/// does with the steps the record stores. A claim is made only if the record allows it
/// ([`Record::allows_steps_claim`]) *and* the claim's other rule does.
///
/// Exhaustive on purpose, like [`Change`](crate::store::Change): a store must apply each kind of
/// claim exactly, so a store that matches every variant is one that keeps the contract, and a new kind
/// (or a new field of one) is a change of the contract that comes with a new major version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepsClaim<'a> {
    /// An operation without steps: made only on a record without steps, or an expired one (whose
    /// steps it removes: a new operation). A record whose steps live on refuses it: code without
    /// steps never takes over an operation run with steps, whose body would run finished steps again.
    #[default]
    Untouched,
    /// Starts the operation afresh: the record's steps become `initial` (no step finished yet), in
    /// place of any stored ones. Made only on an absent or expired record, one without steps, or
    /// (`restarts`) the FAILED record holding exactly the steps the caller judged a failure to restart
    /// after; a record whose steps live on blocks it, and the caller resumes instead.
    Fresh {
        /// The steps of an operation that has just started, encoded.
        initial: &'a [u8],
        /// The operation restarts from scratch after a failure
        /// ([`Operation::restart_steps_after_failure`](crate::Operation::restart_steps_after_failure)):
        /// the steps of the FAILED record it restarts after, as stored. Any change to the record since
        /// (another call restarted it, or pinned it) refuses the claim.
        restarts: Option<&'a [u8]>,
    },
    /// Takes over a record whose steps live on, keeping them: made only while the record is not
    /// expired and its steps are exactly `steps` (those the caller saw and will replay: a step stored
    /// meanwhile blocks the claim, rather than being run again), and (`restart_failed`) it is not FAILED.
    Resume {
        /// The stored steps the caller saw, as stored.
        steps: &'a [u8],
        /// As for [`Fresh`](Self::Fresh).
        restart_failed: bool,
    },
}

/// The names of the record's attributes in the table. The defaults: `pk`, `status`, `token`, `attempt`,
/// `lease_until`, `expires_at`, `fingerprint`, `response`, `error`, `replay_until` (only written with
/// retention), `claim_writes` (only written by claims with business writes), `completed_in` (only
/// written by a DynamoDB store that knows its region), `steps` (only written by operations run with
/// steps), `released` (only written by the release of a call that gave up a claim in flight) and `sk` (the sort key, only in a DynamoDB table
/// layout that has one).
///
/// A setting of the record, not of one store: every store sizes its records by them
/// ([`Store::response_budget`](crate::Store::response_budget)), and the DynamoDB store's expressions
/// name them through placeholders (`store::dynamodb::expression`).
///
/// Start from [`AttributeNames::default`] and change the names you need (the fields are public):
///
/// ```
/// let mut names = idempotent_runtime::AttributeNames::default();
/// names.status = "state".to_owned();
/// assert_eq!(names.key, "pk");
/// ```
///
/// `#[non_exhaustive]`: a struct expression cannot build it outside this crate, so an attribute the
/// record gains later (with its default name) breaks no caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttributeNames {
    /// Partition key (type S).
    pub key: String,
    /// Sort key (type S), in a DynamoDB table layout that has one (`store::dynamodb::Layout`).
    pub sort_key: String,
    /// `PENDING`, `COMPLETED` or `FAILED` (S).
    pub status: String,
    /// The claim's fencing token (S).
    pub token: String,
    /// Claims made so far (N).
    pub attempt: String,
    /// End of a PENDING claim's lease, epoch milliseconds (N).
    pub lease_until: String,
    /// Expiry, epoch seconds (N); the table's TTL attribute.
    pub expires_at: String,
    /// Fingerprint of the payload (S).
    pub fingerprint: String,
    /// The encoded response (B).
    pub response: String,
    /// A FAILED call's error text (S).
    pub error: String,
    /// With retention: end of the replay window, epoch seconds (N).
    pub replay_until: String,
    /// Present (BOOL `true`) while a claim's business writes are in effect.
    pub claim_writes: String,
    /// The region whose store completed the record (S), when the store knows its region.
    pub completed_in: String,
    /// The finished steps' values of an operation run with steps (B), while it is PENDING or FAILED.
    pub steps: String,
    /// The tokens of calls that released their claim before it landed (SS): a claim under one of
    /// them is refused ([`Record::released`]).
    pub released: String,
    /// Until when (N, epoch milliseconds) a claim under one of the released tokens can hold the key
    /// ([`Record::released_until_ms`]).
    pub released_until: String,
    /// The greatest token released by a release that found the released tokens full (S): a claim
    /// under any token up to it is refused ([`Record::released_through`]).
    pub released_through: String,
}

// Used by the DynamoDB store, which reads a returned item by these names.
#[cfg(feature = "dynamodb")]
impl AttributeNames {
    /// Every name, in the order of the fields.
    fn all(&self) -> [&str; 17] {
        [
            &self.key,
            &self.sort_key,
            &self.status,
            &self.token,
            &self.attempt,
            &self.lease_until,
            &self.expires_at,
            &self.fingerprint,
            &self.response,
            &self.error,
            &self.replay_until,
            &self.claim_writes,
            &self.completed_in,
            &self.steps,
            &self.released,
            &self.released_until,
            &self.released_through,
        ]
    }

    /// Whether no two of the names are the same attribute.
    pub(crate) fn are_distinct(&self) -> bool {
        let all = self.all();
        all.iter()
            .enumerate()
            .all(|(i, name)| !all[i + 1..].contains(name))
    }
}

impl Default for AttributeNames {
    fn default() -> Self {
        Self {
            key: "pk".into(),
            sort_key: "sk".into(),
            status: "status".into(),
            token: "token".into(),
            attempt: "attempt".into(),
            lease_until: "lease_until".into(),
            expires_at: "expires_at".into(),
            fingerprint: "fingerprint".into(),
            response: "response".into(),
            error: "error".into(),
            replay_until: "replay_until".into(),
            claim_writes: "claim_writes".into(),
            completed_in: "completed_in".into(),
            steps: "steps".into(),
            released: "released".into(),
            released_until: "released_until".into(),
            released_through: "released_through".into(),
        }
    }
}

/// The claim rules at their edges: the stores' conditions and the model rest on them.
#[cfg(test)]
mod tests {
    use super::*;

    /// Expires after second 1000 (its last live millisecond is `1_000_999`).
    const EXPIRES_S: u64 = 1_000;

    fn record(status: Status) -> Record {
        Record {
            key: "ns#k".into(),
            status,
            token: "t".into(),
            attempt: 1,
            lease_until_ms: (status == Status::Pending).then_some(900_000),
            expires_at_s: EXPIRES_S,
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
    fn every_status_is_stored_as_its_name_and_read_back() {
        for (status, stored) in [
            (Status::Pending, "PENDING"),
            (Status::Completed, "COMPLETED"),
            (Status::Failed, "FAILED"),
        ] {
            assert_eq!(status.as_str(), stored);
            assert_eq!(Status::parse(stored), Some(status));
        }
        assert_eq!(Status::parse("pending"), None);
        assert_eq!(Status::parse(""), None);
    }

    #[test]
    fn a_record_expires_once_its_expiry_second_has_passed() {
        let completed = record(Status::Completed);
        assert!(!completed.is_expired(999_999));
        assert!(!completed.is_expired(1_000_999), "its last second is live");
        assert!(completed.is_expired(1_001_000));
    }

    #[test]
    fn a_pending_claim_is_claimable_only_once_its_lease_has_passed() {
        let pending = record(Status::Pending);
        assert!(!pending.is_claimable(899_999));
        assert!(
            !pending.is_claimable(900_000),
            "the lease's last millisecond is live"
        );
        assert!(pending.is_claimable(900_001));
        // A claim without a lease (not one this library writes) blocks until the record expires.
        let unleased = Record {
            lease_until_ms: None,
            ..record(Status::Pending)
        };
        assert!(!unleased.is_claimable(950_000));
        assert!(unleased.is_claimable(1_001_000));
    }

    #[test]
    fn a_completed_record_blocks_until_it_expires_and_a_failed_one_never() {
        let completed = record(Status::Completed);
        assert!(!completed.is_claimable(950_000));
        assert!(completed.is_claimable(1_001_000));
        assert!(record(Status::Failed).is_claimable(950_000));
    }

    /// `is_claimable_with_writes` and `is_claimable_keeping_writes` split the claimable records by
    /// whether claim-time writes are in effect; an expired record is a new operation for both.
    #[test]
    fn claimable_records_split_by_whether_claim_writes_are_in_effect() {
        let without = record(Status::Failed);
        let with = Record {
            claim_writes_in_effect: true,
            ..record(Status::Failed)
        };
        let live_ms = 950_000;
        let expired_ms = 1_001_000;
        assert!(without.is_claimable_with_writes(live_ms));
        assert!(!without.is_claimable_keeping_writes(live_ms));
        assert!(!with.is_claimable_with_writes(live_ms));
        assert!(with.is_claimable_keeping_writes(live_ms));
        assert!(with.is_claimable_with_writes(expired_ms));
        assert!(!with.is_claimable_keeping_writes(expired_ms));
        // A record that is not claimable at all is neither.
        let held = Record {
            claim_writes_in_effect: true,
            ..record(Status::Pending)
        };
        assert!(!held.is_claimable_with_writes(899_000));
        assert!(!held.is_claimable_keeping_writes(899_000));
        let held_without = record(Status::Pending);
        assert!(!held_without.is_claimable_with_writes(899_000));
        assert!(!held_without.is_claimable_keeping_writes(899_000));
    }
}
