//! The return type may be an alias, as long as it is a `Result<T, E>` with the bounds met.
#![deny(warnings)]

use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug)]
enum PaymentError {
    Idempotency(idempotent_runtime::Error),
}

impl fmt::Display for PaymentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PaymentError::Idempotency(e) => write!(f, "idempotency: {e}"),
        }
    }
}

impl From<idempotent_runtime::Error> for PaymentError {
    fn from(e: idempotent_runtime::Error) -> Self {
        PaymentError::Idempotency(e)
    }
}

/// The crate-local alias most crates have.
type Result<T, E = PaymentError> = std::result::Result<T, E>;

mod boxed {
    /// An `anyhow`-style alias: any error converts into the box, `idempotent_runtime::Error` too.
    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
}

#[idempotent(key = order_id)]
async fn charge(order_id: u64) -> Result<u64> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[idempotent(key = order_id)]
async fn refund(order_id: u64) -> boxed::Result<Vec<u64>> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(vec![order_id])
}

#[idempotent(key = order_id)]
async fn explicit(order_id: u64) -> Result<u64, Box<dyn StdError + Send + Sync>> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

/// `std::io::Result`: `idempotent_runtime::Error` converts into `std::io::Error`.
#[idempotent(key = order_id)]
async fn read_back(order_id: u64) -> std::io::Result<String> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    for _ in 0..2 {
        assert_eq!(charge(1).await.unwrap(), 1);
        assert_eq!(refund(1).await.unwrap(), vec![1]);
        assert_eq!(explicit(1).await.unwrap(), 1);
        assert_eq!(read_back(1).await.unwrap(), "1");
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 4);
}
