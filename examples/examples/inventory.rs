//! Inventory reservation, exactly once per order: the stock decrement and the reservation record commit in
//! one DynamoDB transaction with the idempotency record (`transact = tx`); and a hold taken at claim time
//! (`claim_with`) that a retry after a failed payment does not take again.
//!
//! On DynamoDB, the business items (`sku#apple`, `reservation#..`) are written into the same table as the
//! idempotency records (created if missing): point it at a scratch table, never a production one.
//!
//! ```text
//! cargo run -p idempotent-examples --example inventory
//! IDEMPOTENT_DYNAMODB_ENDPOINT=http://127.0.0.1:8000 cargo run -p idempotent-examples --example inventory
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use idempotent_examples::Backend;
use idempotent_runtime::aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use idempotent_runtime::{DynamoDbStore, Error, Idempotency, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    id: String,
    sku: String,
    qty: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Reservation {
    order: String,
    sku: String,
    qty: u64,
}

#[derive(Debug)]
enum ShopError {
    InvalidWrite(String),
    PaymentDeclined,
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
            ShopError::InvalidWrite(e) => write!(f, "invalid write: {e}"),
            ShopError::PaymentDeclined => f.write_str("payment declined"),
            ShopError::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ShopError {}

/// The business table: one item per SKU (`available`), one per reservation.
struct Inventory {
    table: String,
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// How often the body ran.
static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = order.id, payload = order, transact = tx, name = "inventory::reserve")]
async fn reserve(inventory: &Inventory, order: &Order) -> Result<Reservation, ShopError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    let invalid = |e: idempotent_runtime::aws_sdk_dynamodb::error::BuildError| {
        ShopError::InvalidWrite(e.to_string())
    };
    // Take the stock, if there is enough of it ...
    tx.update(
        Update::builder()
            .table_name(&inventory.table)
            .key("pk", s(&format!("sku#{}", order.sku)))
            .update_expression("SET available = available - :qty")
            .condition_expression("available >= :qty")
            .expression_attribute_values(":qty", n(order.qty))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(invalid)?,
    );
    // ... and record the reservation, in the same transaction as the idempotency record.
    tx.put(
        Put::builder()
            .table_name(&inventory.table)
            .item("pk", s(&format!("reservation#{}", order.id)))
            .item("sku", s(&order.sku))
            .item("qty", n(order.qty))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .map_err(invalid)?,
    );
    Ok(Reservation {
        order: order.id.clone(),
        sku: order.sku.clone(),
        qty: order.qty,
    })
}

/// Where the business table lives, to show the stock.
enum Tables {
    Memory(Arc<MemoryStore>),
    DynamoDb(idempotent_runtime::aws_sdk_dynamodb::Client),
}

impl Tables {
    async fn apples(&self, table: &str) -> u64 {
        let key: HashMap<String, AttributeValue> = [("pk".to_owned(), s("sku#apple"))].into();
        let item = match self {
            Tables::Memory(store) => store.get_item(table, &key),
            Tables::DynamoDb(client) => client
                .get_item()
                .table_name(table)
                .set_key(Some(key))
                .consistent_read(true)
                .send()
                .await
                .ok()
                .and_then(|o| o.item),
        };
        item.and_then(|i| i.get("available")?.as_n().ok()?.parse().ok())
            .unwrap_or(0)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = idempotent_examples::backend_from_env("idempotency-examples").await;
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let seed: HashMap<String, AttributeValue> = [
        ("pk".to_owned(), s("sku#apple")),
        ("available".to_owned(), n(10)),
    ]
    .into();

    // The idempotency records and the business items share one table here; they may as well not.
    let (idem, tables, table) = match &backend {
        Backend::Memory => {
            println!(
                "store: in memory (set IDEMPOTENT_DYNAMODB_ENDPOINT or IDEMPOTENCY_TABLE for DynamoDB)"
            );
            let store = Arc::new(MemoryStore::new());
            store.create_table("inventory", "pk", None)?;
            store.put_item("inventory", seed)?;
            let idem = Idempotency::builder_arc(store.clone()).build();
            (idem, Tables::Memory(store), "inventory".to_owned())
        }
        Backend::DynamoDb { client, table } => {
            println!("store: DynamoDB table `{table}`");
            let store = DynamoDbStore::new(client.clone(), table);
            store.create_table().await?;
            client
                .put_item()
                .table_name(table)
                .set_item(Some(seed))
                .send()
                .await?;
            let tables = Tables::DynamoDb(client.clone());
            (Idempotency::builder(store).build(), tables, table.clone())
        }
    };
    idem.install();
    let inventory = Inventory { table };
    println!("stock of apples: {}", tables.apples(&inventory.table).await);

    let order = Order {
        id: format!("order-{run}"),
        sku: "apple".into(),
        qty: 3,
    };
    println!("1. reserve {} apples for {}", order.qty, order.id);
    let first = reserve(&inventory, &order).await?;
    println!(
        "   -> {first:?}; stock now {}",
        tables.apples(&inventory.table).await
    );

    println!("2. the same order again (a retry)");
    let again = reserve(&inventory, &order).await?;
    println!(
        "   -> {again:?} (replayed: {}); stock still {}",
        again == first,
        tables.apples(&inventory.table).await
    );

    let big = Order {
        id: format!("order-{run}-big"),
        sku: "apple".into(),
        qty: 50,
    };
    println!(
        "3. reserve {} apples for {}: more than there are",
        big.qty, big.id
    );
    match reserve(&inventory, &big).await {
        Err(ShopError::Idempotency(Error::TransactionCanceled { reasons, .. })) => {
            for r in reasons.iter().filter(|r| r.code != "None") {
                println!(
                    "   -> canceled: action {} {} (nothing was written)",
                    r.index, r.code
                );
            }
        }
        other => println!("   -> unexpected: {other:?}"),
    }
    println!(
        "stock of apples: {}; the body ran {} times for 3 calls",
        tables.apples(&inventory.table).await,
        RUNS.load(Ordering::SeqCst)
    );

    // Claim and reserve: the hold commits with the claim, before the body runs. It is in effect at most
    // once per key: the retry after a failed payment does not take the stock again.
    let held = format!("order-{run}-held");
    let declined = AtomicBool::new(true);
    println!("4. hold 2 apples at claim time for {held}; the payment step then fails");
    let attempt = hold(&idem, &inventory, &held, &declined).await;
    println!(
        "   -> {attempt:?}; stock now {} (held)",
        tables.apples(&inventory.table).await
    );
    declined.store(false, Ordering::SeqCst);
    println!("5. retry {held}: the payment goes through");
    let retried = hold(&idem, &inventory, &held, &declined).await?;
    println!(
        "   -> {retried}; stock still {} (the hold was not taken twice)",
        tables.apples(&inventory.table).await
    );
    Ok(())
}

/// Takes 2 apples at claim time (`claim_with`), then charges, which fails while `declined` is set.
async fn hold(
    idem: &Idempotency,
    inventory: &Inventory,
    order: &str,
    declined: &AtomicBool,
) -> Result<String, ShopError> {
    let take = Update::builder()
        .table_name(&inventory.table)
        .key("pk", s("sku#apple"))
        .update_expression("SET available = available - :qty")
        .condition_expression("available >= :qty")
        .expression_attribute_values(":qty", n(2))
        .build()
        .map_err(|e| ShopError::InvalidWrite(e.to_string()))?;
    idem.operation("inventory::hold", order)
        .claim_with([TransactWriteItem::builder().update(take).build()])
        .run(|_| async {
            if declined.load(Ordering::SeqCst) {
                return Err(ShopError::PaymentDeclined);
            }
            Ok(format!("{order}: 2 apples held and paid"))
        })
        .await
}
