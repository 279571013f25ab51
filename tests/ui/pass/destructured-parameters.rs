//! `key`, `payload` and `store` naming parameters bound by patterns.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

struct Context {
    idem: Idempotency,
    tenant: u32,
}

struct Order {
    id: String,
    cents: u64,
}

#[idempotent(key = (tenant, id), payload = (cents, currency), store = idem)]
async fn charge(
    Context { idem, tenant }: &Context,
    Order { id, cents }: Order,
    (currency, _note): (&str, &str),
) -> Result<String, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{tenant}/{id}: {cents} {currency}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let ctx = Context {
        idem: Idempotency::in_memory(),
        tenant: 7,
    };
    let order = || Order {
        id: "order-1".to_owned(),
        cents: 500,
    };
    let first = charge(&ctx, order(), ("EUR", "first")).await.unwrap();
    let again = charge(&ctx, order(), ("EUR", "retry")).await.unwrap();
    assert_eq!(first, "7/order-1: 500 EUR");
    assert_eq!(again, first);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
