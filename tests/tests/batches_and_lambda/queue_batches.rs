//! The queue consumer on DynamoDB Local: duplicates within and across batches run once, a failing
//! message is the only one reported for redelivery, and concurrency stays within its bound.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::batch::{BatchResponse, ItemFailure, Outcome};
use idempotent_runtime::{Clock as _, Error, Status};
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

/// 100,000 random 16-hex-digit strings: 1.9 MB of JSON that gzip cannot shrink below DynamoDB's 400 KB.
fn too_large() -> Vec<String> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..100_000)
        .map(|_| {
            // xorshift64: incompressible enough, and the same every run.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect()
}

/// A redelivered message whose work is done but whose result cannot be replayed (too large to store,
/// or expired with only its tombstone retained) is done: it is not reported for redelivery, where it
/// would come back until it is dead-lettered.
#[tokio::test]
async fn work_done_by_an_earlier_delivery_is_never_reported_for_redelivery() {
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let h = Harness::with(backend, |b| b.retain(Duration::from_hours(7 * 24))).await;
        let runs = AtomicUsize::new(0);
        let batch = h.idem.batch("orders::done").ttl(Duration::from_hours(1));
        let process = |messages: Vec<(&'static str, u32)>| {
            batch.process(
                messages,
                |m| m.0.to_owned(),
                |m| m.1,
                |m| {
                    let runs = &runs;
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>(if m.1 == 1 { too_large() } else { Vec::new() })
                    }
                },
            )
        };

        // m3 is a duplicate of m1, whose response was too large to store.
        let first = process(vec![("m1", 1), ("m2", 2), ("m3", 1)]).await;
        assert_eq!(first.items[0].outcome, Outcome::Executed, "{backend:?}");
        assert_eq!(first.items[1].outcome, Outcome::Executed, "{backend:?}");
        assert!(
            first.batch_response().batch_item_failures.is_empty(),
            "{backend:?}: {first:?}"
        );
        // Both records outlive their ttl as tombstones; the queue brings both orders again.
        h.clock.advance(Duration::from_hours(2));
        let second = process(vec![("m4", 2), ("m5", 1)]).await;
        assert!(
            second.batch_response().batch_item_failures.is_empty(),
            "{backend:?}: {second:?}"
        );
        assert_eq!(second.count(&Outcome::Failed(String::new())), 0);
        assert!(
            matches!(&first.items[2].outcome, Outcome::Done(why) if why.contains("too large")),
            "{backend:?}: {first:?}"
        );
        for item in &second.items {
            assert!(
                matches!(&item.outcome, Outcome::Done(why) if why.contains("expired")),
                "{backend:?}: {second:?}"
            );
        }
        assert_eq!(second.count(&Outcome::Done(String::new())), 2);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "{backend:?}: each order ran once"
        );
    }
}

/// A message with a body of its own.
#[derive(Debug, Clone)]
struct Delivery {
    id: &'static str,
    order: &'static str,
    body: &'static str,
}

fn delivery(id: &'static str, order: &'static str, body: &'static str) -> Delivery {
    Delivery { id, order, body }
}

/// With a payload, a message whose key was used with another body fails alone, as a payload mismatch,
/// within a batch and across batches; the same body is replayed.
#[tokio::test]
async fn a_changed_body_with_the_same_key_is_a_payload_mismatch() {
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let h = Harness::new(backend).await;
        let shipped = Mutex::new(Vec::new());
        let batch = h
            .idem
            .batch("orders::payload")
            .payload(|m: &Delivery| m.body);
        let process = |messages: Vec<Delivery>| {
            batch.process(
                messages,
                |m| m.id.to_owned(),
                |m| m.order,
                |m| {
                    let shipped = &shipped;
                    async move {
                        shipped.lock().unwrap().push(m.body);
                        Ok::<_, Error>(format!("shipped {}", m.body))
                    }
                },
            )
        };
        let first = process(vec![
            delivery("m1", "order-a", "2 boxes"),
            delivery("m2", "order-a", "2 boxes"),
            delivery("m3", "order-a", "3 boxes"),
            delivery("m4", "order-b", "1 box"),
        ])
        .await;
        let outcomes: Vec<&Outcome> = first.items.iter().map(|i| &i.outcome).collect();
        assert_eq!(outcomes[0], &Outcome::Executed, "{backend:?}");
        assert_eq!(outcomes[1], &Outcome::Replayed, "{backend:?}");
        assert!(
            matches!(outcomes[2], Outcome::Failed(why) if why.contains("different payload")),
            "{backend:?}: {outcomes:?}"
        );
        assert_eq!(outcomes[3], &Outcome::Executed, "{backend:?}");
        assert_eq!(
            first.batch_response().batch_item_failures,
            vec![ItemFailure {
                item_identifier: "m3".into()
            }]
        );
        // Across batches too.
        let second = process(vec![
            delivery("m5", "order-a", "3 boxes"),
            delivery("m6", "order-a", "2 boxes"),
        ])
        .await;
        assert!(
            matches!(&second.items[0].outcome, Outcome::Failed(why) if why.contains("different payload")),
            "{backend:?}: {second:?}"
        );
        assert_eq!(second.items[1].outcome, Outcome::Replayed, "{backend:?}");
        // Keys run concurrently, so the two orders ship in either order; each exactly once.
        let mut shipped = shipped.lock().unwrap().clone();
        shipped.sort_unstable();
        assert_eq!(shipped, ["1 box", "2 boxes"], "{backend:?}");
    }
}

/// A handler that panics fails its own message; the batch goes on with the others, including the
/// messages with the same key after it.
#[tokio::test]
async fn a_panicking_message_fails_alone_and_the_batch_goes_on() {
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let h = Harness::new(backend).await;
        let shipper = Shipper::default();
        let report = h
            .idem
            .batch("orders::panic")
            .concurrency(2)
            .process(
                vec![
                    msg("m1", "order-a"),
                    msg("m2", "order-boom"),
                    msg("m3", "order-b"),
                    msg("m4", "order-boom"),
                    msg("m5", "order-c"),
                ],
                |m| m.id.to_owned(),
                |m| m.order,
                |m| {
                    let shipper = &shipper;
                    async move {
                        if m.order == "order-boom" {
                            std::panic::panic_any(format!(
                                "the label printer caught fire on {}",
                                m.order
                            ));
                        }
                        shipper.ship(m).await
                    }
                },
            )
            .await;
        let outcomes: Vec<(&str, &Outcome)> = report
            .items
            .iter()
            .map(|i| (i.id.as_str(), &i.outcome))
            .collect();
        assert_eq!(outcomes[0], ("m1", &Outcome::Executed), "{backend:?}");
        assert!(
            matches!(outcomes[1], ("m2", Outcome::Failed(why))
                if why.contains("panicked") && why.contains("the label printer caught fire on order-boom")),
            "{backend:?}: {outcomes:?}"
        );
        assert_eq!(outcomes[2], ("m3", &Outcome::Executed), "{backend:?}");
        assert!(
            matches!(outcomes[3], ("m4", Outcome::Failed(_))),
            "{backend:?}: {outcomes:?}"
        );
        assert_eq!(outcomes[4], ("m5", &Outcome::Executed), "{backend:?}");
        let failed: Vec<String> = report
            .batch_response()
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect();
        assert_eq!(failed, ["m2", "m4"], "{backend:?}");
        assert_eq!(
            (
                shipper.runs("order-a"),
                shipper.runs("order-b"),
                shipper.runs("order-c")
            ),
            (1, 1, 1)
        );
    }
}

/// A message whose key closure panics (or whose key's `Serialize` does) fails alone, like a panicking
/// handler: the batch goes on with the others and only that message is delivered again. A panic that
/// escaped `process` failed the whole batch, every time it came back, until it was dead-lettered.
#[tokio::test]
async fn a_message_whose_key_panics_fails_alone() {
    let h = Harness::new(Backend::Memory).await;
    let shipper = Shipper::default();
    let report = h
        .idem
        .batch("orders::key_panic")
        .process(
            vec![
                msg("m1", "order-a"),
                msg("m2", "order-boom"),
                msg("m3", "order-b"),
            ],
            |m| m.id.to_owned(),
            |m| {
                assert!(m.order != "order-boom", "no key for {}", m.order);
                m.order
            },
            |m| {
                let shipper = &shipper;
                async move { shipper.ship(m).await }
            },
        )
        .await;
    let outcomes: Vec<(&str, &Outcome)> = report
        .items
        .iter()
        .map(|i| (i.id.as_str(), &i.outcome))
        .collect();
    assert_eq!(outcomes[0], ("m1", &Outcome::Executed));
    assert!(
        matches!(outcomes[1], ("m2", Outcome::Failed(why))
            if why.contains("panicked") && why.contains("no key for order-boom")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2], ("m3", &Outcome::Executed));
    assert_eq!(
        report.batch_response().batch_item_failures,
        vec![ItemFailure {
            item_identifier: "m2".into()
        }]
    );
    assert_eq!((shipper.runs("order-a"), shipper.runs("order-b")), (1, 1));
}

/// A redelivered message whose work is done, but whose stored result no longer deserializes into the
/// handler's output type (the type changed in a deploy), is done: its result is never used by the
/// batch, and reporting it for redelivery would bring it back, and fail it, until it is dead-lettered.
#[tokio::test]
async fn done_work_whose_result_no_longer_deserializes_is_not_redelivered() {
    let h = Harness::new(Backend::Memory).await;
    let runs = AtomicUsize::new(0);
    let batch = h.idem.batch("orders::deploy");
    let first = batch
        .process(
            vec![("m1", 7_u32)],
            |m| m.0.to_owned(),
            |m| m.1,
            |m| {
                let runs = &runs;
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(format!("shipped {}", m.1))
                }
            },
        )
        .await;
    assert_eq!(first.items[0].outcome, Outcome::Executed);
    // The next version's handler returns a number; the queue brings the message again.
    let second = batch
        .process(
            vec![("m2", 7_u32)],
            |m| m.0.to_owned(),
            |m| m.1,
            |m| {
                let runs = &runs;
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(m.1)
                }
            },
        )
        .await;
    assert!(
        second.batch_response().batch_item_failures.is_empty(),
        "{second:?}"
    );
    assert!(
        matches!(&second.items[0].outcome, Outcome::Done(why) if why.contains("deserialize")),
        "{second:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A handler that runs once and returns a value JSON cannot hold (a NaN): the work is done and the
/// record is COMPLETED without a response, so neither the first delivery nor a redelivery may be
/// reported for redelivery, where the message would come back until it is dead-lettered.
#[tokio::test]
async fn a_result_that_does_not_serialize_is_done_never_redelivered() {
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let h = Harness::new(backend).await;
        let runs = AtomicUsize::new(0);
        let batch = h.idem.batch("orders::nan");
        let process = |messages: Vec<(&'static str, u32)>| {
            batch.process(
                messages,
                |m| m.0.to_owned(),
                |m| m.1,
                |_| {
                    let runs = &runs;
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>(f64::NAN)
                    }
                },
            )
        };
        let first = process(vec![("m1", 7)]).await;
        assert!(
            matches!(&first.items[0].outcome, Outcome::Done(why) if why.contains("serialize")),
            "{backend:?}: {first:?}"
        );
        assert!(
            first.batch_response().batch_item_failures.is_empty(),
            "{backend:?}: {first:?}"
        );
        assert_eq!(
            h.record("orders::nan", &7_u32).await.unwrap().status,
            Status::Completed,
            "{backend:?}"
        );
        let again = process(vec![("m2", 7)]).await;
        assert!(
            matches!(&again.items[0].outcome, Outcome::Done(why) if why.contains("serialize")),
            "{backend:?}: {again:?}"
        );
        assert!(
            again.batch_response().batch_item_failures.is_empty(),
            "{backend:?}: {again:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend:?}: ran once");
    }
}

/// A key that does not serialize is no work done: the message fails (its record was never claimed).
#[tokio::test]
async fn a_key_that_does_not_serialize_fails() {
    let h = Harness::new(Backend::Memory).await;
    let runs = AtomicUsize::new(0);
    let report = h
        .idem
        .batch("orders::nan_key")
        .process(
            vec![("m1", f64::NAN)],
            |m| m.0.to_owned(),
            |m| std::collections::BTreeMap::from([(vec![1_u8], m.1)]),
            |_| {
                let runs = &runs;
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(())
                }
            },
        )
        .await;
    assert!(
        matches!(&report.items[0].outcome, Outcome::Failed(why) if why.contains("serialize")),
        "{report:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A message of a FIFO queue: its delivery id, its message group (an account) and what it does.
#[derive(Debug, Clone)]
struct Entry {
    id: &'static str,
    account: &'static str,
    op: &'static str,
}

fn entry(id: &'static str, account: &'static str, op: &'static str) -> Entry {
    Entry { id, account, op }
}

/// On a FIFO queue, m1 ("debit", account 1) fails: m3 ("close") and m5 of the same group must not run
/// before it, and are reported for redelivery with it; account 2's group goes on. Without `fifo` (a
/// standard queue's rule), the batch ran and deleted m3 although m1 failed. The redelivery then runs
/// account 1's messages in their order.
#[tokio::test]
async fn a_fifo_batch_stops_a_group_at_its_first_failure_and_the_others_go_on() {
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let h = Harness::new(backend).await;
        let log = Mutex::new(Vec::new());
        let declined = Mutex::new(true);
        let handler = |m: Entry| {
            let (log, declined) = (&log, &declined);
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if m.op == "debit" && *declined.lock().unwrap() {
                    return Err(ShipError(format!("{}: insufficient funds", m.id)));
                }
                log.lock().unwrap().push(m.id);
                Ok::<_, ShipError>(format!("{} {}", m.op, m.account))
            }
        };
        let messages = vec![
            entry("m1", "acct-1", "debit"),
            entry("m2", "acct-2", "open"),
            entry("m3", "acct-1", "close"),
            entry("m4", "acct-2", "deposit"),
            entry("m5", "acct-1", "archive"),
        ];
        let fifo = h
            .idem
            .batch("accounts::fifo")
            .concurrency(4)
            .fifo(|m: &Entry| m.account);
        let report = fifo
            .process(messages.clone(), |m| m.id.to_owned(), |m| m.id, handler)
            .await;
        let outcomes: Vec<(&str, &Outcome)> = report
            .items
            .iter()
            .map(|i| (i.id.as_str(), &i.outcome))
            .collect();
        assert!(
            matches!(outcomes[0], ("m1", Outcome::Failed(why)) if why.contains("insufficient funds")),
            "{backend:?}: {outcomes:?}"
        );
        assert_eq!(outcomes[1], ("m2", &Outcome::Executed), "{backend:?}");
        for at in [2, 4] {
            assert!(
                matches!(outcomes[at].1, Outcome::Failed(why) if why.contains("`m1`")),
                "{backend:?}: {outcomes:?}"
            );
        }
        assert_eq!(outcomes[3], ("m4", &Outcome::Executed), "{backend:?}");
        let failed: Vec<String> = report
            .batch_response()
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect();
        assert_eq!(failed, ["m1", "m3", "m5"], "{backend:?}");
        assert_eq!(*log.lock().unwrap(), ["m2", "m4"], "{backend:?}");
        assert!(
            h.record("accounts::fifo", "m3").await.is_none(),
            "{backend:?}: m3 was never claimed"
        );

        // The queue delivers account 1's group again, in order; now the debit goes through.
        *declined.lock().unwrap() = false;
        log.lock().unwrap().clear();
        let again = fifo
            .process(
                vec![
                    messages[0].clone(),
                    messages[2].clone(),
                    messages[4].clone(),
                ],
                |m| m.id.to_owned(),
                |m| m.id,
                handler,
            )
            .await;
        assert_eq!(again.count(&Outcome::Executed), 3, "{backend:?}: {again:?}");
        assert_eq!(*log.lock().unwrap(), ["m1", "m3", "m5"], "{backend:?}");

        // The control: without `fifo`, the group's later message runs despite the failure before it.
        *declined.lock().unwrap() = true;
        log.lock().unwrap().clear();
        let unordered = h
            .idem
            .batch("accounts::standard")
            .process(
                messages[..3].to_vec(),
                |m| m.id.to_owned(),
                |m| m.id,
                handler,
            )
            .await;
        assert_eq!(unordered.items[2].outcome, Outcome::Executed, "{backend:?}");
    }
}

/// In a FIFO batch, a group's messages that share a key with another group's keep both groups'
/// order: the lanes merge, and a failure still stops only its own group.
#[tokio::test]
async fn a_fifo_group_sharing_a_key_with_another_keeps_both_orders() {
    let h = Harness::new(Backend::Memory).await;
    let log = Mutex::new(Vec::new());
    let report = h
        .idem
        .batch("accounts::shared")
        .fifo(|m: &Entry| m.account)
        .process(
            vec![
                entry("m1", "acct-1", "debit"),
                entry("m2", "acct-2", "transfer"),
                entry("m3", "acct-1", "transfer"), // the same work as m2: a replay
                entry("m4", "acct-2", "close"),
            ],
            |m| m.id.to_owned(),
            |m| m.op,
            |m| {
                let log = &log;
                async move {
                    if m.op == "debit" {
                        return Err(ShipError("declined".into()));
                    }
                    log.lock().unwrap().push(m.id);
                    Ok::<_, ShipError>(m.op.to_owned())
                }
            },
        )
        .await;
    let outcomes: Vec<&Outcome> = report.items.iter().map(|i| &i.outcome).collect();
    assert!(matches!(outcomes[0], Outcome::Failed(_)), "{outcomes:?}");
    assert_eq!(outcomes[1], &Outcome::Executed, "{outcomes:?}");
    assert!(
        matches!(outcomes[2], Outcome::Failed(why) if why.contains("`m1`")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[3], &Outcome::Executed, "{outcomes:?}");
    assert_eq!(*log.lock().unwrap(), ["m2", "m4"]);
}

/// `Batch::deadline`, as `Operation::deadline`: each claim leases the time left until the deadline,
/// and a message whose turn comes after it is not claimed but delivered again.
#[tokio::test]
async fn a_batch_deadline_bounds_its_claims_and_stops_at_the_deadline() {
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let h = Harness::with(backend, |b| {
            b.heartbeat(false).default_lease(Duration::from_mins(5))
        })
        .await;
        let leases = Mutex::new(Vec::new());
        let deadline = std::time::SystemTime::now() + Duration::from_secs(3);
        let report = h
            .idem
            .batch("orders::deadline")
            .deadline(deadline)
            .process(
                vec![("m1", 1_u32), ("m2", 2)],
                |m| m.0.to_owned(),
                |m| m.1,
                |m| {
                    let (h, leases) = (&h, &leases);
                    async move {
                        let record = h.record("orders::deadline", &m.1).await.unwrap();
                        let now = h.clock.now_ms();
                        leases
                            .lock()
                            .unwrap()
                            .push(record.lease_until_ms.unwrap() - now);
                        Ok::<_, Error>(())
                    }
                },
            )
            .await;
        assert_eq!(
            report.count(&Outcome::Executed),
            2,
            "{backend:?}: {report:?}"
        );
        for lease in leases.lock().unwrap().iter() {
            assert!(
                (1..=3_000).contains(lease),
                "{backend:?}: a lease of {lease} ms, not the time left"
            );
        }

        let runs = AtomicUsize::new(0);
        let past = h
            .idem
            .batch("orders::deadline")
            .deadline(std::time::SystemTime::now() - Duration::from_secs(1))
            .process(
                vec![("m3", 3_u32)],
                |m| m.0.to_owned(),
                |m| m.1,
                |_| {
                    let runs = &runs;
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>(())
                    }
                },
            )
            .await;
        assert!(
            matches!(&past.items[0].outcome, Outcome::Failed(why) if why.contains("deadline")),
            "{backend:?}: {past:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert!(h.record("orders::deadline", &3_u32).await.is_none());
    }
}
