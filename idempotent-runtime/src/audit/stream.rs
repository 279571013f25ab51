//! [`StreamReader`]: the table's stream, polled with the Streams API (`aws-sdk-dynamodbstreams`).
//!
//! Shards are listed with `DescribeStream` (paged), read parents before children (so that a key's changes
//! are seen in order across a shard split), with `GetShardIterator` and `GetRecords`. Iterators expire
//! 15 minutes after they are handed out: an `ExpiredIteratorException` is answered with a new iterator
//! after the last record read. A `TrimmedDataAccessException` (the position is older than the stream's
//! 24 hours) restarts the shard at its oldest record (records read before are not fed to the auditor again), and is counted: records were lost in between. A
//! shard that no longer exists (`ResourceNotFoundException`) is dropped, and counted. Throttling
//! (`LimitExceededException`: more than two readers on a shard) waits and tries again.

use std::collections::HashSet;
use std::time::Duration;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodbstreams::error::ProvideErrorMetadata as _;
use aws_sdk_dynamodbstreams::types::{Record, ShardIteratorType};

use super::{Auditor, Change, Finding, Identity};
use crate::BoxError;

/// The audit could not read the stream. Each variant is `#[non_exhaustive]` too: match it with `..`,
/// so that a field a variant gains later breaks no caller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The table has no stream, or one without the old images the audit reads.
    #[error(
        "table `{table}` has {what}; the audit reads a stream of NEW_AND_OLD_IMAGES: turn it on with `idempotent table create --table {table} --stream` (or UpdateTable with StreamSpecification StreamEnabled=true, StreamViewType=NEW_AND_OLD_IMAGES)"
    )]
    #[non_exhaustive]
    NoStream {
        /// The table.
        table: String,
        /// What it has instead: "no stream", "a stream of `KEYS_ONLY`".
        what: String,
    },
    /// A request failed (after the SDK's retries).
    #[error("{operation} failed: {source}")]
    #[non_exhaustive]
    Request {
        /// The request: `DescribeTable`, `DescribeStream`, `GetShardIterator`, `GetRecords`.
        operation: &'static str,
        /// The SDK's error.
        #[source]
        source: BoxError,
    },
    /// A request could not be signed: no AWS credentials, or a credentials configuration that fails.
    #[error(
        "{operation} failed: no usable AWS credentials ({source}): configure them (environment, profile, role); DynamoDB Local accepts any, e.g. AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local"
    )]
    #[non_exhaustive]
    Credentials {
        /// The request: `DescribeTable`, `DescribeStream`, `GetShardIterator`, `GetRecords`.
        operation: &'static str,
        /// The credentials provider's error.
        #[source]
        source: BoxError,
    },
}

fn request(
    operation: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> AuditError {
    if let Some(why) = credentials_error(&e) {
        return AuditError::Credentials {
            operation,
            source: why.into(),
        };
    }
    AuditError::Request {
        operation,
        source: Box::new(e),
    }
}

/// The credentials provider's error in `e`'s chain of sources, with its own sources, as text: the
/// SDK reports it as an "unhandled error" that does not say so.
fn credentials_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use aws_credential_types::provider::error::CredentialsError;
    let mut source = Some(e);
    while let Some(error) = source {
        if error.downcast_ref::<CredentialsError>().is_some() {
            let mut text = error.to_string();
            let mut cause = error.source();
            while let Some(c) = cause {
                let line = c.to_string();
                // Providers often repeat their source's text in their own.
                if !text.contains(&line) {
                    text = format!("{text}: {line}");
                }
                cause = c.source();
            }
            return Some(text);
        }
        source = error.source();
    }
    None
}

/// The ARN of `table`'s stream, as `DescribeTable` reports it.
///
/// # Errors
/// [`AuditError::NoStream`] when the table has no stream, or one without old and new images;
/// [`AuditError::Request`] when `DescribeTable` fails.
pub async fn stream_arn(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<String, AuditError> {
    let described = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| request("DescribeTable", aws_sdk_dynamodb::Error::from(e)))?;
    let description = described.table();
    let spec = description.and_then(|t| t.stream_specification());
    let no_stream = |what: String| AuditError::NoStream {
        table: table.to_owned(),
        what,
    };
    match spec {
        Some(spec) if spec.stream_enabled() => {
            let view = spec.stream_view_type().map(|v| v.as_str().to_owned());
            if view.as_deref() != Some("NEW_AND_OLD_IMAGES") {
                return Err(no_stream(format!(
                    "a stream of {}",
                    view.unwrap_or_else(|| "unknown images".to_owned())
                )));
            }
            description
                .and_then(|t| t.latest_stream_arn())
                .map(str::to_owned)
                .ok_or_else(|| no_stream("no stream ARN".to_owned()))
        }
        _ => Err(no_stream("no stream".to_owned())),
    }
}

/// Where a reader starts in the shards that exist when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StartFrom {
    /// The oldest record the stream keeps (24 hours).
    #[default]
    TrimHorizon,
    /// Records written from now on.
    Latest,
}

/// How a [`StreamReader`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Keep reading new records (until the future is dropped); else stop once every shard is read.
    pub follow: bool,
    /// Where to start.
    pub start: StartFrom,
    /// How long to wait after a round of reads that found nothing new.
    pub poll_interval: Duration,
    /// Without `follow`: an open shard counts as read after this many reads in a row return no record
    /// (a stream may return an empty page before records that follow it), or once a read returns a
    /// record written after the read started. A closed shard is read to its end.
    pub idle_polls: u32,
    /// Records per `GetRecords` (at most 1,000).
    pub limit: i32,
}

impl ReadOptions {
    /// With [`follow`](Self::follow).
    #[must_use]
    pub fn follow(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    /// Starting from `start`.
    #[must_use]
    pub fn start(mut self, start: StartFrom) -> Self {
        self.start = start;
        self
    }

    /// With [`poll_interval`](Self::poll_interval).
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// With [`idle_polls`](Self::idle_polls).
    #[must_use]
    pub fn idle_polls(mut self, polls: u32) -> Self {
        self.idle_polls = polls;
        self
    }

    /// With [`limit`](Self::limit) records per read (1 to 1,000).
    #[must_use]
    pub fn limit(mut self, limit: i32) -> Self {
        self.limit = limit;
        self
    }
}

impl Default for ReadOptions {
    /// From the trim horizon, not following, a second between idle rounds, 3 idle reads, 1,000 records
    /// per read.
    fn default() -> Self {
        Self {
            follow: false,
            start: StartFrom::TrimHorizon,
            poll_interval: Duration::from_secs(1),
            idle_polls: 3,
            limit: 1000,
        }
    }
}

/// What a [`StreamReader`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ReadStats {
    /// Shards read.
    pub shards: u64,
    /// Stream records read.
    pub records: u64,
    /// `GetRecords` requests.
    pub get_records: u64,
    /// Iterators renewed after they expired.
    pub expired_iterators: u64,
    /// Positions trimmed from the stream before they were read: records lost.
    pub trimmed: u64,
    /// Shards that disappeared before they were read to their end.
    pub shards_gone: u64,
    /// Reads refused for throttling, and tried again.
    pub throttled: u64,
}

#[derive(Debug)]
struct Shard {
    id: String,
    parent: Option<String>,
    /// How a fresh iterator starts, until a record was read.
    start: ShardIteratorType,
    /// The last record read since the iterator's start (where a renewed iterator continues).
    after: Option<String>,
    /// The last record fed to the auditor, kept across a restart from the trim horizon: records at or
    /// before it are not fed again.
    fed: Option<String>,
    iterator: Option<String>,
    /// Read to its end (a closed shard), or gone.
    finished: bool,
    /// Reads in a row that returned nothing.
    idle: u32,
    /// `DescribeStream` gave it an ending sequence number: no record will be added to it.
    closed: bool,
    /// Without `follow`: it gave a record written after the run started, so it was read as far as
    /// the run goes (on a table written to all the time, an open shard is never idle).
    caught_up: bool,
}

/// Without `follow`, a closed shard is read to its end past empty pages (a shard may return some before
/// the records further in), but at most this many in a row: a stream that never ends a closed shard
/// does not keep the run from ending.
const CLOSED_SHARD_EMPTY_PAGES: u32 = 100;

/// Reads a table's stream and feeds an [`Auditor`].
#[derive(Debug)]
pub struct StreamReader {
    client: aws_sdk_dynamodbstreams::Client,
    arn: String,
    options: ReadOptions,
    shards: Vec<Shard>,
    listed: bool,
    stats: ReadStats,
    /// When the current [`read`](Self::read) started, epoch seconds.
    started_s: u64,
}

impl StreamReader {
    /// A reader of the stream `arn` (see [`stream_arn`]).
    #[must_use]
    pub fn new(
        client: aws_sdk_dynamodbstreams::Client,
        arn: impl Into<String>,
        options: ReadOptions,
    ) -> Self {
        Self {
            client,
            arn: arn.into(),
            options,
            shards: Vec::new(),
            listed: false,
            stats: ReadStats::default(),
            started_s: 0,
        }
    }

    /// What it did so far.
    #[must_use]
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// Reads the stream into `auditor`, calling `on_finding` with each finding: until every shard is read
    /// (closed shards to their end, open ones until [`ReadOptions::idle_polls`] reads found nothing, or
    /// until a read returns records written after this call started),
    /// or with [`ReadOptions::follow`], for as long as the future runs.
    ///
    /// # Errors
    /// [`AuditError::Request`] when a request fails otherwise than as the module's docs describe.
    pub async fn read(
        &mut self,
        auditor: &mut Auditor,
        on_finding: &mut (dyn FnMut(Finding) + Send),
    ) -> Result<(), AuditError> {
        let mut relist = true;
        let mut listed_at = tokio::time::Instant::now();
        self.started_s = crate::clock::Clock::now_ms(&crate::clock::SystemClock) / 1000;
        for shard in &mut self.shards {
            shard.caught_up = false;
        }
        loop {
            // New shards appear when a shard closes (a split, or every few hours on AWS).
            if relist || (self.options.follow && listed_at.elapsed() > Duration::from_mins(1)) {
                self.list_shards().await?;
                listed_at = tokio::time::Instant::now();
                relist = false;
            }
            let ready = self.ready();
            if ready.is_empty() && !self.options.follow {
                return Ok(());
            }
            let mut records = 0;
            for i in ready {
                records += self.poll(i, auditor, on_finding).await?;
                relist |= self.shards[i].finished;
            }
            if records == 0 && !relist {
                tokio::time::sleep(self.options.poll_interval).await;
            }
        }
    }

    /// The shards to read now: not finished, their parent finished (or unknown: trimmed), and without
    /// `follow`, not idle.
    fn ready(&self) -> Vec<usize> {
        let finished: HashSet<&str> = self
            .shards
            .iter()
            .filter(|s| s.finished)
            .map(|s| s.id.as_str())
            .collect();
        let known: HashSet<&str> = self.shards.iter().map(|s| s.id.as_str()).collect();
        (0..self.shards.len())
            .filter(|&i| {
                let s = &self.shards[i];
                let idle_polls = if s.closed {
                    CLOSED_SHARD_EMPTY_PAGES.max(self.options.idle_polls)
                } else {
                    self.options.idle_polls
                };
                !s.finished
                    && (self.options.follow || (!s.caught_up && s.idle < idle_polls))
                    && s.parent
                        .as_deref()
                        .is_none_or(|p| finished.contains(p) || !known.contains(p))
            })
            .collect()
    }

    /// Adds the shards `DescribeStream` lists that are not known yet.
    async fn list_shards(&mut self) -> Result<(), AuditError> {
        let first = !self.listed;
        let mut after: Option<String> = None;
        loop {
            let out = self
                .client
                .describe_stream()
                .stream_arn(&self.arn)
                .set_exclusive_start_shard_id(after.take())
                .send()
                .await
                .map_err(|e| request("DescribeStream", aws_sdk_dynamodbstreams::Error::from(e)))?;
            let Some(description) = out.stream_description() else {
                break;
            };
            for shard in description.shards() {
                let Some(id) = shard.shard_id() else { continue };
                let closed = shard
                    .sequence_number_range()
                    .and_then(|r| r.ending_sequence_number())
                    .is_some();
                if let Some(known) = self.shards.iter_mut().find(|s| s.id == id) {
                    known.closed |= closed;
                    continue;
                }
                // `Latest` applies to the shards open when the reader starts; a closed one has
                // nothing new, and a shard found later is read from its start.
                let latest = first && self.options.start == StartFrom::Latest;
                self.shards.push(Shard {
                    id: id.to_owned(),
                    parent: shard.parent_shard_id().map(str::to_owned),
                    start: if latest {
                        ShardIteratorType::Latest
                    } else {
                        ShardIteratorType::TrimHorizon
                    },
                    after: None,
                    fed: None,
                    iterator: None,
                    finished: latest && closed,
                    idle: 0,
                    closed,
                    caught_up: false,
                });
                self.stats.shards += 1;
            }
            match description.last_evaluated_shard_id() {
                Some(last) => after = Some(last.to_owned()),
                None => break,
            }
        }
        self.listed = true;
        Ok(())
    }

    /// One `GetRecords` on shard `i` (after getting it an iterator if needed); the number of records.
    async fn poll(
        &mut self,
        i: usize,
        auditor: &mut Auditor,
        on_finding: &mut (dyn FnMut(Finding) + Send),
    ) -> Result<usize, AuditError> {
        let Some(iterator) = self.iterator(i).await? else {
            return Ok(0);
        };
        self.stats.get_records += 1;
        let out = self
            .client
            .get_records()
            .shard_iterator(iterator)
            .limit(self.options.limit)
            .send()
            .await;
        let shard = &mut self.shards[i];
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                shard.iterator = None;
                match e.code() {
                    Some("ExpiredIteratorException") => self.stats.expired_iterators += 1,
                    Some("TrimmedDataAccessException") => {
                        self.stats.trimmed += 1;
                        shard.after = None;
                        shard.start = ShardIteratorType::TrimHorizon;
                    }
                    Some("ResourceNotFoundException") => {
                        self.stats.shards_gone += 1;
                        shard.finished = true;
                    }
                    Some("LimitExceededException") => {
                        self.stats.throttled += 1;
                        tokio::time::sleep(self.options.poll_interval).await;
                    }
                    _ => {
                        return Err(request(
                            "GetRecords",
                            aws_sdk_dynamodbstreams::Error::from(e),
                        ));
                    }
                }
                return Ok(0);
            }
        };
        let records = out.records();
        for record in records {
            let change = Change::from_stream(record);
            if !change.sequence_number.is_empty() {
                shard.after = Some(change.sequence_number.clone());
            }
            if shard
                .fed
                .as_deref()
                .is_some_and(|fed| !super::is_after(&change.sequence_number, fed))
            {
                continue;
            }
            shard.fed = Some(change.sequence_number.clone());
            // After the run's start second (not in it: a record written just before the start may carry
            // the same second, or the same rounded minute).
            shard.caught_up |= change.created_at_s.is_some_and(|at| at > self.started_s);
            if let Some(finding) = auditor.observe(&change) {
                on_finding(finding);
            }
        }
        self.stats.records += records.len() as u64;
        shard.idle = if records.is_empty() {
            shard.idle + 1
        } else {
            0
        };
        // None: a closed shard, read to its end.
        shard.iterator = out.next_shard_iterator().map(str::to_owned);
        shard.finished = shard.iterator.is_none();
        Ok(records.len())
    }

    /// Shard `i`'s iterator: the one held, or a new one after the last record read (else from the
    /// shard's start). `None` when the shard is gone.
    async fn iterator(&mut self, i: usize) -> Result<Option<String>, AuditError> {
        if let Some(iterator) = self.shards[i].iterator.take() {
            return Ok(Some(iterator));
        }
        loop {
            let shard = &self.shards[i];
            let request_ = self
                .client
                .get_shard_iterator()
                .stream_arn(&self.arn)
                .shard_id(&shard.id);
            let request_ = match &shard.after {
                Some(after) => request_
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .sequence_number(after),
                None => request_.shard_iterator_type(shard.start.clone()),
            };
            let got = request_.send().await;
            let shard = &mut self.shards[i];
            match got {
                Ok(out) => return Ok(out.shard_iterator().map(str::to_owned)),
                Err(e) => match e.code() {
                    Some("TrimmedDataAccessException") if shard.after.is_some() => {
                        self.stats.trimmed += 1;
                        shard.after = None;
                        shard.start = ShardIteratorType::TrimHorizon;
                    }
                    Some("ResourceNotFoundException") => {
                        self.stats.shards_gone += 1;
                        shard.finished = true;
                        return Ok(None);
                    }
                    _ => {
                        return Err(request(
                            "GetShardIterator",
                            aws_sdk_dynamodbstreams::Error::from(e),
                        ));
                    }
                },
            }
        }
    }
}

impl Change {
    /// The change a stream record of the Streams API carries.
    #[must_use]
    pub fn from_stream(record: &Record) -> Self {
        let stream = record.dynamodb();
        let image = |item: Option<
            &std::collections::HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>,
        >| {
            item.map(|item| {
                item.iter()
                    .map(|(name, value)| (name.clone(), from_stream_value(value)))
                    .collect()
            })
        };
        Self {
            sequence_number: stream
                .and_then(|s| s.sequence_number())
                .unwrap_or_default()
                .to_owned(),
            created_at_s: stream
                .and_then(|s| s.approximate_creation_date_time())
                .and_then(|t| u64::try_from(t.secs()).ok()),
            event_name: record
                .event_name()
                .map_or_else(String::new, |n| n.as_str().to_owned()),
            identity: record.user_identity().map(|id| Identity {
                kind: id.r#type().unwrap_or_default().to_owned(),
                principal: id.principal_id().unwrap_or_default().to_owned(),
            }),
            old_image: image(stream.and_then(|s| s.old_image.as_ref())),
            new_image: image(stream.and_then(|s| s.new_image.as_ref())),
        }
    }
}

fn from_stream_value(value: &aws_sdk_dynamodbstreams::types::AttributeValue) -> AttributeValue {
    use aws_sdk_dynamodbstreams::types::AttributeValue as S;
    match value {
        S::N(n) => AttributeValue::N(n.clone()),
        S::S(s) => AttributeValue::S(s.clone()),
        S::Bool(b) => AttributeValue::Bool(*b),
        S::B(b) => AttributeValue::B(Blob::new(b.as_ref())),
        S::Null(b) => AttributeValue::Null(*b),
        S::M(m) => AttributeValue::M(
            m.iter()
                .map(|(k, v)| (k.clone(), from_stream_value(v)))
                .collect(),
        ),
        S::L(l) => AttributeValue::L(l.iter().map(from_stream_value).collect()),
        S::Ss(v) => AttributeValue::Ss(v.clone()),
        S::Ns(v) => AttributeValue::Ns(v.clone()),
        S::Bs(v) => AttributeValue::Bs(v.iter().map(|b| Blob::new(b.as_ref())).collect()),
        // A type newer than this SDK: no record attribute has it, so the record will not decode.
        _ => AttributeValue::Null(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(follow: bool, shards: &[(&str, Option<&str>, bool, u32)]) -> StreamReader {
        let config = aws_sdk_dynamodbstreams::Config::builder()
            .behavior_version(aws_sdk_dynamodbstreams::config::BehaviorVersion::latest())
            .build();
        let mut r = StreamReader::new(
            aws_sdk_dynamodbstreams::Client::from_conf(config),
            "arn",
            ReadOptions::default().follow(follow).idle_polls(2),
        );
        for (id, parent, finished, idle) in shards {
            r.shards.push(Shard {
                id: (*id).to_owned(),
                parent: parent.map(str::to_owned),
                start: ShardIteratorType::TrimHorizon,
                after: None,
                fed: None,
                iterator: None,
                finished: *finished,
                idle: *idle,
                closed: false,
                caught_up: false,
            });
        }
        r
    }

    #[test]
    fn a_child_shard_is_read_only_after_its_parent() {
        // A split: `a` has two children; `b` closed and was read; `c` lost its parent to trimming.
        let r = reader(
            false,
            &[
                ("a", None, false, 0),
                ("a1", Some("a"), false, 0),
                ("a2", Some("a"), false, 0),
                ("b", None, true, 0),
                ("b1", Some("b"), false, 0),
                ("c1", Some("trimmed"), false, 0),
            ],
        );
        let ids = |r: &StreamReader| {
            r.ready()
                .into_iter()
                .map(|i| r.shards[i].id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&r), ["a", "b1", "c1"]);
        let mut r = r;
        r.shards[0].finished = true;
        assert_eq!(ids(&r), ["a1", "a2", "b1", "c1"]);
        // Without --follow, an open shard read empty `idle_polls` times in a row is done for this run;
        // with --follow it is polled again.
        r.shards[1].idle = 2;
        assert_eq!(ids(&r), ["a2", "b1", "c1"]);
        r.options.follow = true;
        assert_eq!(ids(&r), ["a1", "a2", "b1", "c1"]);
    }

    #[test]
    fn a_closed_shard_is_read_past_empty_pages_and_then_its_children() {
        // GetRecords may return empty pages before the records further in a shard. A closed shard ends
        // (no next iterator): three empty pages must not end it, else its children are never read.
        let mut r = reader(false, &[("a", None, false, 2), ("a1", Some("a"), false, 0)]);
        r.shards[0].closed = true;
        let ids = |r: &StreamReader| {
            r.ready()
                .into_iter()
                .map(|i| r.shards[i].id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&r), ["a"]);
        // A closed shard that only ever returns empty pages is given up on, so that the run ends.
        r.shards[0].idle = CLOSED_SHARD_EMPTY_PAGES;
        assert_eq!(ids(&r), Vec::<String>::new());
    }

    /// A fake Streams endpoint of one shard whose `GetRecords` never ends: `busy` (an open shard of a
    /// table written to all the time: a new record on every read) or empty pages of a closed shard.
    async fn endless_shard(busy: bool) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
        use std::sync::atomic::{AtomicU64, Ordering};
        let reads = std::sync::Arc::new(AtomicU64::new(0));
        let counter = reads.clone();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let reads = counter.clone();
            async move {
                let target = headers
                    .get("x-amz-target")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs();
                let body = match target.as_str() {
                    "DescribeStream" => {
                        let range = if busy {
                            serde_json::json!({"StartingSequenceNumber": "1"})
                        } else {
                            serde_json::json!({"StartingSequenceNumber": "1", "EndingSequenceNumber": "9"})
                        };
                        serde_json::json!({"StreamDescription": {"StreamArn": "arn", "StreamStatus": "ENABLED",
                            "Shards": [{"ShardId": "s1", "SequenceNumberRange": range}]}})
                    }
                    "GetShardIterator" => serde_json::json!({"ShardIterator": "it"}),
                    _ => {
                        let n = reads.fetch_add(1, Ordering::Relaxed) + 1;
                        let records = if busy {
                            serde_json::json!([{"eventID": "e", "eventName": "INSERT", "dynamodb": {
                                "ApproximateCreationDateTime": now, "SequenceNumber": (100 + n).to_string(),
                                "NewImage": {"pk": {"S": "another application's item"}}}}])
                        } else {
                            serde_json::json!([])
                        };
                        serde_json::json!({"Records": records, "NextShardIterator": "it"})
                    }
                };
                (
                    [("content-type", "application/x-amz-json-1.0")],
                    body.to_string(),
                )
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, reads)
    }

    async fn read_to_the_end(busy: bool) -> (Result<(), AuditError>, u64) {
        let (url, reads) = endless_shard(busy).await;
        let config = aws_sdk_dynamodbstreams::Config::builder()
            .behavior_version(aws_sdk_dynamodbstreams::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodbstreams::config::Region::new("us-east-1"))
            .endpoint_url(url)
            .credentials_provider(aws_sdk_dynamodbstreams::config::Credentials::new(
                "a", "b", None, None, "test",
            ))
            .build();
        let mut reader = StreamReader::new(
            aws_sdk_dynamodbstreams::Client::from_conf(config),
            "arn",
            ReadOptions::default().poll_interval(Duration::from_millis(1)),
        );
        let table = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        let store = crate::DynamoDbStore::new(aws_sdk_dynamodb::Client::from_conf(table), "t");
        let mut auditor = Auditor::new(&store, super::super::AuditConfig::default());
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            reader.read(&mut auditor, &mut |_| {}),
        )
        .await;
        let reads = reads.load(std::sync::atomic::Ordering::Relaxed);
        (read.expect("`audit` without --follow did not end"), reads)
    }

    #[tokio::test]
    async fn without_follow_a_closed_shard_of_empty_pages_ends_the_run() {
        let (read, reads) = read_to_the_end(false).await;
        read.unwrap();
        assert_eq!(u64::from(CLOSED_SHARD_EMPTY_PAGES), reads);
    }

    #[tokio::test]
    async fn without_follow_a_busy_open_shard_ends_the_run() {
        // A table written to all the time: each read of its open shard returns a record, so it never
        // has `idle_polls` empty reads in a row. The run reads what was there when it started, and ends.
        let (read, reads) = read_to_the_end(true).await;
        read.unwrap();
        assert!(reads > 1, "{reads} reads");
    }
}
