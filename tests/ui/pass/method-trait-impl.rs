//! A method in a trait impl (native `async fn` in a trait), using the installed handle.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

trait Gateway {
    async fn charge(&self, order_id: u64, cents: u64) -> Result<u64, Error>;
}

struct Card {
    fee: u64,
}

impl Gateway for Card {
    #[idempotent(key = order_id, payload = cents)]
    async fn charge(&self, order_id: u64, cents: u64) -> Result<u64, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(cents + self.fee)
    }
}

async fn pay<G: Gateway>(gateway: &G) -> u64 {
    gateway.charge(1, 500).await.unwrap()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    let card = Card { fee: 30 };
    assert_eq!(pay(&card).await, 530);
    assert_eq!(pay(&card).await, 530);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
