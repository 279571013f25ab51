//! Retry storms into one process, on DynamoDB Local: `calls` concurrent identical calls (one key, one
//! handle), with and without `wait`, with coalescing off and on. Per storm it prints the DynamoDB
//! requests the process sent (counted by an SDK interceptor), the write and read units they consume,
//! how the calls ended, and the latency of every call but the one that ran the body (p50, p99).
//!
//! ```text
//! scripts/dynamodb-local start
//! cargo run --release -p idempotent-examples --bin storm -- --endpoint "$(scripts/dynamodb-local endpoint)"
//! ```
//!
//! Units: every record here is under 1 KB, so each conditional write (a claim, a completion, and a
//! refused claim too: a failed condition consumes the item's size) consumes 1 write unit, and each
//! strongly consistent `GetItem` (a poll) 1 read unit. The body takes 50 ms, a fast handler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
};
use clap::Parser;
use idempotent_runtime::{DynamoDbStore, Error, Idempotency};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Retry storms into one process, coalescing off and on.
#[derive(Debug, Parser)]
struct Args {
    /// DynamoDB Local's endpoint (`scripts/dynamodb-local endpoint`).
    #[arg(long, env = "IDEMPOTENT_DYNAMODB_ENDPOINT")]
    endpoint: String,
    /// Storms per row (each on a key of its own); requests are the median storm's.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
}

/// The client's requests, by operation.
#[derive(Debug, Clone, Default)]
struct Requests(Arc<Mutex<HashMap<String, u64>>>, Arc<AtomicU64>);

impl Requests {
    fn take(&self) -> HashMap<String, u64> {
        self.1.store(0, Ordering::SeqCst);
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "Requests"
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
        *self.0.lock().unwrap().entry(operation).or_default() += 1;
        self.1.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One storm's figures.
#[derive(Debug, Clone, Copy)]
struct Storm {
    writes: u64,
    reads: u64,
    ok: usize,
    in_progress: usize,
    runs: usize,
}

async fn storm(
    idem: &Idempotency,
    key: String,
    calls: usize,
    wait: Duration,
    requests: &Requests,
    latencies: &mut Vec<Duration>,
) -> Result<Storm, BoxError> {
    requests.take();
    let runs = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..calls)
        .map(|_| {
            let (idem, key, runs) = (idem.clone(), key.clone(), runs.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let result = idem
                    .operation("storm::charge", &key)
                    .wait(wait)
                    .run(|_| async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, Error>(format!("receipt for {key}"))
                    })
                    .await;
                (result, started.elapsed())
            })
        })
        .collect();
    let mut figures = Storm {
        writes: 0,
        reads: 0,
        ok: 0,
        in_progress: 0,
        runs: 0,
    };
    let mut storm_latencies = Vec::new();
    for task in tasks {
        let (result, elapsed) = task.await?;
        match result {
            Ok(_) => figures.ok += 1,
            Err(Error::InProgress { .. }) => figures.in_progress += 1,
            Err(e) => return Err(e.into()),
        }
        storm_latencies.push(elapsed);
    }
    // Every call but the one that ran the body: the longest is the leader's (claim, body, completion).
    storm_latencies.sort();
    storm_latencies.pop();
    latencies.extend(storm_latencies);
    let by_operation = requests.take();
    figures.writes = ["UpdateItem", "PutItem", "TransactWriteItems", "DeleteItem"]
        .iter()
        .map(|op| by_operation.get(*op).copied().unwrap_or(0))
        .sum();
    figures.reads = by_operation.get("GetItem").copied().unwrap_or(0);
    figures.runs = usize::try_from(runs.load(Ordering::SeqCst))?;
    Ok(figures)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index into a short list of latencies"
    )]
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let requests = Requests::default();
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(&args.endpoint)
        .credentials_provider(Credentials::new("dummy", "dummy", None, None, "storm"))
        .interceptor(requests.clone())
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let table = format!(
        "storm-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );
    let store = DynamoDbStore::new(client, &table);
    store.create_table().await?;
    println!(
        "| calls | wait | coalescing | DynamoDB requests | write units | read units | ok / InProgress | body runs | others' latency p50 / p99 |"
    );
    println!("|---:|---|---|---:|---:|---:|---|---:|---|");
    for calls in [20, 100] {
        for wait in [Duration::ZERO, Duration::from_secs(5)] {
            for coalesce in [false, true] {
                let idem = Idempotency::builder(store.clone())
                    .coalesce(coalesce)
                    .build();
                let mut storms = Vec::new();
                let mut latencies = Vec::new();
                for round in 0..args.repeat {
                    let key = format!("{calls}-{}-{coalesce}-{round}", wait.as_secs());
                    storms.push(storm(&idem, key, calls, wait, &requests, &mut latencies).await?);
                }
                storms.sort_by_key(|s| s.writes + s.reads);
                let median = storms[storms.len() / 2];
                latencies.sort();
                println!(
                    "| {calls} | {} | {} | {} | {} | {} | {} / {} | {} | {:.0?} / {:.0?} |",
                    if wait.is_zero() { "no" } else { "5 s" },
                    if coalesce { "on" } else { "off" },
                    median.writes + median.reads,
                    median.writes,
                    median.reads,
                    median.ok,
                    median.in_progress,
                    median.runs,
                    percentile(&latencies, 0.5),
                    percentile(&latencies, 0.99),
                );
            }
        }
    }
    Ok(())
}
