//! A payment that runs at most once per (tenant, order), however often it is retried.
//!
//! ```text
//! cargo run -p idempotent-examples --example payment
//! IDEMPOTENT_DYNAMODB_ENDPOINT=http://127.0.0.1:8000 cargo run -p idempotent-examples --example payment
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, idempotent};
use serde::{Deserialize, Serialize};

/// What the client sends; the same request may arrive several times.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeRequest {
    tenant: u32,
    order_id: String,
    amount_cents: u64,
}

/// What the client gets back, the first time and on every replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Debug)]
enum PaymentError {
    /// The card network said no (this time).
    GatewayUnavailable,
    /// The idempotency layer said no (in progress, store trouble, ...).
    Idempotency(Error),
}

impl From<Error> for PaymentError {
    fn from(e: Error) -> Self {
        PaymentError::Idempotency(e)
    }
}

impl std::fmt::Display for PaymentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PaymentError::GatewayUnavailable => f.write_str("the payment gateway is unavailable"),
            PaymentError::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PaymentError {}

/// How many times the card was actually charged.
static CHARGES: AtomicUsize = AtomicUsize::new(0);
/// Makes the gateway fail this many more times.
static GATEWAY_FAILURES: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = (req.tenant, req.order_id), payload = &req, ttl = "24h", name = "payment::charge")]
async fn charge(req: ChargeRequest) -> Result<Receipt, PaymentError> {
    if GATEWAY_FAILURES
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return Err(PaymentError::GatewayUnavailable);
    }
    let n = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
    println!(
        "  [body] charging {} cents for order {} (charge #{n})",
        req.amount_cents, req.order_id
    );
    Ok(Receipt {
        charge_id: format!("ch_{}_{}", req.tenant, req.order_id),
        amount_cents: req.amount_cents,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = idempotent_examples::idempotency_from_env("idempotency-examples").await?;
    idem.install();
    // A fresh order id per run, so the example also shows a first call against a persistent table.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let request = ChargeRequest {
        tenant: 7,
        order_id: format!("order-{run}"),
        amount_cents: 4_200,
    };

    println!("1. first call");
    let first = charge(request.clone()).await?;
    println!("   -> {first:?}");

    println!("2. the client timed out and sends the same request again");
    let replay = charge(request.clone()).await?;
    println!(
        "   -> {replay:?} (replayed: {}, card charged {} time(s))",
        replay == first,
        CHARGES.load(Ordering::SeqCst)
    );

    println!("3. the same key with a different amount");
    let tampered = ChargeRequest {
        amount_cents: 1,
        ..request.clone()
    };
    match charge(tampered).await {
        Err(PaymentError::Idempotency(e @ Error::PayloadMismatch { .. })) => {
            println!("   -> rejected: {e}");
        }
        other => println!("   -> unexpected: {other:?}"),
    }

    println!("4. a new order whose first attempt fails, then a retry");
    let second_order = ChargeRequest {
        order_id: format!("order-{run}-b"),
        ..request
    };
    GATEWAY_FAILURES.store(1, Ordering::SeqCst);
    match charge(second_order.clone()).await {
        Err(e) => {
            println!("   -> first attempt failed: {e} (the record is FAILED, a retry may run)");
        }
        Ok(r) => println!("   -> unexpected success {r:?}"),
    }
    let retried = charge(second_order).await?;
    println!("   -> retry succeeded: {retried:?}");

    println!(
        "card charged {} time(s) for 2 orders and 5 calls",
        CHARGES.load(Ordering::SeqCst)
    );
    Ok(())
}
