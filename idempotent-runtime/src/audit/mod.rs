//! The TTL-deletion audit: the idempotency table's DynamoDB stream, read for the deletions TTL made and
//! for the late retries that came after them. Behind the `audit` feature.
//!
//! A record deleted by TTL is gone: a duplicate that arrives after the deletion finds no item, claims the
//! key anew, and runs the body again. `retain` tombstones ([`Builder::retain`](crate::Builder::retain))
//! keep such a duplicate from running while they live; the audit tells whether the windows are long
//! enough, from the table's own stream (`NEW_AND_OLD_IMAGES`: `idempotent table create --stream`).
//!
//! [`Auditor`] is the logic, fed one [`Change`] at a time, whatever reads the stream:
//! [`StreamReader`] polls it (`aws-sdk-dynamodbstreams`: the `idempotent audit` command), and
//! [`Auditor::observe_lambda`] takes a Lambda stream consumer's event (`aws_lambda_events`).
//!
//! # What it recognises
//!
//! - **A deletion** is a stream record with an old image and no new image. Not the event name alone:
//!   DynamoDB Local streams its TTL deletions as an event named `UNKNOWN_TO_SDK_VERSION` (it is a
//!   `REMOVE` on AWS).
//! - **A TTL deletion** ([`Rule`]): on AWS, the record's `userIdentity` is of type `Service` with
//!   principal `dynamodb.amazonaws.com` ([`Rule::ServiceIdentity`]). Where the identity is absent (a
//!   global table's replica in another region, DynamoDB Local), the old image's `expires_at` at or
//!   before the record's `ApproximateCreationDateTime` ([`Rule::Expiry`]). DynamoDB Streams round
//!   that time down, to the minute on DynamoDB Local (and on AWS in the documented examples): a time on
//!   a whole minute is taken as "some instant in that minute", so a record that expired within it
//!   counts. The price: a user's delete in the minute before a record's expiry counts as TTL's.
//! - **A late retry after deletion** ([`LateRetry`]): a new claim of a key (an insert: a new image and
//!   no old one) after TTL deleted the key's record. Counted once per deletion, whatever the number of
//!   claims after it, and once however often the stream's records are read again.
//!
//! Items that are not idempotency records (another application's items in the table, a record of
//! another layout) are counted ([`Summary::not_records`]) and otherwise ignored.
//!
//! # Memory
//!
//! To match a claim with an earlier deletion, the auditor remembers each TTL deletion (a 64-bit hash of
//! the key, the deletion time, the record's expiry and completion times, the stream position): about
//! 100 bytes each, for [`AuditConfig::window`] of event time, and at most
//! [`AuditConfig::max_tracked`] of them (the oldest are forgotten first, and counted in
//! [`Summary::forgotten`]). A retry later than the window after its deletion is not recognised.
//!
//! # Metrics (with the `metrics` feature)
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `dynamo_ttl_delete_before_retry_total` | `namespace` | a claim of a key after TTL deleted its record, seen in the stream ([`LateRetry`]) |
//! | `idempotency_ttl_deletions_total` | `namespace`, `rule` | TTL deletions, by the [`Rule`] that recognised them |
//! | `idempotency_ttl_deletion_lag_seconds` | `namespace` | histogram: deletion time − `expires_at` |
//!
//! (The runtime also counts `dynamo_ttl_delete_before_retry_total`, without labels, when a claim
//! replaces an expired record TTL has not deleted yet: see [`telemetry`](crate::telemetry).)

mod lambda;
mod stream;

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher as _;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;

use crate::record::{Record, Status};
use crate::store::dynamodb::DynamoDbStore;

pub use stream::{AuditError, ReadOptions, ReadStats, StartFrom, StreamReader, stream_arn};

/// The `userIdentity` type of a deletion made by a service.
pub const SERVICE_IDENTITY_TYPE: &str = "Service";
/// The `userIdentity` principal of a deletion made by DynamoDB's TTL.
pub const TTL_PRINCIPAL: &str = "dynamodb.amazonaws.com";

/// One stream record, as the auditor needs it: from the Streams API ([`Change::from_stream`]), or from
/// a Lambda event ([`Change::from_lambda`]).
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Change {
    /// The record's sequence number (digits; increasing along a key's changes).
    pub sequence_number: String,
    /// `ApproximateCreationDateTime`, epoch seconds (`None` when the record has none).
    pub created_at_s: Option<u64>,
    /// `INSERT`, `MODIFY`, `REMOVE`, or what the emulator sends (`UNKNOWN_TO_SDK_VERSION`).
    pub event_name: String,
    /// The record's `userIdentity`, when it has one.
    pub identity: Option<Identity>,
    /// The item before the change.
    pub old_image: Option<HashMap<String, AttributeValue>>,
    /// The item after the change.
    pub new_image: Option<HashMap<String, AttributeValue>>,
}

impl Change {
    /// A change with no images, identity or time; set them with the builder-style methods.
    #[must_use]
    pub fn new(sequence_number: impl Into<String>, event_name: impl Into<String>) -> Self {
        Self {
            sequence_number: sequence_number.into(),
            event_name: event_name.into(),
            ..Self::default()
        }
    }

    /// With `ApproximateCreationDateTime` at `seconds` since the epoch.
    #[must_use]
    pub fn created_at(mut self, seconds: u64) -> Self {
        self.created_at_s = Some(seconds);
        self
    }

    /// With the `userIdentity` `kind` (its `type`) and `principal`.
    #[must_use]
    pub fn identity(mut self, kind: impl Into<String>, principal: impl Into<String>) -> Self {
        self.identity = Some(Identity {
            kind: kind.into(),
            principal: principal.into(),
        });
        self
    }

    /// With the old image `item`.
    #[must_use]
    pub fn old_image(mut self, item: HashMap<String, AttributeValue>) -> Self {
        self.old_image = Some(item);
        self
    }

    /// With the new image `item`.
    #[must_use]
    pub fn new_image(mut self, item: HashMap<String, AttributeValue>) -> Self {
        self.new_image = Some(item);
        self
    }
}

/// A stream record's `userIdentity`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Identity {
    /// Its `type` (`Service` for TTL).
    pub kind: String,
    /// Its `principalId` (`dynamodb.amazonaws.com` for TTL).
    pub principal: String,
}

/// Which rule recognised a TTL deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Rule {
    /// The record's `userIdentity`: type `Service`, principal `dynamodb.amazonaws.com` (AWS, in the
    /// region that deleted the item).
    ServiceIdentity,
    /// No identity, and the old image's `expires_at` is at or before the record's creation time (in
    /// its minute, when the time is on a whole minute).
    Expiry,
}

impl Rule {
    /// The label: `service_identity` or `expiry`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Rule::ServiceIdentity => "service_identity",
            Rule::Expiry => "expiry",
        }
    }
}

/// What a change was, as far as the audit goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Finding {
    /// TTL deleted a record.
    TtlDeletion(TtlDeletion),
    /// A key was claimed again after TTL deleted its record.
    LateRetry(LateRetry),
}

/// A record TTL deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TtlDeletion {
    /// The record key.
    pub key: String,
    /// Its namespace (the key before its last `#`).
    pub namespace: String,
    /// The deleted record's status.
    #[serde(serialize_with = "status_text")]
    pub status: Status,
    /// The rule that recognised the deletion.
    pub rule: Rule,
    /// When it was deleted (the stream record's time), epoch seconds.
    pub deleted_at_s: u64,
    /// The record's `expires_at`, epoch seconds.
    pub expires_at_s: u64,
    /// Deletion time − `expires_at`, seconds (0 when the rounded deletion time is earlier).
    pub deletion_lag_s: u64,
    /// Deletion time − the record's completion, seconds: for a COMPLETED record when
    /// [`AuditConfig::ttl`] is set (the completion is `replay_until` − ttl with retention, else
    /// `expires_at` − ttl).
    pub age_since_completion_s: Option<u64>,
}

/// A key claimed again after TTL deleted its record: the body ran again, unless a `retain` tombstone
/// or the payload's own idempotency stopped it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LateRetry {
    /// The record key.
    pub key: String,
    /// Its namespace.
    pub namespace: String,
    /// When TTL deleted the earlier record, epoch seconds.
    pub deleted_at_s: u64,
    /// When the key was claimed again (the stream record's time), epoch seconds.
    pub retried_at_s: u64,
    /// Retry − deletion, seconds.
    pub after_deletion_s: u64,
    /// Retry − the earlier record's `expires_at`, seconds: how much longer `ttl` + `retain` would have
    /// had to be to answer this retry.
    pub after_expiry_s: u64,
    /// Retry − the earlier record's completion, seconds (when known, see
    /// [`TtlDeletion::age_since_completion_s`]).
    pub after_completion_s: Option<u64>,
}

/// How the auditor remembers deletions, and what it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditConfig {
    /// How long after a deletion (in event time) a claim of the same key still counts as a late retry.
    pub window: Duration,
    /// At most this many deletions remembered at once (the oldest are forgotten first).
    pub max_tracked: usize,
    /// The functions' `ttl`, to date a completion from its record (`None`: ages since completion are
    /// not reported).
    pub ttl: Option<Duration>,
    /// Changes before this instant (epoch seconds) only feed the correlation: they are neither
    /// reported nor counted.
    pub report_from_s: Option<u64>,
}

impl AuditConfig {
    /// With [`window`](Self::window) `window`.
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// With [`max_tracked`](Self::max_tracked) `max`.
    #[must_use]
    pub fn max_tracked(mut self, max: usize) -> Self {
        self.max_tracked = max;
        self
    }

    /// With the functions' [`ttl`](Self::ttl).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Reporting only changes from `epoch_s` on ([`report_from_s`](Self::report_from_s)).
    #[must_use]
    pub fn report_from(mut self, epoch_s: u64) -> Self {
        self.report_from_s = Some(epoch_s);
        self
    }
}

impl Default for AuditConfig {
    /// A window of 7 days, at most a million deletions remembered (about 100 MB), no `ttl`.
    fn default() -> Self {
        Self {
            window: Duration::from_hours(7 * 24),
            max_tracked: 1_000_000,
            ttl: None,
            report_from_s: None,
        }
    }
}

/// The audit's figures so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Summary {
    /// Stream records seen (duplicates and records before [`AuditConfig::report_from_s`] included).
    pub changes: u64,
    /// TTL deletions, recognised by [`Rule::ServiceIdentity`].
    pub ttl_deletions_by_identity: u64,
    /// TTL deletions, recognised by [`Rule::Expiry`].
    pub ttl_deletions_by_expiry: u64,
    /// Deletions that were not TTL's (a user's `DeleteItem`).
    pub other_deletions: u64,
    /// Keys claimed again after TTL deleted their record.
    pub late_retries: u64,
    /// Stream records seen again (the same position of a key's changes), ignored.
    pub duplicates: u64,
    /// Items that are not idempotency records of this table's layout and names.
    pub not_records: u64,
    /// Deletions forgotten before their window ended, to stay within [`AuditConfig::max_tracked`].
    pub forgotten: u64,
    /// The shortest deletion lag, seconds.
    pub min_lag_s: Option<u64>,
    /// The longest deletion lag, seconds.
    pub max_lag_s: Option<u64>,
    /// The mean deletion lag, seconds.
    pub mean_lag_s: Option<u64>,
    /// The longest [`LateRetry::after_expiry_s`]: `ttl` + `retain` would have to be at least this much
    /// longer to answer every late retry seen.
    pub max_retry_after_expiry_s: Option<u64>,
    /// The longest [`LateRetry::after_completion_s`]: with `ttl` + `retain` above it, every late retry
    /// seen would have been answered.
    pub max_retry_after_completion_s: Option<u64>,
    #[serde(skip)]
    lag_sum_s: u128,
}

impl Summary {
    /// All TTL deletions.
    #[must_use]
    pub fn ttl_deletions(&self) -> u64 {
        self.ttl_deletions_by_identity + self.ttl_deletions_by_expiry
    }
}

/// A deletion remembered for the window.
#[derive(Debug, Clone)]
struct Tracked {
    deleted_at_s: u64,
    expires_at_s: u64,
    completed_at_s: Option<u64>,
    /// The sequence number of the key's latest change seen: a record at or before it is a duplicate.
    last_sequence: String,
    /// A claim after the deletion was counted.
    retried: bool,
    /// Which remembered deletion this is: its entry in [`Auditor::order`] has the same.
    generation: u64,
}

/// The audit's logic: fed the stream's changes in order ([`observe`](Self::observe)), it reports
/// [`Finding`]s and keeps a [`Summary`].
///
/// Changes of one key must come in stream order (as a shard's records, parents before children; a
/// Lambda stream consumer gets them so); changes of different keys may interleave freely. A change
/// seen again (a reread batch) is recognised by its sequence number and ignored.
#[derive(Debug)]
pub struct Auditor {
    store: DynamoDbStore,
    config: AuditConfig,
    tracked: HashMap<u64, Tracked>,
    /// Tracked keys in the order they were deleted: deletion time, key hash, generation (an entry
    /// whose key was deleted again since is stale, and skipped).
    order: VecDeque<(u64, u64, u64)>,
    generations: u64,
    summary: Summary,
}

impl Auditor {
    /// An auditor of `store`'s table: its [`Layout`](crate::Layout) and
    /// [`AttributeNames`](crate::AttributeNames) decode the stream's images.
    #[must_use]
    pub fn new(store: &DynamoDbStore, config: AuditConfig) -> Self {
        Self {
            store: store.clone(),
            config,
            tracked: HashMap::new(),
            order: VecDeque::new(),
            generations: 0,
            summary: Summary::default(),
        }
    }

    /// The figures so far.
    #[must_use]
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// How many deletions are remembered now.
    #[must_use]
    pub fn tracked(&self) -> usize {
        self.tracked.len()
    }

    /// Takes in the next change; returns what it was, if the audit cares.
    pub fn observe(&mut self, change: &Change) -> Option<Finding> {
        self.summary.changes += 1;
        let reported = match (self.config.report_from_s, change.created_at_s) {
            (Some(from), Some(at)) => at >= from,
            (Some(_), None) | (None, _) => true,
        };
        if let Some(at) = change.created_at_s {
            self.forget_before(at.saturating_sub(self.config.window.as_secs()));
        }
        match (&change.old_image, &change.new_image) {
            (Some(old), None) => self.deletion(change, old, reported),
            (None, Some(new)) => self.insertion(change, new, reported),
            _ => None,
        }
    }

    fn deletion(
        &mut self,
        change: &Change,
        old: &HashMap<String, AttributeValue>,
        reported: bool,
    ) -> Option<Finding> {
        let Ok(record) = self.store.parse_item(old) else {
            self.summary.not_records += u64::from(reported);
            return None;
        };
        let hash = key_hash(&record.key);
        if let Some(known) = self.tracked.get_mut(&hash) {
            if !is_after(&change.sequence_number, &known.last_sequence) {
                self.summary.duplicates += 1;
                return None;
            }
            known.last_sequence.clone_from(&change.sequence_number);
        }
        let Some(rule) = ttl_rule(change, &record) else {
            self.summary.other_deletions += u64::from(reported);
            return None;
        };
        let deleted_at_s = change.created_at_s.unwrap_or(record.expires_at_s);
        let completed_at_s = self.completed_at(&record);
        self.remember(
            hash,
            Tracked {
                deleted_at_s,
                expires_at_s: record.expires_at_s,
                completed_at_s,
                last_sequence: change.sequence_number.clone(),
                retried: false,
                generation: 0,
            },
        );
        if !reported {
            return None;
        }
        let lag = deleted_at_s.saturating_sub(record.expires_at_s);
        let namespace = namespace(&record.key).to_owned();
        match rule {
            Rule::ServiceIdentity => self.summary.ttl_deletions_by_identity += 1,
            Rule::Expiry => self.summary.ttl_deletions_by_expiry += 1,
        }
        let s = &mut self.summary;
        s.min_lag_s = Some(s.min_lag_s.map_or(lag, |m| m.min(lag)));
        s.max_lag_s = Some(s.max_lag_s.map_or(lag, |m| m.max(lag)));
        s.lag_sum_s += u128::from(lag);
        s.mean_lag_s = u64::try_from(s.lag_sum_s / u128::from(s.ttl_deletions())).ok();
        #[cfg(feature = "metrics")]
        {
            metrics::counter!("idempotency_ttl_deletions_total", "namespace" => namespace.clone(), "rule" => rule.as_str()).increment(1);
            #[allow(clippy::cast_precision_loss)]
            metrics::histogram!("idempotency_ttl_deletion_lag_seconds", "namespace" => namespace.clone())
                .record(lag as f64);
        }
        Some(Finding::TtlDeletion(TtlDeletion {
            namespace,
            status: record.status,
            rule,
            deleted_at_s,
            expires_at_s: record.expires_at_s,
            deletion_lag_s: lag,
            age_since_completion_s: completed_at_s.map(|c| deleted_at_s.saturating_sub(c)),
            key: record.key,
        }))
    }

    fn insertion(
        &mut self,
        change: &Change,
        new: &HashMap<String, AttributeValue>,
        reported: bool,
    ) -> Option<Finding> {
        let Ok(record) = self.store.parse_item(new) else {
            self.summary.not_records += u64::from(reported);
            return None;
        };
        let known = self.tracked.get_mut(&key_hash(&record.key))?;
        if !is_after(&change.sequence_number, &known.last_sequence) {
            self.summary.duplicates += 1;
            return None;
        }
        known.last_sequence.clone_from(&change.sequence_number);
        let retried_at_s = change.created_at_s.unwrap_or(known.deleted_at_s);
        // The age-based forgetting stops at the first deletion still in the window, and deletions
        // read from several shards are not in time order: one past the window may still be here.
        if known.retried
            || retried_at_s.saturating_sub(known.deleted_at_s) > self.config.window.as_secs()
        {
            return None;
        }
        known.retried = true;
        if !reported {
            return None;
        }
        let retry = LateRetry {
            namespace: namespace(&record.key).to_owned(),
            deleted_at_s: known.deleted_at_s,
            retried_at_s,
            after_deletion_s: retried_at_s.saturating_sub(known.deleted_at_s),
            after_expiry_s: retried_at_s.saturating_sub(known.expires_at_s),
            after_completion_s: known.completed_at_s.map(|c| retried_at_s.saturating_sub(c)),
            key: record.key,
        };
        let s = &mut self.summary;
        s.late_retries += 1;
        s.max_retry_after_expiry_s = s.max_retry_after_expiry_s.max(Some(retry.after_expiry_s));
        s.max_retry_after_completion_s =
            s.max_retry_after_completion_s.max(retry.after_completion_s);
        #[cfg(feature = "metrics")]
        metrics::counter!("dynamo_ttl_delete_before_retry_total", "namespace" => retry.namespace.clone())
            .increment(1);
        tracing::warn!(
            key = %crate::telemetry::escaped(&retry.key),
            after_deletion_s = retry.after_deletion_s,
            after_expiry_s = retry.after_expiry_s,
            "a key was claimed again after TTL deleted its record"
        );
        Some(Finding::LateRetry(retry))
    }

    /// The completion time of a COMPLETED `record`, from the configured ttl.
    fn completed_at(&self, record: &Record) -> Option<u64> {
        let ttl = self.config.ttl?.as_secs();
        (record.status == Status::Completed).then(|| {
            record
                .replay_until_s
                .unwrap_or(record.expires_at_s)
                .saturating_sub(ttl)
        })
    }

    fn remember(&mut self, hash: u64, mut tracked: Tracked) {
        if self.config.max_tracked == 0 {
            return;
        }
        self.generations += 1;
        tracked.generation = self.generations;
        self.order
            .push_back((tracked.deleted_at_s, hash, tracked.generation));
        self.tracked.insert(hash, tracked);
        while self.order.len() > self.config.max_tracked {
            if self.pop_oldest() {
                self.summary.forgotten += 1;
            }
        }
    }

    /// Forgets deletions older than `cutoff_s` (epoch seconds).
    fn forget_before(&mut self, cutoff_s: u64) {
        while self.order.front().is_some_and(|(at, ..)| *at < cutoff_s) {
            self.pop_oldest();
        }
    }

    /// Forgets the oldest deletion; whether it was still remembered (not replaced by a later one).
    fn pop_oldest(&mut self) -> bool {
        let Some((_, hash, generation)) = self.order.pop_front() else {
            return false;
        };
        let current = self
            .tracked
            .get(&hash)
            .is_some_and(|t| t.generation == generation);
        if current {
            self.tracked.remove(&hash);
        }
        current
    }
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's `serialize_with` passes a reference"
)]
fn status_text<S: serde::Serializer>(status: &Status, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(status.as_str())
}

/// The rule by which `change`, a deletion of `record`, was TTL's, if it was.
fn ttl_rule(change: &Change, record: &Record) -> Option<Rule> {
    if let Some(id) = &change.identity {
        (id.kind == SERVICE_IDENTITY_TYPE && id.principal == TTL_PRINCIPAL)
            .then_some(Rule::ServiceIdentity)
    } else {
        let at = change.created_at_s?;
        // A time on a whole minute may be a rounded one: the deletion was within that minute.
        let latest = if at % 60 == 0 {
            at.saturating_add(59)
        } else {
            at
        };
        (record.expires_at_s <= latest).then_some(Rule::Expiry)
    }
}

/// Whether the sequence number `a` comes after `b` (both decimal digits, of any length). A change
/// without a sequence number (none in a well-formed stream record) comes after anything: it cannot be
/// recognised as seen before, and is not taken for a duplicate.
fn is_after(a: &str, b: &str) -> bool {
    if a.is_empty() || b.is_empty() {
        return true;
    }
    let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
    (a.len(), a) > (b.len(), b)
}

fn key_hash(key: &str) -> u64 {
    foldhash::quality::FixedState::default().hash_one(key)
}

/// The namespace of a record key: before its last `#`.
fn namespace(key: &str) -> &str {
    key.rsplit_once('#').map_or(key, |(ns, _)| ns)
}

#[cfg(test)]
mod tests;
