//! The payments API (`POST /payments`) behind the `Idempotency-Key` layer, served on loopback.
//!
//! ```text
//! cargo run -p idempotent-examples --example axum_payments            # in memory, port 3000
//! PORT=8080 IDEMPOTENT_DYNAMODB_ENDPOINT=http://127.0.0.1:8000 cargo run -p idempotent-examples --example axum_payments
//! ```
//!
//! Then, in another shell (the gateway takes `GATEWAY_DELAY_MS`, 2000 by default, so that a duplicate
//! sent meanwhile sees the 409):
//!
//! ```text
//! curl -i localhost:3000/payments -H 'Authorization: Bearer sk_acme' -H 'Idempotency-Key: order-1' \
//!      -H 'Content-Type: application/json' -d '{"amount":4200,"currency":"eur"}'
//! ```

use std::sync::Arc;
use std::time::Duration;

use idempotent_examples::payments::{Ledger, app};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = idempotent_examples::idempotency_from_env("idempotency-examples").await?;
    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |p| p.parse())?;
    let delay_ms: u64 = std::env::var("GATEWAY_DELAY_MS").map_or(Ok(2000), |d| d.parse())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "payments API on http://{} (POST /payments; gateway delay {delay_ms} ms)",
        listener.local_addr()?
    );
    println!(
        "try: curl -i localhost:{port}/payments -H 'Authorization: Bearer sk_acme' -H 'Idempotency-Key: order-1' -H 'Content-Type: application/json' -d '{{\"amount\":4200,\"currency\":\"eur\"}}'"
    );
    let app = app(
        idem,
        Arc::new(Ledger::default()),
        Duration::from_millis(delay_ms),
    );
    axum::serve(listener, app).await?;
    Ok(())
}
