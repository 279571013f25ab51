//! One `#[idempotent]` call shape on the memory store, repeated: for what a timer cannot show reliably
//! on a shared machine. `BENCHMARKS.md` uses it for instructions per call and resident bytes per key.
//!
//! ```sh
//! cargo build --release -p idempotent-examples --bin footprint
//! # instructions per call: the difference of two counts, so that set-up cancels out
//! valgrind --tool=callgrind target/release/footprint replay 2000
//! valgrind --tool=callgrind target/release/footprint replay 4000
//! # resident bytes per key of the memory store, in a fresh process
//! target/release/footprint first 100000
//! ```
//!
//! `replay N` calls one completed key N times; `first N` makes N first calls on distinct keys and prints
//! the resident growth per key. `--no-heartbeat` runs on a handle without the lease heartbeat.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use idempotent_runtime::{Error, Idempotency, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};

/// The wrapper benchmark's response (`benches/wrapper.rs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

/// The wrapper benchmark's function: a small tuple key, a small response.
#[idempotent(key = (tenant, order_id), store = idem, name = "bench::small")]
async fn small(idem: &Idempotency, tenant: u32, order_id: &str) -> Result<Receipt, Error> {
    Ok(Receipt {
        charge_id: format!("ch_{tenant}_{order_id}"),
        amount_cents: 4_200,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Calls of one completed key.
    Replay,
    /// First calls, each on a new key.
    First,
}

/// Repeats one call shape on the memory store.
#[derive(Debug, Parser)]
struct Args {
    /// Which calls to repeat.
    mode: Mode,
    /// How many calls.
    calls: usize,
    /// A handle without the lease heartbeat.
    #[arg(long)]
    no_heartbeat: bool,
}

/// The process's resident set size, in bytes (`VmRSS` in /proc/self/status).
fn resident_bytes() -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or("no VmRSS line in /proc/self/status")?
        .parse::<u64>()?;
    Ok(kib * 1024)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let idem = Idempotency::builder_arc(Arc::new(MemoryStore::new()))
        .heartbeat(!args.no_heartbeat)
        .build();
    // Keys built before the count starts.
    let ids: Vec<String> = match args.mode {
        Mode::Replay => Vec::new(),
        Mode::First => (0..args.calls).map(|i| format!("order-{i}")).collect(),
    };
    println!(
        "future of one call: {} bytes",
        std::mem::size_of_val(&small(&idem, 7, "order-0"))
    );
    runtime.block_on(async {
        small(&idem, 7, "completed").await?;
        let before = resident_bytes()?;
        let started = Instant::now();
        match args.mode {
            Mode::Replay => {
                for _ in 0..args.calls {
                    black_box(small(&idem, 7, "completed").await?);
                }
            }
            Mode::First => {
                for id in &ids {
                    black_box(small(&idem, 7, id).await?);
                }
            }
        }
        let elapsed = started.elapsed();
        let calls = u64::try_from(args.calls.max(1))?;
        println!(
            "{:?}: {} calls, {} ns per call",
            args.mode,
            args.calls,
            elapsed.as_nanos() / u128::from(calls)
        );
        if args.mode == Mode::First {
            let grown = resident_bytes()?.saturating_sub(before);
            println!("memory store: {} resident bytes per key", grown / calls);
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
