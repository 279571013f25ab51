//! `keys list` and `keys stats` ([`admin::list_keys`], [`admin::key_stats`]) on DynamoDB Local, in every
//! table layout: a table seeded with records in every status (a live claim, a claim past its lease, two
//! failures with the same first line of error, completions in two namespaces, one expired) and an item
//! that is not a record.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use idempotent_runtime::admin::{self, KeyFilter, Progress};
use idempotent_runtime::store::{Change, ClaimOutcome, ClaimRequest, Transition, WriteOutcome};
use idempotent_runtime::{DynamoDbStore, Layout, Status, Store, derive_key};
use idempotent_tests::{client, unique_table};

const NS: &str = "billing::charge";
const OTHER: &str = "shipping::label";

fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

async fn claim(store: &DynamoDbStore, key: &str, now_ms: u64, lease_ms: u64) {
    let token = format!("t-{key}");
    let outcome = store
        .claim(&ClaimRequest::new(
            key,
            &token,
            now_ms,
            now_ms + lease_ms,
            now_ms / 1000 + 3600,
        ))
        .await
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Claimed), "{outcome:?}");
}

async fn finish(store: &DynamoDbStore, key: &str, change: Change<'_>) {
    let token = format!("t-{key}");
    let outcome = store
        .transition(&Transition::new(key, &token, change))
        .await
        .unwrap();
    assert_eq!(outcome, WriteOutcome::Applied);
}

/// The records seeded, by key.
struct Seeded {
    live: String,
    stuck: String,
    completed: String,
    expired: String,
}

async fn seed(layout: &Layout) -> (DynamoDbStore, Seeded) {
    let (client, _) = client();
    let store = DynamoDbStore::new(client, unique_table("keys")).with_layout(layout.clone());
    store.ensure_table().await.unwrap();
    let now = now_ms();
    let key = |ns: &str, n: u32| derive_key(ns, &n).unwrap();
    let seeded = Seeded {
        live: key(NS, 1),
        stuck: key(NS, 2),
        completed: key(NS, 3),
        expired: key(OTHER, 4),
    };
    claim(&store, &seeded.live, now, 60_000).await;
    // Claimed 20 minutes ago with a minute's lease: its worker is gone.
    claim(&store, &seeded.stuck, now - 20 * 60_000, 60_000).await;
    claim(&store, &seeded.completed, now, 60_000).await;
    finish(
        &store,
        &seeded.completed,
        Change::Complete {
            response: Some(b"\"ch_3\""),
            expires_at_s: now / 1000 + 3600,
            replay_until_s: None,
        },
    )
    .await;
    claim(&store, &seeded.expired, now, 60_000).await;
    finish(
        &store,
        &seeded.expired,
        Change::Complete {
            response: Some(b"{}"),
            expires_at_s: now / 1000 - 600,
            replay_until_s: None,
        },
    )
    .await;
    for n in [5, 6] {
        let k = key(NS, n);
        claim(&store, &k, now, 60_000).await;
        let error = format!("declined\ncard {n}");
        finish(
            &store,
            &k,
            Change::Fail {
                error: &error,
                expires_at_s: now / 1000 + 3600,
                release_claim_writes: false,
            },
        )
        .await;
    }
    // Another application's item, in the table's key schema.
    let mut item = match layout {
        Layout::Key => store.item_key("order-7").unwrap(),
        _ => store.item_key("orders#7").unwrap(),
    };
    item.insert("amount".into(), AttributeValue::N("7".into()));
    store
        .client()
        .put_item()
        .table_name(store.table())
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
    (store, seeded)
}

fn progress() -> (Progress, Arc<AtomicU64>) {
    let seen = Arc::new(AtomicU64::new(0));
    let max = seen.clone();
    (
        Arc::new(move |n| {
            max.fetch_max(n, Ordering::SeqCst);
        }),
        seen,
    )
}

fn filter(
    status: Option<Status>,
    older_than: Option<Duration>,
    namespace: Option<&str>,
) -> KeyFilter {
    let mut f = KeyFilter::default();
    f.status = status;
    f.older_than = older_than;
    f.namespace = namespace.map(str::to_owned);
    f
}

#[tokio::test]
async fn keys_list_finds_stuck_claims_failures_and_completions_in_every_layout() {
    for layout in [
        Layout::Key,
        Layout::static_partition("orders"),
        Layout::Tenant,
    ] {
        let (store, seeded) = seed(&layout).await;
        let now = now_ms();
        let (progress, seen) = progress();
        let all = admin::list_keys(&store, &KeyFilter::default(), 1000, 3, now, progress)
            .await
            .unwrap();
        assert_eq!((all.scanned, all.not_records), (7, 1), "{layout}");
        assert_eq!(all.keys.len(), 6, "{layout}");
        assert_eq!(
            seen.load(Ordering::SeqCst),
            7,
            "the progress heard every item: {layout}"
        );
        let keys =
            |list: &admin::KeyList| list.keys.iter().map(|k| k.key.clone()).collect::<Vec<_>>();
        let mut pending = vec![seeded.live.clone(), seeded.stuck.clone()];
        pending.sort();
        let list = |f: KeyFilter| {
            let store = store.clone();
            async move {
                admin::list_keys(&store, &f, 1000, 2, now, Arc::new(|_| {}))
                    .await
                    .unwrap()
            }
        };
        assert_eq!(
            keys(&list(filter(Some(Status::Pending), None, None)).await),
            pending,
            "{layout}"
        );
        // Stuck for at least ten minutes: the claim whose lease ran out 19 minutes ago.
        let stuck = list(filter(
            Some(Status::Pending),
            Some(Duration::from_mins(10)),
            None,
        ))
        .await;
        assert_eq!(keys(&stuck), [seeded.stuck.as_str()], "{layout}");
        assert!(
            stuck.keys[0]
                .lease_left_ms
                .is_some_and(|ms| ms < -18 * 60_000),
            "{layout}"
        );
        // Expired for at least five minutes: the completion that expired ten minutes ago.
        let old = list(filter(None, Some(Duration::from_mins(5)), None)).await;
        // (And the claim stuck for 19 minutes.)
        let mut stale = vec![seeded.stuck.clone(), seeded.expired.clone()];
        stale.sort();
        assert_eq!(keys(&old), stale, "{layout}");
        let other = list(filter(None, None, Some(OTHER))).await;
        assert_eq!(keys(&other), [seeded.expired.as_str()], "{layout}");
        let failed = list(filter(Some(Status::Failed), None, Some(NS))).await;
        assert_eq!(failed.keys.len(), 2, "{layout}");
        assert!(failed.keys.iter().all(|k| {
            k.error
                .as_deref()
                .is_some_and(|e| e.starts_with("declined\n"))
        }));
        let completed = list(filter(Some(Status::Completed), None, Some(NS))).await;
        assert_eq!(keys(&completed), [seeded.completed.as_str()], "{layout}");
        assert_eq!(
            completed.keys[0].response_preview.as_deref(),
            Some("\"ch_3\"")
        );
        // A huge table's list is cut at its limit (per segment too): the first keys, all counted.
        let mut sorted = keys(&all);
        sorted.sort();
        for segments in [1, 4] {
            let cut = admin::list_keys(
                &store,
                &KeyFilter::default(),
                2,
                segments,
                now,
                Arc::new(|_| {}),
            )
            .await
            .unwrap();
            assert_eq!((cut.matched, cut.scanned), (6, 7), "{layout}");
            assert_eq!(keys(&cut), sorted[..2], "{layout}");
        }
    }
}

#[tokio::test]
async fn keys_stats_counts_by_namespace_and_status_in_every_layout() {
    for layout in [
        Layout::Key,
        Layout::static_partition("orders"),
        Layout::Tenant,
    ] {
        let (store, _) = seed(&layout).await;
        let stats = admin::key_stats(&store, 4, now_ms(), Arc::new(|_| {}))
            .await
            .unwrap();
        assert_eq!((stats.scanned, stats.not_records), (7, 1), "{layout}");
        let groups: Vec<_> = stats
            .groups
            .iter()
            .map(|g| {
                (
                    g.namespace.as_str(),
                    g.status.as_str(),
                    g.count,
                    g.expired,
                    g.past_lease,
                )
            })
            .collect();
        assert_eq!(
            groups,
            [
                (NS, "COMPLETED", 1, 0, 0),
                (NS, "FAILED", 2, 0, 0),
                (NS, "PENDING", 2, 0, 1),
                (OTHER, "COMPLETED", 1, 1, 0),
            ],
            "{layout}"
        );
        assert!(
            stats
                .groups
                .iter()
                .all(|g| g.bytes >= g.max_bytes && g.max_bytes > 50),
            "{stats:?}"
        );
        assert_eq!(stats.errors.len(), 1, "{stats:?}");
        let e = &stats.errors[0];
        assert_eq!(
            (e.namespace.as_str(), e.error.as_str(), e.count),
            (NS, "declined", 2)
        );
    }
}

#[tokio::test]
async fn a_scan_needs_one_segment_at_least() {
    let (client, _) = client();
    let store = DynamoDbStore::new(client, unique_table("keys"));
    store.ensure_table().await.unwrap();
    let e = admin::key_stats(&store, 0, now_ms(), Arc::new(|_| {}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("1 to 1,000,000 segments"), "{e}");
}
