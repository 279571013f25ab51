//! End-to-end benchmark against DynamoDB Local: `#[idempotent]` on [`DynamoDbStore`] ("ours") beside a
//! hand-written baseline that sends exactly the bare SDK requests the protocol needs and nothing else.
//!
//! ```text
//! scripts/dynamodb-local start            # prints the endpoint
//! IDEMPOTENT_DYNAMODB_ENDPOINT=http://127.0.0.1:PORT \
//!     cargo run --profile bench -p idempotent-examples --bin bench
//! ```
//!
//! For every concurrency (1, 8, 64) and workload it prints calls/s, p50/p99 latency, DynamoDB requests per
//! call (an SDK interceptor counts every HTTP attempt) and the process's CPU time per call
//! (`getrusage(RUSAGE_SELF)`, user + system, every thread). Workloads:
//!
//! - `first`: every call has a new key (claim + complete).
//! - `duplicate`: every call repeats a key completed before the timed run (one failed conditional claim).
//! - `mix`: alternately a new key and a duplicate.
//! - `fail-retry`: new keys; one call in ten fails in the body, and the caller retries it once at once
//!   (claim + fail, then claim + complete). A retried call counts as one call; its latency includes both.
//!
//! The baseline makes the same requests with the same expressions and attribute sizes (key, token,
//! fingerprint, response), but derives no key, hashes no payload, serializes nothing and parses no record:
//! the floor any library on this protocol can reach. `scripts/bench` runs this binary one cell at a time,
//! alternating with the Powertools bench, and writes BENCHMARKS.md's table and chart.
//!
//! `--null-dynamodb` runs `first` and `duplicate` against an in-process HTTP client that answers every
//! request at once (success, or the failed condition with the completed record): the client's own CPU per
//! call, with no server sharing the cores and no network. Baseline, ours, the baseline sent through
//! `customize().config_override(..)` (as the store sends its requests when given a retry policy), ours
//! without the lease heartbeat (what its timer costs), and two steps between the baseline and ours that
//! split the difference: the baseline's calls made through ours' `DynamoDbStore` (`baseline+store`), and
//! those with the protocol's own work added, key derivation, the payload's fingerprint and the response's
//! serialization or decoding (`baseline+store+protocol`).
//!
//! `--memory-keys N` instead measures memory: the process's peak RSS over N distinct first calls on
//! DynamoDB, then the [`MemoryStore`](idempotent_runtime::MemoryStore)'s resident bytes per key.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
    StalledStreamProtectionConfig,
};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use clap::{Parser, ValueEnum};
use idempotent_runtime::store::dynamodb::expression::{self, CLAIMABLE, HELD_BY_TOKEN};
use idempotent_runtime::store::{Change, ClaimOutcome, ClaimRequest, Transition, WriteOutcome};
use idempotent_runtime::{
    AttributeNames, DynamoDbStore, Error, Idempotency, Status, Store, idempotent,
};
use serde::{Deserialize, Serialize};

/// End-to-end benchmark of `#[idempotent]` on DynamoDB Local, beside a bare-SDK baseline.
#[derive(Debug, Parser)]
#[command(about, long_about = None)]
struct Args {
    /// DynamoDB Local's endpoint (default: `$IDEMPOTENT_DYNAMODB_ENDPOINT`; `scripts/dynamodb-local start`
    /// prints one).
    #[arg(long)]
    endpoint: Option<String>,
    /// Concurrent callers (tokio tasks), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 64])]
    concurrency: Vec<usize>,
    /// Workloads, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Workload::ALL)]
    workload: Vec<Workload>,
    /// Implementations, comma-separated; each cell runs them in interleaved rounds (A B B A ...).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Impl::Ours, Impl::Baseline])]
    implementation: Vec<Impl>,
    /// Timed calls per cell.
    #[arg(long, default_value_t = 2_000)]
    calls: usize,
    /// Untimed calls per implementation before the first cell (connections, DynamoDB Local's JIT).
    #[arg(long, default_value_t = 300)]
    warmup: usize,
    /// Keys completed before a `duplicate` or `mix` cell (duplicates cycle over them).
    #[arg(long, default_value_t = 500)]
    seed_keys: usize,
    /// Append one JSON line per cell to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Measure memory over this many distinct keys instead of running the cells.
    #[arg(long)]
    memory_keys: Option<usize>,
    /// Instead of DynamoDB Local, answer every request in-process at once (a null DynamoDB): client CPU
    /// per call with no server and no network, for `first` and `duplicate` at concurrency 1 (those of
    /// `--workload`).
    #[arg(long)]
    null_dynamodb: bool,
    /// An experiment, not part of `scripts/bench`: send the baseline's requests through
    /// `customize().config_override(..)` with an empty override, as the store does, to measure its cost.
    #[arg(long)]
    baseline_config_override: bool,
    /// DynamoDB Local's process id (`scripts/bench` passes it): the server's CPU time, all its threads,
    /// is read around each implementation's rounds, for the server's CPU per call beside the client's.
    #[arg(long)]
    server_pid: Option<u32>,
    /// With --null-dynamodb: only these variants, comma-separated (`baseline`, `ours`,
    /// `baseline+config_override`, `ours-no-heartbeat`, `ours-uncoalesced`, `ours-detached` (the
    /// body on a task of its own), `ours-one-step` (the body as one step), `baseline+store`,
    /// `baseline+store+protocol`;
    /// default: every variant of --implementation), so that one can be counted alone
    /// (`scripts/bench-count`).
    #[arg(long, value_delimiter = ',')]
    variant: Vec<String>,
    /// An experiment, not part of `scripts/bench`: build the SDK client (both sides use the same one)
    /// with stalled-stream protection off, to measure what its per-response timer costs a request.
    #[arg(long)]
    no_stalled_stream_protection: bool,
    /// The runtime the null DynamoDB's calls run on. `multi-thread` (tokio's, a worker per core) is an
    /// experiment, not part of `scripts/bench`: the scheduler's cross-thread work then counts too.
    #[arg(long, value_enum, default_value_t = NullRuntime::CurrentThread)]
    null_runtime: NullRuntime,
    /// An experiment, not part of `scripts/bench`: give the SDK client an operation attempt timeout of
    /// this many milliseconds (none by default), to measure what its per-attempt timer costs.
    #[arg(long)]
    attempt_timeout_ms: Option<u64>,
    /// An experiment, not part of `scripts/bench`: with --null-dynamodb, answer each request only after
    /// yielding to the runtime this many times, so that every request wakes its call and polls it again
    /// from the top this many times more, as a response over a network does (none by default).
    #[arg(long, default_value_t = 0)]
    null_yields: usize,
}

/// The runtime of `--null-dynamodb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum NullRuntime {
    CurrentThread,
    MultiThread,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Workload {
    First,
    Duplicate,
    Mix,
    FailRetry,
}

impl Workload {
    const ALL: [Workload; 4] = [
        Workload::First,
        Workload::Duplicate,
        Workload::Mix,
        Workload::FailRetry,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::First => "first",
            Workload::Duplicate => "duplicate",
            Workload::Mix => "mix",
            Workload::FailRetry => "fail-retry",
        }
    }

    fn needs_seed(self) -> bool {
        matches!(self, Workload::Duplicate | Workload::Mix)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Impl {
    Ours,
    Baseline,
}

impl Impl {
    fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Baseline => "baseline",
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// The function under test, and what both implementations store.

/// The same request may arrive several times.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeRequest {
    tenant: u32,
    order_id: String,
    amount_cents: u64,
    currency: String,
}

impl ChargeRequest {
    fn new(order_id: String) -> Self {
        Self {
            tenant: 7,
            order_id,
            amount_cents: 4_200,
            currency: "EUR".to_owned(),
        }
    }
}

/// What a caller gets back, the first time and on every replay (about 100 bytes of JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
    currency: String,
    status: String,
}

impl Receipt {
    fn for_request(req: &ChargeRequest) -> Self {
        Self {
            charge_id: format!("ch_{}_{}", req.tenant, req.order_id),
            amount_cents: req.amount_cents,
            currency: req.currency.clone(),
            status: "succeeded".to_owned(),
        }
    }
}

#[derive(Debug)]
enum ChargeError {
    Declined,
    Idempotency(Error),
}

impl From<Error> for ChargeError {
    fn from(e: Error) -> Self {
        ChargeError::Idempotency(e)
    }
}

impl std::fmt::Display for ChargeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChargeError::Declined => f.write_str("declined by the gateway"),
            ChargeError::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

/// Body executions of `charge`, to check that duplicates never ran it.
static BODY_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = (req.tenant, &req.order_id), payload = &req, ttl = "24h", name = "bench::charge")]
async fn charge(req: ChargeRequest, fail: bool) -> Result<Receipt, ChargeError> {
    BODY_RUNS.fetch_add(1, Ordering::Relaxed);
    if fail {
        return Err(ChargeError::Declined);
    }
    Ok(Receipt::for_request(&req))
}

/// `charge`'s body (without its failure), run on a task of its own: what `detach` adds to a call.
#[idempotent(
    key = (req.tenant, &req.order_id),
    payload = &req,
    ttl = "24h",
    name = "bench::charge",
    detach
)]
async fn charge_detached(req: ChargeRequest) -> Result<Receipt, ChargeError> {
    BODY_RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(Receipt::for_request(&req))
}

/// `charge`'s body (without its failure) as one step: what a step adds to a call (its stored value,
/// one more write).
#[idempotent(
    key = (req.tenant, &req.order_id),
    payload = &req,
    ttl = "24h",
    name = "bench::charge",
    steps = steps
)]
async fn charge_in_one_step(req: ChargeRequest) -> Result<Receipt, ChargeError> {
    BODY_RUNS.fetch_add(1, Ordering::Relaxed);
    steps
        .run("receipt", || async {
            Ok::<_, ChargeError>(Receipt::for_request(&req))
        })
        .await
}

// ---------------------------------------------------------------------------------------------------------
// Counting requests.

/// Counts every HTTP request the client sends (each attempt, SDK retries included).
#[derive(Debug, Clone, Default)]
struct RequestCounter(Arc<AtomicU64>);

impl RequestCounter {
    fn take(&self) -> u64 {
        self.0.swap(0, Ordering::Relaxed)
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------------------
// The baseline: the bare requests, with the store's own expressions and the same attribute sizes.

/// A claim with a payload fingerprint, no business writes.
const CLAIM: &str = expression::claim_update(true, false);
/// A completion with a stored response, no retention.
const COMPLETE: &str = expression::complete_update(true, false, false);
/// A failure without compensating writes.
const FAIL: &str = expression::fail_update(false);

/// The condition of ours' plain claim without steps, as its store sends it: claimable, holding no
/// steps of an expired operation, and not released by the claim's own call. A bare-SDK implementation
/// of the same protocol sends the same condition, and the SDK signs (hashes) every byte of it, so the
/// baseline sends it too: the comparison counts the client's work, not the length of the protocol's
/// expressions.
fn claim_condition() -> String {
    format!(
        "({CLAIMABLE}) AND ({}) AND {} AND {}",
        expression::STEPS_UNTOUCHED,
        expression::NOT_RELEASED,
        expression::OUTLIVES_RELEASED
    )
}

#[derive(Debug)]
struct Baseline {
    client: Client,
    table: String,
    claim_names: HashMap<String, String>,
    /// [`claim_condition`], built once.
    claim_condition: String,
    transition_names: HashMap<String, String>,
    /// A response of the same size as ours, encoded once.
    response: aws_sdk_dynamodb::primitives::Blob,
    /// A stand-in for the payload's fingerprint (64 hex digits, like ours).
    fingerprint: String,
    tokens: AtomicU64,
    /// The process id, read once: `std::process::id()` is a system call (`getpid`), which a token made
    /// per call would pay and ours' do not.
    pid: u32,
    floor: Floor,
    /// Ours' store on the same client, for [`Floor::Store`] and [`Floor::StoreProtocol`].
    store: DynamoDbStore,
}

/// How the baseline makes its calls: the bare requests, or steps from them towards ours, so that the
/// difference between the two is split by what each step adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Floor {
    /// The bare fluent requests.
    Bare,
    /// The bare requests through `customize().config_override(..)`, with an empty override.
    ConfigOverride,
    /// The same claims and completions through ours' [`DynamoDbStore`], called as a `dyn Store` as ours'
    /// handle calls it: its request building and its parsing of the returned record, nothing else.
    Store,
    /// [`Floor::Store`] plus the protocol's own work: the key derived from `(tenant, order_id)`, the
    /// payload's fingerprint (for a duplicate, compared with the record's, whose status is checked), and
    /// the response serialized (first call) or decoded (duplicate). What ours adds beyond this is its
    /// state machine, the macro's expansion, the call's span and the lease heartbeat.
    StoreProtocol,
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Baseline {
    fn new(client: Client, table: String, floor: Floor) -> Self {
        let store = DynamoDbStore::new(client.clone(), table.clone());
        let receipt = Receipt::for_request(&ChargeRequest::new("0".repeat(24)));
        let claim_condition = claim_condition();
        Self {
            client,
            table,
            claim_names: expression::attribute_names(
                &AttributeNames::default(),
                &[CLAIM, &claim_condition],
            ),
            claim_condition,
            transition_names: expression::attribute_names(
                &AttributeNames::default(),
                &[COMPLETE, FAIL, HELD_BY_TOKEN],
            ),
            response: serde_json::to_vec(&receipt)
                .expect("a receipt serializes")
                .into(),
            fingerprint: "f".repeat(64),
            tokens: AtomicU64::new(0),
            pid: std::process::id(),
            floor,
            store,
        }
    }

    /// The record key: as long as ours (`namespace#` + 64 characters), without hashing; `id` left-padded
    /// with zeros, as `format!("bench::charge#{id:0>64}")` gives it. Copied, not formatted: the floor
    /// builds its strings the cheapest way (`format!` pads one character at a time, and took about 4,400
    /// instructions per duplicate for the key and the token together, about a sixth of what ours does
    /// beyond the floor).
    fn key(id: &str) -> String {
        const PREFIX: &str = "bench::charge#";
        const ZEROS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
        let pad = ZEROS.len().saturating_sub(id.chars().count());
        let mut key = String::with_capacity(PREFIX.len() + pad + id.len());
        key.push_str(PREFIX);
        key.push_str(&ZEROS[..pad]);
        key.push_str(id);
        key
    }

    /// A 36-character token, like a UUID, without a random source: the process id and a counter, as
    /// `format!("{pid:08x}-0000-4000-8000-{n:012x}")` gives them (for counters below 16^12), with each
    /// hex digit written into place rather than formatted.
    fn token(&self) -> String {
        let n = self.tokens.fetch_add(1, Ordering::Relaxed);
        token_text(self.pid, n)
    }

    /// The conditional claim: `None` when claimed, the blocking item otherwise.
    async fn claim(
        &self,
        key: &str,
        token: &str,
    ) -> Result<Option<HashMap<String, AttributeValue>>, BoxError> {
        let now = now_ms();
        let values = HashMap::from([
            (":pending".to_owned(), s("PENDING")),
            (":failed".to_owned(), s("FAILED")),
            (":tk".to_owned(), s(token)),
            (":lu".to_owned(), n(now + 60_000)),
            (":ex".to_owned(), n(now / 1000 + 60 + 86_400)),
            (":ex_ms".to_owned(), n((now / 1000 + 60 + 86_400) * 1000)),
            (":one".to_owned(), n(1)),
            (":now_s".to_owned(), n(now / 1000)),
            (":now_ms".to_owned(), n(now)),
            (":fp".to_owned(), s(&self.fingerprint)),
        ]);
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(key))
            .update_expression(CLAIM)
            .condition_expression(&self.claim_condition)
            .set_expression_attribute_names(Some(self.claim_names.clone()))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let result = if self.floor == Floor::ConfigOverride {
            request
                .customize()
                .config_override(aws_sdk_dynamodb::config::Builder::new())
                .send()
                .await
        } else {
            request.send().await
        };
        match result {
            Ok(_) => Ok(None),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(e)) => {
                    Ok(Some(e.item().cloned().unwrap_or_default()))
                }
                _ => Err(err.into()),
            },
        }
    }

    /// The fenced update out of PENDING: COMPLETED with the response, or FAILED with an error.
    async fn settle(&self, key: &str, token: &str, ok: bool) -> Result<(), BoxError> {
        let expires = now_ms() / 1000 + if ok { 86_400 } else { 60 };
        let mut values = HashMap::from([
            (":pending".to_owned(), s("PENDING")),
            (":tk".to_owned(), s(token)),
            (":ex".to_owned(), n(expires)),
            (":ex_ms".to_owned(), n(expires * 1000)),
        ]);
        let update = if ok {
            values.insert(":completed".to_owned(), s("COMPLETED"));
            values.insert(":rs".to_owned(), AttributeValue::B(self.response.clone()));
            COMPLETE
        } else {
            values.insert(":failed".to_owned(), s("FAILED"));
            values.insert(":er".to_owned(), s("declined by the gateway"));
            FAIL
        };
        let mut names = self.transition_names.clone();
        names.retain(|k, _| update.contains(k.as_str()) || HELD_BY_TOKEN.contains(k.as_str()));
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(key))
            .update_expression(update)
            .condition_expression(HELD_BY_TOKEN)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if self.floor == Floor::ConfigOverride {
            request
                .customize()
                .config_override(aws_sdk_dynamodb::config::Builder::new())
                .send()
                .await?;
        } else {
            request.send().await?;
        }
        Ok(())
    }

    /// A first call: claim, then complete (or fail, claim again and complete).
    async fn first(&self, id: &str, fail_first: bool) -> Result<(), BoxError> {
        if matches!(self.floor, Floor::Store | Floor::StoreProtocol) {
            return self.first_through_store(id, fail_first).await;
        }
        let key = Self::key(id);
        let mut fail = fail_first;
        loop {
            let token = self.token();
            if self.claim(&key, &token).await?.is_some() {
                return Err(format!("baseline: key {key} was already claimed").into());
            }
            self.settle(&key, &token, !fail).await?;
            if !fail {
                return Ok(());
            }
            fail = false;
        }
    }

    /// A duplicate: the one failed conditional claim that returns the stored response.
    async fn duplicate(&self, id: &str) -> Result<usize, BoxError> {
        if matches!(self.floor, Floor::Store | Floor::StoreProtocol) {
            return self.duplicate_through_store(id).await;
        }
        let key = Self::key(id);
        let token = self.token();
        match self.claim(&key, &token).await? {
            Some(item) => match item.get("response") {
                Some(AttributeValue::B(bytes)) => Ok(bytes.as_ref().len()),
                _ => Err(format!("baseline: {key} has no stored response").into()),
            },
            None => Err(format!("baseline: duplicate {key} was claimable").into()),
        }
    }

    /// The claim request of a call at `now`, as ours makes it (one attempt; no clock-skew margin).
    fn claim_request<'a>(
        key: &'a str,
        token: &'a str,
        attempt: u32,
        fingerprint: &'a str,
        now: u64,
    ) -> ClaimRequest<'a> {
        let mut request =
            ClaimRequest::new(key, token, now, now + 60_000, now / 1000 + 60 + 86_400);
        request.attempt = attempt;
        request.fingerprint = Some(fingerprint);
        request
    }

    /// The key and the fingerprint of the call on `id`: derived from the request with
    /// [`Floor::StoreProtocol`], the baseline's stand-ins otherwise.
    fn key_and_fingerprint(&self, id: &str) -> Result<(String, Cow<'_, str>), BoxError> {
        if self.floor == Floor::StoreProtocol {
            let req = ChargeRequest::new(id.to_owned());
            let key =
                idempotent_runtime::derive_key("bench::charge", &(req.tenant, &req.order_id))?;
            Ok((key, Cow::Owned(idempotent_runtime::fingerprint(&req)?)))
        } else {
            Ok((Self::key(id), Cow::Borrowed(&self.fingerprint)))
        }
    }

    /// [`Baseline::first`] through ours' store: a claim and a fenced completion (or failure) as `dyn
    /// Store` calls.
    async fn first_through_store(&self, id: &str, fail_first: bool) -> Result<(), BoxError> {
        let store: &dyn Store = &self.store;
        let (key, fingerprint) = self.key_and_fingerprint(id)?;
        let serialized;
        let response: &[u8] = if self.floor == Floor::StoreProtocol {
            serialized =
                serde_json::to_vec(&Receipt::for_request(&ChargeRequest::new(id.to_owned())))?;
            &serialized
        } else {
            self.response.as_ref()
        };
        let mut fail = fail_first;
        for attempt in 1.. {
            let token = self.token();
            let now = now_ms();
            let claim = Self::claim_request(&key, &token, attempt, &fingerprint, now);
            if store.claim(&claim).await? != ClaimOutcome::Claimed {
                return Err(format!("baseline+store: key {key} was already claimed").into());
            }
            let change = if fail {
                Change::Fail {
                    error: "declined by the gateway",
                    expires_at_s: now / 1000 + 60,
                    release_claim_writes: false,
                }
            } else {
                Change::Complete {
                    response: Some(response),
                    expires_at_s: now / 1000 + 86_400,
                    replay_until_s: None,
                }
            };
            let transition = Transition::new(&key, &token, change);
            if store.transition(&transition).await? != WriteOutcome::Applied {
                return Err(format!("baseline+store: {key} was not ours to settle").into());
            }
            if !fail {
                break;
            }
            fail = false;
        }
        Ok(())
    }

    /// [`Baseline::duplicate`] through ours' store: the claim as a `dyn Store` call, which returns the
    /// blocking record parsed.
    async fn duplicate_through_store(&self, id: &str) -> Result<usize, BoxError> {
        let store: &dyn Store = &self.store;
        let (key, fingerprint) = self.key_and_fingerprint(id)?;
        let token = self.token();
        let claim = Self::claim_request(&key, &token, 1, &fingerprint, now_ms());
        let ClaimOutcome::Existing(record) = store.claim(&claim).await? else {
            return Err(format!("baseline+store: duplicate {key} was claimable").into());
        };
        let Some(response) = record.response else {
            return Err(format!("baseline+store: {key} has no stored response").into());
        };
        if self.floor != Floor::StoreProtocol {
            return Ok(response.len());
        }
        if record.status != Status::Completed
            || record.fingerprint.as_deref() != Some(&*fingerprint)
        {
            return Err(format!(
                "baseline+store+protocol: {key} is not a completed call of this payload"
            )
            .into());
        }
        let receipt: Receipt = serde_json::from_slice(&response)?;
        Ok(receipt.charge_id.len())
    }
}

/// See [`Baseline::token`].
fn token_text(pid: u32, n: u64) -> String {
    fn hex(out: &mut [u8], mut value: u64) {
        for digit in out.iter_mut().rev() {
            *digit = b"0123456789abcdef"[(value & 0xf) as usize];
            value >>= 4;
        }
    }
    let mut token = *b"00000000-0000-4000-8000-000000000000";
    hex(&mut token[..8], u64::from(pid));
    hex(&mut token[24..], n);
    String::from_utf8(token.to_vec()).expect("hex digits and dashes are ASCII")
}

// ---------------------------------------------------------------------------------------------------------
// One call of a workload, for either implementation.

#[derive(Debug)]
enum Op {
    Fresh { id: String, fail_first: bool },
    Duplicate { id: String },
}

fn seed_id(prefix: &str, j: usize) -> String {
    format!("{prefix}-seed-{j}")
}

fn op(workload: Workload, prefix: &str, i: usize, seed_keys: usize) -> Op {
    let fresh = |fail_first| Op::Fresh {
        id: format!("{prefix}-{i}"),
        fail_first,
    };
    match workload {
        Workload::Duplicate => Op::Duplicate {
            id: seed_id(prefix, i % seed_keys),
        },
        Workload::Mix if i.is_multiple_of(2) => Op::Duplicate {
            id: seed_id(prefix, (i / 2) % seed_keys),
        },
        Workload::First | Workload::Mix => fresh(false),
        Workload::FailRetry => fresh(i.is_multiple_of(10)),
    }
}

/// How ours runs `charge`'s body: the null DynamoDB's variants of ours beside the plain one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// In the caller's future (`charge`).
    Inline,
    /// On a task of its own (`charge_detached`).
    Detached,
    /// As one step (`charge_in_one_step`).
    OneStep,
}

impl Body {
    /// The body of the null DynamoDB's variant `label`.
    fn of(label: &str) -> Self {
        match label {
            "ours-detached" => Body::Detached,
            "ours-one-step" => Body::OneStep,
            _ => Body::Inline,
        }
    }
}

#[derive(Debug)]
struct Ctx {
    baseline: Baseline,
    body: Body,
}

async fn run_op(ctx: &Ctx, imp: Impl, op: Op) -> Result<(), BoxError> {
    match (imp, op) {
        (Impl::Ours, Op::Fresh { id, .. } | Op::Duplicate { id }) if ctx.body != Body::Inline => {
            let req = ChargeRequest::new(id);
            let result = if ctx.body == Body::Detached {
                charge_detached(req).await
            } else {
                charge_in_one_step(req).await
            };
            result.map(drop).map_err(|e| e.to_string().into())
        }
        (Impl::Ours, Op::Fresh { id, fail_first }) => {
            let req = ChargeRequest::new(id);
            match charge(req.clone(), fail_first).await {
                Ok(_) => Ok(()),
                Err(ChargeError::Declined) if fail_first => charge(req, false)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string().into()),
                Err(e) => Err(e.to_string().into()),
            }
        }
        (Impl::Ours, Op::Duplicate { id }) => charge(ChargeRequest::new(id), false)
            .await
            .map(drop)
            .map_err(|e| e.to_string().into()),
        (Impl::Baseline, Op::Fresh { id, fail_first }) => ctx.baseline.first(&id, fail_first).await,
        (Impl::Baseline, Op::Duplicate { id }) => ctx.baseline.duplicate(&id).await.map(drop),
    }
}

/// Runs `ops` calls from `concurrency` tasks; returns each call's latency and the number of errors.
async fn drive(
    ctx: &Arc<Ctx>,
    imp: Impl,
    concurrency: usize,
    calls: usize,
    make: Arc<dyn Fn(usize) -> Op + Send + Sync>,
    record: bool,
) -> (Vec<Duration>, usize, Option<String>) {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (ctx, next, make) = (Arc::clone(ctx), Arc::clone(&next), Arc::clone(&make));
            tokio::spawn(async move {
                let mut latencies =
                    Vec::with_capacity(if record { calls / concurrency + 1 } else { 0 });
                let (mut errors, mut first_error) = (0, None);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= calls {
                        break;
                    }
                    let op = make(i);
                    let start = Instant::now();
                    let result = run_op(&ctx, imp, op).await;
                    if record {
                        latencies.push(start.elapsed());
                    }
                    if let Err(e) = result {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                    }
                }
                (latencies, errors, first_error)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(if record { calls } else { 0 });
    let (mut errors, mut first_error) = (0, None);
    for task in tasks {
        let (latencies, e, first) = task.await.expect("a bench task panicked");
        all.extend(latencies);
        errors += e;
        first_error = first_error.or(first);
    }
    (all, errors, first_error)
}

// ---------------------------------------------------------------------------------------------------------
// A null DynamoDB: every request answered in-process, at once.

mod null {
    use std::sync::{Arc, RwLock};

    use aws_smithy_runtime_api::client::http::{
        HttpConnector, HttpConnectorFuture, SharedHttpClient, SharedHttpConnector, http_client_fn,
    };
    use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    /// Answers `200 {}` (the write applied), or, while `rejecting` holds an item, a
    /// `ConditionalCheckFailedException` carrying that item (`ReturnValuesOnConditionCheckFailure=ALL_OLD`).
    #[derive(Debug, Clone, Default)]
    pub(super) struct NullDynamoDb {
        rejecting: Arc<RwLock<Option<Arc<str>>>>,
        /// How many times each answer yields to the runtime first (`--null-yields`).
        yields: usize,
    }

    impl NullDynamoDb {
        /// Answers each request after yielding to the runtime `yields` times.
        pub(super) fn yielding(yields: usize) -> Self {
            Self {
                yields,
                ..Self::default()
            }
        }

        /// From now on, fail every condition and return `item` (DynamoDB JSON of the attribute map).
        pub(super) fn reject_with(&self, item: Option<String>) {
            let body = item.map(|item| {
                format!(
                    r#"{{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed","Item":{item}}}"#
                )
                .into()
            });
            *self.rejecting.write().expect("not poisoned") = body;
        }

        pub(super) fn client(&self) -> SharedHttpClient {
            let connector = SharedHttpConnector::new(self.clone());
            http_client_fn(move |_, _| connector.clone())
        }
    }

    impl HttpConnector for NullDynamoDb {
        fn call(&self, _request: HttpRequest) -> HttpConnectorFuture {
            let rejecting = self.rejecting.read().expect("not poisoned").clone();
            let (status, body) = match rejecting {
                Some(body) => (400, SdkBody::from(body.as_bytes())),
                None => (200, SdkBody::from("{}")),
            };
            let mut response =
                HttpResponse::new(StatusCode::try_from(status).expect("a status"), body);
            response
                .headers_mut()
                .insert("content-type", "application/x-amz-json-1.0");
            if self.yields == 0 {
                return HttpConnectorFuture::ready(Ok(response));
            }
            let yields = self.yields;
            HttpConnectorFuture::new(async move {
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                Ok(response)
            })
        }
    }
}

/// The completed record a duplicate finds, as DynamoDB JSON, for the null DynamoDB to return.
fn completed_item(req: &ChargeRequest) -> Result<String, BoxError> {
    let key = idempotent_runtime::derive_key("bench::charge", &(req.tenant, &req.order_id))?;
    let fingerprint = idempotent_runtime::fingerprint(req)?;
    let response = serde_json::to_vec(&Receipt::for_request(req))?;
    let b64 = base64_encode(&response);
    Ok(serde_json::json!({
        "pk": {"S": key},
        "status": {"S": "COMPLETED"},
        "token": {"S": "00000000-0000-4000-8000-000000000000"},
        "attempt": {"N": "1"},
        "expires_at": {"N": (now_ms() / 1000 + 86_400).to_string()},
        "fingerprint": {"S": fingerprint},
        "response": {"B": b64},
    })
    .to_string())
}

fn base64_encode(bytes: &[u8]) -> String {
    aws_smithy_types::base64::encode(bytes)
}

/// A client whose requests the null DynamoDB answers, counting them.
fn null_client(sdk: SdkOptions, yields: usize) -> (null::NullDynamoDb, RequestCounter, Client) {
    let null = null::NullDynamoDb::yielding(yields);
    let counter = RequestCounter::default();
    let config = client_config("http://127.0.0.1:9", &counter, sdk).http_client(null.client());
    (null, counter, Client::from_conf(config.build()))
}

/// One variant of the null DynamoDB: its implementation, how the baseline makes its calls, its name, and
/// ours' handle.
type NullVariant<'h> = (Impl, Floor, &'static str, Option<&'h Idempotency>);

/// The null DynamoDB's variants of the implementations in `only`, and of those only the ones `named`
/// names when it names any.
fn null_variants<'h>(
    ours: &'h Idempotency,
    ours_no_heartbeat: &'h Idempotency,
    ours_uncoalesced: &'h Idempotency,
    only: &[Impl],
    named: &[String],
) -> Result<Vec<NullVariant<'h>>, BoxError> {
    let variants: Vec<NullVariant<'h>> = [
        (Impl::Baseline, Floor::Bare, "baseline", None),
        (Impl::Ours, Floor::Bare, "ours", Some(ours)),
        (
            Impl::Baseline,
            Floor::ConfigOverride,
            "baseline+config_override",
            None,
        ),
        (
            Impl::Ours,
            Floor::Bare,
            "ours-no-heartbeat",
            Some(ours_no_heartbeat),
        ),
        (
            Impl::Ours,
            Floor::Bare,
            "ours-uncoalesced",
            Some(ours_uncoalesced),
        ),
        (Impl::Ours, Floor::Bare, "ours-detached", Some(ours)),
        (Impl::Ours, Floor::Bare, "ours-one-step", Some(ours)),
        (Impl::Baseline, Floor::Store, "baseline+store", None),
        (
            Impl::Baseline,
            Floor::StoreProtocol,
            "baseline+store+protocol",
            None,
        ),
    ]
    .into_iter()
    .filter(|&(imp, _, label, _)| {
        only.contains(&imp) && (named.is_empty() || named.iter().any(|n| n == label))
    })
    .collect();
    match named
        .iter()
        .find(|n| !variants.iter().any(|&(_, _, label, _)| label == n.as_str()))
    {
        Some(unknown) => Err(format!(
            "--variant {unknown}: not one of baseline, ours, baseline+config_override, \
             ours-no-heartbeat, ours-uncoalesced, ours-detached, ours-one-step, baseline+store, \
             baseline+store+protocol (of the implementations --implementation names)"
        )
        .into()),
        None => Ok(variants),
    }
}

/// Client CPU per call with no server: `first` and `duplicate`, one caller, `calls` calls each.
async fn null_cells(
    calls: usize,
    warmup: usize,
    only: &[Impl],
    named: &[String],
    workloads: &[Workload],
    sdk: SdkOptions,
    yields: usize,
) -> Result<Vec<Cell>, BoxError> {
    // Many short interleaved rounds, in an order that rotates every round (A B C D, B C D A, ...): the
    // machine's speed drifts over seconds (other processes, the hypervisor), so each variant is compared
    // with the baseline within the same round, and its ratio is the median of those per-round ratios.
    const ROUNDS: usize = 100;
    let (null, counter, client) = null_client(sdk, yields);
    let store = DynamoDbStore::new(client.clone(), "bench-ours");
    let ours = Idempotency::builder(store.clone()).build();
    // The same handle without the lease heartbeat: what the heartbeat's timer costs a call.
    let ours_no_heartbeat = Idempotency::builder(store.clone()).heartbeat(false).build();
    // The same handle without coalescing: what the flight map costs a call that finds no flight.
    let ours_uncoalesced = Idempotency::builder(store).coalesce(false).build();
    ours.install();
    let variants = null_variants(&ours, &ours_no_heartbeat, &ours_uncoalesced, only, named)?;
    let dup = ChargeRequest::new("null-duplicate".to_owned());
    let item = completed_item(&dup)?;
    let per_round = calls.div_ceil(ROUNDS).max(1);
    let mut results = Vec::new();
    for workload in [Workload::First, Workload::Duplicate]
        .into_iter()
        .filter(|w| workloads.contains(w))
    {
        null.reject_with((workload == Workload::Duplicate).then(|| item.clone()));
        let make: Arc<dyn Fn(usize) -> Op + Send + Sync> = Arc::new(move |i| match workload {
            Workload::Duplicate => Op::Duplicate {
                id: "null-duplicate".to_owned(),
            },
            _ => Op::Fresh {
                id: format!("null-{i}"),
                fail_first: false,
            },
        });
        let contexts: Vec<_> = variants
            .iter()
            .map(|&(_, floor, label, _)| {
                Arc::new(Ctx {
                    baseline: Baseline::new(client.clone(), "bench-baseline".to_owned(), floor),
                    body: Body::of(label),
                })
            })
            .collect();
        for (ctx, &(imp, _, _, handle)) in contexts.iter().zip(&variants) {
            handle.inspect(|h| h.install());
            drive(ctx, imp, 1, warmup, Arc::clone(&make), false).await;
        }
        let mut rounds: Vec<Vec<(f64, f64)>> = vec![Vec::new(); variants.len()];
        let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
        let mut requests = vec![0_u64; variants.len()];
        for round in 0..ROUNDS {
            for v in interleaved(round, variants.len()) {
                let (ctx, &(imp, _, label, handle)) = (&contexts[v], &variants[v]);
                handle.inspect(|h| h.install());
                counter.take();
                let cpu0 = cpu_time();
                let t0 = Instant::now();
                let (lat, _, first_error) =
                    drive(ctx, imp, 1, per_round, Arc::clone(&make), true).await;
                let elapsed = t0.elapsed().as_secs_f64();
                let cpu = cpu_time().saturating_sub(cpu0).as_secs_f64();
                if let Some(e) = first_error {
                    return Err(format!("null DynamoDB, {label} {}: {e}", workload.name()).into());
                }
                requests[v] += counter.take();
                #[allow(clippy::cast_precision_loss)]
                let n = per_round as f64;
                rounds[v].push((n / elapsed, cpu * 1e6 / n));
                latencies[v].extend(lat);
            }
        }
        let baseline = variants
            .iter()
            .position(|&(imp, floor, _, _)| imp == Impl::Baseline && floor == Floor::Bare);
        for (v, &(_, _, label, _)) in variants.iter().enumerate() {
            let median = |pick: fn(&(f64, f64)) -> f64| quartiles(rounds[v].iter().map(pick)).0;
            // This variant's CPU per call over the baseline's, round by round.
            let vs_baseline = baseline
                .map(|b| quartiles(rounds[v].iter().zip(&rounds[b]).map(|(v, b)| v.1 / b.1)));
            latencies[v].sort_unstable();
            results.push(Cell {
                kind: "null",
                implementation: label,
                workload: workload.name(),
                concurrency: 1,
                calls: per_round * ROUNDS,
                errors: 0,
                seconds: f64::NAN,
                calls_per_s: median(|r| r.0),
                p50_ms: percentile_ms(&latencies[v], 0.50),
                p99_ms: percentile_ms(&latencies[v], 0.99),
                requests_per_call: ratio(requests[v], per_round * ROUNDS),
                cpu_us_per_call: median(|r| r.1),
                server_cpu_us_per_call: None,
                cpu_vs_baseline: vs_baseline.map(|r| r.0),
                cpu_vs_baseline_quartiles: vs_baseline.map(|r| (r.1, r.2)),
            });
        }
    }
    Ok(results)
}

// ---------------------------------------------------------------------------------------------------------
// Measuring.

/// The order of `n` implementations in round `round`: rotated by one every round (A B C, B C A, C A B,
/// ...; for two, A B, B A), so that over `n` rounds each takes every place once and a drift over the
/// run favours none of them. Not reversed every round (A B C, C B A): for three or more, that runs the
/// first and the last twice in a row at every other boundary between rounds, the second time on caches
/// they have just warmed, an advantage the others never get.
fn interleaved(round: usize, n: usize) -> Vec<usize> {
    (0..n).map(|i| (round + i) % n).collect()
}

/// The median, first and third quartiles of `values` (not empty).
fn quartiles(values: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut xs: Vec<f64> = values.collect();
    xs.sort_by(f64::total_cmp);
    let at = |q: usize| xs[(xs.len() - 1) * q / 4];
    (at(2), at(1), at(3))
}

/// User + system CPU time of the whole process (every thread), from `getrusage(RUSAGE_SELF)`.
fn cpu_time() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage(RUSAGE_SELF) cannot fail");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
    };
    tv(usage.user_time()) + tv(usage.system_time())
}

/// CPU time of the process `pid` so far, every thread's: the sum of the first field (time on the CPU,
/// in nanoseconds) of each `/proc/PID/task/*/schedstat`. `None` when the process cannot be read. A
/// thread that exits between two readings takes its time with it; DynamoDB Local's request threads are
/// a pool that lives as long as the server.
fn process_cpu_time(pid: u32) -> Option<Duration> {
    let mut total = 0_u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue; // exited meanwhile
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// Peak resident set size of the process so far, in bytes (`ru_maxrss`, KiB on Linux).
fn peak_rss_bytes() -> u64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage(RUSAGE_SELF) cannot fail");
    u64::try_from(usage.max_rss()).unwrap_or(0) * 1024
}

/// Current resident set size, in bytes (`VmRSS` in /proc/self/status).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[derive(Debug, Serialize)]
struct Cell {
    kind: &'static str,
    implementation: &'static str,
    workload: &'static str,
    concurrency: usize,
    calls: usize,
    errors: usize,
    seconds: f64,
    calls_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    requests_per_call: f64,
    cpu_us_per_call: f64,
    /// The server's CPU time per call (every thread of the `--server-pid` process), when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    server_cpu_us_per_call: Option<f64>,
    /// Null DynamoDB: the median over rounds of this variant's CPU per call over the baseline's in the
    /// same round.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_vs_baseline: Option<f64>,
    /// Null DynamoDB: the first and third quartiles of those per-round ratios.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_vs_baseline_quartiles: Option<(f64, f64)>,
}

#[allow(clippy::cast_precision_loss)] // counts far below 2^52
fn ratio(a: u64, b: usize) -> f64 {
    a as f64 / b as f64
}

fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

/// One implementation's share of a cell, summed over its rounds.
#[derive(Debug)]
struct Run {
    imp: Impl,
    prefix: String,
    latencies: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
    elapsed: Duration,
    cpu: Duration,
    /// The server's, when its process id is known and readable at every round.
    server_cpu: Option<Duration>,
    requests: u64,
    body_runs: usize,
}

impl Default for Run {
    fn default() -> Self {
        Self {
            imp: Impl::Ours,
            prefix: String::new(),
            latencies: Vec::new(),
            errors: 0,
            first_error: None,
            elapsed: Duration::ZERO,
            cpu: Duration::ZERO,
            server_cpu: Some(Duration::ZERO),
            requests: 0,
            body_runs: 0,
        }
    }
}

struct Bench {
    ctx: Arc<Ctx>,
    counter: RequestCounter,
    run: String,
    seed_keys: usize,
    server_pid: Option<u32>,
}

impl Bench {
    /// One cell per implementation, measured in interleaved rounds (A B B A ...), so that a drift of
    /// DynamoDB Local (its JIT, its table growing, other processes) does not favour whoever runs last.
    async fn cells(
        &self,
        impls: &[Impl],
        workload: Workload,
        concurrency: usize,
        calls: usize,
    ) -> Result<Vec<Cell>, BoxError> {
        const ROUNDS: usize = 8;
        let per_round = calls.div_ceil(ROUNDS).max(1);
        let calls = per_round * ROUNDS;
        let seed_keys = self.seed_keys.min(calls).max(1);
        let mut runs = Vec::new();
        for &imp in impls {
            let prefix = format!(
                "{}-{}-{}-c{concurrency}",
                self.run,
                imp.name(),
                workload.name()
            );
            if workload.needs_seed() {
                self.seed(imp, &prefix, seed_keys).await?;
            }
            runs.push(Run {
                imp,
                prefix,
                ..Run::default()
            });
        }
        for round in 0..ROUNDS {
            for k in interleaved(round, runs.len()) {
                let run = &mut runs[k];
                let (prefix, offset) = (run.prefix.clone(), round * per_round);
                let make: Arc<dyn Fn(usize) -> Op + Send + Sync> =
                    Arc::new(move |i| op(workload, &prefix, offset + i, seed_keys));
                let body_runs = BODY_RUNS.load(Ordering::Relaxed);
                self.counter.take();
                let server0 = self.server_pid.and_then(process_cpu_time);
                let cpu0 = cpu_time();
                let t0 = Instant::now();
                let (latencies, errors, first_error) =
                    drive(&self.ctx, run.imp, concurrency, per_round, make, true).await;
                run.elapsed += t0.elapsed();
                run.cpu += cpu_time().saturating_sub(cpu0);
                let server1 = self.server_pid.and_then(process_cpu_time);
                run.server_cpu = run
                    .server_cpu
                    .zip(server0.zip(server1))
                    .map(|(sum, (before, after))| sum + after.saturating_sub(before));
                run.requests += self.counter.take();
                run.body_runs += BODY_RUNS.load(Ordering::Relaxed) - body_runs;
                run.latencies.extend(latencies);
                run.errors += errors;
                run.first_error = run.first_error.take().or(first_error);
            }
        }
        let mut out = Vec::new();
        for mut run in runs {
            if let Some(e) = &run.first_error {
                eprintln!(
                    "bench: {} {} c={concurrency}: {} calls failed, first: {e}",
                    run.imp.name(),
                    workload.name(),
                    run.errors
                );
            }
            if run.imp == Impl::Ours {
                let expected = (0..calls)
                    .map(|i| match op(workload, "", i, seed_keys) {
                        Op::Fresh { fail_first, .. } => 1 + usize::from(fail_first),
                        Op::Duplicate { .. } => 0,
                    })
                    .sum::<usize>();
                if run.body_runs != expected && run.errors == 0 {
                    return Err(format!(
                        "the body ran {} times, expected {expected}",
                        run.body_runs
                    )
                    .into());
                }
            }
            run.latencies.sort_unstable();
            #[allow(clippy::cast_precision_loss)]
            let calls_f = calls as f64;
            out.push(Cell {
                kind: "cell",
                implementation: run.imp.name(),
                workload: workload.name(),
                concurrency,
                calls,
                errors: run.errors,
                seconds: run.elapsed.as_secs_f64(),
                calls_per_s: calls_f / run.elapsed.as_secs_f64(),
                p50_ms: percentile_ms(&run.latencies, 0.50),
                p99_ms: percentile_ms(&run.latencies, 0.99),
                requests_per_call: ratio(run.requests, calls),
                cpu_us_per_call: run.cpu.as_secs_f64() * 1e6 / calls_f,
                server_cpu_us_per_call: run.server_cpu.map(|cpu| cpu.as_secs_f64() * 1e6 / calls_f),
                cpu_vs_baseline: None,
                cpu_vs_baseline_quartiles: None,
            });
        }
        Ok(out)
    }

    /// Completes `keys` keys for a cell's duplicates, untimed.
    async fn seed(&self, imp: Impl, prefix: &str, keys: usize) -> Result<(), BoxError> {
        let prefix = prefix.to_owned();
        let seed: Arc<dyn Fn(usize) -> Op + Send + Sync> = Arc::new(move |j| Op::Fresh {
            id: seed_id(&prefix, j),
            fail_first: false,
        });
        let (_, errors, first) = drive(&self.ctx, imp, 16, keys, seed, false).await;
        match first {
            Some(e) => Err(format!("{errors} seed calls failed, first: {e}").into()),
            None => Ok(()),
        }
    }

    async fn warm_up(&self, imp: Impl, calls: usize) -> Result<(), BoxError> {
        if calls == 0 {
            return Ok(());
        }
        let prefix = format!("{}-{}-warmup", self.run, imp.name());
        let make: Arc<dyn Fn(usize) -> Op + Send + Sync> =
            Arc::new(move |i| op(Workload::First, &prefix, i, 1));
        let (_, errors, first) = drive(&self.ctx, imp, 8, calls, make, false).await;
        match first {
            Some(e) => Err(format!("{errors} warm-up calls failed, first: {e}").into()),
            None => Ok(()),
        }
    }
}

fn print_table(cells: &[Cell]) {
    let mut out = String::new();
    out.push_str("| implementation | workload | concurrency | calls | calls/s | p50 ms | p99 ms | requests/call | CPU µs/call | errors |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for c in cells {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.0} | {} |",
            c.implementation,
            c.workload,
            c.concurrency,
            c.calls,
            c.calls_per_s,
            c.p50_ms,
            c.p99_ms,
            c.requests_per_call,
            c.cpu_us_per_call,
            c.errors
        );
    }
    let find = |imp: &str, w: &str, conc: usize| {
        cells
            .iter()
            .find(|c| c.implementation == imp && c.workload == w && c.concurrency == conc)
    };
    let mut ratios = String::new();
    for c in cells.iter().filter(|c| c.implementation == "ours") {
        if let Some(b) = find("baseline", c.workload, c.concurrency) {
            let _ = writeln!(
                ratios,
                "| {} | {} | {:.2} | {:.2} |",
                c.workload,
                c.concurrency,
                c.calls_per_s / b.calls_per_s,
                c.cpu_us_per_call / b.cpu_us_per_call
            );
        }
    }
    if !ratios.is_empty() {
        out.push_str("\n| workload | concurrency | throughput ours/baseline | CPU/call ours/baseline |\n|---|---:|---:|---:|\n");
        out.push_str(&ratios);
    }
    print!("{out}");
}

fn append_json<T: Serialize>(path: Option<&PathBuf>, value: &T) -> std::io::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let line = serde_json::to_string(value).map_err(std::io::Error::other)?;
    writeln!(file, "{line}")
}

fn client_at(endpoint: &str, counter: &RequestCounter, sdk: SdkOptions) -> Client {
    Client::from_conf(client_config(endpoint, counter, sdk).build())
}

/// The SDK client's configuration both sides share, for DynamoDB Local at `endpoint` (or the null
/// DynamoDB, which adds its HTTP client): local credentials, the request counter, and `sdk`'s settings.
fn client_config(
    endpoint: &str,
    counter: &RequestCounter,
    sdk: SdkOptions,
) -> aws_sdk_dynamodb::config::Builder {
    let mut config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("local", "local", None, None, "bench"))
        .interceptor(counter.clone())
        .stalled_stream_protection(sdk.stalled_stream());
    config.set_timeout_config(sdk.timeouts());
    config
}

/// The SDK client's settings that the experiments change (both sides share the client).
#[derive(Debug, Clone, Copy)]
struct SdkOptions {
    /// Stalled-stream protection: on is the SDK's default.
    stalled_stream_protection: bool,
    /// An operation attempt timeout: none is the SDK's default.
    attempt_timeout: Option<Duration>,
}

impl Default for SdkOptions {
    /// The SDK's defaults.
    fn default() -> Self {
        Self {
            stalled_stream_protection: true,
            attempt_timeout: None,
        }
    }
}

impl SdkOptions {
    fn of(args: &Args) -> Self {
        Self {
            stalled_stream_protection: !args.no_stalled_stream_protection,
            attempt_timeout: args.attempt_timeout_ms.map(Duration::from_millis),
        }
    }

    fn stalled_stream(self) -> StalledStreamProtectionConfig {
        if self.stalled_stream_protection {
            StalledStreamProtectionConfig::enabled().build()
        } else {
            StalledStreamProtectionConfig::disabled()
        }
    }

    /// Set only for an attempt timeout, so that the SDK's default timeouts stay as they are otherwise.
    fn timeouts(self) -> Option<TimeoutConfig> {
        self.attempt_timeout.map(|timeout| {
            TimeoutConfig::builder()
                .operation_attempt_timeout(timeout)
                .build()
        })
    }
}

#[derive(Debug, Serialize)]
struct Memory {
    kind: &'static str,
    keys: usize,
    dynamodb_concurrency: usize,
    dynamodb_seconds: f64,
    dynamodb_errors: usize,
    peak_rss_mib_before: f64,
    peak_rss_mib_after: f64,
    store_bytes_per_key: f64,
    store_records: usize,
}

#[allow(clippy::cast_precision_loss)]
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Peak RSS over `keys` distinct first calls on DynamoDB, then the memory store's resident bytes per key.
async fn memory(bench: &Bench, idem: &Idempotency, keys: usize) -> Result<Memory, BoxError> {
    const CONCURRENCY: usize = 64;
    idem.install();
    bench.warm_up(Impl::Ours, 200).await?;
    let peak_before = peak_rss_bytes();
    let prefix = format!("{}-memory", bench.run);
    let make: Arc<dyn Fn(usize) -> Op + Send + Sync> =
        Arc::new(move |i| op(Workload::First, &prefix, i, 1));
    let t0 = Instant::now();
    let (_, errors, first) = drive(&bench.ctx, Impl::Ours, CONCURRENCY, keys, make, false).await;
    let seconds = t0.elapsed().as_secs_f64();
    if let Some(e) = first {
        eprintln!("bench: memory run: {errors} calls failed, first: {e}");
    }
    let peak_after = peak_rss_bytes();

    // The memory store, in the same process: resident bytes before and after `keys` records.
    let store = Arc::new(idempotent_runtime::MemoryStore::new());
    let local = Idempotency::builder_arc(store.clone()).build();
    local.install();
    let rss0 = rss_bytes();
    for i in 0..keys {
        charge(ChargeRequest::new(format!("{}-mem-{i}", bench.run)), false)
            .await
            .map_err(|e| e.to_string())?;
    }
    let rss1 = rss_bytes();
    let records = store.len();
    idem.install();
    #[allow(clippy::cast_precision_loss)]
    let per_key = rss1.saturating_sub(rss0) as f64 / records.max(1) as f64;
    drop(local);
    Ok(Memory {
        kind: "memory",
        keys,
        dynamodb_concurrency: CONCURRENCY,
        dynamodb_seconds: seconds,
        dynamodb_errors: errors,
        peak_rss_mib_before: mib(peak_before),
        peak_rss_mib_after: mib(peak_after),
        store_bytes_per_key: per_key,
        store_records: records,
    })
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    // The null DynamoDB's calls run on one thread: each call's CPU is then the client's own work. On
    // the multi-thread runtime, the second worker's wake-ups and searches for work also count (about a
    // third of the floor's CPU per call on the bench's machine, the same for every variant), and how
    // many there are varies from process to process, which widened the spread of a process's ratios
    // two to three times (`--null-runtime multi-thread` measures that way).
    let one_thread = args.null_dynamodb && args.null_runtime == NullRuntime::CurrentThread;
    let runtime = if one_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()?;
    if args.null_dynamodb {
        runtime.block_on(without_a_server(&args))
    } else {
        runtime.block_on(against_dynamodb(&args))
    }
}

/// The null DynamoDB's cells.
async fn without_a_server(args: &Args) -> Result<(), BoxError> {
    let cells = null_cells(
        args.calls.max(1),
        args.warmup,
        &args.implementation,
        &args.variant,
        &args.workload,
        SdkOptions::of(args),
        args.null_yields,
    )
    .await?;
    for cell in &cells {
        append_json(args.json.as_ref(), cell)?;
    }
    print_table(&cells);
    Ok(())
}

/// The cells (or the memory measurement) against DynamoDB Local.
async fn against_dynamodb(args: &Args) -> Result<(), BoxError> {
    let endpoint = args
        .endpoint
        .clone()
        .or_else(|| std::env::var("IDEMPOTENT_DYNAMODB_ENDPOINT").ok())
        .ok_or(
            "no DynamoDB endpoint: start DynamoDB Local with `scripts/dynamodb-local start` and pass \
             --endpoint or set IDEMPOTENT_DYNAMODB_ENDPOINT to the URL it prints (or run `scripts/bench`)",
        )?;
    if let Some(pid) = args.server_pid
        && process_cpu_time(pid).is_none()
    {
        return Err(format!("--server-pid {pid}: /proc/{pid}/task cannot be read").into());
    }
    let counter = RequestCounter::default();
    let client = client_at(&endpoint, &counter, SdkOptions::of(args));
    let store = DynamoDbStore::new(client.clone(), "bench-ours");
    store.create_table().await?;
    DynamoDbStore::new(client.clone(), "bench-baseline")
        .create_table()
        .await?;
    let idem = Idempotency::builder(store).build();
    idem.install();
    let run = format!(
        "{:x}-{:x}",
        std::process::id(),
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis()
    );
    let bench = Bench {
        ctx: Arc::new(Ctx {
            body: Body::Inline,
            baseline: Baseline::new(
                client,
                "bench-baseline".to_owned(),
                if args.baseline_config_override {
                    Floor::ConfigOverride
                } else {
                    Floor::Bare
                },
            ),
        }),
        counter,
        run,
        server_pid: args.server_pid,
        seed_keys: args.seed_keys.max(1),
    };

    if let Some(keys) = args.memory_keys {
        let m = memory(&bench, &idem, keys).await?;
        println!(
            "memory: peak RSS {:.1} MiB after {} distinct keys on DynamoDB at concurrency {} ({:.1} MiB before; {:.1} s, {} errors); memory store: {:.0} resident bytes per key ({} records)",
            m.peak_rss_mib_after,
            m.keys,
            m.dynamodb_concurrency,
            m.peak_rss_mib_before,
            m.dynamodb_seconds,
            m.dynamodb_errors,
            m.store_bytes_per_key,
            m.store_records
        );
        append_json(args.json.as_ref(), &m)?;
        return Ok(());
    }

    for &imp in &args.implementation {
        bench.warm_up(imp, args.warmup).await?;
    }
    let mut cells = Vec::new();
    for &concurrency in &args.concurrency {
        for &workload in &args.workload {
            for cell in bench
                .cells(
                    &args.implementation,
                    workload,
                    concurrency.max(1),
                    args.calls.max(1),
                )
                .await?
            {
                append_json(args.json.as_ref(), &cell)?;
                cells.push(cell);
            }
        }
    }
    print_table(&cells);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The baseline's key and token are the very strings `format!` gave them before they were copied
    /// into place instead.
    #[test]
    fn the_baselines_key_and_token_are_what_format_gives() {
        for id in ["", "1", "run-7-seed-42", &"x".repeat(64), &"y".repeat(70)] {
            assert_eq!(Baseline::key(id), format!("bench::charge#{id:0>64}"));
        }
        for (pid, n) in [(0, 0), (1, 15), (4_194_304, 16), (u32::MAX, (1 << 48) - 1)] {
            assert_eq!(
                token_text(pid, n),
                format!("{pid:08x}-0000-4000-8000-{n:012x}")
            );
        }
    }

    #[test]
    fn rounds_rotate_their_order() {
        assert_eq!(interleaved(0, 2), [0, 1]);
        assert_eq!(interleaved(1, 2), [1, 0]);
        assert_eq!(interleaved(0, 3), [0, 1, 2]);
        assert_eq!(interleaved(1, 3), [1, 2, 0]);
        assert_eq!(interleaved(2, 3), [2, 0, 1]);
        for n in 3..8 {
            for round in 0..3 * n {
                // No implementation runs twice in a row across two rounds.
                assert_ne!(
                    interleaved(round, n).last(),
                    interleaved(round + 1, n).first(),
                    "{n} implementations, rounds {round} and {}",
                    round + 1
                );
            }
            // Over n rounds, each takes every place once.
            for place in 0..n {
                let mut at: Vec<usize> = (0..n).map(|round| interleaved(round, n)[place]).collect();
                at.sort_unstable();
                assert_eq!(at, (0..n).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn quartiles_are_taken_from_the_sorted_values() {
        assert_eq!(
            quartiles([5.0, 1.0, 4.0, 2.0, 3.0].into_iter()),
            (3.0, 2.0, 4.0)
        );
        assert_eq!(quartiles([7.0].into_iter()), (7.0, 7.0, 7.0));
    }

    #[test]
    fn the_steps_between_the_baseline_and_ours_are_variants_of_their_own() {
        let (_, _, client) = null_client(SdkOptions::default(), 0);
        let idem = Idempotency::builder(DynamoDbStore::new(client, "t")).build();
        let named = [
            "baseline+store".to_owned(),
            "baseline+store+protocol".to_owned(),
        ];
        let variants =
            null_variants(&idem, &idem, &idem, &[Impl::Baseline, Impl::Ours], &named).unwrap();
        let floors: Vec<_> = variants
            .iter()
            .map(|&(imp, floor, label, _)| (imp, floor, label))
            .collect();
        assert_eq!(
            floors,
            [
                (Impl::Baseline, Floor::Store, "baseline+store"),
                (
                    Impl::Baseline,
                    Floor::StoreProtocol,
                    "baseline+store+protocol"
                ),
            ]
        );
        let unknown = null_variants(
            &idem,
            &idem,
            &idem,
            &[Impl::Baseline],
            &["store".to_owned()],
        )
        .unwrap_err();
        assert!(
            unknown.to_string().contains("baseline+store+protocol"),
            "{unknown}"
        );
    }

    #[tokio::test]
    async fn the_store_steps_make_the_baselines_requests_and_check_what_they_get() {
        let (null, counter, client) = null_client(SdkOptions::default(), 0);
        for floor in [Floor::Store, Floor::StoreProtocol] {
            let baseline = Baseline::new(client.clone(), "t".to_owned(), floor);
            // A first call: one claim and one completion; one that fails first: two of each.
            null.reject_with(None);
            baseline.first("a", false).await.unwrap();
            assert_eq!(counter.take(), 2, "{floor:?}");
            baseline.first("b", true).await.unwrap();
            assert_eq!(counter.take(), 4, "{floor:?}");
            // A duplicate: one failed claim, which returns the completed record.
            let dup = ChargeRequest::new("dup".to_owned());
            null.reject_with(Some(completed_item(&dup).unwrap()));
            let response = serde_json::to_vec(&Receipt::for_request(&dup)).unwrap();
            let got = baseline.duplicate("dup").await.unwrap();
            assert_eq!(counter.take(), 1, "{floor:?}");
            match floor {
                // The stored response's length, as the bare baseline returns.
                Floor::Store => assert_eq!(got, response.len()),
                // The decoded receipt's id.
                _ => assert_eq!(got, Receipt::for_request(&dup).charge_id.len()),
            }
            // Another payload under the record: only the protocol's step compares fingerprints.
            let other = baseline.duplicate("other").await;
            assert_eq!(counter.take(), 1, "{floor:?}");
            match floor {
                Floor::Store => assert_eq!(other.unwrap(), response.len()),
                _ => assert!(
                    other
                        .unwrap_err()
                        .to_string()
                        .contains("not a completed call of this payload")
                ),
            }
        }
    }

    /// `--null-yields N`: the same answers and requests, each request polling its call N times more.
    #[tokio::test]
    async fn a_yielding_null_dynamodb_answers_the_same_after_more_polls() {
        async fn polled<F: Future>(future: F) -> (F::Output, usize) {
            let mut future = std::pin::pin!(future);
            let mut polls = 0;
            let output = std::future::poll_fn(|cx| {
                polls += 1;
                future.as_mut().poll(cx)
            })
            .await;
            (output, polls)
        }
        let mut polls = Vec::new();
        for yields in [0, 3] {
            let (null, counter, client) = null_client(SdkOptions::default(), yields);
            let baseline = Baseline::new(client, "t".to_owned(), Floor::Bare);
            null.reject_with(None);
            let (first, first_polls) = polled(baseline.first("a", false)).await;
            first.unwrap();
            assert_eq!(counter.take(), 2);
            let dup = ChargeRequest::new("dup".to_owned());
            null.reject_with(Some(completed_item(&dup).unwrap()));
            let (got, dup_polls) = polled(baseline.duplicate("dup")).await;
            let response = serde_json::to_vec(&Receipt::for_request(&dup)).unwrap();
            assert_eq!(got.unwrap(), response.len());
            assert_eq!(counter.take(), 1);
            polls.push((first_polls, dup_polls));
        }
        let [(first, dup), (first_yielding, dup_yielding)] = polls[..] else {
            unreachable!("two runs")
        };
        assert!(first_yielding >= first + 2 * 3, "{polls:?}");
        assert!(dup_yielding >= dup + 3, "{polls:?}");
    }

    #[test]
    fn a_process_cpu_time_grows_with_the_work_of_its_threads() {
        let pid = std::process::id();
        let before = process_cpu_time(pid).expect("this process's own /proc entry");
        // Busy on this thread (which outlives the readings) until the reading moves by 20 ms, or give up
        // after 10 s of wall time.
        let started = Instant::now();
        let mut x = 0_u64;
        let moved = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            let now = process_cpu_time(pid).expect("this process's own /proc entry");
            if now >= before + Duration::from_millis(20) {
                break true;
            }
            if started.elapsed() > Duration::from_secs(10) {
                break false;
            }
        };
        assert!(
            moved,
            "10 s of busy work did not move the process's CPU time by 20 ms"
        );
        assert_eq!(process_cpu_time(u32::MAX), None, "no such process");
    }
}
