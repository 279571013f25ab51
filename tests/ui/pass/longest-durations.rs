//! The longest durations the attribute takes: 100 years, the runtime's `MAX_DURATION`.

use idempotent_runtime::{Error, Idempotency, MAX_DURATION, idempotent};

#[idempotent(key = order_id, ttl = "36500d", lease = "36500d", wait = "876000h")]
async fn charge(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert_eq!(MAX_DURATION.as_secs(), 36_500 * 24 * 3600);
    Idempotency::in_memory().install();
    assert_eq!(charge(7).await.unwrap(), 7);
}
