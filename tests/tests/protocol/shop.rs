//! A business table with one stock item, on either store: the memory store's own tables, or a table on
//! DynamoDB Local next to the idempotency table.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use idempotent_runtime::{DynamoDbStore, MemoryStore};
use idempotent_tests::{Harness, unique_table};

/// The business table and the store it lives in.
pub(crate) struct Shop {
    memory: Option<Arc<MemoryStore>>,
    client: Option<Client>,
    table: String,
}

fn key(pk: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([("pk".to_owned(), AttributeValue::S(pk.to_owned()))])
}

impl Shop {
    /// A table `inventory-..` whose item `sku-1` has `available` units.
    pub(crate) async fn new(h: &Harness, available: u64) -> Self {
        let table = unique_table("inventory");
        let shop = Self {
            memory: h.memory.clone(),
            client: h.dynamodb.as_ref().map(|store| store.client().clone()),
            table,
        };
        let mut item = key("sku-1");
        item.insert(
            "available".to_owned(),
            AttributeValue::N(available.to_string()),
        );
        if let Some(memory) = shop.memory() {
            memory.create_table(&shop.table, "pk", None).unwrap();
            memory.put_item(&shop.table, item).unwrap();
        } else {
            let client = shop.client();
            // A table of the idempotency table's shape (partition key `pk`, type S) serves as well.
            DynamoDbStore::new(client.clone(), &shop.table)
                .create_table()
                .await
                .unwrap();
            client
                .put_item()
                .table_name(&shop.table)
                .set_item(Some(item))
                .send()
                .await
                .unwrap();
        }
        shop
    }

    fn memory(&self) -> Option<&MemoryStore> {
        self.memory.as_deref()
    }

    fn client(&self) -> Client {
        self.client.clone().expect("a memory or DynamoDB store")
    }

    /// The item `pk`, read consistently.
    pub(crate) async fn item(&self, pk: &str) -> Option<HashMap<String, AttributeValue>> {
        if let Some(memory) = self.memory() {
            return memory.get_item(&self.table, &key(pk));
        }
        self.client()
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(pk)))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
    }

    /// Units of `sku-1` left.
    pub(crate) async fn available(&self) -> u64 {
        let item = self.item("sku-1").await.expect("the stock item");
        item["available"].as_n().unwrap().parse().unwrap()
    }

    /// `available -= qty`, if that many are left.
    pub(crate) fn take(&self, qty: u64) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key("sku-1")))
            .update_expression("SET available = available - :q")
            .condition_expression("available >= :q")
            .expression_attribute_values(":q", AttributeValue::N(qty.to_string()))
            .build()
            .unwrap();
        TransactWriteItem::builder().update(update).build()
    }

    /// `available += qty`: gives back what [`take`](Self::take) took.
    pub(crate) fn give_back(&self, qty: u64) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key("sku-1")))
            .update_expression("SET available = available + :q")
            .expression_attribute_values(":q", AttributeValue::N(qty.to_string()))
            .build()
            .unwrap();
        TransactWriteItem::builder().update(update).build()
    }

    /// Writes the item `pk` with a `bytes`-long string attribute, once (`attribute_not_exists`).
    pub(crate) fn put_blob(&self, pk: &str, bytes: usize) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(key(pk)))
            .item("blob", AttributeValue::S("x".repeat(bytes)))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .unwrap();
        TransactWriteItem::builder().put(put).build()
    }
}
