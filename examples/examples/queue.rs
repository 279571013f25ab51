//! A queue consumer (SQS-style): two batches delivered at least once — duplicates within a batch and
//! across batches, one message that fails the first time — each order shipped exactly once, and the
//! partial-batch response that has the queue deliver only the failed message again.
//!
//! ```text
//! cargo run -p idempotent-examples --example queue
//! ```

use std::collections::HashSet;
use std::sync::Mutex;

use idempotent_runtime::Error;
use serde::Deserialize;

/// An SQS record, reduced to what the consumer reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SqsMessage {
    message_id: String,
    body: String,
}

#[derive(Debug, Deserialize)]
struct Shipment {
    order_id: String,
}

fn batch(messages: &[(&str, &str)]) -> Vec<SqsMessage> {
    messages
        .iter()
        .map(|(id, order)| SqsMessage {
            message_id: (*id).to_owned(),
            body: format!(r#"{{"order_id":"{order}"}}"#),
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = idempotent_examples::idempotency_from_env("idempotency-examples").await?;
    // The carrier refuses order-3 once.
    let refused_once = Mutex::new(HashSet::from(["order-3".to_owned()]));
    let consumer = idem.batch("queue::ship").concurrency(4);
    let key = |m: &SqsMessage| {
        serde_json::from_str::<Shipment>(&m.body).map_or_else(|_| m.body.clone(), |s| s.order_id)
    };

    let batches = [
        batch(&[
            ("m1", "order-1"),
            ("m2", "order-2"),
            ("m3", "order-1"),
            ("m4", "order-3"),
        ]),
        // m4 again (it failed), and order-2 from a producer that sent it twice.
        batch(&[("m4", "order-3"), ("m5", "order-2")]),
    ];
    for (n, messages) in batches.into_iter().enumerate() {
        println!("batch {}:", n + 1);
        let report = consumer
            .process(
                messages,
                |m| m.message_id.clone(),
                key,
                |m| ship(&refused_once, m),
            )
            .await;
        for item in &report.items {
            println!("  {} -> {:?}", item.id, item.outcome);
        }
        println!(
            "  response: {}",
            serde_json::to_string(&report.batch_response())?
        );
    }
    Ok(())
}

/// Ships one message's order; fails for an order the carrier refuses (once).
async fn ship(refused_once: &Mutex<HashSet<String>>, m: SqsMessage) -> Result<String, Failure> {
    let shipment: Shipment = serde_json::from_str(&m.body).map_err(|e| Failure(e.to_string()))?;
    let refused = refused_once
        .lock()
        .map_err(|e| Failure(e.to_string()))?
        .remove(&shipment.order_id);
    if refused {
        return Err(Failure(format!("carrier refused {}", shipment.order_id)));
    }
    println!("  [handler] shipping {}", shipment.order_id);
    // The carrier's API call.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    Ok(format!("tracking-{}", shipment.order_id))
}

/// The handler's error: its text is what the report shows.
#[derive(Debug)]
struct Failure(String);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure(e.to_string())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
