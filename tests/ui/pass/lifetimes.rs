//! Named and elided lifetimes in the parameters; borrowed keys.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

struct Order<'a> {
    tenant: &'a str,
    id: &'a str,
    lines: &'a [u64],
}

#[idempotent(key = (order.tenant, order.id), store = idem)]
async fn charge<'a, 'b: 'a>(
    idem: &'b Idempotency,
    order: &Order<'a>,
    label: &str,
) -> Result<String, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{label}: {}", order.lines.iter().sum::<u64>()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::in_memory();
    let lines = vec![2, 3];
    let order = Order {
        tenant: "acme",
        id: "order-1",
        lines: &lines,
    };
    assert_eq!(charge(&idem, &order, "total").await.unwrap(), "total: 5");
    assert_eq!(charge(&idem, &order, "again").await.unwrap(), "total: 5");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
