//! Micro-benchmarks of the wrapper's own cost, on the memory store (no I/O): `cargo bench -p
//! idempotent-examples --bench wrapper`.
//!
//! - `wrapper/*`: a whole `#[idempotent]` call: first execution (claim, body, complete) and replay of a
//!   completed key, with the default heartbeat and without it; and a first execution whose body is
//!   `detach`ed (spawned on a task of its own), beside the inline one.
//! - `key/*`: key derivation and payload fingerprints for a small key and a 10 KB payload, beside the floor
//!   (serialize straight into SHA-256, no canonicalization).
//! - `response/*`: first execution and replay with 1 KB and 100 KB responses, beside the floor (`serde_json`
//!   alone).
//! - `step/*`: each piece of work a call of the bench binary's `charge` does beyond the bare SDK requests,
//!   alone: its key and its payload's fingerprint, the claim's token, the response's JSON and its decoding,
//!   the blocking record's parsing out of the SDK's attribute map, the call's span, the default handle's
//!   look-up, and the heartbeat's timer (built and dropped; registered and cancelled).
//!
//! `cargo test --all-targets` runs each benchmark once, as a smoke test; nothing here is timed by a test.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idempotent_runtime::{Error, Idempotency, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

#[idempotent(key = (tenant, order_id), store = idem, name = "bench::small")]
async fn small(idem: &Idempotency, tenant: u32, order_id: &str) -> Result<Receipt, Error> {
    Ok(Receipt {
        charge_id: format!("ch_{tenant}_{order_id}"),
        amount_cents: 4_200,
    })
}

/// `small` with `detach`: the body runs on a task of its own, so it owns its parameters.
#[idempotent(key = (tenant, order_id), store = idem, name = "bench::small_detached", detach)]
async fn small_detached(
    idem: Idempotency,
    tenant: u32,
    order_id: String,
) -> Result<Receipt, Error> {
    Ok(Receipt {
        charge_id: format!("ch_{tenant}_{order_id}"),
        amount_cents: 4_200,
    })
}

/// A response (or payload) of about `bytes` bytes of JSON: nested objects, strings and numbers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Document {
    id: String,
    customer: BTreeMap<String, String>,
    lines: Vec<Line>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    sku: String,
    description: String,
    quantity: u32,
    unit_cents: u64,
    tags: Vec<String>,
}

impl Document {
    fn of_size(bytes: usize) -> Self {
        let customer = [
            ("name", "Ada Lovelace"),
            ("email", "ada@example.com"),
            ("country", "GB"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut doc = Document {
            id: "doc-1".to_owned(),
            customer,
            lines: Vec::new(),
        };
        // Grow by each line's own size (plus its comma) rather than re-serializing the whole document.
        let mut size = serde_json::to_vec(&doc).expect("serializes").len();
        let mut i: u64 = 0;
        while size < bytes {
            let line = Line {
                sku: format!("SKU-{:08}", i.wrapping_mul(2_654_435_761) % 100_000_000),
                description: format!("item {i} of the order, colour {}", i % 7),
                quantity: u32::try_from(i % 5 + 1).expect("small"),
                unit_cents: i * 37 % 10_000,
                tags: vec![format!("t{}", i % 3), format!("batch-{}", i / 10)],
            };
            size += serde_json::to_vec(&line).expect("serializes").len() + 1;
            doc.lines.push(line);
            i += 1;
        }
        doc
    }
}

#[idempotent(key = id, store = idem, name = "bench::sized")]
async fn sized(idem: &Idempotency, id: u64, response: &Document) -> Result<Document, Error> {
    Ok(response.clone())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn handle(heartbeat: bool) -> Idempotency {
    Idempotency::builder_arc(Arc::new(MemoryStore::new()))
        .heartbeat(heartbeat)
        .build()
}

fn wrapper(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("wrapper");
    // Longer than the other groups: these are the figures with bars, and this machine's speed drifts
    // over seconds.
    group.measurement_time(Duration::from_secs(5));
    for (name, heartbeat) in [
        ("first_execution", true),
        ("first_execution_no_heartbeat", false),
    ] {
        // A fresh store per sample, so the map does not grow across the whole run; keys are built
        // before the clock starts.
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let idem = handle(heartbeat);
                let ids: Vec<String> = (0..iters).map(|i| format!("order-{i}")).collect();
                let start = Instant::now();
                for id in &ids {
                    black_box(small(&idem, 7, id).await.expect("first call"));
                }
                start.elapsed()
            });
        });
    }
    // The same first call with its body detached: what the body's task costs (its spawn, and the
    // caller's wait on it), beside `first_execution`. The handle's clone per call (a reference count)
    // is in the figure; the keys' strings are built before the clock starts and moved in.
    group.bench_function("first_execution_detach", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let idem = handle(true);
            let ids: Vec<String> = (0..iters).map(|i| format!("order-{i}")).collect();
            let start = Instant::now();
            for id in ids {
                black_box(
                    small_detached(idem.clone(), 7, id)
                        .await
                        .expect("first call"),
                );
            }
            start.elapsed()
        });
    });
    for (name, heartbeat) in [("replay", true), ("replay_no_heartbeat", false)] {
        let idem = handle(heartbeat);
        rt.block_on(small(&idem, 7, "order-1")).expect("first call");
        group.bench_function(name, |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(small(&idem, 7, "order-1").await.expect("replay")) });
        });
    }
    group.finish();
}

/// SHA-256 of `value`'s JSON written straight into the hasher: what a key costs without sorting maps.
fn floor_hash<T: Serialize>(value: &T) -> [u8; 32] {
    struct Hasher(Sha256);
    impl std::io::Write for Hasher {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.update(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut hasher = Hasher(Sha256::new());
    serde_json::to_writer(&mut hasher, value).expect("serializes");
    hasher.0.finalize().into()
}

fn key(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    let small_key = (7_u32, "order-12345678");
    let large = Document::of_size(10 * 1024);
    group.bench_function("derive_small", |b| {
        b.iter(|| idempotent_runtime::derive_key("bench::charge", black_box(&small_key)));
    });
    group.bench_function("floor_small", |b| {
        b.iter(|| floor_hash(black_box(&small_key)));
    });
    group.throughput(Throughput::Bytes(
        serde_json::to_vec(&large).expect("serializes").len() as u64,
    ));
    group.bench_function("derive_10kb", |b| {
        b.iter(|| idempotent_runtime::derive_key("bench::charge", black_box(&large)));
    });
    group.bench_function("fingerprint_10kb", |b| {
        b.iter(|| idempotent_runtime::fingerprint(black_box(&large)));
    });
    group.bench_function("floor_10kb", |b| {
        b.iter(|| floor_hash(black_box(&large)));
    });
    group.finish();
}

fn response(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("response");
    for (label, bytes) in [("1kb", 1024), ("100kb", 100 * 1024)] {
        let doc = Document::of_size(bytes);
        let json = serde_json::to_vec(&doc).expect("serializes");
        group.throughput(Throughput::Bytes(json.len() as u64));
        group.bench_function(format!("first_{label}"), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let doc = doc.clone();
                async move {
                    let idem = handle(true);
                    let start = Instant::now();
                    for id in 0..iters {
                        black_box(sized(&idem, id, &doc).await.expect("first call"));
                    }
                    start.elapsed()
                }
            });
        });
        let idem = handle(true);
        rt.block_on(sized(&idem, 0, &doc)).expect("first call");
        group.bench_function(format!("replay_{label}"), |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(sized(&idem, 0, &doc).await.expect("replay")) });
        });
        // The floors: what the body's clone plus serde_json alone cost for the same value.
        group.bench_function(format!("floor_clone_serialize_{label}"), |b| {
            b.iter(|| serde_json::to_vec(&black_box(&doc).clone()).expect("serializes"));
        });
        group.bench_function(format!("floor_deserialize_{label}"), |b| {
            b.iter(|| serde_json::from_slice::<Document>(black_box(&json)).expect("parses"));
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

/// The bench binary's request and receipt (`examples/src/bin/bench.rs`), so each step costs what it
/// costs there.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeRequest {
    tenant: u32,
    order_id: String,
    amount_cents: u64,
    currency: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeReceipt {
    charge_id: String,
    amount_cents: u64,
    currency: String,
    status: String,
}

/// The completed record a duplicate gets back from DynamoDB, as the SDK hands it over.
fn completed_item(
    key: &str,
    fingerprint: &str,
    response: &[u8],
) -> std::collections::HashMap<String, idempotent_runtime::aws_sdk_dynamodb::types::AttributeValue>
{
    use idempotent_runtime::aws_sdk_dynamodb::types::AttributeValue;
    let s = |v: &str| AttributeValue::S(v.to_owned());
    std::collections::HashMap::from([
        ("pk".to_owned(), s(key)),
        ("status".to_owned(), s("COMPLETED")),
        (
            "token".to_owned(),
            s("00000000-0000-4000-8000-000000000000"),
        ),
        ("attempt".to_owned(), AttributeValue::N("1".to_owned())),
        (
            "expires_at".to_owned(),
            AttributeValue::N("1900000000".to_owned()),
        ),
        ("fingerprint".to_owned(), s(fingerprint)),
        (
            "response".to_owned(),
            AttributeValue::B(response.to_vec().into()),
        ),
    ])
}

fn step(c: &mut Criterion) {
    use idempotent_runtime::aws_sdk_dynamodb as sdk;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut group = c.benchmark_group("step");
    let req = ChargeRequest {
        tenant: 7,
        order_id: "null-12345".to_owned(),
        amount_cents: 4_200,
        currency: "EUR".to_owned(),
    };
    let receipt = ChargeReceipt {
        charge_id: format!("ch_{}_{}", req.tenant, req.order_id),
        amount_cents: req.amount_cents,
        currency: req.currency.clone(),
        status: "succeeded".to_owned(),
    };
    group.bench_function("key", |b| {
        b.iter(|| {
            idempotent_runtime::derive_key("bench::charge", black_box(&(req.tenant, &req.order_id)))
        });
    });
    group.bench_function("fingerprint", |b| {
        b.iter(|| idempotent_runtime::fingerprint(black_box(&req)));
    });
    group.bench_function("token", |b| {
        b.iter(|| uuid::Uuid::new_v4().to_string());
    });
    group.bench_function("token_in_buffer", |b| {
        b.iter(|| {
            let mut buffer = uuid::Uuid::encode_buffer();
            let token: &str = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buffer);
            black_box(token.len())
        });
    });
    group.bench_function("serialize_response", |b| {
        b.iter(|| serde_json::to_vec(black_box(&receipt)).expect("serializes"));
    });
    let json = serde_json::to_vec(&receipt).expect("serializes");
    group.bench_function("decode_response", |b| {
        b.iter(|| serde_json::from_slice::<ChargeReceipt>(black_box(&json)).expect("parses"));
    });
    let key = idempotent_runtime::derive_key("bench::charge", &(req.tenant, &req.order_id))
        .expect("a key");
    let fingerprint = idempotent_runtime::fingerprint(&req).expect("a fingerprint");
    let item = completed_item(&key, &fingerprint, &json);
    let config = sdk::Config::builder()
        .behavior_version(sdk::config::BehaviorVersion::latest())
        .region(sdk::config::Region::new("us-east-1"))
        .build();
    let store = idempotent_runtime::DynamoDbStore::new(sdk::Client::from_conf(config), "t");
    group.bench_function("parse_record", |b| {
        b.iter(|| store.parse_item(black_box(&item)).expect("a record"));
    });
    group.bench_function("copy_item", |b| {
        b.iter(|| black_box(&item).clone());
    });
    group.bench_function("span", |b| {
        b.iter(|| {
            let span = tracing::info_span!(
                "idempotent",
                namespace = "bench::charge",
                key = black_box("0123456789ab"),
                attempt = tracing::field::Empty,
                outcome = tracing::field::Empty,
            );
            span.record("outcome", "executed");
            span
        });
    });
    Idempotency::in_memory().install();
    group.bench_function("installed_handle", |b| {
        b.iter(Idempotency::installed);
    });
    Idempotency::uninstall();
    group.bench_function("heartbeat_timer_unpolled", |b| {
        let _guard = rt.enter();
        b.iter(|| tokio::time::sleep(black_box(Duration::from_secs(20))));
    });
    // What a call whose work is still pending pays for its heartbeat: the timer is registered (waking
    // the runtime's parked driver when it is the earliest timer), then cancelled when the work ends.
    group.bench_function("heartbeat_timer_registered", |b| {
        b.to_async(&rt).iter(|| async {
            let sleep = tokio::time::sleep(Duration::from_secs(20));
            tokio::pin!(sleep);
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            black_box(std::future::Future::poll(sleep.as_mut(), &mut cx).is_pending())
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = wrapper, key, response, step
}
criterion_main!(benches);
