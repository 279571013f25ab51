//! `DynamoDbStore::ensure_table` and `check` on DynamoDB Local: a table is created, waited for, given its
//! TTL, and verified against the store's attribute names.

use aws_sdk_dynamodb::types::TimeToLiveSpecification;
use idempotent_runtime::{AttributeNames, DynamoDbStore, StoreError};
use idempotent_tests::{create_plain_table, unique_table};

#[tokio::test]
async fn ensure_table_creates_waits_and_enables_ttl_and_is_idempotent() {
    let (client, requests) = idempotent_tests::client();
    let store = DynamoDbStore::new(client, unique_table("ensure"));
    let err = store.check().await.unwrap_err();
    assert!(matches!(err, StoreError::TableNotFound(_)), "{err:?}");

    let report = store.ensure_table().await.unwrap();
    assert_eq!(report.status, "ACTIVE");
    assert_eq!(report.key_attribute, "pk");
    assert_eq!(report.ttl_attribute.as_deref(), Some("expires_at"));
    assert_eq!(report.billing_mode, "PAY_PER_REQUEST");

    // Again: nothing to do, the same answer.
    requests.reset();
    assert_eq!(store.ensure_table().await.unwrap(), report);
    assert_eq!(requests.of("UpdateTimeToLive"), 0, "TTL was already on");
    assert_eq!(store.check().await.unwrap(), report);
}

#[tokio::test]
async fn ensure_table_enables_ttl_on_a_table_created_without_it() {
    let (client, _) = idempotent_tests::client();
    let table = unique_table("no-ttl");
    create_plain_table(&client, &table, "pk").await;
    let store = DynamoDbStore::new(client, &table);
    assert_eq!(
        store.check().await.unwrap().ttl_attribute,
        None,
        "TTL off is reported"
    );
    let report = store.ensure_table().await.unwrap();
    assert_eq!(report.ttl_attribute.as_deref(), Some("expires_at"));
    assert_eq!(
        store.check().await.unwrap().ttl_attribute.as_deref(),
        Some("expires_at")
    );
}

/// Several processes starting at once: all of them race to create the table and to enable its TTL (a
/// loser of the TTL race used to fail with `TimeToLive is already enabled`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_ensure_table_calls_all_succeed() {
    let (client, _) = idempotent_tests::client();
    for _ in 0..3 {
        let table = unique_table("raced");
        let calls = (0..8).map(|_| {
            let store = DynamoDbStore::new(client.clone(), &table);
            async move { store.ensure_table().await }
        });
        for report in spawn_all(calls).await {
            let report = report.unwrap();
            assert_eq!(report.status, "ACTIVE");
            assert_eq!(report.ttl_attribute.as_deref(), Some("expires_at"));
        }
    }
}

async fn spawn_all<F: std::future::Future + Send + 'static>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_table_with_another_key_schema_is_refused_and_left_alone() {
    let (client, requests) = idempotent_tests::client();
    let table = unique_table("other-key");
    create_plain_table(&client, &table, "id").await;
    let store = DynamoDbStore::new(client, &table);
    requests.reset();
    for err in [
        store.ensure_table().await.unwrap_err(),
        store.check().await.unwrap_err(),
    ] {
        let StoreError::Schema(detail) = &err else {
            panic!("expected a schema error, got {err:?}")
        };
        assert!(
            detail.contains("partition key `pk` of type S") && detail.contains("\"id\""),
            "{detail}"
        );
    }
    assert_eq!(requests.of("UpdateTimeToLive"), 0, "nothing was changed");
}

#[tokio::test]
async fn ttl_on_another_attribute_is_refused() {
    let (client, _) = idempotent_tests::client();
    let table = unique_table("other-ttl");
    create_plain_table(&client, &table, "pk").await;
    client
        .update_time_to_live()
        .table_name(&table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name("gone_at")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let err = DynamoDbStore::new(client.clone(), &table)
        .ensure_table()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Schema(d) if d.contains("TTL on `gone_at`") && d.contains("`expires_at`")),
        "{err:?}"
    );
    // With the table's attribute name, the same table fits.
    let mut names = AttributeNames::default();
    names.expires_at = "gone_at".into();
    let report = DynamoDbStore::with_attribute_names(client, &table, names)
        .ensure_table()
        .await
        .unwrap();
    assert_eq!(report.ttl_attribute.as_deref(), Some("gone_at"));
}
