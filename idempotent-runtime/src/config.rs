//! [`Idempotency`]: the handle generated code runs against (a store, defaults and a clock).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::store::Store;
use crate::store::memory::MemoryStore;

/// Default `ttl`: how long a COMPLETED response is replayed.
pub const DEFAULT_TTL: Duration = Duration::from_hours(24);
/// Default `lease`: how long a PENDING claim blocks other callers when its worker stops sending heartbeats.
pub const DEFAULT_LEASE: Duration = Duration::from_mins(1);
/// Default clock-skew margin: how far apart the clocks of two callers may be (see
/// [`Builder::clock_skew_margin`]).
pub const DEFAULT_CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(1);
/// Default retry hint of [`Error::InProgress`](crate::Error::InProgress) (see [`Builder::retry_hint`]).
pub const DEFAULT_RETRY_HINT: Duration = Duration::from_secs(1);
/// The longest duration a handle accepts for any of its settings (100 years): longer ones are a mistake,
/// and sums of them must not overflow.
pub const MAX_DURATION: Duration = Duration::from_hours(100 * 365 * 24);

/// The kill switch: set to `1` or `true`, every idempotent call without business writes runs its body
/// directly — no store call, no record, no replay — for local runs and tests. Calls whose writes commit
/// with the record (`transact = ..`, `claim_with`) still go through the store: without it, their writes
/// would be lost. Read once per process; a warning is logged when a handle is built, or at the first call.
pub const DISABLED_VAR: &str = "IDEMPOTENT_DISABLED";

/// Whether the kill switch ([`DISABLED_VAR`]) is on; logs a warning the first time it is found on.
pub(crate) fn disabled() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| {
        let on = std::env::var(DISABLED_VAR)
            .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "TRUE" | "True"));
        if on {
            tracing::warn!(
                "{DISABLED_VAR} is set: idempotency is OFF in this process; calls run their bodies directly (except those with business writes), and duplicates run again"
            );
        }
        on
    })
}

/// A setting of [`Builder`] that cannot work, found by [`Builder::try_build`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid idempotency setting: {0}")]
pub struct ConfigError(String);

/// A store plus the defaults used by `#[idempotent]` functions: cheap to clone (one `Arc`).
///
/// Pass it to a function with `store = ..` (an `Idempotency`, a reference to one, or an `Arc` of one), or
/// [`install`](Idempotency::install) it once as the process-wide default.
///
/// A handle and its clones coalesce the calls made through them (on by default; [`Builder::coalesce`]):
/// while a call on a key is in flight, another call on that key with the same payload sends no request
/// of its own. It follows the first call and gets what that call stored (with `wait`), or
/// [`Error::InProgress`](crate::Error::InProgress) once the first call's claim holds the key (without
/// it); if the first call ends without a stored result, one follower at a time claims for itself. A
/// retry storm of identical requests into one process costs the requests of one call. Across
/// processes (or handles) nothing changes: the store decides, and a follower only ever gets a record
/// the store holds. Costs per call, by path:
///
/// | path | requests |
/// |---|---|
/// | first call | 2 (claim, complete or fail) |
/// | duplicate of a COMPLETED key | 1 (the refused claim returns the record); 0 from the local cache |
/// | duplicate while the key is in flight in another process | 1 (with `wait`, plus one read per poll) |
/// | duplicate while the key is in flight in this process (same handle) | 0 |
///
/// ```
/// use std::time::Duration;
/// use idempotent_runtime::Idempotency;
///
/// let idem = Idempotency::builder_in_memory()
///     .default_ttl(Duration::from_secs(3600))
///     .default_lease(Duration::from_secs(30))
///     .build();
/// idem.install();
/// ```
#[derive(Debug, Clone)]
pub struct Idempotency {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    lease: Duration,
    failed_ttl: Duration,
    retain: Option<Duration>,
    heartbeat: bool,
    clock_skew_margin: Duration,
    retry_hint: Duration,
    /// The most JSON bytes a response may have, stored or replayed.
    max_response_bytes: usize,
    /// Shared by the handles [`Idempotency::with_max_response_bytes`] derives.
    cache: Option<Arc<crate::cache::ResponseCache>>,
    /// The detached calls still running, from their claim on (and the releases of dropped claims), for
    /// [`Idempotency::drain`].
    tasks: tokio_util::task::TaskTracker,
    /// The keys in flight through this handle, for coalescing; shared like the cache.
    flights: Option<Arc<crate::handler::flight::Flights>>,
}

static INSTALLED: RwLock<Option<Idempotency>> = RwLock::new(None);

impl Idempotency {
    /// Records in the DynamoDB table `table`, through a ready client (see
    /// [`DynamoDbStore`](crate::DynamoDbStore) for the table's shape).
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    pub fn dynamodb(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Self::builder(crate::DynamoDbStore::new(client, table)).build()
    }

    /// Records in this process's memory ([`MemoryStore`]): for tests and local runs.
    #[must_use]
    pub fn in_memory() -> Self {
        Self::builder_in_memory().build()
    }

    /// A builder over any store.
    pub fn builder(store: impl Store) -> Builder {
        Self::builder_arc(Arc::new(store))
    }

    /// A builder over a shared store (keep a clone of the `Arc` to inspect the store in tests).
    pub fn builder_arc(store: Arc<dyn Store>) -> Builder {
        Builder {
            store,
            clock: Arc::new(SystemClock),
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            failed_ttl: None,
            retain: None,
            heartbeat: true,
            clock_skew_margin: DEFAULT_CLOCK_SKEW_MARGIN,
            retry_hint: DEFAULT_RETRY_HINT,
            cache: None,
            max_response_bytes: crate::codec::DEFAULT_MAX_RESPONSE_BYTES,
            coalesce: true,
        }
    }

    /// A builder over a new [`MemoryStore`].
    pub fn builder_in_memory() -> Builder {
        Self::builder(MemoryStore::new())
    }

    /// Makes this handle the process-wide default, used by functions without `store = ..`. Installing
    /// again replaces the previous default (calls already running keep the one they started with).
    pub fn install(&self) {
        *INSTALLED.write().unwrap_or_else(PoisonError::into_inner) = Some(self.clone());
    }

    /// The installed default, if any.
    #[must_use]
    pub fn installed() -> Option<Idempotency> {
        INSTALLED
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Removes the installed default (for tests).
    pub fn uninstall() {
        *INSTALLED.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    /// The clock.
    #[must_use]
    pub fn clock(&self) -> &dyn Clock {
        self.inner.clock.as_ref()
    }

    /// `ttl` for functions that do not set one.
    #[must_use]
    pub fn default_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// `lease` for functions that do not set one.
    #[must_use]
    pub fn default_lease(&self) -> Duration {
        self.inner.lease
    }

    /// How long a FAILED record is kept (it is claimable at once; this is only how long operators can see
    /// its error).
    #[must_use]
    pub fn failed_ttl(&self) -> Duration {
        self.inner.failed_ttl
    }

    /// How long a record is kept after its response stops being replayed, if at all.
    #[must_use]
    pub fn retain(&self) -> Option<Duration> {
        self.inner.retain
    }

    /// Whether a running body's lease is extended by heartbeats.
    #[must_use]
    pub fn heartbeat(&self) -> bool {
        self.inner.heartbeat
    }

    /// How far ahead of another caller's clock this caller's clock may be: every takeover and expiry
    /// decision waits this much longer (see [`Builder::clock_skew_margin`]).
    #[must_use]
    pub fn clock_skew_margin(&self) -> Duration {
        self.inner.clock_skew_margin
    }

    /// The longest [`Error::InProgress::retry_hint`](crate::Error::InProgress) this handle gives for a
    /// claim whose holder is alive; a stalled claim's hint is the time left on its lease (see
    /// [`Builder::retry_hint`]).
    #[must_use]
    pub fn retry_hint(&self) -> Duration {
        self.inner.retry_hint
    }

    /// The most JSON bytes a response may have (see [`Builder::max_response_bytes`]).
    #[must_use]
    pub fn max_response_bytes(&self) -> usize {
        self.inner.max_response_bytes
    }

    /// This handle with another [`max_response_bytes`](Self::max_response_bytes): the same store,
    /// clock, settings, local cache and tasks (drained by either).
    pub(crate) fn with_max_response_bytes(&self, limit: usize) -> Idempotency {
        if limit == self.inner.max_response_bytes {
            return self.clone();
        }
        Idempotency {
            inner: Arc::new(Inner {
                max_response_bytes: limit,
                ..Inner::clone(&self.inner)
            }),
        }
    }

    pub(crate) fn cache(&self) -> Option<&crate::cache::ResponseCache> {
        self.inner.cache.as_deref()
    }

    /// The keys in flight through this handle (and the handles derived from it), unless coalescing
    /// is off ([`Builder::coalesce`]).
    pub(crate) fn flights(&self) -> Option<&Arc<crate::handler::flight::Flights>> {
        self.inner.flights.as_ref()
    }

    /// The work this handle started on tasks of its own (detached bodies, releases of dropped claims),
    /// and the detached calls whose claim has not landed yet.
    pub(crate) fn tasks(&self) -> &tokio_util::task::TaskTracker {
        &self.inner.tasks
    }

    /// Waits, for at most `timeout`, until every body this handle (or a clone of it) runs detached
    /// ([`Operation::detach`](crate::Operation::detach), the attribute's `detach`) has finished and
    /// stored its outcome, and every release of a dropped claim has been sent. Returns how many were
    /// still running when `timeout` passed: `0` when all finished.
    ///
    /// A detached call counts from the moment it starts (its future is first polled), before its
    /// claim is sent: a call whose claim is still on its way when `drain` is called is waited for
    /// until its body has finished too (or until its claim is refused, or the call dropped).
    ///
    /// Call it in a graceful shutdown, after the server stopped taking requests and before the process
    /// exits: a detached body keeps running after its caller is gone (a client hung up, a timeout), and
    /// a process that exits under it cuts it off like a crash, which leaves its key PENDING until the
    /// lease runs out (and runs the body again for the next caller). Bodies detached while it waits are
    /// waited for too; the handle stays usable afterwards.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use idempotent_runtime::{Error, Idempotency};
    /// let idem = Idempotency::in_memory();
    /// let call = idem
    ///     .operation("billing::charge", "order-1")
    ///     .detach()
    ///     .run(|_| async {
    ///         tokio::time::sleep(Duration::from_millis(50)).await;
    ///         Ok::<_, Error>(42)
    ///     });
    /// // The caller gives up; the body runs on, and its result is stored.
    /// let _ = tokio::time::timeout(Duration::from_millis(10), call).await;
    /// // At shutdown (after the server stopped accepting requests):
    /// assert_eq!(idem.drain(Duration::from_secs(30)).await, 0);
    /// # }
    /// ```
    pub async fn drain(&self, timeout: Duration) -> usize {
        let tasks = self.tasks();
        // `wait` returns once the tracker is closed and empty. Closing only arms `wait`: tasks spawned
        // later are tracked all the same, so it stays closed (and several drains can wait at once).
        tasks.close();
        let _ = tokio::time::timeout(timeout, tasks.wait()).await;
        tasks.len()
    }
}

/// Builds an [`Idempotency`]; start from [`Idempotency::builder`].
#[derive(Debug)]
#[must_use]
pub struct Builder {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    lease: Duration,
    failed_ttl: Option<Duration>,
    retain: Option<Duration>,
    heartbeat: bool,
    clock_skew_margin: Duration,
    retry_hint: Duration,
    cache: Option<usize>,
    max_response_bytes: usize,
    coalesce: bool,
}

impl Builder {
    /// Coalesces concurrent calls on one key in this process (on by default): while a call on a key
    /// is in flight through this handle (or a clone of it), another call on the same key with the same
    /// payload makes no request of its own. With `wait` it gets the first call's outcome when that is
    /// stored (the stored response, decoded, as a duplicate reading the record would get it); if the
    /// first call ends without a stored result (its body failed or panicked, it was dropped), one
    /// waiting call at a time goes on to claim the key itself. Without `wait` it gets
    /// [`Error::InProgress`](crate::Error::InProgress) as soon as the first call's claim is answered
    /// and holds the key (or it gets the stored response, if that is what the first call found). A
    /// call with another payload is not coalesced: the store answers it (`PayloadMismatch`).
    ///
    /// So a retry storm of identical requests into one process costs the requests of one call: the
    /// others cost nothing. Across processes the store decides, as without coalescing: a coalesced call
    /// only ever gets a record that is stored, or makes its own claim.
    ///
    /// A call no other call follows pays for a hash of its key and an entry in a sharded map (a short
    /// lock when it starts, when its claim is answered and when it ends), nothing else: the state its
    /// followers wait on is allocated by the first call that follows (`scripts/bench-count` counts it;
    /// `docs/performance-notes.md`). Off, every call makes its own requests, as calls in different
    /// processes do.
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// Keeps up to `capacity` COMPLETED responses in this process, so a duplicate handled by the same
    /// process is answered without a round trip (off by default). Only COMPLETED records are cached, and
    /// only while they are replayable, so answers never differ from the store's; a payload mismatch is
    /// still detected.
    pub fn local_cache(mut self, capacity: usize) -> Self {
        self.cache = Some(capacity).filter(|c| *c > 0);
        self
    }

    /// Keeps a tombstone of each COMPLETED record for `retain` after its `ttl` (the "audit log for
    /// recently expired keys"): a very late duplicate then gets [`Error::Expired`](crate::Error::Expired)
    /// instead of running the body again. Without it (the default), a key counts as new once its `ttl`
    /// has passed. The stored item lives `ttl + retain`; its response is kept but no longer replayed.
    pub fn retain(mut self, retain: Duration) -> Self {
        self.retain = Some(retain).filter(|r| !r.is_zero());
        self
    }

    /// `ttl` for functions that do not set one (default 24 h).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// `lease` for functions that do not set one (default 60 s).
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long FAILED records stay visible (default: the lease). A FAILED record that keeps out the
    /// late claim of a call that gave up stays until that claim can no longer land.
    pub fn failed_ttl(mut self, ttl: Duration) -> Self {
        self.failed_ttl = Some(ttl);
        self
    }

    /// The clock expiries and leases are computed from (default: the system clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Whether to extend a running body's lease every third of the lease (default: on), so a live worker
    /// is never taken over and `lease` only bounds how long a crashed worker blocks its key.
    pub fn heartbeat(mut self, on: bool) -> Self {
        self.heartbeat = on;
        self
    }

    /// How far apart the clocks of the callers sharing a table may be (default 1 s).
    ///
    /// Takeover and expiry are decided with the caller's own clock: a lapsed lease or an expired record
    /// is only treated as such once it has been so for longer than this margin. So as long as no two
    /// callers' clocks differ by more than the margin, a caller never takes over a live claim, and never
    /// treats a live record as expired. Keep machines on NTP (skew is then milliseconds) and raise the
    /// margin if yours can drift further. The price of a larger margin: a crashed caller's key is
    /// blocked that much longer.
    ///
    /// What happens when heartbeats fail for a whole lease (the store unreachable from the worker, or
    /// the process stalled): the claim lapses, another caller may take the key over and run the body a
    /// second time; the first one's completion is then fenced ([`LeaseLost`](crate::Error::LeaseLost)),
    /// so only one result is ever stored.
    pub fn clock_skew_margin(mut self, margin: Duration) -> Self {
        self.clock_skew_margin = margin;
        self
    }

    /// The longest [`retry_hint`](crate::Error::InProgress) to give a caller that found the key in
    /// progress (default 1 s): how long it should wait before asking again, e.g. an HTTP
    /// `Retry-After`. The hint is never longer than the time until the other call's lease runs out.
    /// A claim whose heartbeats have stopped (its lease not extended for longer than a heartbeat
    /// interval) gets the time left on its lease instead, in whole seconds: see
    /// [`Error::InProgress`](crate::Error::InProgress)'s `retry_hint`.
    pub fn retry_hint(mut self, hint: Duration) -> Self {
        self.retry_hint = hint;
        self
    }

    /// The most bytes of JSON a response may have (default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`](crate::DEFAULT_MAX_RESPONSE_BYTES), 16 MiB): the bound on what
    /// this handle stores and on what it reads back.
    ///
    /// A stored record is untrusted input: another service sharing the table, or a tampered item, can
    /// hold a few hundred kilobytes of gzip that inflate to hundreds of megabytes on every replay. A
    /// replay inflates at most this many bytes, and refuses a response that inflates to more as a
    /// corrupt record ([`Error::CorruptRecord`](crate::Error::CorruptRecord); the body does not run).
    /// So that a response this handle stored always replays, a body's value whose JSON is larger is
    /// not stored: it is recorded like one over the item limit, and duplicates get
    /// [`Error::ResponseTooLarge`](crate::Error::ResponseTooLarge). Raise it when responses are larger
    /// than 16 MiB of JSON that still compresses into DynamoDB's 400 KB item; every handle reading those
    /// records needs the same setting. The HTTP layer sets its own bound, from its
    /// `max_stored_response_bytes`.
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = limit;
        self
    }

    /// The handle, or the first setting that cannot work: a zero `ttl` or `max_response_bytes`, a
    /// `lease` under [`MIN_LEASE`](crate::MIN_LEASE), or any duration longer than [`MAX_DURATION`].
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting.
    pub fn try_build(self) -> Result<Idempotency, ConfigError> {
        // Says so at start-up when the kill switch is on.
        disabled();
        let durations = [
            ("default_ttl", Some(self.ttl)),
            ("default_lease", Some(self.lease)),
            ("failed_ttl", self.failed_ttl),
            ("retain", self.retain),
            ("clock_skew_margin", Some(self.clock_skew_margin)),
            ("retry_hint", Some(self.retry_hint)),
        ];
        for (name, value) in durations {
            if let Some(value) = value.filter(|v| *v > MAX_DURATION) {
                return Err(ConfigError(format!(
                    "`{name}` is {value:?}; at most {MAX_DURATION:?} (100 years) is supported"
                )));
            }
        }
        for (name, value) in [("default_ttl", self.ttl), ("default_lease", self.lease)] {
            if value.is_zero() {
                return Err(ConfigError(format!("`{name}` must be longer than zero")));
            }
        }
        if self.lease < crate::MIN_LEASE {
            return Err(ConfigError(format!(
                "`default_lease` is {:?}; a lease must be at least {:?}: heartbeats renew it every third of it, and each renewal's round trip eats into it",
                self.lease,
                crate::MIN_LEASE
            )));
        }
        if self.max_response_bytes == 0 {
            return Err(ConfigError(
                "`max_response_bytes` must be at least 1 (no response could be stored)".to_owned(),
            ));
        }
        Ok(Idempotency {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                ttl: self.ttl,
                lease: self.lease,
                failed_ttl: self.failed_ttl.unwrap_or(self.lease),
                retain: self.retain,
                heartbeat: self.heartbeat,
                clock_skew_margin: self.clock_skew_margin,
                retry_hint: self.retry_hint,
                max_response_bytes: self.max_response_bytes,
                cache: self
                    .cache
                    .map(|capacity| Arc::new(crate::cache::ResponseCache::new(capacity))),
                tasks: tokio_util::task::TaskTracker::new(),
                flights: self.coalesce.then(Arc::default),
            }),
        })
    }

    /// The handle.
    ///
    /// # Panics
    /// When a setting cannot work (see [`try_build`](Self::try_build), which returns the error instead).
    #[must_use]
    pub fn build(self) -> Idempotency {
        match self.try_build() {
            Ok(idem) => idem,
            Err(e) => panic!("{e}"),
        }
    }
}
