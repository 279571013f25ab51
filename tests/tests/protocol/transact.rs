//! Transactional completion on DynamoDB Local: business writes staged on `transact = tx` commit in one
//! `TransactWriteItems` with the COMPLETED record, or not at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, Put, ReturnValuesOnConditionCheckFailure, Update};
use idempotent_runtime::{Error, Idempotency, Status, idempotent};
use idempotent_tests::{Backend, Harness, unique_table};
use tokio::sync::{Notify, Semaphore};

#[derive(Debug)]
enum ShopError {
    Build(String),
    Idempotency(Error),
}

impl From<Error> for ShopError {
    fn from(e: Error) -> Self {
        ShopError::Idempotency(e)
    }
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShopError::Build(e) => write!(f, "bad write: {e}"),
            ShopError::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

/// A business table with one counter item.
struct Inventory {
    client: Client,
    table: String,
}

impl Inventory {
    async fn new(client: Client, available: u64) -> Self {
        let table = unique_table("inventory");
        idempotent_tests::create_plain_table(&client, &table, "pk").await;
        client
            .put_item()
            .table_name(&table)
            .item("pk", AttributeValue::S("sku-1".into()))
            .item("available", AttributeValue::N(available.to_string()))
            .send()
            .await
            .unwrap();
        Self { client, table }
    }

    async fn item(&self, pk: &str) -> Option<HashMap<String, AttributeValue>> {
        self.client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
    }

    async fn available(&self) -> u64 {
        let item = self.item("sku-1").await.unwrap();
        item["available"].as_n().unwrap().parse().unwrap()
    }

    /// `available -= qty` if enough is left.
    fn decrement(&self, qty: u64) -> Result<Update, ShopError> {
        Update::builder()
            .table_name(&self.table)
            .key("pk", AttributeValue::S("sku-1".into()))
            .update_expression("SET available = available - :q")
            .condition_expression("available >= :q")
            .expression_attribute_values(":q", AttributeValue::N(qty.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| ShopError::Build(e.to_string()))
    }

    /// The reservation item of `order`, written once.
    fn reservation(&self, order: &str, qty: u64) -> Result<Put, ShopError> {
        Put::builder()
            .table_name(&self.table)
            .item("pk", AttributeValue::S(format!("reservation#{order}")))
            .item("qty", AttributeValue::N(qty.to_string()))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .map_err(|e| ShopError::Build(e.to_string()))
    }
}

#[derive(Debug, Default)]
struct Control {
    runs: AtomicUsize,
    hold: Option<(Notify, Semaphore)>,
}

#[idempotent(key = order, store = idem, name = "transact::reserve", transact = tx, lease = "30s")]
async fn reserve(
    idem: &Idempotency,
    shop: &Inventory,
    ctl: &Control,
    order: &str,
    qty: u64,
) -> Result<u64, ShopError> {
    let run = ctl.runs.fetch_add(1, Ordering::SeqCst) + 1;
    tx.update(shop.decrement(qty)?);
    tx.put(shop.reservation(order, qty)?);
    if let Some((started, release)) = &ctl.hold {
        started.notify_one();
        release.acquire().await.unwrap().forget();
    }
    Ok(run as u64)
}

#[idempotent(key = order, store = idem, name = "transact::many", transact = tx)]
async fn many(
    idem: &Idempotency,
    shop: &Inventory,
    order: &str,
    writes: usize,
) -> Result<(), ShopError> {
    for i in 0..writes {
        tx.put(shop.reservation(&format!("{order}-{i}"), 1)?);
    }
    Ok(())
}

async fn setup(available: u64) -> (Harness, Inventory) {
    let h = Harness::new(Backend::DynamoDb).await;
    let shop = Inventory::new(h.client(), available).await;
    h.requests.reset();
    (h, shop)
}

#[tokio::test]
async fn the_business_write_and_the_completed_record_land_together_in_two_round_trips() {
    let (h, shop) = setup(10).await;
    let ctl = Control::default();
    assert_eq!(reserve(&h.idem, &shop, &ctl, "o-1", 3).await.unwrap(), 1);
    assert_eq!(h.requests.total(), 2, "claim + one TransactWriteItems");
    assert_eq!(
        (
            h.requests.of("UpdateItem"),
            h.requests.of("TransactWriteItems")
        ),
        (1, 1)
    );
    assert_eq!(shop.available().await, 7);
    assert_eq!(
        shop.item("reservation#o-1").await.unwrap()["qty"]
            .as_n()
            .unwrap(),
        "3"
    );
    let record = h.record("transact::reserve", "o-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);

    h.requests.reset();
    assert_eq!(
        reserve(&h.idem, &shop, &ctl, "o-1", 3).await.unwrap(),
        1,
        "replayed"
    );
    assert_eq!(h.requests.total(), 1);
    assert_eq!(shop.available().await, 7, "a duplicate writes nothing");
    assert_eq!(ctl.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failing_business_condition_writes_nothing_and_leaves_the_record_failed() {
    let (h, shop) = setup(2).await;
    let ctl = Control::default();
    let err = reserve(&h.idem, &shop, &ctl, "o-1", 5).await.unwrap_err();
    let ShopError::Idempotency(Error::TransactionCanceled {
        namespace, reasons, ..
    }) = err
    else {
        panic!("expected TransactionCanceled, got {err:?}")
    };
    assert_eq!(namespace, "transact::reserve");
    let codes: Vec<_> = reasons.iter().map(|r| (r.index, r.code.as_str())).collect();
    assert_eq!(
        codes,
        [(0, "None"), (1, "ConditionalCheckFailed"), (2, "None")]
    );
    let old = reasons[1]
        .item
        .as_ref()
        .expect("ALL_OLD returns the item that failed");
    assert_eq!(old["available"].as_n().unwrap(), "2");
    assert_eq!(shop.available().await, 2);
    assert!(shop.item("reservation#o-1").await.is_none());
    let record = h.record("transact::reserve", "o-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert!(
        record
            .error
            .unwrap()
            .contains("action 1 ConditionalCheckFailed")
    );

    // A retry after a restock runs again and commits.
    shop.client
        .put_item()
        .table_name(&shop.table)
        .item("pk", AttributeValue::S("sku-1".into()))
        .item("available", AttributeValue::N("9".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(reserve(&h.idem, &shop, &ctl, "o-1", 5).await.unwrap(), 2);
    assert_eq!(shop.available().await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_over_before_commit_applies_nothing() {
    let h = Harness::with(Backend::DynamoDb, |b| b.heartbeat(false)).await;
    let shop = Arc::new(Inventory::new(h.client(), 10).await);
    let slow = Arc::new(Control {
        hold: Some((Notify::new(), Semaphore::new(0))),
        ..Control::default()
    });
    let first = tokio::spawn({
        let (idem, shop, slow) = (h.idem.clone(), shop.clone(), slow.clone());
        async move { reserve(&idem, &shop, &slow, "o-1", 4).await }
    });
    slow.hold.as_ref().unwrap().0.notified().await;
    // Past the 30 s lease by more than the 1 s clock-skew margin.
    h.clock.advance(Duration::from_secs(32));
    let fast = Control::default();
    // Another process takes over: in the first one's, a duplicate would wait on it.
    let other = h.another_process(|b| b.heartbeat(false));
    assert_eq!(reserve(&other, &shop, &fast, "o-1", 4).await.unwrap(), 1);
    slow.hold.as_ref().unwrap().1.add_permits(1);
    let late = first.await.unwrap().unwrap_err();
    assert!(
        matches!(late, ShopError::Idempotency(Error::LeaseLost { .. })),
        "{late:?}"
    );
    assert_eq!(
        shop.available().await,
        6,
        "only the new owner's reservation was applied"
    );
    assert_eq!(
        h.record("transact::reserve", "o-1").await.unwrap().attempt,
        2
    );
}

#[tokio::test]
async fn too_many_staged_writes_fail_before_the_transaction_is_sent() {
    let (h, shop) = setup(10).await;
    let err = many(&h.idem, &shop, "o-1", 100).await.unwrap_err();
    let ShopError::Idempotency(Error::TooManyWrites { detail, .. }) = err else {
        panic!("expected TooManyWrites, got {err:?}")
    };
    assert!(
        detail.contains("100 writes") && detail.contains("at most 99"),
        "{detail}"
    );
    assert_eq!(h.requests.of("TransactWriteItems"), 0, "nothing sent");
    assert_eq!(
        h.record("transact::many", "o-1").await.unwrap().status,
        Status::Failed
    );
    // 99 fit.
    many(&h.idem, &shop, "o-2", 99).await.unwrap();
    assert!(shop.item("reservation#o-2-98").await.is_some());
}

#[tokio::test]
async fn claim_with_reserves_at_claim_time_and_rolls_back_with_the_claim() {
    let (h, shop) = setup(5).await;
    let runs = &AtomicUsize::new(0);
    let call = |order: &'static str, qty: u64| {
        let writes = [aws_sdk_dynamodb::types::TransactWriteItem::builder()
            .update(shop.decrement(qty).unwrap())
            .build()];
        h.idem
            .operation("transact::claim-with", order)
            .claim_with(writes)
            .run(move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ShopError>(qty)
            })
    };
    assert_eq!(call("o-1", 3).await.unwrap(), 3);
    assert_eq!(shop.available().await, 2);
    assert_eq!(
        call("o-1", 3).await.unwrap(),
        3,
        "a duplicate replays and reserves nothing"
    );
    assert_eq!(shop.available().await, 2);
    let err = call("o-2", 3).await.unwrap_err();
    assert!(
        matches!(&err, ShopError::Idempotency(Error::TransactionCanceled { reasons, .. }) if reasons[1].code == "ConditionalCheckFailed"),
        "{err:?}"
    );
    assert!(
        h.record("transact::claim-with", "o-2").await.is_none(),
        "the claim rolled back with the reservation"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[idempotent(key = order, store = idem, name = "transact::invalid", transact = tx)]
async fn invalid_write(idem: &Idempotency, table: &str, order: &str) -> Result<(), ShopError> {
    tx.update(
        Update::builder()
            .table_name(table)
            .key("pk", AttributeValue::S("x".into()))
            .update_expression("SET available = :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .map_err(|e| ShopError::Build(e.to_string()))?,
    );
    Ok(())
}

#[tokio::test]
async fn a_transaction_refused_as_invalid_releases_the_claim_for_a_retry() {
    let (h, shop) = setup(1).await;
    let err = invalid_write(&h.idem, "no-such-business-table", "o-1")
        .await
        .unwrap_err();
    let ShopError::Idempotency(Error::WriteRejected { source, .. }) = &err else {
        panic!("expected the business write's own error, got {err:?}")
    };
    assert!(
        source
            .to_string()
            .contains("a table in the transaction does not exist"),
        "{source}"
    );
    assert!(
        source.to_string().contains("`no-such-business-table`"),
        "the candidate tables are named: {source}"
    );
    let record = h.record("transact::invalid", "o-1").await.unwrap();
    assert_eq!(
        record.status,
        Status::Failed,
        "nothing was written, so the key is free for a retry"
    );
    invalid_write(&h.idem, &shop.table, "o-1").await.unwrap();
    assert_eq!(
        h.record("transact::invalid", "o-1").await.unwrap().status,
        Status::Completed
    );
}
