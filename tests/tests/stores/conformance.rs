//! The store contract, `idempotent_runtime::store::conformance`, run against both built-in stores (every
//! case must pass) and a store without transactions (its transaction cases are skipped, and say so);
//! then what only the DynamoDB store can show (round trips, custom attribute names). `broken_stores.rs`
//! shows that the suite catches stores that break the contract.

use idempotent_runtime::store::conformance::request::{NOW, claim, complete};
use idempotent_runtime::store::conformance::{
    self, BusinessTable, Outcome, RECORD_CASES, Subject, TRANSACTION_CASES,
};
use idempotent_runtime::store::{ClaimOutcome, Store, WriteOutcome};
use idempotent_runtime::{MemoryStore, Status};
use idempotent_tests::{RecordsOnly, create_plain_table, dynamodb_store, unique_table};

/// A memory store with a business table for the transaction cases.
fn memory() -> Subject<MemoryStore> {
    let store = MemoryStore::new();
    store.create_table("business", "id", None).unwrap();
    Subject::new(store).with_business_table(BusinessTable::new("business", "id"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_memory_store_keeps_the_whole_contract() {
    let report = conformance::check(|| async { memory() }).await;
    report.assert_complete();
    assert_eq!(report.store(), "memory");
    assert_eq!(
        report.cases().len(),
        RECORD_CASES.len() + TRANSACTION_CASES.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dynamodb_store_keeps_the_whole_contract() {
    let (client, _) = idempotent_tests::client();
    let business = unique_table("business");
    create_plain_table(&client, &business, "id").await;
    let business = &business;
    let report = conformance::check(move || async move {
        let (store, _) = dynamodb_store().await;
        Subject::new(store).with_business_table(BusinessTable::new(business, "id"))
    })
    .await;
    println!("{report}");
    report.assert_complete();
    assert_eq!(report.store(), "dynamodb");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_without_transactions_passes_with_its_transaction_cases_skipped() {
    let report = conformance::check(|| async { RecordsOnly::default() }).await;
    report.assert_passed();
    assert_eq!(
        report.outcome("transactions_are_supported_or_refused_as_unsupported"),
        Some(&Outcome::Passed)
    );
    let skipped: Vec<_> = report.skipped().map(|c| c.name).collect();
    assert_eq!(skipped, TRANSACTION_CASES[1..], "{report}");
    for case in report.skipped() {
        assert!(
            matches!(&case.outcome, Outcome::Skipped(why)
                if why == "the records-only store does not support transactions (`claim_transaction` and \
                           `transact_transition` return `StoreError::Unsupported`)"),
            "{report}"
        );
    }
    let complete = std::panic::catch_unwind(|| report.assert_complete());
    assert!(complete.is_err(), "skipped cases are not a complete pass");
}

async fn pending(store: &dyn Store, key: &str, token: &str) {
    assert_eq!(
        store.claim(&claim(key, token, NOW)).await.unwrap(),
        ClaimOutcome::Claimed
    );
}

#[tokio::test]
async fn a_duplicate_claim_on_dynamodb_returns_the_old_record_in_the_same_round_trip() {
    let (store, counter) = dynamodb_store().await;
    pending(&store, "k", "t1").await;
    counter.reset();
    let outcome = store.claim(&claim("k", "t2", NOW + 1)).await.unwrap();
    let ClaimOutcome::Existing(r) = outcome else {
        panic!("expected the existing record, got {outcome:?}")
    };
    assert_eq!(
        (r.status, r.token.as_str(), r.attempt),
        (Status::Pending, "t1", 1)
    );
    assert_eq!(
        counter.total(),
        1,
        "the old record must come back with the failed claim"
    );
    // The losing claim changed nothing.
    assert_eq!(store.get("k").await.unwrap().unwrap().token, "t1");
}

#[tokio::test]
async fn custom_attribute_names_are_used_for_every_attribute() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use idempotent_runtime::{AttributeNames, DynamoDbStore};
    let mut names = AttributeNames::default();
    names.key = "id".into();
    names.status = "state".into();
    names.token = "fence".into();
    names.attempt = "tries".into();
    names.lease_until = "lease_ms".into();
    names.expires_at = "ttl".into();
    names.fingerprint = "fp".into();
    names.response = "body".into();
    names.error = "why".into();
    names.replay_until = "replay_s".into();
    names.claim_writes = "held".into();
    names.sort_key = "range".into();
    names.completed_in = "region".into();
    names.steps = "done".into();
    names.released = "given_up".into();
    names.released_until = "given_up_until".into();
    let (client, _) = idempotent_tests::client();
    let store = DynamoDbStore::with_attribute_names(
        client.clone(),
        idempotent_tests::unique_table("names"),
        names,
    );
    store.create_table().await.unwrap();
    pending(&store, "k", "t1").await;
    let expires = NOW / 1000 + 99;
    assert_eq!(
        store
            .transition(&complete("k", "t1", b"{}", expires))
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    let item = client
        .get_item()
        .table_name(store.table())
        .key("id", AttributeValue::S("k".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    let mut keys: Vec<_> = item.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["body", "fence", "fp", "id", "state", "tries", "ttl"]);
    assert_eq!(item["state"].as_s().unwrap(), "COMPLETED");
    assert_eq!(store.get("k").await.unwrap().unwrap().expires_at_s, expires);
    let ttl = client
        .describe_time_to_live()
        .table_name(store.table())
        .send()
        .await
        .unwrap();
    assert_eq!(
        ttl.time_to_live_description()
            .and_then(|d| d.attribute_name()),
        Some("ttl")
    );
    // A claim with business writes marks them as in effect under its own name.
    let write = aws_sdk_dynamodb::types::TransactWriteItem::builder()
        .put(
            aws_sdk_dynamodb::types::Put::builder()
                .table_name(store.table())
                .item("id", AttributeValue::S("business-item".into()))
                .build()
                .unwrap(),
        )
        .build();
    assert_eq!(
        store
            .claim_transaction(&claim("k2", "t2", NOW), &[write].into_iter().collect())
            .await
            .unwrap(),
        idempotent_runtime::store::TransactOutcome::Committed
    );
    let record = store.get("k2").await.unwrap().unwrap();
    assert!(record.claim_writes_in_effect);
    let item = client
        .get_item()
        .table_name(store.table())
        .key("id", AttributeValue::S("k2".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    assert_eq!(item["held"], AttributeValue::Bool(true));
}
