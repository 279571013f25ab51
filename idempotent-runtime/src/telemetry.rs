//! What the runtime reports about itself: one `idempotent` span per call, closed with its outcome; one
//! event per store request, with the DynamoDB error code when there is one; and, with the `metrics`
//! feature, counters and a histogram through the `metrics` facade.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `idempotency_calls_total` | `namespace`, `outcome` | calls, by how they ended ([`Outcome`]) |
//! | `idempotency_store_requests_total` | `op`, `result` | store requests, by operation and result |
//! | `idempotency_store_seconds` | `op` | store request latency (histogram) |
//! | `transact_write_cancellation_reason_total` | `reason` | canceled transactions, per failed action's code |
//! | `idempotency_consumed_wcu_total` | `op` | write capacity DynamoDB reports (`ReturnConsumedCapacity`) |
//! | `idempotency_calls_dropped_total` | `namespace`, `phase` | calls whose future was dropped before they finished (a client hung up, a timeout): `claim` (before the body started: the claim is released), `body` (while the body ran: the key stays PENDING until its lease) |
//! | `dynamo_ttl_delete_before_retry_total` | — | a claim replaced its key's expired record (a duplicate after the `ttl`) |
//! | `idempotency_region_failovers_total` | `op`, `from`, `to` | requests a [`RoutedStore`](crate::RoutedStore) with failover sent to another region than the key's home (`from`) |
//! | `dynamo_cross_region_duplicate_detected_total` | `home`, `completed_in` | a [`RoutedStore`](crate::RoutedStore)'s claim found its key COMPLETED by another region than the key's home: a claim was decided outside home-region routing (failover, a process with other regions, or one without routing) |

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use crate::error::Error;
use crate::store::StoreError;

/// How a call ended: the `outcome` field of its span and the label of `idempotency_calls_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The body ran and its result was stored.
    Executed,
    /// The body ran after this call took over a lapsed claim, and its result was stored.
    TakenOver,
    /// The stored response was returned; the body did not run.
    Replayed,
    /// The response came from the local cache, without a round trip.
    Cached,
    /// Another call holds the key.
    InProgress,
    /// The key was used with another payload.
    PayloadMismatch,
    /// The claim was taken over before the result was stored.
    LeaseLost,
    /// The body returned `Err`; the record is FAILED.
    Failed,
    /// The key was missing and the call was rejected.
    MissingKey,
    /// The key was missing and the body ran without idempotency.
    Skipped,
    /// Any other error (the store, serialization, a refused transaction, ...).
    Error,
}

impl Outcome {
    /// The label: `executed`, `taken_over`, `replayed`, `cached`, `in_progress`, `payload_mismatch`,
    /// `lease_lost`, `failed`, `missing_key`, `skipped` or `error`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::TakenOver => "taken_over",
            Outcome::Replayed => "replayed",
            Outcome::Cached => "cached",
            Outcome::InProgress => "in_progress",
            Outcome::PayloadMismatch => "payload_mismatch",
            Outcome::LeaseLost => "lease_lost",
            Outcome::Failed => "failed",
            Outcome::MissingKey => "missing_key",
            Outcome::Skipped => "skipped",
            Outcome::Error => "error",
        }
    }

    /// The outcome of a call that ended with `error`.
    pub(crate) fn of(error: &Error) -> Self {
        match error {
            Error::InProgress { .. } => Outcome::InProgress,
            Error::PayloadMismatch { .. } => Outcome::PayloadMismatch,
            Error::LeaseLost { .. } => Outcome::LeaseLost,
            Error::MissingKey { .. } => Outcome::MissingKey,
            _ => Outcome::Error,
        }
    }
}

/// Text taken from a record (an error, a key, a namespace, a region, a response), made safe for a
/// terminal or a log line: control characters are written as escapes (`\n`, `\r`, `\t`,
/// `\u{1b}`), as are the characters that reorder text or end a line without being controls
/// (bidirectional overrides and isolates, U+2028 and U+2029); everything else, backslashes included,
/// as it is.
///
/// A record is untrusted input: a body's error text often echoes its caller's input, and an item may
/// have been written by someone else. Printed raw, an escape sequence in it could retitle an
/// operator's terminal, erase a line and draw a fake one; in a log line, a newline could forge the
/// next entry. The runtime writes such text into `tracing` fields through this, and the `idempotent`
/// command line prints it so.
///
/// ```
/// use idempotent_runtime::telemetry::escaped;
/// let error = "declined\r\x1b[2Kstatus     COMPLETED\x1b]0;owned\x07";
/// assert_eq!(
///     escaped(error).to_string(),
///     "declined\\r\\u{1b}[2Kstatus     COMPLETED\\u{1b}]0;owned\\u{7}"
/// );
/// assert_eq!(escaped("naïve \\ \"ok\"").to_string(), "naïve \\ \"ok\"");
/// ```
#[must_use]
pub fn escaped(text: &str) -> Escaped<'_> {
    Escaped(text)
}

/// What [`escaped`] returns: displays its text with control characters escaped.
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(&'a str);

impl Escaped<'_> {
    /// Whether `c` is written as an escape.
    fn escapes(c: char) -> bool {
        c.is_control()
            || matches!(
                c,
                '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            )
    }
}

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(Self::escapes) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c => write!(f, "\\u{{{:x}}}", u32::from(c))?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// The first 12 digits of a record key's hash. A record key ends with its key's 64-digit hash
/// (`"{namespace}#{hash}"`), so the hash is found from the end, without scanning the namespace; any
/// other text gives its own first 12 characters, or all of it.
fn short_hash(key: &str) -> &str {
    let hash = key.get(key.len().saturating_sub(64)..).unwrap_or(key);
    hash.get(..12).unwrap_or(hash)
}

/// The span of one call. Its key field is a short prefix of the key's hash, never the key itself.
pub(crate) fn call_span(namespace: &'static str, key: &str) -> tracing::Span {
    tracing::info_span!(
        "idempotent",
        namespace,
        key = short_hash(key),
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// Records a claim's attempt number on the current span when that is a call's own ([`call_span`]):
/// with this crate's spans filtered off, the current span is the caller's, whose fields are not this
/// crate's to write.
pub(crate) fn record_attempt(number: u32) {
    let span = tracing::Span::current();
    if span
        .metadata()
        .is_some_and(|m| m.name() == "idempotent" && m.target() == module_path!())
    {
        span.record("attempt", number);
    }
}

pin_project_lite::pin_project! {
    /// A call's state machine in the call's span: entered while it is polled and while it is dropped
    /// (what a dropped call logs belongs to the call), as `tracing`'s `Instrumented` does, but with the
    /// entering and leaving out of line ([`in_span`]), compiled once rather than into each function's
    /// poll and drop.
    pub(crate) struct InSpan<F> {
        #[pin]
        future: Option<F>,
        span: tracing::Span,
    }

    impl<F> PinnedDrop for InSpan<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            in_span(this.span, &mut Dropping(this.future));
        }
    }
}

impl<F> InSpan<F> {
    /// `future`, run in `span`.
    pub(crate) fn new(future: F, span: tracing::Span) -> Self {
        Self {
            future: Some(future),
            span,
        }
    }

    /// The span.
    pub(crate) fn span(self: Pin<&mut Self>) -> &tracing::Span {
        self.project().span
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let mut polling = Polling {
            future: this.future,
            cx,
            polled: Poll::Pending,
        };
        in_span(this.span, &mut polling);
        polling.polled
    }
}

/// What [`in_span`] runs: a trait of one method rather than a `dyn FnMut`, whose vtable would carry a
/// `call_once` shim for every future.
trait InSpanDo {
    fn run(&mut self);
}

/// [`InSpan`]'s poll, inside the span.
struct Polling<'a, 'b, 'c, F: Future> {
    future: Pin<&'a mut Option<F>>,
    cx: &'b mut std::task::Context<'c>,
    polled: Poll<F::Output>,
}

impl<F: Future> InSpanDo for Polling<'_, '_, '_, F> {
    fn run(&mut self) {
        if let Some(future) = self.future.as_mut().as_pin_mut() {
            self.polled = future.poll(self.cx);
        }
    }
}

/// [`InSpan`]'s drop of its future, inside the span.
struct Dropping<'a, F>(Pin<&'a mut Option<F>>);

impl<F> InSpanDo for Dropping<'_, F> {
    fn run(&mut self) {
        self.0.set(None);
    }
}

/// `work`, run inside `span`.
#[inline(never)]
fn in_span(span: &tracing::Span, work: &mut dyn InSpanDo) {
    let _entered = span.enter();
    work.run();
}

/// Enters `span` until the guard is dropped; out of line, so that each function's code only calls it.
#[inline(never)]
pub(crate) fn enter(span: &tracing::Span) -> tracing::span::Entered<'_> {
    span.enter()
}

/// Closes a call: its span's `outcome`, and the call counter.
pub(crate) fn finish(span: &tracing::Span, namespace: &'static str, outcome: Outcome) {
    span.record("outcome", outcome.as_str());
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idempotency_calls_total",
        "namespace" => namespace,
        "outcome" => outcome.as_str()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = namespace;
}

/// A call that ended before it reached the store (a missing key): a span of its own, closed at once.
pub(crate) fn finish_early(namespace: &'static str, outcome: Outcome) {
    let span = tracing::info_span!("idempotent", namespace, outcome = tracing::field::Empty);
    finish(&span, namespace, outcome);
}

/// How a store request went, for its event and counter: `ok`, `condition_failed`, `canceled`, or the
/// error's kind; and DynamoDB's error code, when there is one.
pub(crate) trait Observed {
    fn result(&self) -> (&'static str, Option<&str>);
}

impl<T: Observed> Observed for Result<T, StoreError> {
    fn result(&self) -> (&'static str, Option<&str>) {
        match self {
            Ok(outcome) => outcome.result(),
            Err(e) => (
                match e {
                    StoreError::Throttled(_) => "throttled",
                    StoreError::Unavailable(_) => "unavailable",
                    StoreError::TableNotFound(_) => "table_not_found",
                    StoreError::Invalid(_) => "invalid",
                    StoreError::Corrupt(_) => "corrupt",
                    StoreError::Schema(_) => "schema",
                    StoreError::Unsupported { .. } => "unsupported",
                    StoreError::Other(_) => "error",
                    StoreError::AccessDenied { .. } => "access_denied",
                    StoreError::RegionUnavailable { .. } => "region_unavailable",
                },
                e.code(),
            ),
        }
    }
}

/// Runs one store request `op`: logs its result and latency, and counts it.
///
/// The clock is read only when the latency has a taker: the `metrics` histogram, or a subscriber that
/// takes this debug event. Otherwise the event (which a `log` bridge may still take) has no
/// `elapsed_us`: two reads of the clock are a measurable part of a call on the memory store.
pub(crate) async fn observe<T: Observed>(op: &'static str, request: impl Future<Output = T>) -> T {
    let started =
        (cfg!(feature = "metrics") || tracing::enabled!(tracing::Level::DEBUG)).then(Instant::now);
    let outcome = request.await;
    let elapsed = started.map(|started| started.elapsed());
    let elapsed_us = elapsed.map(|elapsed| elapsed.as_micros());
    let (result, code) = outcome.result();
    // Fields that are `None` (no error code, no latency) are left out of the event.
    tracing::debug!(
        op,
        result,
        dynamo_error_code = code,
        elapsed_us,
        "store request"
    );
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("idempotency_store_requests_total", "op" => op, "result" => result)
            .increment(1);
        metrics::histogram!("idempotency_store_seconds", "op" => op)
            .record(elapsed.unwrap_or_default().as_secs_f64());
    }
    outcome
}

/// Counts the failed actions of a canceled transaction by their code.
pub(crate) fn canceled(reasons: &[crate::CancellationReason]) {
    #[cfg(feature = "metrics")]
    for reason in reasons.iter().filter(|r| r.failed()) {
        metrics::counter!(
            "transact_write_cancellation_reason_total",
            "reason" => reason.code.clone()
        )
        .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = reasons;
}

/// Where a call was when its future was dropped: the `phase` label of `idempotency_calls_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// Before its body started: its claim (if it landed) is released.
    Claim,
    /// While its body ran (not detached): the key stays PENDING until its lease runs out.
    Body,
}

/// Counts a step of an operation run with steps: `stored` (it ran, and its value was stored) or
/// `replayed` (an earlier call finished it): `idempotency_steps_total{namespace, outcome}`.
pub(crate) fn step(namespace: &'static str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idempotency_steps_total",
        "namespace" => namespace,
        "outcome" => outcome
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (namespace, outcome);
}

/// Logs and counts a call whose future was dropped before it finished.
#[cold]
pub(crate) fn call_dropped(namespace: &'static str, phase: Dropped) {
    let phase = match phase {
        Dropped::Claim => {
            tracing::debug!(
                namespace,
                "call dropped before its body started; releasing its claim"
            );
            "claim"
        }
        Dropped::Body => {
            tracing::warn!(
                namespace,
                "call dropped while its body was running: the body stopped where it was and the key stays PENDING until its lease runs out; run it with `detach` to have it finish and store its result"
            );
            "body"
        }
    };
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idempotency_calls_dropped_total",
        "namespace" => namespace,
        "phase" => phase
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = phase;
}

/// Counts a claim that replaced its key's expired record (TTL had not deleted it yet): a duplicate that came
/// after the `ttl`. The memory store always sees it; the DynamoDB store, with the `metrics` feature, from
/// the claim's old values (`ReturnValues=UPDATED_OLD`), for plain claims (a transaction returns none).
pub(crate) fn expired_record_reclaimed() {
    tracing::debug!("the key's record had expired; claimed anew");
    #[cfg(feature = "metrics")]
    metrics::counter!("dynamo_ttl_delete_before_retry_total").increment(1);
}

/// Logs and counts a request for a key sent to region `to` instead of the key's home `from`
/// ([`RoutedStore::failover`](crate::RoutedStore::failover)): because of `error` (the home region's,
/// or the last region's tried before `to`), or, with no error, because the call's claim failed over
/// earlier and its later requests follow it.
pub(crate) fn region_failover(op: &'static str, from: &str, to: &str, error: Option<&StoreError>) {
    if let Some(error) = error {
        tracing::warn!(
            op,
            from,
            to,
            error = %error,
            "region unavailable; failing over (the key may now be claimed in two regions)"
        );
    } else {
        tracing::debug!(op, from, to, "following a claim that failed over");
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idempotency_region_failovers_total",
        "op" => op,
        "from" => from.to_owned(),
        "to" => to.to_owned()
    )
    .increment(1);
}

/// Logs and counts a claim that found its key COMPLETED in region `completed_in`, which is not the
/// key's home region `home`: on a global table, that completion was claimed outside home-region routing,
/// and the key may have run in two regions.
pub(crate) fn cross_region_duplicate(home: &str, completed_in: &str) {
    // The region is the record's text, which another writer of the table may have chosen.
    let completed_in = escaped(completed_in).to_string();
    tracing::warn!(
        home,
        completed_in,
        "a key's record was completed in another region than its home: it was claimed outside home-region routing, and may have run in both"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "dynamo_cross_region_duplicate_detected_total",
        "home" => home.to_owned(),
        "completed_in" => completed_in
    )
    .increment(1);
}

/// Counts the write capacity DynamoDB reported for a request (only the DynamoDB store reports it).
#[cfg_attr(
    not(all(feature = "metrics", feature = "dynamodb")),
    allow(dead_code, reason = "called by the DynamoDB store only")
)]
#[cfg_attr(
    feature = "metrics",
    allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)
)]
pub(crate) fn consumed_wcu(op: &'static str, units: f64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idempotency_consumed_wcu_total", "op" => op)
        // Writes consume whole units.
        .increment(units.max(0.0).ceil() as u64);
    #[cfg(not(feature = "metrics"))]
    let _ = (op, units);
}

impl Observed for crate::store::ClaimOutcome {
    fn result(&self) -> (&'static str, Option<&str>) {
        match self {
            crate::store::ClaimOutcome::Claimed => ("ok", None),
            crate::store::ClaimOutcome::Existing(_) => {
                ("condition_failed", Some("ConditionalCheckFailedException"))
            }
        }
    }
}

impl Observed for crate::store::WriteOutcome {
    fn result(&self) -> (&'static str, Option<&str>) {
        match self {
            crate::store::WriteOutcome::Applied => ("ok", None),
            crate::store::WriteOutcome::Rejected(_) => {
                ("condition_failed", Some("ConditionalCheckFailedException"))
            }
        }
    }
}

impl Observed for crate::store::TransactOutcome {
    fn result(&self) -> (&'static str, Option<&str>) {
        match self {
            crate::store::TransactOutcome::Committed => ("ok", None),
            crate::store::TransactOutcome::Rejected(_) => {
                ("condition_failed", Some("TransactionCanceledException"))
            }
            crate::store::TransactOutcome::Canceled(reasons) => {
                canceled(reasons);
                ("canceled", Some("TransactionCanceledException"))
            }
        }
    }
}

impl Observed for Option<crate::Record> {
    fn result(&self) -> (&'static str, Option<&str>) {
        ("ok", None)
    }
}

#[cfg(test)]
mod short_hash_tests {
    use super::short_hash;

    #[test]
    fn the_span_shows_the_start_of_the_hash_and_never_the_key() {
        let key = crate::derive_key("billing::charge#v2", &("acme", 42)).expect("derives");
        let hash = &key[key.len() - 64..];
        assert_eq!(short_hash(&key), &hash[..12]);
        assert_eq!(short_hash("short"), "short");
        // Text that is not a record key never panics, whatever its characters.
        assert_eq!(short_hash("ééééééééé"), "éééééé");
        let odd = format!("é{}", "a".repeat(64));
        assert_eq!(short_hash(&odd), "aaaaaaaaaaaa");
    }
}

#[cfg(test)]
mod observe_tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    use super::observe;
    use crate::store::StoreError;

    /// A subscriber that takes events up to `max` and keeps the field names of each "store request".
    struct Events {
        max: Level,
        seen: Arc<Mutex<Vec<Vec<&'static str>>>>,
    }

    struct Names(Vec<&'static str>);

    impl Visit for Names {
        fn record_debug(&mut self, field: &Field, _: &dyn std::fmt::Debug) {
            self.0.push(field.name());
        }
    }

    impl Subscriber for Events {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            *metadata.level() <= self.max
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut names = Names(Vec::new());
            event.record(&mut names);
            self.seen.lock().expect("not poisoned").push(names.0);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// The field names of the events a store request with `outcome` logs under a subscriber taking up
    /// to `max`.
    async fn logged(
        max: Level,
        outcome: Result<Option<crate::Record>, StoreError>,
    ) -> Vec<Vec<&'static str>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = Events {
            max,
            seen: Arc::clone(&seen),
        };
        let _guard = tracing::subscriber::set_default(subscriber);
        let ok = outcome.is_ok();
        assert_eq!(observe("get", async { outcome }).await.is_ok(), ok);
        let seen = seen.lock().expect("not poisoned");
        seen.clone()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_debug_subscriber_gets_each_store_requests_latency() {
        let mut events = logged(Level::DEBUG, Ok(None)).await;
        assert_eq!(events.len(), 1, "one event per store request");
        events[0].sort_unstable();
        assert_eq!(events[0], ["elapsed_us", "message", "op", "result"]);
        // With DynamoDB's error code, when the error has one.
        let missing = StoreError::TableNotFound("idempotency".to_owned());
        let mut events = logged(Level::DEBUG, Err(missing)).await;
        events[0].sort_unstable();
        assert_eq!(
            events[0],
            ["dynamo_error_code", "elapsed_us", "message", "op", "result"]
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn without_a_taker_for_debug_events_no_store_request_is_logged() {
        assert!(logged(Level::INFO, Ok(None)).await.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn control_and_reordering_characters_are_escaped_and_nothing_else() {
        let cases = [
            (
                "plain text, é ß 漢字 🙂 \\ \" '",
                "plain text, é ß 漢字 🙂 \\ \" '",
            ),
            ("a\nb\r\tc", "a\\nb\\r\\tc"),
            (
                "\u{1b}]0;title\u{7}\u{1b}[2K",
                "\\u{1b}]0;title\\u{7}\\u{1b}[2K",
            ),
            ("\u{0}\u{7f}\u{85}\u{9b}", "\\u{0}\\u{7f}\\u{85}\\u{9b}"),
            (
                "x\u{202e}gnp.exe\u{2066}\u{2028}",
                "x\\u{202e}gnp.exe\\u{2066}\\u{2028}",
            ),
            ("", ""),
        ];
        for (text, shown) in cases {
            assert_eq!(escaped(text).to_string(), shown, "{text:?}");
        }
    }
}
