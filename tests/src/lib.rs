//! Shared support for the test suite: DynamoDB Local clients, fresh tables, a request counter, and the
//! two stores behind one constructor so every behaviour test runs against both.

// Test support fails the test by panicking when its set-up fails (no DynamoDB Local, no table); saying
// so on every helper adds nothing.
#![allow(clippy::missing_panics_doc)]

pub mod proxy;
pub mod seen;
pub mod spans;

/// Each named `async fn(Backend)` of the calling module as two `#[tokio::test]`s, `memory` and
/// `dynamodb`, in a module named after it (`$test::memory`, `$test::dynamodb`); attributes written
/// before a name (`#[ignore = ".."]`) go on both.
///
/// ```text
/// async fn a_duplicate_replays(backend: Backend) { /* .. */ }
///
/// idempotent_tests::on_both_stores!(a_duplicate_replays);
/// ```
///
/// Beginning with `mod <memory module>, mod <dynamodb module>;`, the tests are grouped by store
/// instead (`memory::$test`, `dynamodb::$test`: the layout of the modules that were written this
/// way, kept so their names stay), and each name carries its own test attribute, which goes on both:
///
/// ```text
/// idempotent_tests::on_both_stores! {
///     mod memory, mod dynamodb;
///     #[tokio::test]
///     a_duplicate_replays,
///     #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
///     racing_callers_run_the_body_once,
/// }
/// ```
#[macro_export]
macro_rules! on_both_stores {
    (mod $memory:ident, mod $dynamodb:ident; $($(#[$attr:meta])* $test:ident),* $(,)?) => {
        mod $memory {
            $(
                $(#[$attr])*
                async fn $test() {
                    super::$test($crate::Backend::Memory).await;
                }
            )*
        }

        mod $dynamodb {
            $(
                $(#[$attr])*
                async fn $test() {
                    super::$test($crate::Backend::DynamoDb).await;
                }
            )*
        }
    };
    ($($(#[$attr:meta])* $test:ident),* $(,)?) => {$(
        mod $test {
            $(#[$attr])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$test($crate::Backend::Memory).await;
            }

            $(#[$attr])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dynamodb() {
                super::$test($crate::Backend::DynamoDb).await;
            }
        }
    )*};
}

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
};
use idempotent_runtime::{DynamoDbStore, Idempotency, ManualClock, MemoryStore, Store};

/// The environment variable `scripts/test` sets to DynamoDB Local's endpoint.
pub const ENDPOINT_VAR: &str = "IDEMPOTENT_DYNAMODB_ENDPOINT";

/// DynamoDB Local's endpoint. Panics (failing the test, never skipping it) when none is configured.
#[must_use]
pub fn endpoint() -> String {
    std::env::var(ENDPOINT_VAR).unwrap_or_else(|_| {
        panic!(
            "this test needs DynamoDB Local, and {ENDPOINT_VAR} is not set: run the tests with `scripts/test` \
             (it installs and starts DynamoDB Local), or start one with `scripts/dynamodb-local start` and \
             export {ENDPOINT_VAR}=<the printed endpoint>"
        )
    })
}

/// Counts the HTTP requests a client sends (every attempt, retries included), by operation.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    total: Arc<AtomicUsize>,
    by_operation: Arc<Mutex<HashMap<String, usize>>>,
}

impl RequestCounter {
    /// Requests sent so far.
    #[must_use]
    pub fn total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// Requests of one operation (`UpdateItem`, `GetItem`, `TransactWriteItems`, ...).
    #[must_use]
    pub fn of(&self, operation: &str) -> usize {
        self.by_operation
            .lock()
            .unwrap()
            .get(operation)
            .copied()
            .unwrap_or(0)
    }

    /// Sets every count to zero.
    pub fn reset(&self) {
        self.total.store(0, Ordering::SeqCst);
        self.by_operation.lock().unwrap().clear();
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let operation = context
            .request()
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or("unknown")
            .to_owned();
        self.total.fetch_add(1, Ordering::SeqCst);
        *self
            .by_operation
            .lock()
            .unwrap()
            .entry(operation)
            .or_default() += 1;
        Ok(())
    }
}

/// The configuration of a client for DynamoDB Local at `endpoint`: dummy credentials, region
/// `us-east-1`, and `counter` counting its requests.
fn local_config(endpoint: &str, counter: &RequestCounter) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("dummy", "dummy", None, None, "tests"))
        .interceptor(counter.clone())
}

/// A client for DynamoDB Local at `endpoint` with dummy credentials, counting its requests.
#[must_use]
pub fn client_at(endpoint: &str) -> (Client, RequestCounter) {
    let counter = RequestCounter::default();
    let config = local_config(endpoint, &counter).build();
    (Client::from_conf(config), counter)
}

/// A client through `endpoint` (a [`proxy::FaultProxy`]) whose retries are quick (so fault tests stay
/// short: 3 attempts, 5 to 50 ms apart) and whose retry budget is its own and unlimited (the SDK's shared
/// token bucket would otherwise stop retrying under a deliberate storm of faults, which is not what these
/// tests measure).
#[must_use]
pub fn faulty_client(endpoint: &str) -> (Client, RequestCounter) {
    use aws_sdk_dynamodb::config::retry::{RetryConfig, RetryPartition, TokenBucket};
    let counter = RequestCounter::default();
    let config = local_config(endpoint, &counter)
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(std::time::Duration::from_millis(5))
                .with_max_backoff(std::time::Duration::from_millis(50)),
        )
        .retry_partition(
            RetryPartition::custom(unique_table("faults"))
                .token_bucket(TokenBucket::unlimited())
                .build(),
        )
        .build();
    (Client::from_conf(config), counter)
}

/// A client for the DynamoDB Local that `scripts/test` started.
#[must_use]
pub fn client() -> (Client, RequestCounter) {
    client_at(&endpoint())
}

/// A unique table name, so tests running at once never share records.
#[must_use]
pub fn unique_table(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst),
        uuid_suffix()
    )
}

fn uuid_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000)
}

/// A fresh table on DynamoDB Local and a store on it, with a request counter on its client.
pub async fn dynamodb_store() -> (DynamoDbStore, RequestCounter) {
    let (client, counter) = client();
    let store = DynamoDbStore::new(client, unique_table("idem"));
    store.create_table().await.expect("create the test table");
    counter.reset();
    (store, counter)
}

/// Creates `table` on DynamoDB Local with a partition key `key` of type S, on-demand, TTL off: a table
/// The raw item of the record `key`, read consistently by the store's own item key (so in any table
/// layout), or `None` once it is gone.
pub async fn raw_item(
    store: &DynamoDbStore,
    key: &str,
) -> Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    store
        .client()
        .get_item()
        .table_name(store.table())
        .set_key(Some(store.item_key(key).unwrap()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

/// as someone might create it by hand (business tables, or idempotency tables to verify).
pub async fn create_plain_table(client: &Client, table: &str, key: &str) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    client
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create a table on DynamoDB Local");
}

/// A store without transactions: a [`MemoryStore`] behind only the required [`Store`] methods, so
/// `claim_transaction` and `transact_transition` are the trait's defaults (`StoreError::Unsupported`),
/// as in a third-party store that never implemented them.
#[derive(Debug, Default)]
pub struct RecordsOnly(pub MemoryStore);

#[async_trait::async_trait]
impl Store for RecordsOnly {
    async fn claim(
        &self,
        request: &idempotent_runtime::store::ClaimRequest<'_>,
    ) -> Result<idempotent_runtime::store::ClaimOutcome, idempotent_runtime::StoreError> {
        self.0.claim(request).await
    }

    async fn transition(
        &self,
        transition: &idempotent_runtime::store::Transition<'_>,
    ) -> Result<idempotent_runtime::store::WriteOutcome, idempotent_runtime::StoreError> {
        self.0.transition(transition).await
    }

    async fn get(
        &self,
        key: &str,
    ) -> Result<Option<idempotent_runtime::Record>, idempotent_runtime::StoreError> {
        self.0.get(key).await
    }

    fn kind(&self) -> &'static str {
        "records-only"
    }
}

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// [`MemoryStore`].
    Memory,
    /// [`DynamoDbStore`] on DynamoDB Local.
    DynamoDb,
}

/// Everything a behaviour test needs: a handle with a manual clock, the store behind it, and (on
/// DynamoDB) the request counter.
#[derive(Debug, Clone)]
pub struct Harness {
    /// The handle to pass as `store = ..`.
    pub idem: Idempotency,
    /// The store behind `idem`.
    pub store: Arc<dyn Store>,
    /// The same store, when it is a [`MemoryStore`] (its business tables).
    pub memory: Option<Arc<MemoryStore>>,
    /// The same store, when it is a [`DynamoDbStore`] (its client and table).
    pub dynamodb: Option<DynamoDbStore>,
    /// The clock behind `idem`.
    pub clock: ManualClock,
    /// Requests sent to DynamoDB (always zero on the memory store).
    pub requests: RequestCounter,
}

impl Harness {
    /// A harness on `backend` whose clock starts now; `configure` may change the builder.
    pub async fn new(backend: Backend) -> Self {
        Self::with(backend, |b| b).await
    }

    /// A harness whose builder is adjusted by `configure`.
    pub async fn with(
        backend: Backend,
        configure: impl FnOnce(idempotent_runtime::Builder) -> idempotent_runtime::Builder,
    ) -> Self {
        match backend {
            Backend::Memory => {
                let memory = Arc::new(MemoryStore::new());
                Self {
                    memory: Some(memory.clone()),
                    ..Self::over(memory, RequestCounter::default(), configure)
                }
            }
            Backend::DynamoDb => {
                let (store, counter) = dynamodb_store().await;
                Self {
                    dynamodb: Some(store.clone()),
                    ..Self::over(Arc::new(store), counter, configure)
                }
            }
        }
    }

    /// The DynamoDB client behind a [`Backend::DynamoDb`] harness.
    ///
    /// # Panics
    /// On a harness over another store.
    #[must_use]
    pub fn client(&self) -> Client {
        self.dynamodb
            .as_ref()
            .expect("a harness on DynamoDB Local")
            .client()
            .clone()
    }

    /// A harness over a store of the test's own (one with injected faults, say).
    pub fn over(
        store: Arc<dyn Store>,
        requests: RequestCounter,
        configure: impl FnOnce(idempotent_runtime::Builder) -> idempotent_runtime::Builder,
    ) -> Self {
        let clock = ManualClock::starting_now();
        let idem = configure(Idempotency::builder_arc(store.clone()).clock(clock.clone())).build();
        Self {
            idem,
            store,
            memory: None,
            dynamodb: None,
            clock,
            requests,
        }
    }

    /// A harness on a fresh DynamoDB Local table whose client goes through a new fault proxy (quick SDK
    /// retries, see [`faulty_client`]); the proxy forwards everything until given rules.
    pub async fn behind_proxy(
        configure: impl FnOnce(idempotent_runtime::Builder) -> idempotent_runtime::Builder,
    ) -> (Self, proxy::FaultProxy) {
        let (direct, _) = client();
        let table = unique_table("idem");
        DynamoDbStore::new(direct, &table)
            .create_table()
            .await
            .expect("create the test table");
        let proxy = proxy::FaultProxy::start(&endpoint()).await;
        let (client, requests) = faulty_client(proxy.endpoint());
        let dynamodb = DynamoDbStore::new(client, table);
        let store: Arc<dyn Store> = Arc::new(dynamodb.clone());
        let clock = ManualClock::starting_now();
        let idem = configure(Idempotency::builder_arc(store.clone()).clock(clock.clone())).build();
        let harness = Self {
            idem,
            store,
            memory: None,
            dynamodb: Some(dynamodb),
            clock,
            requests,
        };
        (harness, proxy)
    }

    /// A handle over the same store and clock standing for another process: its calls are not
    /// coalesced with `idem`'s (coalescing is per handle), so each makes its own requests, as a
    /// duplicate arriving at another instance of the service does. `configure` may change its builder.
    #[must_use]
    pub fn another_process(
        &self,
        configure: impl FnOnce(idempotent_runtime::Builder) -> idempotent_runtime::Builder,
    ) -> Idempotency {
        configure(Idempotency::builder_arc(self.store.clone()).clock(self.clock.clone())).build()
    }

    /// The stored record of `key` in `namespace`.
    pub async fn record<K: serde::Serialize + ?Sized>(
        &self,
        namespace: &str,
        key: &K,
    ) -> Option<idempotent_runtime::Record> {
        let key = idempotent_runtime::derive_key(namespace, key).unwrap();
        self.store.get(&key).await.unwrap()
    }
}

/// What the bodies under test return as their error: the body's own failure, or the library's.
#[derive(Debug)]
pub enum AppError {
    /// The body's own failure.
    Declined,
    /// The library's.
    Idempotency(idempotent_runtime::Error),
}

impl From<idempotent_runtime::Error> for AppError {
    fn from(e: idempotent_runtime::Error) -> Self {
        AppError::Idempotency(e)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Declined => f.write_str("declined"),
            AppError::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

impl AppError {
    /// The library's error, or a panic naming what came instead.
    #[track_caller]
    #[must_use]
    pub fn idempotency(self) -> idempotent_runtime::Error {
        match self {
            AppError::Idempotency(e) => e,
            other @ AppError::Declined => panic!("expected an idempotency error, got {other:?}"),
        }
    }
}

/// The library's error inside `result`.
///
/// # Panics
/// When `result` is not an [`AppError::Idempotency`].
pub fn idem_error<T: std::fmt::Debug>(result: Result<T, AppError>) -> idempotent_runtime::Error {
    match result {
        Err(AppError::Idempotency(e)) => e,
        other => panic!("expected an idempotency error, got {other:?}"),
    }
}

/// A body that can be held open: it counts its run, signals that it started, then waits for a permit;
/// [`fail_next`](Gate::fail_next) makes the next run that is let through fail.
#[derive(Debug)]
pub struct Gate {
    runs: std::sync::atomic::AtomicUsize,
    started: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
    fail: std::sync::atomic::AtomicBool,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            runs: std::sync::atomic::AtomicUsize::new(0),
            started: tokio::sync::Notify::new(),
            release: tokio::sync::Semaphore::new(0),
            fail: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Gate {
    /// How often the body ran.
    #[must_use]
    pub fn runs(&self) -> usize {
        self.runs.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts a run, says it started and waits until released. Which run this is (1, 2, ...), or
    /// [`AppError::Declined`] when [`fail_next`](Gate::fail_next) asked for a failure.
    ///
    /// # Errors
    /// [`AppError::Declined`] when the run was asked to fail.
    ///
    /// # Panics
    /// When the gate's semaphore is closed (never: nothing closes it).
    pub async fn enter(&self) -> Result<usize, AppError> {
        let run = self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        self.started.notify_one();
        self.release.acquire().await.unwrap().forget();
        if self.fail.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(AppError::Declined);
        }
        Ok(run)
    }

    /// Waits until a body has entered.
    pub async fn started(&self) {
        self.started.notified().await;
    }

    /// Lets one body through.
    pub fn release(&self) {
        self.release.add_permits(1);
    }

    /// Makes the next body let through return [`AppError::Declined`].
    pub fn fail_next(&self) {
        self.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How often each step's effect happened, by step name, and the downstream keys each step was given:
/// what the steps tests count to show that a finished step does not run again.
#[derive(Debug, Default)]
pub struct Effects {
    runs: Mutex<HashMap<String, usize>>,
    keys: Mutex<HashMap<String, Vec<String>>>,
}

impl Effects {
    /// `step`'s effect happened once more.
    pub fn happened(&self, step: &str) {
        *self
            .runs
            .lock()
            .unwrap()
            .entry(step.to_owned())
            .or_default() += 1;
    }

    /// How often `step`'s effect happened.
    #[must_use]
    pub fn runs(&self, step: &str) -> usize {
        self.runs.lock().unwrap().get(step).copied().unwrap_or(0)
    }

    /// How often the checkout's three steps happened: reserve, charge and email.
    #[must_use]
    pub fn checkout(&self) -> (usize, usize, usize) {
        (
            self.runs("reserve"),
            self.runs("charge"),
            self.runs("email"),
        )
    }

    /// `step` was given the downstream key `key`.
    pub fn keyed(&self, step: &str, key: String) {
        self.keys
            .lock()
            .unwrap()
            .entry(step.to_owned())
            .or_default()
            .push(key);
    }

    /// The downstream keys `step` was given, in order.
    #[must_use]
    pub fn keys(&self, step: &str) -> Vec<String> {
        self.keys
            .lock()
            .unwrap()
            .get(step)
            .cloned()
            .unwrap_or_default()
    }
}

/// What the steps tests' three-step checkout returns: the reserve's hold and the charge's id.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    /// The reserve step's value.
    pub hold: u32,
    /// The charge step's value.
    pub charge: String,
}

/// How the steps tests' third step ("email") behaves.
#[derive(Debug, Clone, Copy)]
pub enum Email {
    /// Succeeds.
    Sends,
    /// Returns an error.
    Fails,
    /// Never finishes: a crash in the making, once the caller drops the call.
    Hangs,
}

/// A store whose *resuming* claims land but whose answer never comes back while [`hold`](Self::hold)
/// is on: the caller's future is still waiting on the claim when it is dropped (a client that hung up,
/// a `timeout`), which is when the call releases its claim.
#[derive(Debug)]
pub struct SlowResume {
    inner: Arc<dyn Store>,
    hold: std::sync::atomic::AtomicBool,
    /// Told when a held claim has landed.
    landed: tokio::sync::Notify,
}

impl SlowResume {
    /// `inner`, answering at once until [`hold`](Self::hold) is turned on.
    #[must_use]
    pub fn new(inner: Arc<dyn Store>) -> Self {
        SlowResume {
            inner,
            hold: std::sync::atomic::AtomicBool::new(false),
            landed: tokio::sync::Notify::new(),
        }
    }

    /// Holds back (`true`) or no longer holds back the answers to resuming claims that landed.
    pub fn hold(&self, on: bool) {
        self.hold.store(on, Ordering::SeqCst);
    }

    /// Returns once a held claim has landed.
    pub async fn landed(&self) {
        self.landed.notified().await;
    }
}

#[async_trait::async_trait]
impl Store for SlowResume {
    async fn claim(
        &self,
        request: &idempotent_runtime::store::ClaimRequest<'_>,
    ) -> Result<idempotent_runtime::store::ClaimOutcome, idempotent_runtime::StoreError> {
        let outcome = self.inner.claim(request).await?;
        if self.hold.load(Ordering::SeqCst)
            && matches!(
                request.steps,
                idempotent_runtime::store::StepsClaim::Resume { .. }
            )
            && outcome == idempotent_runtime::store::ClaimOutcome::Claimed
        {
            self.landed.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(outcome)
    }

    async fn transition(
        &self,
        transition: &idempotent_runtime::store::Transition<'_>,
    ) -> Result<idempotent_runtime::store::WriteOutcome, idempotent_runtime::StoreError> {
        self.inner.transition(transition).await
    }

    async fn get(
        &self,
        key: &str,
    ) -> Result<Option<idempotent_runtime::Record>, idempotent_runtime::StoreError> {
        self.inner.get(key).await
    }

    fn response_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        self.inner.response_budget(key, fingerprint)
    }

    fn kind(&self) -> &'static str {
        "slow-resume"
    }
}

/// The name the test harness gives test `name` of the module at `module_path` (`module_path!()`: the
/// path without the binary's crate name), for running one test of this binary again in a child process
/// with `--exact`.
#[must_use]
pub fn test_path(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}

/// The store a test runs on: a fresh memory store, or a fresh table on DynamoDB Local.
pub async fn backing(backend: Backend) -> Arc<dyn Store> {
    match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::DynamoDb => Arc::new(dynamodb_store().await.0),
    }
}

/// Another store, behind a type a test binary can wrap with an
/// [`Override`](idempotent_runtime::store::conformance::Override) of its own. Every request goes to
/// the store inside, transactions included.
#[derive(Debug)]
pub struct Forward(pub Arc<dyn Store>);

#[async_trait::async_trait]
impl Store for Forward {
    async fn claim(
        &self,
        request: &idempotent_runtime::store::ClaimRequest<'_>,
    ) -> Result<idempotent_runtime::store::ClaimOutcome, idempotent_runtime::StoreError> {
        self.0.claim(request).await
    }

    async fn transition(
        &self,
        transition: &idempotent_runtime::store::Transition<'_>,
    ) -> Result<idempotent_runtime::store::WriteOutcome, idempotent_runtime::StoreError> {
        self.0.transition(transition).await
    }

    async fn get(
        &self,
        key: &str,
    ) -> Result<Option<idempotent_runtime::Record>, idempotent_runtime::StoreError> {
        self.0.get(key).await
    }

    async fn claim_transaction(
        &self,
        request: &idempotent_runtime::store::ClaimRequest<'_>,
        writes: &idempotent_runtime::store::Writes,
    ) -> Result<idempotent_runtime::store::TransactOutcome, idempotent_runtime::StoreError> {
        self.0.claim_transaction(request, writes).await
    }

    async fn transact_transition(
        &self,
        transition: &idempotent_runtime::store::Transition<'_>,
        writes: &idempotent_runtime::store::Writes,
    ) -> Result<idempotent_runtime::store::TransactOutcome, idempotent_runtime::StoreError> {
        self.0.transact_transition(transition, writes).await
    }

    fn kind(&self) -> &'static str {
        self.0.kind()
    }
}

/// An [`Override`](idempotent_runtime::store::conformance::Override) shared with the test, which
/// keeps a handle on its switches: the claims and transitions go through the override inside.
#[derive(Debug)]
pub struct SharedOverride<O>(pub Arc<O>);

#[async_trait::async_trait]
impl<O: idempotent_runtime::store::conformance::Override<Forward>>
    idempotent_runtime::store::conformance::Override<Forward> for SharedOverride<O>
{
    fn kind(&self) -> &'static str {
        self.0.kind()
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &idempotent_runtime::store::ClaimRequest<'_>,
    ) -> Result<idempotent_runtime::store::ClaimOutcome, idempotent_runtime::StoreError> {
        self.0.claim(inner, request).await
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &idempotent_runtime::store::Transition<'_>,
    ) -> Result<idempotent_runtime::store::WriteOutcome, idempotent_runtime::StoreError> {
        self.0.transition(inner, transition).await
    }
}

/// An error whose `From<idempotent_runtime::Error>` panics (`From<Error> panics on: <the error>`): a
/// call whose library error is converted into it panics there.
#[derive(Debug)]
pub struct FromPanics;

impl std::fmt::Display for FromPanics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the body's own error")
    }
}

impl From<idempotent_runtime::Error> for FromPanics {
    fn from(e: idempotent_runtime::Error) -> Self {
        panic!("From<Error> panics on: {e}")
    }
}

/// A panic's message, as `panic!` gave it (`None` for a payload that is not a string).
#[must_use]
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> Option<String> {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
}

/// A panic's message, as `panic!` gave it (`<not a string>` for a payload that is not a string).
#[must_use]
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic_message(panic).unwrap_or_else(|| "<not a string>".to_owned())
}

/// Polls `future` once with a waker that does nothing (a call on the memory store that does not wait
/// ends at its first poll).
pub fn poll_once<F: std::future::Future + ?Sized>(
    future: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    let waker = futures_util::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    future.poll(&mut cx)
}

/// How many times a body ran.
#[derive(Debug, Default, Clone)]
pub struct Runs(pub Arc<AtomicUsize>);

impl Runs {
    /// The runs so far.
    #[must_use]
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A claim the store applies `after` it was sent, whether or not its caller is still there (real
/// DynamoDB goes on with a request whose client left): the request goes on a task of its own.
#[derive(Debug)]
pub struct ClaimAppliedLate(pub std::time::Duration);

#[async_trait::async_trait]
impl idempotent_runtime::store::conformance::Override<Forward> for ClaimAppliedLate {
    fn kind(&self) -> &'static str {
        "claim-applied-late"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &idempotent_runtime::store::ClaimRequest<'_>,
    ) -> Result<idempotent_runtime::store::ClaimOutcome, idempotent_runtime::StoreError> {
        let store = inner.0.clone();
        let (key, token) = (request.key.to_owned(), request.token.to_owned());
        let fingerprint = request.fingerprint.map(str::to_owned);
        let (attempt, now_ms, lease_until_ms, expires_at_s) = (
            request.attempt,
            request.now_ms,
            request.lease_until_ms,
            request.expires_at_s,
        );
        let after = self.0;
        let applied = tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let mut request = idempotent_runtime::store::ClaimRequest::new(
                &key,
                &token,
                now_ms,
                lease_until_ms,
                expires_at_s,
            );
            request.attempt = attempt;
            request.fingerprint = fingerprint.as_deref();
            store.claim(&request).await
        });
        applied.await.unwrap()
    }
}

/// The capacity estimate's input ([`idempotent_runtime::admin::Traffic`]) is a type a program builds,
/// and one that grows (it gained `steps` and `step_bytes` for operations run with steps): a program
/// that lists every field in a struct expression stops compiling when it gains another. Built outside
/// the runtime, the struct expression must be refused (`#[non_exhaustive]`, with a constructor), so that
/// no program depends on the exact list of fields.
///
/// ```compile_fail,E0639
/// use std::time::Duration;
/// use idempotent_runtime::admin::Traffic;
///
/// let traffic = Traffic {
///     peak_rps: 100.0,
///     duplicate_ratio: 0.1,
///     response_bytes: 1024,
///     transactional: false,
///     business_items: 0,
///     business_item_bytes: 0,
///     body: None,
///     lease: Duration::from_secs(60),
///     steps: 0,
///     step_bytes: 0,
/// };
/// let _ = idempotent_runtime::admin::capacity(&traffic);
/// ```
pub mod traffic_is_not_built_field_by_field {}

/// The audit's error ([`idempotent_runtime::audit::AuditError`]) is `#[non_exhaustive]`, but its
/// variants' fields are neither `#[non_exhaustive]` nor documented as frozen (as those of
/// [`idempotent_runtime::Error`] and [`idempotent_runtime::StoreError`] are): a program that handles
/// it by naming every field of a variant stops compiling when the variant gains one. Outside the
/// runtime, a pattern that names a variant's fields without `..` must be refused (E0638).
///
/// ```compile_fail,E0638
/// use idempotent_runtime::audit::AuditError;
///
/// fn advice(error: &AuditError) -> String {
///     match error {
///         AuditError::NoStream { table, what } => format!("{table}: {what}: turn the stream on"),
///         AuditError::Request { operation, source } => format!("{operation}: {source}"),
///         other => other.to_string(),
///     }
/// }
/// # let _ = advice;
/// ```
pub mod audit_error_variants_are_not_matched_field_by_field {}

/// [`idempotent_runtime::Layout::StaticPartition`] is a variant with a named field that a program
/// builds (a table laid out with one constant partition key), and it is not documented as frozen:
/// a program that builds it with a struct expression stops compiling when it gains a field (a key
/// prefix, say). [`Layout::static_partition`](idempotent_runtime::Layout::static_partition) builds it;
/// outside the runtime the struct expression must be refused (E0639).
///
/// ```compile_fail,E0639
/// use idempotent_runtime::Layout;
///
/// let layout = Layout::StaticPartition {
///     value: "tenant-1".to_owned(),
/// };
/// let _ = layout;
/// ```
pub mod static_partition_is_not_built_field_by_field {}
