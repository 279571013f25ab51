//! The queue consumer on DynamoDB Local: duplicates within and across batches run once, a failing
//! message is the only one reported for redelivery, and concurrency stays within its bound.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::batch::{BatchResponse, ItemFailure, Outcome};
use idempotent_runtime::{Error, Status};
use idempotent_tests::{Backend, Harness};

/// An SQS-like message: its delivery id and the order it is about.
#[derive(Debug, Clone)]
struct Message {
    id: &'static str,
    order: &'static str,
}

fn msg(id: &'static str, order: &'static str) -> Message {
    Message { id, order }
}

#[derive(Debug)]
struct ShipError(String);

impl From<Error> for ShipError {
    fn from(e: Error) -> Self {
        ShipError(e.to_string())
    }
}

impl std::fmt::Display for ShipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Ships orders, counting how often each one really ran; `poison` orders fail while it is set.
#[derive(Default)]
struct Shipper {
    runs: Mutex<HashMap<&'static str, usize>>,
    poisoned: Mutex<Option<&'static str>>,
}

impl Shipper {
    async fn ship(&self, m: Message) -> Result<String, ShipError> {
        *self.runs.lock().unwrap().entry(m.order).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if *self.poisoned.lock().unwrap() == Some(m.order) {
            return Err(ShipError(format!("carrier refused {}", m.order)));
        }
        Ok(format!("shipped {}", m.order))
    }

    fn runs(&self, order: &str) -> usize {
        self.runs.lock().unwrap().get(order).copied().unwrap_or(0)
    }
}

#[tokio::test]
async fn duplicates_within_and_across_batches_run_once_and_only_failures_are_redelivered() {
    let h = Harness::new(Backend::DynamoDb).await;
    let shipper = Shipper::default();
    *shipper.poisoned.lock().unwrap() = Some("order-c");
    let batch = h.idem.batch("orders::ship").concurrency(4);
    let process = |messages: Vec<Message>| {
        batch.process(
            messages,
            |m| m.id.to_owned(),
            |m| m.order,
            |m| shipper.ship(m),
        )
    };

    let first = process(vec![
        msg("m1", "order-a"),
        msg("m2", "order-b"),
        msg("m3", "order-a"), // a duplicate within the batch
        msg("m4", "order-c"), // fails
        msg("m5", "order-b"),
    ])
    .await;
    let outcomes: Vec<(&str, &Outcome)> = first
        .items
        .iter()
        .map(|i| (i.id.as_str(), &i.outcome))
        .collect();
    assert_eq!(outcomes[0], ("m1", &Outcome::Executed));
    assert_eq!(outcomes[1], ("m2", &Outcome::Executed));
    assert_eq!(outcomes[2], ("m3", &Outcome::Replayed));
    assert!(
        matches!(outcomes[3], ("m4", Outcome::Failed(why)) if why.contains("carrier refused order-c"))
    );
    assert_eq!(outcomes[4], ("m5", &Outcome::Replayed));
    assert_eq!(
        first.batch_response(),
        BatchResponse {
            batch_item_failures: vec![ItemFailure {
                item_identifier: "m4".into()
            }]
        }
    );
    assert_eq!(
        serde_json::to_value(first.batch_response()).unwrap(),
        serde_json::json!({ "batchItemFailures": [{ "itemIdentifier": "m4" }] })
    );
    assert_eq!((shipper.runs("order-a"), shipper.runs("order-b")), (1, 1));
    assert_eq!(
        h.record("orders::ship", "order-c").await.unwrap().status,
        Status::Failed
    );

    // The queue delivers m4 again, and order-a once more (a producer-side duplicate).
    *shipper.poisoned.lock().unwrap() = None;
    let second = process(vec![msg("m4", "order-c"), msg("m6", "order-a")]).await;
    assert_eq!(second.items[0].outcome, Outcome::Executed);
    assert_eq!(second.items[1].outcome, Outcome::Replayed);
    assert!(second.batch_response().batch_item_failures.is_empty());
    assert_eq!(
        (
            shipper.runs("order-a"),
            shipper.runs("order-b"),
            shipper.runs("order-c")
        ),
        (1, 1, 2),
        "each order shipped once; order-c's failed attempt is the only re-run"
    );
    assert_eq!(second.count(&Outcome::Replayed), 1);
}

#[tokio::test]
async fn concurrency_stays_within_its_bound() {
    let h = Harness::new(Backend::DynamoDb).await;
    let running = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    let orders = ["o1", "o2", "o3", "o4", "o5", "o6", "o7"];
    let report = h
        .idem
        .batch("orders::bounded")
        .concurrency(3)
        .process(
            orders,
            |o| (*o).to_owned(),
            |o| *o,
            |_| async {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Stay until three run at once (or 2 s pass: the last message runs alone), so that
                // the bound is reached however slowly the claims land on a busy machine.
                let until = tokio::time::Instant::now() + Duration::from_secs(2);
                while running.load(Ordering::SeqCst) < 3 && tokio::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                most.fetch_max(running.load(Ordering::SeqCst), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            },
        )
        .await;
    assert_eq!(report.count(&Outcome::Executed), 7);
    assert_eq!(most.load(Ordering::SeqCst), 3, "three at once, never more");
}
