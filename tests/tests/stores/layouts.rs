//! Table layouts ([`Layout`]) on DynamoDB Local: every layout runs the store's behaviour (a first call,
//! a duplicate replay, a failure and retry, a takeover, a transaction with a business write, racing
//! claims) with the same round trips; each item carries the layout's key attributes; and a condition on
//! the partition key attribute holds per item, not per partition.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use idempotent_runtime::store::conformance::request;
use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, TransactOutcome, Transition, WriteOutcome, Writes,
};
use idempotent_runtime::{DynamoDbStore, Error, Layout, Status, Store, StoreError, derive_key};
use idempotent_tests::{
    AppError, Harness, RequestCounter, client, idem_error, raw_item, unique_table,
};

const NS: &str = "billing::charge";

/// The three layouts, the static one with a value of its own.
fn layouts() -> [Layout; 3] {
    [
        Layout::Key,
        Layout::static_partition("orders"),
        Layout::Tenant,
    ]
}

/// A fresh table of `layout` on DynamoDB Local, created by the store, with a request counter.
async fn store(layout: &Layout) -> (DynamoDbStore, RequestCounter) {
    let (client, counter) = client();
    let store = DynamoDbStore::new(client, unique_table("layout")).with_layout(layout.clone());
    let report = store.ensure_table().await.expect("create the test table");
    assert_eq!(&report.layout, layout);
    assert_eq!(
        report.sort_key_attribute.as_deref(),
        layout.has_sort_key().then_some("sk")
    );
    counter.reset();
    (store, counter)
}

async fn harness(layout: &Layout) -> Harness {
    let (store, counter) = store(layout).await;
    Harness {
        dynamodb: Some(store.clone()),
        ..Harness::over(Arc::new(store), counter, |b| b)
    }
}

/// The raw item of `key`, read by the layout's item key.
async fn item(
    store: &DynamoDbStore,
    key: &str,
) -> std::collections::HashMap<String, AttributeValue> {
    raw_item(store, key).await.expect("the record's item")
}

#[tokio::test]
async fn a_first_call_and_its_duplicate_in_every_layout() {
    for layout in layouts() {
        let h = harness(&layout).await;
        let runs = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..2 {
            let value: String = h
                .idem
                .operation(NS, &(7, "order-1"))
                .run(|_| async {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, Error>("ch_7".to_owned())
                })
                .await
                .unwrap();
            assert_eq!(value, "ch_7", "{layout}");
        }
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{layout}"
        );
        // A claim and a completion, then one claim that finds the record: the budgets of every layout.
        assert_eq!(h.requests.of("UpdateItem"), 3, "{layout}");
        assert_eq!(h.requests.total(), 3, "{layout}");
        let record = h.record(NS, &(7, "order-1")).await.unwrap();
        assert_eq!(record.status, Status::Completed);
        assert_eq!(record.key, derive_key(NS, &(7, "order-1")).unwrap());
        // The item carries the layout's key attributes.
        let store = h.dynamodb.as_ref().unwrap();
        let raw = item(store, &record.key).await;
        let (namespace, hash) = record.key.rsplit_once('#').unwrap();
        let expected: Vec<(&str, &str)> = match &layout {
            Layout::Key => vec![("pk", record.key.as_str())],
            Layout::StaticPartition { value, .. } => {
                vec![("pk", value.as_str()), ("sk", record.key.as_str())]
            }
            Layout::Tenant => vec![("pk", namespace), ("sk", hash)],
            other => panic!("a layout this test does not know: {other}"),
        };
        for (attribute, value) in expected {
            assert_eq!(
                raw[attribute],
                AttributeValue::S(value.to_owned()),
                "{layout}"
            );
        }
        assert_eq!(raw.contains_key("sk"), layout.has_sort_key(), "{layout}");
    }
}

#[tokio::test]
async fn a_failure_and_its_retry_in_every_layout() {
    for layout in layouts() {
        let h = harness(&layout).await;
        let failed: Result<String, AppError> = h
            .idem
            .operation(NS, "order-2")
            .run(|_| async { Err(AppError::Declined) })
            .await;
        assert!(matches!(failed, Err(AppError::Declined)), "{layout}");
        let record = h.record(NS, "order-2").await.unwrap();
        assert_eq!(record.status, Status::Failed, "{layout}");
        assert_eq!(record.error.as_deref(), Some("declined"));
        let value: String = h
            .idem
            .operation(NS, "order-2")
            .run(|_| async { Ok::<_, AppError>("second".to_owned()) })
            .await
            .unwrap();
        assert_eq!(value, "second", "{layout}");
        let record = h.record(NS, "order-2").await.unwrap();
        assert_eq!(
            (record.status, record.attempt),
            (Status::Completed, 2),
            "{layout}"
        );
    }
}

#[tokio::test]
async fn a_takeover_in_every_layout() {
    for layout in layouts() {
        let h = harness(&layout).await;
        // A worker that dies mid-body: its claim stays PENDING.
        let stuck = tokio::spawn({
            let idem = h.idem.clone();
            async move {
                idem.operation(NS, "order-3")
                    .lease(Duration::from_secs(5))
                    .run(|_| std::future::pending::<Result<String, Error>>())
                    .await
            }
        });
        let pending = loop {
            if let Some(record) = h.record(NS, "order-3").await {
                break record;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        stuck.abort();
        assert_eq!(pending.status, Status::Pending, "{layout}");
        // While the lease runs, a duplicate is refused; after it, the key is taken over. From another
        // process: in the dead worker's, they would follow its call until the abort reaches it.
        let other = h.another_process(|b| b);
        let busy = other
            .operation(NS, "order-3")
            .run(|_| async { Ok::<_, AppError>("early".to_owned()) })
            .await;
        assert!(
            matches!(idem_error(busy), Error::InProgress { .. }),
            "{layout}"
        );
        h.clock.advance(Duration::from_secs(7));
        let value: String = other
            .operation(NS, "order-3")
            .run(|_| async { Ok::<_, AppError>("taken over".to_owned()) })
            .await
            .unwrap();
        assert_eq!(value, "taken over", "{layout}");
        let record = h.record(NS, "order-3").await.unwrap();
        assert_eq!((record.status, record.attempt), (Status::Completed, 2));
        // The dead worker's token is fenced out.
        let late = h
            .store
            .transition(&Transition::new(
                &record.key,
                &pending.token,
                Change::Complete {
                    response: Some(b"\"late\""),
                    expires_at_s: u64::MAX / 2,
                    replay_until_s: None,
                },
            ))
            .await
            .unwrap();
        assert!(
            matches!(&late, WriteOutcome::Rejected(Some(r)) if r.token == record.token),
            "{layout}: {late:?}"
        );
    }
}

/// A business table (partition key `id`) on the store's DynamoDB Local.
async fn business_table(client: &Client) -> String {
    let table = unique_table("business");
    idempotent_tests::create_plain_table(client, &table, "id").await;
    table
}

fn business_put(table: &str, id: &str) -> Put {
    Put::builder()
        .table_name(table)
        .item("id", AttributeValue::S(id.to_owned()))
        .condition_expression("attribute_not_exists(id)")
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_transaction_with_a_business_write_in_every_layout() {
    for layout in layouts() {
        let h = harness(&layout).await;
        let client = h.client();
        let business = business_table(&client).await;
        for _ in 0..2 {
            let put = business_put(&business, "order-4");
            let value: String = h
                .idem
                .operation(NS, "order-4")
                .transact()
                .run(|cx| async move {
                    let ((), tx) = cx.into_parts();
                    tx.put(put);
                    Ok::<_, Error>("shipped".to_owned())
                })
                .await
                .unwrap();
            assert_eq!(value, "shipped", "{layout}");
        }
        // A claim, one TransactWriteItems, and the duplicate's claim.
        assert_eq!(h.requests.of("TransactWriteItems"), 1, "{layout}");
        assert_eq!(h.requests.of("UpdateItem"), 2, "{layout}");
        let record = h.record(NS, "order-4").await.unwrap();
        assert_eq!(record.status, Status::Completed, "{layout}");
        let written = client
            .get_item()
            .table_name(&business)
            .key("id", AttributeValue::S("order-4".into()))
            .send()
            .await
            .unwrap();
        assert!(written.item.is_some(), "{layout}");
        // A business condition that fails cancels the whole transaction, by the record's full key.
        let put = business_put(&business, "order-4");
        let key = derive_key(NS, "order-5").unwrap();
        let claim = claim(&key, "t5", now_ms());
        assert_eq!(h.store.claim(&claim).await.unwrap(), ClaimOutcome::Claimed);
        let writes: Writes = [TransactWriteItem::builder().put(put).build()]
            .into_iter()
            .collect();
        let outcome = h
            .store
            .transact_transition(&complete(&key, "t5"), &writes)
            .await
            .unwrap();
        assert!(
            matches!(&outcome, TransactOutcome::Canceled(reasons)
                if reasons.len() == 2 && reasons[0].code == "None" && reasons[1].code == "ConditionalCheckFailed"),
            "{layout}: {outcome:?}"
        );
        assert_eq!(
            h.store.get(&key).await.unwrap().unwrap().status,
            Status::Pending,
            "{layout}"
        );
    }
}

fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// The suite's claim, without a fingerprint, its TTL an hour after `now_ms`.
fn claim<'a>(key: &'a str, token: &'a str, now_ms: u64) -> ClaimRequest<'a> {
    let mut claim = request::claim(key, token, now_ms);
    claim.expires_at_s = now_ms / 1000 + 3600;
    claim.fingerprint = None;
    claim
}

fn complete<'a>(key: &'a str, token: &'a str) -> Transition<'a> {
    request::complete(key, token, b"{}", now_ms() / 1000 + 3600)
}

#[tokio::test]
async fn of_16_racing_claims_exactly_one_wins_in_every_layout() {
    for layout in layouts() {
        let (store, _) = store(&layout).await;
        let key = derive_key(NS, "order-6").unwrap();
        let now = now_ms();
        let claims = (0..16).map(|i| {
            let (store, key) = (store.clone(), key.clone());
            async move {
                let token = format!("token-{i}");
                store.claim(&claim(&key, &token, now)).await.unwrap()
            }
        });
        let outcomes = futures_join_all(claims).await;
        let winners = outcomes
            .iter()
            .filter(|o| **o == ClaimOutcome::Claimed)
            .count();
        assert_eq!(winners, 1, "{layout}");
    }
}

/// Runs the futures at once on the runtime's threads.
async fn futures_join_all<T: Send + 'static>(
    futures: impl Iterator<Item = impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

/// In a table with a sort key, `attribute_not_exists` on the *partition* key attribute is evaluated
/// against the one item the request's full key names: other items in the same partition do not make
/// it false. Checked on the bare API, then through the store (two keys in one static partition).
#[tokio::test]
async fn attribute_not_exists_on_the_partition_key_holds_per_item() {
    let layout = Layout::static_partition("one-partition");
    let (store, _) = store(&layout).await;
    let put = |sk: &str| {
        store
            .client()
            .put_item()
            .table_name(store.table())
            .item("pk", AttributeValue::S("p".into()))
            .item("sk", AttributeValue::S(sk.to_owned()))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", "pk")
            .send()
    };
    put("a").await.expect("no item (p, a) yet");
    put("b").await.expect("(p, a) exists, but no item (p, b)");
    let again = put("a").await.unwrap_err();
    assert_eq!(
        aws_sdk_dynamodb::error::ProvideErrorMetadata::code(&again),
        Some("ConditionalCheckFailedException")
    );
    // Through the store: both keys claimed in one partition, each once.
    let (k1, k2) = (
        derive_key(NS, "order-7").unwrap(),
        derive_key(NS, "order-8").unwrap(),
    );
    let now = now_ms();
    assert_eq!(
        store.claim(&claim(&k1, "t1", now)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store.claim(&claim(&k2, "t2", now)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(matches!(
        store.claim(&claim(&k1, "t3", now)).await.unwrap(),
        ClaimOutcome::Existing(r) if r.token == "t1" && r.key == k1
    ));
}

/// The tenant layout's point: one `Query` lists the keys of one namespace.
#[tokio::test]
async fn a_query_on_a_namespace_lists_its_keys_in_the_tenant_layout() {
    let h = harness(&Layout::Tenant).await;
    for (namespace, order) in [("shop::a", "1"), ("shop::a", "2"), ("shop::b", "3")] {
        let _: String = h
            .idem
            .operation(namespace, order)
            .run(|_| async { Ok::<_, Error>(order.to_owned()) })
            .await
            .unwrap();
    }
    let store = h.dynamodb.as_ref().unwrap();
    let listed = store
        .client()
        .query()
        .table_name(store.table())
        .key_condition_expression("pk = :ns")
        .expression_attribute_values(":ns", AttributeValue::S("shop::a".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let mut keys: Vec<String> = listed
        .items()
        .iter()
        .map(|item| store.parse_item(item).unwrap().key)
        .collect();
    keys.sort();
    let mut expected = vec![
        derive_key("shop::a", "1").unwrap(),
        derive_key("shop::a", "2").unwrap(),
    ];
    expected.sort();
    assert_eq!(keys, expected);
}

#[tokio::test]
async fn check_refuses_a_table_of_another_layout() {
    let (key_table, _) = store(&Layout::Key).await;
    for layout in [Layout::Tenant, Layout::static_partition("p")] {
        let other = key_table.clone().with_layout(layout.clone());
        let err = other.check().await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Schema(d) if d.contains("a partition key `pk` and a sort key `sk`") && d.contains(&layout.to_string())),
            "{err:?}"
        );
    }
    let (tenant_table, _) = store(&Layout::Tenant).await;
    let err = tenant_table
        .clone()
        .with_layout(Layout::Key)
        .check()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Schema(d) if d.contains("exactly one partition key `pk`")),
        "{err:?}"
    );
    // The static and tenant layouts share a key schema: the table fits both (a table is still
    // written in one layout for its life).
    let report = tenant_table
        .with_layout(Layout::static_partition("p"))
        .check()
        .await
        .unwrap();
    assert_eq!(report.sort_key_attribute.as_deref(), Some("sk"));
}

#[tokio::test]
async fn a_store_with_a_region_records_where_it_completed() {
    for layout in layouts() {
        let (store, _) = store(&layout).await;
        let store = store.with_region("eu-west-1");
        let key = derive_key(NS, "order-9").unwrap();
        let now = now_ms();
        assert_eq!(
            store.claim(&claim(&key, "t1", now)).await.unwrap(),
            ClaimOutcome::Claimed
        );
        assert_eq!(
            store.transition(&complete(&key, "t1")).await.unwrap(),
            WriteOutcome::Applied
        );
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(
            record.completed_in.as_deref(),
            Some("eu-west-1"),
            "{layout}"
        );
        assert_eq!(
            item(&store, &key).await["completed_in"],
            AttributeValue::S("eu-west-1".into())
        );
        // A new claim of the expired record clears it; a store without a region never writes it.
        let later = now + 3_700_000;
        assert_eq!(
            store.claim(&claim(&key, "t2", later)).await.unwrap(),
            ClaimOutcome::Claimed
        );
        assert_eq!(store.get(&key).await.unwrap().unwrap().completed_in, None);
        let plain =
            DynamoDbStore::new(store.client().clone(), store.table()).with_layout(layout.clone());
        assert_eq!(
            plain.transition(&complete(&key, "t2")).await.unwrap(),
            WriteOutcome::Applied
        );
        assert_eq!(
            plain.get(&key).await.unwrap().unwrap().completed_in,
            None,
            "{layout}"
        );
    }
}

/// The store contract (`idempotent_runtime::store::conformance`), whole, on every layout.
///
/// The suite's keys are plain strings (`"k"`, `"race-0"`), not derived keys; the tenant layout needs a
/// `{namespace}#{hash}` key to split, so there the store is wrapped in [`Namespaced`], which puts every
/// key in a namespace on the way in and takes it off the records on the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_layout_keeps_the_whole_store_contract() {
    use idempotent_runtime::store::conformance::{self, BusinessTable, Subject};
    let (client, _) = client();
    let business = business_table(&client).await;
    for layout in layouts() {
        let (business, layout) = (&business, &layout);
        let report = conformance::check(move || async move {
            let (store, _) = store(layout).await;
            let prefix = if *layout == Layout::Tenant {
                "conformance#"
            } else {
                ""
            };
            Subject::new(Namespaced { store, prefix })
                .with_business_table(BusinessTable::new(business, "id"))
        })
        .await;
        println!("{layout}:\n{report}");
        report.assert_complete();
    }
}

/// A DynamoDB store whose keys get `prefix` in front (see [`every_layout_keeps_the_whole_store_contract`]).
#[derive(Debug)]
struct Namespaced {
    store: DynamoDbStore,
    prefix: &'static str,
}

impl Namespaced {
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn record(&self, mut record: idempotent_runtime::Record) -> idempotent_runtime::Record {
        record.key = record
            .key
            .strip_prefix(self.prefix)
            .expect("a key this wrapper wrote")
            .to_owned();
        record
    }

    fn write(&self, outcome: WriteOutcome) -> WriteOutcome {
        match outcome {
            WriteOutcome::Rejected(record) => {
                WriteOutcome::Rejected(record.map(|r| self.record(r)))
            }
            other => other,
        }
    }

    fn transact(&self, outcome: TransactOutcome) -> TransactOutcome {
        match outcome {
            TransactOutcome::Rejected(record) => {
                TransactOutcome::Rejected(record.map(|r| self.record(r)))
            }
            other => other,
        }
    }
}

#[async_trait::async_trait]
impl Store for Namespaced {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let key = self.key(request.key);
        let mut request = *request;
        request.key = &key;
        Ok(match self.store.claim(&request).await? {
            ClaimOutcome::Existing(record) => ClaimOutcome::Existing(self.record(record)),
            other => other,
        })
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        let key = self.key(transition.key);
        let mut transition = *transition;
        transition.key = &key;
        Ok(self.write(self.store.transition(&transition).await?))
    }

    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let key = self.key(transition.key);
        let mut transition = *transition;
        transition.key = &key;
        Ok(self.transact(self.store.transact_transition(&transition, writes).await?))
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let key = self.key(request.key);
        let mut request = *request;
        request.key = &key;
        Ok(self.transact(self.store.claim_transaction(&request, writes).await?))
    }

    async fn get(&self, key: &str) -> Result<Option<idempotent_runtime::Record>, StoreError> {
        Ok(self
            .store
            .get(&self.key(key))
            .await?
            .map(|r| self.record(r)))
    }

    fn response_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        self.store.response_budget(&self.key(key), fingerprint)
    }

    fn kind(&self) -> &'static str {
        self.store.kind()
    }
}
