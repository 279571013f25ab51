//! The store conformance suite: one set of tests, run against every store.

use std::sync::Arc;

use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, Store, Transition, WriteOutcome,
};
use idempotent_runtime::{MemoryStore, Status};
use idempotent_tests::RequestCounter;

const NOW: u64 = 1_800_000_000_000;
const LEASE: u64 = 60_000;

fn claim<'a>(key: &'a str, token: &'a str, now_ms: u64) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        token,
        attempt: 1,
        now_ms,
        lease_until_ms: now_ms + LEASE,
        expires_at_s: (now_ms + LEASE) / 1000 + 3600,
        fingerprint: Some("fp-1"),
    }
}

fn complete<'a>(
    key: &'a str,
    token: &'a str,
    response: &'a [u8],
    expires_at_s: u64,
) -> Transition<'a> {
    Transition {
        key,
        token,
        change: Change::Complete {
            response: Some(response),
            expires_at_s,
            replay_until_s: None,
        },
    }
}

fn fail<'a>(key: &'a str, token: &'a str) -> Transition<'a> {
    Transition {
        key,
        token,
        change: Change::Fail {
            error: "declined",
            expires_at_s: NOW / 1000 + 60,
            release_claim_writes: false,
        },
    }
}

async fn pending(store: &dyn Store, key: &str, token: &str) {
    assert_eq!(
        store.claim(&claim(key, token, NOW)).await.unwrap(),
        ClaimOutcome::Claimed
    );
}

macro_rules! conformance {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            async fn make() -> (Arc<dyn Store>, Option<RequestCounter>) {
                $make.await
            }

            #[tokio::test]
            async fn claim_of_a_new_key_writes_a_pending_record() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                let r = store.get("k").await.unwrap().expect("record");
                assert_eq!(r.key, "k");
                assert_eq!(r.status, Status::Pending);
                assert_eq!(r.token, "t1");
                assert_eq!(r.attempt, 1);
                assert_eq!(r.lease_until_ms, Some(NOW + LEASE));
                assert_eq!(r.expires_at_s, (NOW + LEASE) / 1000 + 3600);
                assert_eq!(r.fingerprint.as_deref(), Some("fp-1"));
                assert_eq!(r.response, None);
                assert_eq!(r.error, None);
            }

            #[tokio::test]
            async fn duplicate_claim_returns_the_old_record_in_the_same_round_trip() {
                let (store, counter) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                if let Some(c) = &counter {
                    c.reset();
                }
                let outcome = store.claim(&claim("k", "t2", NOW + 1)).await.unwrap();
                let ClaimOutcome::Existing(r) = outcome else {
                    panic!("expected the existing record, got {outcome:?}")
                };
                assert_eq!((r.status, r.token.as_str(), r.attempt), (Status::Pending, "t1", 1));
                if let Some(c) = &counter {
                    assert_eq!(c.total(), 1, "the old record must come back with the failed claim");
                }
                // The losing claim changed nothing.
                assert_eq!(store.get("k").await.unwrap().unwrap().token, "t1");
            }

            #[tokio::test]
            async fn a_retried_claim_finds_its_own_token() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                let outcome = store.claim(&claim("k", "t1", NOW)).await.unwrap();
                assert!(matches!(outcome, ClaimOutcome::Existing(r) if r.token == "t1"));
            }

            #[tokio::test]
            async fn complete_is_guarded_by_the_token() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                let rejected = store.transition(&complete("k", "other", b"{}", 1)).await.unwrap();
                assert!(matches!(&rejected, WriteOutcome::Rejected(Some(r)) if r.status == Status::Pending && r.token == "t1"), "{rejected:?}");
                let expires = NOW / 1000 + 86_400;
                assert_eq!(
                    store.transition(&complete("k", "t1", br#"{"id":7}"#, expires)).await.unwrap(),
                    WriteOutcome::Applied
                );
                let r = store.get("k").await.unwrap().unwrap();
                assert_eq!(r.status, Status::Completed);
                assert_eq!(r.response.as_deref(), Some(&br#"{"id":7}"#[..]));
                assert_eq!(r.expires_at_s, expires);
                assert_eq!(r.lease_until_ms, None);
                assert_eq!(r.token, "t1");
                // A second completion (even with the right token) is rejected: it is no longer PENDING,
                // and the record it returns shows our own completion.
                let again = store.transition(&complete("k", "t1", b"2", expires)).await.unwrap();
                assert!(matches!(&again, WriteOutcome::Rejected(Some(r)) if r.status == Status::Completed && r.token == "t1"));
                assert_eq!(store.get("k").await.unwrap().unwrap().response.as_deref(), Some(&br#"{"id":7}"#[..]));
            }

            #[tokio::test]
            async fn fail_is_guarded_by_the_token() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                assert!(matches!(
                    store.transition(&fail("k", "other")).await.unwrap(),
                    WriteOutcome::Rejected(Some(_))
                ));
                assert_eq!(store.get("k").await.unwrap().unwrap().status, Status::Pending);
                assert_eq!(store.transition(&fail("k", "t1")).await.unwrap(), WriteOutcome::Applied);
                let r = store.get("k").await.unwrap().unwrap();
                assert_eq!(r.status, Status::Failed);
                assert_eq!(r.error.as_deref(), Some("declined"));
                assert_eq!(r.lease_until_ms, None);
            }

            #[tokio::test]
            async fn transitions_of_an_absent_key_are_rejected_without_a_record() {
                let (store, _) = make().await;
                assert_eq!(
                    store.transition(&complete("nope", "t1", b"1", 1)).await.unwrap(),
                    WriteOutcome::Rejected(None)
                );
                assert_eq!(store.get("nope").await.unwrap(), None);
            }

            #[tokio::test]
            async fn a_failed_record_is_claimable_at_once() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                store.transition(&fail("k", "t1")).await.unwrap();
                assert_eq!(store.claim(&claim("k", "t2", NOW + 1)).await.unwrap(), ClaimOutcome::Claimed);
                let r = store.get("k").await.unwrap().unwrap();
                assert_eq!((r.status, r.token.as_str(), r.attempt), (Status::Pending, "t2", 2));
                assert_eq!(r.error, None, "a new claim clears the old error");
            }

            #[tokio::test]
            async fn an_expired_record_is_claimable() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                let expires_s = NOW / 1000 + 10;
                store.transition(&complete("k", "t1", b"1", expires_s)).await.unwrap();
                // Still live at its expiry second.
                assert!(matches!(
                    store.claim(&claim("k", "t2", expires_s * 1000)).await.unwrap(),
                    ClaimOutcome::Existing(_)
                ));
                let later = (expires_s + 1) * 1000;
                assert_eq!(store.claim(&claim("k", "t3", later)).await.unwrap(), ClaimOutcome::Claimed);
                let r = store.get("k").await.unwrap().unwrap();
                assert_eq!((r.status, r.token.as_str(), r.attempt), (Status::Pending, "t3", 2));
                assert_eq!(r.response, None, "a new claim clears the old response");
            }

            #[tokio::test]
            async fn a_pending_record_is_claimable_once_its_lease_ran_out() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                assert!(matches!(
                    store.claim(&claim("k", "t2", NOW + LEASE)).await.unwrap(),
                    ClaimOutcome::Existing(_)
                ), "the lease is live up to and including lease_until");
                assert_eq!(
                    store.claim(&claim("k", "t2", NOW + LEASE + 1)).await.unwrap(),
                    ClaimOutcome::Claimed
                );
                assert_eq!(store.get("k").await.unwrap().unwrap().token, "t2");
            }

            #[tokio::test]
            async fn a_stale_token_cannot_complete_or_fail_after_a_takeover() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "old").await;
                assert_eq!(
                    store.claim(&claim("k", "new", NOW + LEASE + 1)).await.unwrap(),
                    ClaimOutcome::Claimed
                );
                let late = store.transition(&complete("k", "old", b"old", u64::MAX / 2)).await.unwrap();
                assert!(matches!(&late, WriteOutcome::Rejected(Some(r)) if r.token == "new"), "{late:?}");
                assert!(matches!(store.transition(&fail("k", "old")).await.unwrap(), WriteOutcome::Rejected(Some(_))));
                assert_eq!(
                    store.transition(&complete("k", "new", b"new", u64::MAX / 2)).await.unwrap(),
                    WriteOutcome::Applied
                );
                let r = store.get("k").await.unwrap().unwrap();
                assert_eq!((r.token.as_str(), r.response.as_deref()), ("new", Some(&b"new"[..])));
            }

            #[tokio::test]
            async fn a_heartbeat_extends_only_its_own_lease() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                let extend = |token| Transition {
                    key: "k",
                    token,
                    change: Change::ExtendLease {
                        lease_until_ms: NOW + 5 * LEASE,
                        expires_at_s: NOW / 1000 + 9_999,
                    },
                };
                assert!(matches!(store.transition(&extend("other")).await.unwrap(), WriteOutcome::Rejected(_)));
                assert_eq!(store.transition(&extend("t1")).await.unwrap(), WriteOutcome::Applied);
                let r = store.get("k").await.unwrap().unwrap();
                assert_eq!((r.lease_until_ms, r.expires_at_s), (Some(NOW + 5 * LEASE), NOW / 1000 + 9_999));
                // The extended lease holds off a claim that the original lease would have let through.
                assert!(matches!(
                    store.claim(&claim("k", "t2", NOW + LEASE + 1)).await.unwrap(),
                    ClaimOutcome::Existing(_)
                ));
            }

            #[tokio::test]
            async fn a_claim_without_a_fingerprint_clears_the_old_one() {
                let (store, _) = make().await;
                pending(store.as_ref(), "k", "t1").await;
                store.transition(&fail("k", "t1")).await.unwrap();
                let mut request = claim("k", "t2", NOW + 1);
                request.fingerprint = None;
                assert_eq!(store.claim(&request).await.unwrap(), ClaimOutcome::Claimed);
                assert_eq!(store.get("k").await.unwrap().unwrap().fingerprint, None);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn of_32_racing_claims_exactly_one_wins() {
                let (store, _) = make().await;
                for round in 0..5 {
                    let key = format!("race-{round}");
                    let tasks: Vec<_> = (0..32)
                        .map(|i| {
                            let store = store.clone();
                            let key = key.clone();
                            tokio::spawn(async move {
                                let token = format!("t{i}");
                                store.claim(&claim(&key, &token, NOW)).await.unwrap()
                            })
                        })
                        .collect();
                    let mut winners = 0;
                    for t in tasks {
                        if t.await.unwrap() == ClaimOutcome::Claimed {
                            winners += 1;
                        }
                    }
                    assert_eq!(winners, 1, "round {round}");
                }
            }
        }
    };
}

conformance!(memory, async {
    (Arc::new(MemoryStore::new()) as Arc<dyn Store>, None)
});

conformance!(dynamodb, async {
    let (store, counter) = idempotent_tests::dynamodb_store().await;
    (Arc::new(store) as Arc<dyn Store>, Some(counter))
});

#[tokio::test]
async fn custom_attribute_names_are_used_for_every_attribute() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use idempotent_runtime::{AttributeNames, DynamoDbStore};
    let names = AttributeNames {
        key: "id".into(),
        status: "state".into(),
        token: "fence".into(),
        attempt: "tries".into(),
        lease_until: "lease_ms".into(),
        expires_at: "ttl".into(),
        fingerprint: "fp".into(),
        response: "body".into(),
        error: "why".into(),
        replay_until: "replay_s".into(),
        claim_writes: "held".into(),
        sort_key: "range".into(),
        completed_in: "region".into(),
    };
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
