//! A checkout of three effects in a row — reserve the stock, charge the card, send the confirmation —
//! that survives a crash half-way: each step's result is stored in the idempotency record as it
//! finishes (`.steps()`), so the call that takes over after the crash runs only what had not finished.
//! The charge also passes `steps.key("charge")` to the payment gateway as its `Idempotency-Key`, so even
//! a crash *inside* the charge would not charge twice.
//!
//! Here the "crash" is the first attempt's future being dropped right after the charge (as a process
//! that dies there leaves it); the retry comes once that attempt's lease ran out.
//!
//! ```text
//! cargo run -p idempotent-examples --example checkout
//! IDEMPOTENT_DYNAMODB_ENDPOINT=http://127.0.0.1:8000 cargo run -p idempotent-examples --example checkout
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::{Error, Idempotency};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    hold: String,
    charge: String,
}

/// The stock service: every call reserves more.
#[derive(Default)]
struct Stock {
    holds: AtomicUsize,
}

impl Stock {
    async fn reserve(&self, order: &str) -> Result<String, Error> {
        tokio::task::yield_now().await; // the stock service's round trip
        let n = self.holds.fetch_add(1, Ordering::SeqCst) + 1;
        println!("  stock:   reserved 1 item for {order} (hold #{n})");
        Ok(format!("hold-{n}"))
    }
}

/// A payment gateway that honours idempotency keys, as Stripe's and most others do: a request with a
/// key it has seen gets the first answer back, and charges nothing.
#[derive(Default)]
struct Gateway {
    charges: Mutex<HashMap<String, String>>,
    charged: AtomicUsize,
}

impl Gateway {
    async fn charge(&self, order: &str, idempotency_key: &str) -> Result<String, Error> {
        tokio::task::yield_now().await; // the gateway's round trip
        let mut charges = self.charges.lock().unwrap();
        if let Some(charge) = charges.get(idempotency_key) {
            println!(
                "  gateway: key {}… seen before, answering {charge}",
                &idempotency_key[..8]
            );
            return Ok(charge.clone());
        }
        let n = self.charged.fetch_add(1, Ordering::SeqCst) + 1;
        let charge = format!("ch_{n}");
        println!(
            "  gateway: charged {order} → {charge} (key {}…)",
            &idempotency_key[..8]
        );
        charges.insert(idempotency_key.to_owned(), charge.clone());
        Ok(charge)
    }
}

#[derive(Default)]
struct Mailer {
    sent: AtomicUsize,
}

impl Mailer {
    async fn confirm(&self, order: &str, charge: &str) -> Result<(), Error> {
        tokio::task::yield_now().await; // the mail service's round trip
        self.sent.fetch_add(1, Ordering::SeqCst);
        println!("  mailer:  confirmation for {order} ({charge}) sent");
        Ok(())
    }
}

struct Shop {
    stock: Stock,
    gateway: Gateway,
    mailer: Mailer,
}

/// The checkout: three steps, each stored as it finishes. `crash_after_charge` is notified once the
/// charge is stored, for the demonstration to cut the call off there.
async fn checkout(
    idem: &Idempotency,
    shop: &Shop,
    order: &str,
    crash_after_charge: Option<&Notify>,
) -> Result<Receipt, Error> {
    idem.operation("shop::checkout", order)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let hold = steps.run("reserve", || shop.stock.reserve(order)).await?;
            let key = steps.key("charge");
            let charge = steps
                .run("charge", || shop.gateway.charge(order, &key))
                .await?;
            if let Some(crash) = crash_after_charge {
                crash.notify_one();
                std::future::pending::<()>().await; // the process dies here
            }
            steps
                .run("email", || shop.mailer.confirm(order, &charge))
                .await?;
            Ok(Receipt { hold, charge })
        })
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lease = Duration::from_secs(1);
    let idem = idempotent_examples::builder_from_env("idempotency-examples")
        .await?
        .default_lease(lease)
        .build();
    let shop = Shop {
        stock: Stock::default(),
        gateway: Gateway::default(),
        mailer: Mailer::default(),
    };
    let order = format!(
        "order-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );

    println!("1. the first attempt crashes right after the charge:");
    let charged = Notify::new();
    tokio::select! {
        _ = checkout(&idem, &shop, &order, Some(&charged)) => unreachable!("it crashes"),
        () = charged.notified() => println!("  (crash)"),
    }

    // Until its lease runs out (plus the clock-skew margin), the key is still the crashed call's.
    tokio::time::sleep(lease + Duration::from_millis(2100)).await;
    println!("2. the retry, once the crashed attempt's lease ran out: only the email runs");
    let receipt = checkout(&idem, &shop, &order, None).await?;
    println!("  → {receipt:?}");

    println!("3. a duplicate: the receipt is replayed, nothing runs");
    let again = checkout(&idem, &shop, &order, None).await?;
    println!("  → {again:?}");

    let counts = (
        shop.stock.holds.load(Ordering::SeqCst),
        shop.gateway.charged.load(Ordering::SeqCst),
        shop.mailer.sent.load(Ordering::SeqCst),
    );
    println!(
        "reserved {} time(s), charged {} time(s), emailed {} time(s)",
        counts.0, counts.1, counts.2
    );
    assert_eq!(counts, (1, 1, 1), "a step ran twice");
    Ok(())
}
