//! What the `idempotent` command line computes, as a library: a record decoded for operators
//! ([`KeyReport`]), releasing a stuck key ([`release`]), and write capacity from first principles
//! ([`capacity`]); the table's records listed and counted with a parallel `Scan` ([`list_keys`],
//! [`key_stats`]); the table's stream, for the audit ([`stream_report`], [`enable_stream`]). Behind
//! the `cli` feature.

use std::time::Duration;

use serde::Serialize;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::record::{AttributeNames, Record, Status};
use crate::store::{Change, Store, StoreError, Transition, WriteOutcome};

/// How many bytes of a stored response [`KeyReport`] shows.
pub const PREVIEW_BYTES: usize = 200;

/// A record, decoded for an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyReport {
    /// The partition key: `"{namespace}#{hex(sha256(canonical_json(key)))}"`.
    pub key: String,
    /// `PENDING`, `COMPLETED` or `FAILED`.
    pub status: String,
    /// Claims made on the key so far.
    pub attempt: u64,
    /// The fencing token of the record's last claim (or of the release that wrote it): the one call
    /// that may complete or fail it while it is PENDING.
    pub token: String,
    /// Tokens of calls that gave their claim up while it may still have been on its way
    /// ([`Record::released`]): a claim under any of them that lands later is refused. A completion
    /// clears them.
    pub released: Vec<String>,
    /// While PENDING: milliseconds until the lease runs out (negative: it ran out that long ago).
    pub lease_left_ms: Option<i64>,
    /// The expiry, epoch seconds.
    pub expires_at: u64,
    /// The expiry, as an RFC 3339 date.
    pub expires_at_utc: String,
    /// Seconds until the record counts as absent (negative: it expired that long ago).
    pub expires_in_s: i64,
    /// The stored response's size as stored (gzip-compressed when large), if any.
    pub response_bytes: Option<usize>,
    /// The start of the stored response's JSON (at most [`PREVIEW_BYTES`], inflated when compressed,
    /// never parsed), if any. Text from the record: print it with
    /// [`telemetry::escaped`](crate::telemetry::escaped) on a terminal.
    pub response_preview: Option<String>,
    /// A FAILED record's error text.
    pub error: Option<String>,
    /// Whether claim-time writes (`claim_with`) are in effect.
    pub claim_writes_in_effect: bool,
    /// Whether a payload fingerprint is stored.
    pub has_fingerprint: bool,
    /// The region whose store completed the record, when it knew its region.
    pub completed_in: Option<String>,
}

/// `epoch_s` (seconds since the epoch) as an RFC 3339 UTC time, or `(beyond the year 9999)`: an
/// `expires_at` written in milliseconds by another writer of the table is that far, and RFC 3339 (and
/// `SystemTime` on some platforms) cannot hold it.
#[must_use]
pub fn utc_text(epoch_s: u64) -> String {
    // The first second of the year 10000.
    const YEAR_10000_S: u64 = 253_402_300_800;
    std::time::UNIX_EPOCH
        .checked_add(Duration::from_secs(epoch_s))
        .filter(|_| epoch_s < YEAR_10000_S)
        .map_or_else(
            || "(beyond the year 9999)".to_owned(),
            |t| humantime::format_rfc3339_seconds(t).to_string(),
        )
}

impl KeyReport {
    /// `record` as seen at `now_ms`.
    #[must_use]
    pub fn new(record: &Record, now_ms: u64) -> Self {
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let expires_at_utc = utc_text(record.expires_at_s);
        let preview = record.response.as_deref().map(preview);
        Self {
            key: record.key.clone(),
            status: record.status.as_str().to_owned(),
            attempt: record.attempt,
            token: record.token.clone(),
            released: record.released.clone(),
            lease_left_ms: record
                .lease_until_ms
                .filter(|_| record.status == Status::Pending)
                .map(|until| signed(until) - signed(now_ms)),
            expires_at: record.expires_at_s,
            expires_at_utc,
            expires_in_s: signed(record.expires_at_s) - signed(now_ms / 1000),
            response_bytes: record.response.as_ref().map(Vec::len),
            response_preview: preview,
            error: record.error.clone(),
            claim_writes_in_effect: record.claim_writes_in_effect,
            has_fingerprint: record.fingerprint.is_some(),
            completed_in: record.completed_in.clone(),
        }
    }
}

/// The start of a stored response's JSON, as stored: at most [`PREVIEW_BYTES`], with `…` when there is
/// more. Only that much is inflated, and nothing is parsed: a record is untrusted input, and a small
/// one can inflate to hundreds of megabytes, which a listing would otherwise pay for once per record.
fn preview(bytes: &[u8]) -> String {
    let (text, whole) = match crate::codec::prefix(bytes, PREVIEW_BYTES) {
        Ok((json, whole)) => (utf8_prefix(&json), whole),
        Err(crate::codec::DecodeError::NotSerialized(reason)) => (
            format!("<not stored: the response did not serialize: {reason}>"),
            true,
        ),
        Err(e) => (format!("<undecodable: {e:?}>"), true),
    };
    let cut = text.floor_char_boundary(PREVIEW_BYTES);
    if cut < text.len() || !whole {
        format!("{}…", &text[..cut])
    } else {
        text
    }
}

/// `bytes` as text, without a character cut off at the end (invalid UTF-8 elsewhere replaced).
fn utf8_prefix(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(e) if e.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// What [`release`] did.
#[allow(
    clippy::large_enum_variant,
    reason = "an operator's one-off command: the record is handed back as the store returned it"
)]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The PENDING record is now FAILED: the next call claims it at once.
    Released,
    /// The PENDING record of an operation run with steps stays PENDING, with its steps, and its lease
    /// has lapsed: the next call takes it over at once and resumes after the finished steps. (A FAILED
    /// record would be read as a failure of the body, after which an operation with the restart policy
    /// starts over and runs its finished steps again.)
    Lapsed,
    /// The record changed since it was read (completed, failed, or claimed again); nothing was written.
    Changed(Option<Record>),
    /// The record is not PENDING: there is no claim to release; nothing was written.
    NotPending(Status),
}

/// Releases the PENDING `record`'s claim, fenced by the token it holds, so the key may be claimed at
/// once. If its worker is in fact still running, its result will not be stored
/// ([`LeaseLost`](crate::Error::LeaseLost)) once another call took the key, and that call runs the body
/// again.
///
/// A record without steps is moved to FAILED ([`Released::Released`]). It expires in an hour, or, when
/// its claim-time writes are in effect ([`Record::claim_writes_in_effect`]), at the claim's own expiry
/// if that is later: the writes stay in effect, and a retry must still find the record that says so.
///
/// A record with steps ([`Operation::steps`](crate::Operation::steps)) is not failed: a release
/// is no failure of the body, and an operation with the restart policy would start over after one and
/// run its finished steps again. Its lease is made to lapse instead ([`Released::Lapsed`]): it stays
/// PENDING with its steps and its expiry, and the next call takes it over and resumes after the
/// finished steps, whatever its policy. A worker that is still running keeps its claim if its next
/// heartbeat comes before another call: it extends the lease again.
///
/// # Errors
/// The store's error when the write fails.
pub async fn release(
    store: &dyn Store,
    record: &Record,
    now_ms: u64,
) -> Result<Released, StoreError> {
    if record.status != Status::Pending {
        return Ok(Released::NotPending(record.status));
    }
    let change = crate::handler::decide::operator_release(record, now_ms);
    let released = if matches!(change, Change::ExtendLease { .. }) {
        Released::Lapsed
    } else {
        Released::Released
    };
    let transition = Transition {
        key: &record.key,
        token: &record.token,
        change,
    };
    Ok(match store.transition(&transition).await? {
        WriteOutcome::Applied => released,
        WriteOutcome::Rejected(now) => Released::Changed(now),
    })
}

/// The traffic to size a table for ([`capacity`]). Start from [`Traffic::new`] and set the fields
/// that apply; `#[non_exhaustive]`, so that a field it gains later breaks no caller.
///
/// ```
/// # use std::time::Duration;
/// use idempotent_runtime::admin::{Traffic, capacity};
/// let mut traffic = Traffic::new(100.0, Duration::from_secs(60));
/// traffic.duplicate_ratio = 0.1;
/// traffic.response_bytes = 1024;
/// assert!(capacity(&traffic).total_wcu > 0);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Traffic {
    /// First calls (new keys) per second at peak.
    pub peak_rps: f64,
    /// Duplicates per first call: duplicates arrive at `peak_rps × duplicate_ratio`. Only duplicates that
    /// reach the table count: one arriving in the process where a call on its key is in flight follows
    /// that call and sends nothing (coalescing, [`Builder::coalesce`](crate::Builder::coalesce)).
    pub duplicate_ratio: f64,
    /// The stored response's size in bytes.
    pub response_bytes: u64,
    /// Whether completions are transactions (`transact = tx`).
    pub transactional: bool,
    /// Business items written per transactional completion.
    pub business_items: u64,
    /// Each business item's size in bytes.
    pub business_item_bytes: u64,
    /// The body's running time, for heartbeats (every third of the lease).
    pub body: Option<Duration>,
    /// The lease.
    pub lease: Duration,
    /// Steps per first call, for a body run with steps (`.steps()`): one write each.
    pub steps: u64,
    /// Each step's stored value in bytes (JSON; a step's write carries every step before it).
    pub step_bytes: u64,
}

impl Traffic {
    /// `peak_rps` first calls per second at peak, each holding its claim for `lease`: no duplicates, no
    /// response, no business writes, no steps, and bodies too short for a heartbeat.
    #[must_use]
    pub fn new(peak_rps: f64, lease: Duration) -> Self {
        Self {
            peak_rps,
            duplicate_ratio: 0.0,
            response_bytes: 0,
            transactional: false,
            business_items: 0,
            business_item_bytes: 0,
            body: None,
            lease,
            steps: 0,
            step_bytes: 0,
        }
    }
}

/// Write capacity units per second, by where they go ([`capacity`]); each rounded up to a whole unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Capacity {
    /// Claims: one conditional write per first call.
    pub claims_wcu: u64,
    /// Completions: one write per first call (a transaction: twice the size of every item written).
    pub completions_wcu: u64,
    /// Duplicates: a failed conditional write still consumes the size of the item it read.
    pub duplicates_wcu: u64,
    /// Heartbeats of long bodies.
    pub heartbeats_wcu: u64,
    /// Step writes of bodies run with steps: one per step, each the record with the steps so far.
    pub steps_wcu: u64,
    /// All of it.
    pub total_wcu: u64,
    /// The simpler `peak × (1 + duplicate ratio)`, for comparison; it counts one write per call.
    pub reference_wcu: u64,
    /// The record's estimated size with the response, in bytes.
    pub record_bytes: u64,
}

/// Write capacity units a write of `bytes` consumes: one per started kilobyte.
fn wcu(bytes: u64) -> f64 {
    // At most a few hundred: exact in f64.
    #[allow(clippy::cast_precision_loss)]
    let units = bytes.div_ceil(1024).max(1) as f64;
    units
}

/// Write capacity per second for `traffic`, from first principles: a first call costs its claim (the
/// record without a response) plus its completion (the record with it); a duplicate's failed condition
/// consumes the size of the existing, completed record; a transactional completion costs twice per item
/// written; a body running longer than a third of its lease adds a heartbeat per third; a body run with
/// steps adds one write per step, of the record with every step finished so far.
#[must_use]
pub fn capacity(traffic: &Traffic) -> Capacity {
    // The record besides its response, with a typical key and a fingerprint, counted as DynamoDB does.
    let overhead = u64::try_from(
        crate::size::MAX_ITEM_BYTES
            - crate::size::response_budget(
                &AttributeNames::default(),
                &format!("{}#{}", "billing::charge", "0".repeat(64)),
                Some(&"0".repeat(64)),
            ),
    )
    .unwrap_or(u64::MAX);
    let record_bytes = overhead + traffic.response_bytes;
    let peak = traffic.peak_rps;
    let claims_wcu = peak * wcu(overhead);
    let completions_wcu = if traffic.transactional {
        #[allow(clippy::cast_precision_loss)]
        let items = traffic.business_items as f64;
        peak * 2.0 * (wcu(record_bytes) + items * wcu(traffic.business_item_bytes))
    } else {
        peak * wcu(record_bytes)
    };
    let duplicates_wcu = peak * traffic.duplicate_ratio * wcu(record_bytes);
    let heartbeats_wcu = traffic.body.map_or(0.0, |body| {
        let every = (traffic.lease / 3).max(Duration::from_millis(1));
        #[allow(clippy::cast_precision_loss)]
        let beats = (body.as_millis() / every.as_millis()) as f64;
        peak * beats * wcu(overhead)
    });
    // The steps' origin and encoding: about 60 bytes beside the values.
    let steps_wcu: f64 = (1..=traffic.steps)
        .map(|done| peak * wcu(overhead + 60 + done * (traffic.step_bytes + 16)))
        .sum();
    // Rates of at most billions of units: a whole number of them fits u64 exactly.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let units = |x: f64| x.max(0.0).ceil() as u64;
    let (claims, completions, duplicates, heartbeats, steps) = (
        units(claims_wcu),
        units(completions_wcu),
        units(duplicates_wcu),
        units(heartbeats_wcu),
        units(steps_wcu),
    );
    Capacity {
        claims_wcu: claims,
        completions_wcu: completions,
        duplicates_wcu: duplicates,
        heartbeats_wcu: heartbeats,
        steps_wcu: steps,
        total_wcu: claims + completions + duplicates + heartbeats + steps,
        reference_wcu: units(peak * (1.0 + traffic.duplicate_ratio)),
        record_bytes,
    }
}

/// Which records [`list_keys`] lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyFilter {
    /// Only records in this status.
    pub status: Option<Status>,
    /// Only records that stopped holding their key at least this long ago: a PENDING claim whose lease
    /// ran out, a COMPLETED or FAILED record that expired (both wait for TTL to delete them).
    pub older_than: Option<Duration>,
    /// Only records of this namespace.
    pub namespace: Option<String>,
}

impl KeyFilter {
    /// Whether `record` passes, at `now_ms`.
    #[must_use]
    pub fn matches(&self, record: &Record, now_ms: u64) -> bool {
        if self.status.is_some_and(|s| s != record.status) {
            return false;
        }
        if self
            .namespace
            .as_deref()
            .is_some_and(|ns| namespace_of(&record.key) != ns)
        {
            return false;
        }
        match self.older_than {
            None => true,
            Some(age) => {
                let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
                let stale_since_ms = match (record.status, record.lease_until_ms) {
                    (Status::Pending, Some(until)) => until,
                    _ => record.expires_at_s.saturating_mul(1000),
                };
                stale_since_ms.saturating_add(age_ms) <= now_ms
            }
        }
    }
}

/// The namespace of a record key: before its last `#`.
fn namespace_of(key: &str) -> &str {
    key.rsplit_once('#').map_or(key, |(ns, _)| ns)
}

/// Called with the number of items scanned so far (from each segment's task: it must be cheap).
pub type Progress = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// The records [`list_keys`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyList {
    /// Items scanned.
    pub scanned: u64,
    /// Records that passed the filter (more than [`keys`](Self::keys) holds when the list was cut at
    /// its limit).
    pub matched: u64,
    /// Items that are not records of the store's layout and names (another application's), skipped.
    pub not_records: u64,
    /// The records that passed the filter, decoded, by key.
    pub keys: Vec<KeyReport>,
}

/// Lists the records of `store`'s table that pass `filter`, the first `limit` of them by key, with a
/// parallel `Scan` of `segments` segments (one task each; 1 to 1,000,000); `progress` hears how many
/// items were scanned. Works in every [`Layout`](crate::Layout): records are decoded by the store's
/// own decoder.
///
/// A `Scan` reads the whole table (its read capacity: about one unit per 8 KB, eventually consistent);
/// at most `limit` records per segment are kept in memory, whatever the table's size (all of them are
/// counted: [`KeyList::matched`]).
///
/// # Errors
/// [`StoreError::Invalid`] for `segments` out of range; the store's error when a `Scan` fails.
pub async fn list_keys(
    store: &crate::DynamoDbStore,
    filter: &KeyFilter,
    limit: usize,
    segments: u32,
    now_ms: u64,
    progress: Progress,
) -> Result<KeyList, StoreError> {
    let filter = std::sync::Arc::new(filter.clone());
    let parts = scan(
        store,
        segments,
        progress,
        move |part: &mut ListPart, item| {
            part.scanned += 1;
            match item {
                Ok((record, _)) if filter.matches(&record, now_ms) => {
                    part.matched += 1;
                    // The segment's `limit` smallest keys: all the final list can hold from it.
                    let largest = part.keys.last_key_value().map(|(k, _)| k.as_str());
                    if part.keys.len() < limit || largest.is_some_and(|k| record.key.as_str() < k) {
                        let report = KeyReport::new(&record, now_ms);
                        part.keys.insert(record.key, report);
                        if part.keys.len() > limit {
                            part.keys.pop_last();
                        }
                    }
                }
                Ok(_) => {}
                Err(()) => part.not_records += 1,
            }
        },
    )
    .await?;
    let mut all = KeyList::default();
    for part in parts {
        all.scanned += part.scanned;
        all.matched += part.matched;
        all.not_records += part.not_records;
        all.keys.extend(part.keys.into_values());
    }
    all.keys.sort_by(|a, b| a.key.cmp(&b.key));
    all.keys.truncate(limit);
    Ok(all)
}

/// One segment's share of a [`KeyList`].
#[derive(Default)]
struct ListPart {
    scanned: u64,
    matched: u64,
    not_records: u64,
    keys: std::collections::BTreeMap<String, KeyReport>,
}

/// At most this many distinct error lines are counted apart by [`key_stats`]; the rest are counted
/// together (as [`OTHER_ERRORS`]).
pub const MAX_ERROR_LINES: usize = 100;
/// The error line under which [`key_stats`] counts errors beyond [`MAX_ERROR_LINES`].
pub const OTHER_ERRORS: &str = "(other errors)";

/// Records of one namespace and status ([`KeyStats::groups`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyGroup {
    /// The namespace.
    pub namespace: String,
    /// `PENDING`, `COMPLETED` or `FAILED`.
    pub status: String,
    /// Records.
    pub count: u64,
    /// Their items' size, bytes (as DynamoDB counts them: names and values).
    pub bytes: u64,
    /// The largest item, bytes.
    pub max_bytes: u64,
    /// Records past their `expires_at`, waiting for TTL to delete them.
    pub expired: u64,
    /// PENDING records whose lease ran out: their worker stopped (or is late); the next call takes
    /// them over.
    pub past_lease: u64,
}

/// FAILED records with the same error's first line ([`KeyStats::errors`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ErrorLine {
    /// The namespace.
    pub namespace: String,
    /// The error's first line ([`OTHER_ERRORS`] for the lines beyond [`MAX_ERROR_LINES`]).
    pub error: String,
    /// Records.
    pub count: u64,
}

/// What [`key_stats`] counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyStats {
    /// Items scanned.
    pub scanned: u64,
    /// Items that are not records (skipped).
    pub not_records: u64,
    /// Counts and sizes by namespace and status, sorted so.
    pub groups: Vec<KeyGroup>,
    /// FAILED records by namespace and their error's first line, most frequent first.
    pub errors: Vec<ErrorLine>,
}

#[derive(Default)]
struct StatsPart {
    scanned: u64,
    not_records: u64,
    groups: std::collections::BTreeMap<(String, &'static str), KeyGroup>,
    errors: std::collections::HashMap<(String, String), u64>,
}

/// Counts `store`'s records by namespace and status (their number, sizes, how many expired, PENDING
/// past their lease) and FAILED records by their error's first line, with a parallel `Scan` as
/// [`list_keys`]. Memory stays bounded whatever the table's size: the groups, and at most
/// [`MAX_ERROR_LINES`] error lines per segment.
///
/// # Errors
/// As [`list_keys`].
pub async fn key_stats(
    store: &crate::DynamoDbStore,
    segments: u32,
    now_ms: u64,
    progress: Progress,
) -> Result<KeyStats, StoreError> {
    let parts = scan(
        store,
        segments,
        progress,
        move |part: &mut StatsPart, item| {
            part.scanned += 1;
            let Ok((record, bytes)) = item else {
                part.not_records += 1;
                return;
            };
            let namespace = namespace_of(&record.key).to_owned();
            let group = part
                .groups
                .entry((namespace.clone(), record.status.as_str()))
                .or_insert_with(|| KeyGroup {
                    namespace: namespace.clone(),
                    status: record.status.as_str().to_owned(),
                    ..KeyGroup::default()
                });
            group.count += 1;
            group.bytes += bytes;
            group.max_bytes = group.max_bytes.max(bytes);
            group.expired += u64::from(record.is_expired(now_ms));
            group.past_lease += u64::from(
                record.status == Status::Pending
                    && record.lease_until_ms.is_some_and(|until| until < now_ms),
            );
            if record.status == Status::Failed {
                let line = record
                    .error
                    .as_deref()
                    .and_then(|e| e.lines().next())
                    .unwrap_or("")
                    .to_owned();
                let line = if part.errors.len() < MAX_ERROR_LINES
                    || part.errors.contains_key(&(namespace.clone(), line.clone()))
                {
                    line
                } else {
                    OTHER_ERRORS.to_owned()
                };
                *part.errors.entry((namespace, line)).or_default() += 1;
            }
        },
    )
    .await?;
    let mut groups = std::collections::BTreeMap::new();
    let mut errors = std::collections::HashMap::<(String, String), u64>::new();
    let (mut scanned, mut not_records) = (0, 0);
    for part in parts {
        scanned += part.scanned;
        not_records += part.not_records;
        for (key, g) in part.groups {
            let all: &mut KeyGroup = groups.entry(key).or_insert_with(|| KeyGroup {
                namespace: g.namespace.clone(),
                status: g.status.clone(),
                ..KeyGroup::default()
            });
            all.count += g.count;
            all.bytes += g.bytes;
            all.max_bytes = all.max_bytes.max(g.max_bytes);
            all.expired += g.expired;
            all.past_lease += g.past_lease;
        }
        for (key, n) in part.errors {
            *errors.entry(key).or_default() += n;
        }
    }
    let mut errors: Vec<ErrorLine> = errors
        .into_iter()
        .map(|((namespace, error), count)| ErrorLine {
            namespace,
            error,
            count,
        })
        .collect();
    errors.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| (&a.namespace, &a.error).cmp(&(&b.namespace, &b.error)))
    });
    Ok(KeyStats {
        scanned,
        not_records,
        groups: groups.into_values().collect(),
        errors,
    })
}

/// A parallel `Scan` of the store's table: `segments` tasks, each folding its items (decoded by the
/// store, with their size; `Err(())`: not a record) into its own `A`.
async fn scan<A, F>(
    store: &crate::DynamoDbStore,
    segments: u32,
    progress: Progress,
    fold: F,
) -> Result<Vec<A>, StoreError>
where
    A: Default + Send + 'static,
    F: Fn(&mut A, Result<(Record, u64), ()>) + Send + Sync + 'static,
{
    if !(1..=1_000_000).contains(&segments) {
        return Err(StoreError::Invalid(
            format!("a parallel scan takes 1 to 1,000,000 segments, not {segments}").into(),
        ));
    }
    let fold = std::sync::Arc::new(fold);
    let scanned = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for segment in 0..segments {
        let (store, fold, progress, scanned) = (
            store.clone(),
            fold.clone(),
            progress.clone(),
            scanned.clone(),
        );
        tasks.spawn(async move {
            let mut acc = A::default();
            let mut start = None;
            loop {
                let page = store
                    .client()
                    .scan()
                    .table_name(store.table())
                    .segment(i32::try_from(segment).unwrap_or(i32::MAX))
                    .total_segments(i32::try_from(segments).unwrap_or(i32::MAX))
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .map_err(|e| crate::store::dynamodb::store_error(store.table(), e))?;
                let items = page.items();
                for item in items {
                    let decoded = store.parse_item(item).map_err(|_| ());
                    fold(&mut acc, decoded.map(|r| (r, item_bytes(item))));
                }
                let n = items.len() as u64;
                progress(scanned.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n);
                match page.last_evaluated_key {
                    Some(key) if !key.is_empty() => start = Some(key),
                    _ => return Ok::<A, StoreError>(acc),
                }
            }
        });
    }
    let mut parts = Vec::with_capacity(tasks.len());
    while let Some(done) = tasks.join_next().await {
        parts.push(done.map_err(|e| StoreError::Other(e.into()))??);
    }
    Ok(parts)
}

/// An item's size as DynamoDB counts it: each attribute's name and value.
fn item_bytes(item: &std::collections::HashMap<String, AttributeValue>) -> u64 {
    item.iter()
        .map(|(name, value)| (name.len() + value_bytes(value)) as u64)
        .sum()
}

fn value_bytes(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        // A number: about one byte per two digits, plus one.
        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Ss(v) | AttributeValue::Ns(v) => v.iter().map(String::len).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| k.len() + value_bytes(v) + 1)
                .sum::<usize>()
        }
        AttributeValue::L(l) => 3 + l.iter().map(|v| value_bytes(v) + 1).sum::<usize>(),
        _ => 1,
    }
}

/// The table's stream, as `DescribeTable` reports it ([`stream_report`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StreamReport {
    /// Whether a stream is on.
    pub enabled: bool,
    /// What its records hold (`NEW_AND_OLD_IMAGES`, which the audit needs; `KEYS_ONLY`, ..).
    pub view_type: Option<String>,
    /// Its ARN.
    pub arn: Option<String>,
}

impl StreamReport {
    /// Whether the audit can read it: on, with old and new images.
    #[must_use]
    pub fn fits_the_audit(&self) -> bool {
        self.enabled && self.view_type.as_deref() == Some("NEW_AND_OLD_IMAGES")
    }
}

/// The stream of `store`'s table.
///
/// # Errors
/// The store's error when `DescribeTable` fails.
pub async fn stream_report(store: &crate::DynamoDbStore) -> Result<StreamReport, StoreError> {
    let described = store
        .client()
        .describe_table()
        .table_name(store.table())
        .send()
        .await
        .map_err(|e| crate::store::dynamodb::store_error(store.table(), e))?;
    let table = described.table();
    let spec = table.and_then(|t| t.stream_specification());
    let enabled = spec.is_some_and(aws_sdk_dynamodb::types::StreamSpecification::stream_enabled);
    Ok(StreamReport {
        enabled,
        view_type: spec
            .filter(|_| enabled)
            .and_then(|s| s.stream_view_type())
            .map(|v| v.as_str().to_owned()),
        arn: table
            .filter(|_| enabled)
            .and_then(|t| t.latest_stream_arn())
            .map(str::to_owned),
    })
}

/// Turns on the table's stream with old and new images (what the audit reads), unless it is on
/// already, and waits until the table is `ACTIVE` again.
///
/// # Errors
/// [`StoreError::Schema`] when a stream of another view type is on (DynamoDB cannot change it in
/// place: turn it off first, which ends that stream for its readers); the store's error when a request
/// fails.
pub async fn enable_stream(store: &crate::DynamoDbStore) -> Result<StreamReport, StoreError> {
    let now = stream_report(store).await?;
    if now.fits_the_audit() {
        return Ok(now);
    }
    if now.enabled {
        return Err(StoreError::Schema(format!(
            "table `{}` has a stream of {}; the audit needs NEW_AND_OLD_IMAGES, and DynamoDB changes a stream's view type only by turning it off (ending it for its readers) and on again",
            store.table(),
            now.view_type.as_deref().unwrap_or("unknown images")
        )));
    }
    store
        .client()
        .update_table()
        .table_name(store.table())
        .stream_specification(
            aws_sdk_dynamodb::types::StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages)
                .build()
                .map_err(|e| StoreError::Other(e.into()))?,
        )
        .send()
        .await
        .map_err(|e| crate::store::dynamodb::store_error(store.table(), e))?;
    {
        use aws_sdk_dynamodb::client::Waiters as _;
        store
            .client()
            .wait_until_table_exists()
            .table_name(store.table())
            .wait(Duration::from_mins(2))
            .await
            .map_err(|e| StoreError::Other(e.into()))?;
    }
    stream_report(store).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The preview of a COMPLETED record holding `response`.
    fn preview(response: &[u8]) -> String {
        let record = Record {
            key: "n#00".into(),
            status: Status::Completed,
            token: "t".into(),
            attempt: 1,
            lease_until_ms: None,
            expires_at_s: 1,
            fingerprint: None,
            response: Some(response.to_vec()),
            error: None,
            replay_until_s: None,
            claim_writes_in_effect: false,
            completed_in: None,
            steps: None,
            released: Vec::new(),
            released_until_ms: None,
            released_through: None,
        };
        KeyReport::new(&record, 0).response_preview.unwrap()
    }

    /// A record of about 32 KB of gzip that inflates to 32 MiB: the preview inflates its first bytes
    /// only. Cut short, the gzip shows it: the rest, which is never inflated, does not matter.
    #[test]
    fn the_preview_inflates_only_its_prefix() {
        use std::io::Write as _;
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gzip.write_all(b"[\"").unwrap();
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..32 {
            gzip.write_all(&chunk).unwrap();
        }
        gzip.write_all(b"\"]").unwrap();
        let bomb = gzip.finish().unwrap();
        assert!(bomb.len() < 64 * 1024, "{}", bomb.len());
        let start = format!("[\"{}…", "a".repeat(PREVIEW_BYTES - 2));
        assert_eq!(preview(&bomb), start);
        assert_eq!(preview(&bomb[..bomb.len() / 2]), start);
        // Short JSON, plain or compressed, is shown whole; a cut never splits a character.
        assert_eq!(preview(b"\"ch_3\""), "\"ch_3\"");
        let long = serde_json::to_vec(&"é".repeat(PREVIEW_BYTES)).unwrap();
        let shown = preview(&crate::codec::pack(long.clone()));
        assert!(shown.ends_with('…') && shown.len() <= PREVIEW_BYTES + '…'.len_utf8());
        assert_eq!(preview(&long), shown);
        assert!(preview(&[0x1f, 0x8b, 1, 2]).starts_with("<undecodable"));
    }

    fn traffic() -> Traffic {
        Traffic {
            peak_rps: 2000.0,
            duplicate_ratio: 0.15,
            response_bytes: 200,
            transactional: false,
            business_items: 0,
            business_item_bytes: 512,
            body: None,
            lease: Duration::from_mins(1),
            steps: 0,
            step_bytes: 0,
        }
    }

    #[test]
    fn a_first_call_costs_two_writes_and_a_duplicate_one() {
        let c = capacity(&traffic());
        assert_eq!(
            (
                c.claims_wcu,
                c.completions_wcu,
                c.duplicates_wcu,
                c.total_wcu
            ),
            (2000, 2000, 300, 4300)
        );
        assert_eq!(c.reference_wcu, 2300);
    }

    #[test]
    fn a_transactional_completion_costs_twice_per_item() {
        let c = capacity(&Traffic {
            transactional: true,
            business_items: 1,
            ..traffic()
        });
        assert_eq!(c.completions_wcu, 8000);
        assert_eq!(c.total_wcu, 10_300);
    }

    #[test]
    fn each_step_costs_a_write_of_the_record_with_the_steps_so_far() {
        let c = capacity(&Traffic {
            steps: 3,
            step_bytes: 100,
            ..traffic()
        });
        // Three small steps: a kilobyte each.
        assert_eq!(c.steps_wcu, 6000);
        assert_eq!(c.total_wcu, 4300 + 6000);
        // Steps of 400 bytes: the second and third writes carry 0.8 and 1.2 KB of values beside the
        // record's own bytes, two units each.
        let c = capacity(&Traffic {
            steps: 3,
            step_bytes: 400,
            ..traffic()
        });
        assert_eq!(c.steps_wcu, 2000 * (1 + 2 + 2));
    }

    #[test]
    fn large_responses_and_long_bodies_cost_more() {
        let c = capacity(&Traffic {
            response_bytes: 3000,
            body: Some(Duration::from_secs(45)),
            ..traffic()
        });
        // 3,000 bytes and the record's own: 4 KB per completion and per duplicate.
        assert_eq!((c.completions_wcu, c.duplicates_wcu), (8000, 1200));
        // 45 s of body with a 60 s lease: a heartbeat at 20 s and at 40 s.
        assert_eq!(c.heartbeats_wcu, 4000);
    }

    #[test]
    fn a_report_shows_the_claims_token_and_the_released_ones() {
        let record = Record {
            key: "billing#00".to_owned(),
            status: Status::Failed,
            token: "b".to_owned(),
            attempt: 2,
            lease_until_ms: None,
            expires_at_s: 100,
            fingerprint: None,
            response: None,
            error: Some("released".to_owned()),
            replay_until_s: None,
            claim_writes_in_effect: false,
            completed_in: None,
            released: vec!["a".to_owned(), "b".to_owned()],
            released_until_ms: None,
            steps: None,
            released_through: None,
        };
        let report = KeyReport::new(&record, 0);
        assert_eq!(report.token, "b");
        assert_eq!(report.released, ["a", "b"]);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["released"], serde_json::json!(["a", "b"]));
    }

    #[test]
    fn a_record_expiring_past_the_year_9999_is_reported_without_a_panic() {
        // `expires_at` written in milliseconds by mistake (by another writer of the table): `keys list`
        // must still list it, and a stuck table is exactly where such a record is looked for.
        let record = Record {
            key: "billing#00".to_owned(),
            status: Status::Completed,
            token: "t".to_owned(),
            attempt: 1,
            lease_until_ms: None,
            expires_at_s: 1_700_000_000_000,
            fingerprint: None,
            response: None,
            error: None,
            replay_until_s: None,
            claim_writes_in_effect: false,
            completed_in: None,
            released: Vec::new(),
            released_until_ms: None,
            steps: None,
            released_through: None,
        };
        let report = KeyReport::new(&record, 1_700_000_000_000);
        assert_eq!(report.expires_at, 1_700_000_000_000);
        assert_eq!(report.token, "t");
        assert!(report.released.is_empty());
        assert_eq!(report.expires_at_utc, "(beyond the year 9999)");
        let record = Record {
            expires_at_s: u64::MAX,
            ..record
        };
        assert_eq!(KeyReport::new(&record, 0).expires_in_s, i64::MAX);
    }
}
