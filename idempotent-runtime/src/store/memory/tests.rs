//! The memory store's transactions: its records and the emulator's business tables commit together or
//! not at all.

use aws_sdk_dynamodb::types::{
    Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use super::*;

const KEY: &str = "orders#1";
const NOW_MS: u64 = 1_000_000;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn n(v: &str) -> AttributeValue {
    AttributeValue::N(v.to_owned())
}

fn apple() -> HashMap<String, AttributeValue> {
    HashMap::from([("sku".to_owned(), s("apple"))])
}

/// A store with 10 apples in `inventory` and an empty `reservations` table.
fn store() -> MemoryStore {
    let store = MemoryStore::new();
    store.create_table("inventory", "sku", None).unwrap();
    store
        .create_table("reservations", "order_id", None)
        .unwrap();
    let mut stock = apple();
    stock.insert("available".to_owned(), n("10"));
    store.put_item("inventory", stock).unwrap();
    store
}

fn available(store: &MemoryStore) -> AttributeValue {
    store.get_item("inventory", &apple()).unwrap()["available"].clone()
}

/// The example's reservation: take `quantity` apples if there are that many, and record it.
fn reserve(quantity: &str) -> Vec<TransactWriteItem> {
    let take = Update::builder()
        .table_name("inventory")
        .set_key(Some(apple()))
        .update_expression("SET available = available - :q")
        .condition_expression("available >= :q")
        .expression_attribute_values(":q", n(quantity))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .build()
        .unwrap();
    let record = Put::builder()
        .table_name("reservations")
        .item("order_id", s("order-1"))
        .item("quantity", n(quantity))
        .condition_expression("attribute_not_exists(order_id)")
        .build()
        .unwrap();
    vec![
        TransactWriteItem::builder().update(take).build(),
        TransactWriteItem::builder().put(record).build(),
    ]
}

fn claim_request(token: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        key: KEY,
        token,
        attempt: 1,
        now_ms: NOW_MS,
        lease_until_ms: NOW_MS + 60_000,
        expires_at_s: NOW_MS / 1000 + 3600,
        fingerprint: None,
        keep_claim_writes: false,
        steps: crate::store::StepsClaim::Untouched,
    }
}

fn complete(token: &str) -> Transition<'_> {
    Transition {
        key: KEY,
        token,
        change: Change::Complete {
            response: Some(b"{\"ok\":true}"),
            expires_at_s: NOW_MS / 1000 + 86_400,
            replay_until_s: None,
        },
    }
}

async fn claimed_store() -> MemoryStore {
    let store = store();
    assert_eq!(
        store.claim(&claim_request("mine")).await.unwrap(),
        ClaimOutcome::Claimed
    );
    store
}

fn codes(outcome: &TransactOutcome) -> Vec<(usize, &str)> {
    match outcome {
        TransactOutcome::Canceled(reasons) => {
            reasons.iter().map(|r| (r.index, r.code.as_str())).collect()
        }
        other => panic!("expected Canceled, got {other:?}"),
    }
}

#[tokio::test]
async fn staged_writes_commit_with_the_completion() {
    let store = claimed_store().await;
    let outcome = store
        .transact_transition(&complete("mine"), &reserve("3").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(outcome, TransactOutcome::Committed);
    let record = store.get(KEY).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.response.as_deref(), Some(&b"{\"ok\":true}"[..]));
    assert_eq!(available(&store), n("7"));
    assert_eq!(store.items("reservations").len(), 1);
}

#[tokio::test]
async fn a_failing_condition_cancels_everything() {
    let store = claimed_store().await;
    let before = store.get(KEY).await.unwrap();
    let outcome = store
        .transact_transition(&complete("mine"), &reserve("11").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(
        codes(&outcome),
        [(0, "None"), (1, "ConditionalCheckFailed"), (2, "None")]
    );
    let TransactOutcome::Canceled(reasons) = outcome else {
        unreachable!()
    };
    assert_eq!(
        reasons[1].item.as_ref().map(|i| i["available"].clone()),
        Some(n("10"))
    );
    assert_eq!(
        store.get(KEY).await.unwrap(),
        before,
        "the record is untouched: still PENDING under our token"
    );
    assert_eq!(available(&store), n("10"));
    assert!(
        store.items("reservations").is_empty(),
        "the Put that would have held was not applied"
    );
}

#[tokio::test]
async fn a_lost_fence_rejects_with_the_record_and_writes_nothing() {
    let store = claimed_store().await;
    let before = store.get(KEY).await.unwrap();
    // A staged write that would fail too: the record's reason wins, as in DynamoDB.
    for writes in [reserve("3"), reserve("11")] {
        let outcome = store
            .transact_transition(&complete("theirs"), &writes.into_iter().collect())
            .await
            .unwrap();
        assert_eq!(outcome, TransactOutcome::Rejected(before.clone()));
    }
    assert_eq!(store.get(KEY).await.unwrap(), before);
    assert_eq!(available(&store), n("10"));
    assert!(store.items("reservations").is_empty());

    let empty = self::store();
    let outcome = empty
        .transact_transition(&complete("mine"), &reserve("3").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(outcome, TransactOutcome::Rejected(None), "no record at all");
    assert_eq!(available(&empty), n("10"));
}

#[tokio::test]
async fn an_unsupported_write_fails_before_anything_is_written() {
    let store = claimed_store().await;
    let before = store.get(KEY).await.unwrap();
    let nested = Update::builder()
        .table_name("inventory")
        .set_key(Some(apple()))
        .update_expression("SET bins[0] = :q")
        .expression_attribute_values(":q", n("1"))
        .build()
        .unwrap();
    let mut writes = vec![TransactWriteItem::builder().update(nested).build()];
    writes.extend(reserve("3").into_iter().skip(1));
    let err = store
        .transact_transition(&complete("mine"), &writes.into_iter().collect())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)));
    assert!(
        err.to_string()
            .contains("does not support a nested attribute path `bins[0]`"),
        "{err}"
    );
    assert_eq!(store.get(KEY).await.unwrap(), before);
    assert!(store.items("reservations").is_empty());
}

#[tokio::test]
async fn claim_transaction_claims_and_reserves_together() {
    let store = store();
    let outcome = store
        .claim_transaction(&claim_request("mine"), &reserve("4").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(outcome, TransactOutcome::Committed);
    let record = store.get(KEY).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.token.as_str(), record.attempt),
        (Status::Pending, "mine", 1)
    );
    assert_eq!(available(&store), n("6"));
    assert_eq!(store.items("reservations")[0]["quantity"], n("4"));
}

#[tokio::test]
async fn a_failed_reservation_leaves_no_record() {
    let store = store();
    let outcome = store
        .claim_transaction(&claim_request("mine"), &reserve("11").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(
        codes(&outcome),
        [(0, "None"), (1, "ConditionalCheckFailed"), (2, "None")]
    );
    assert_eq!(store.get(KEY).await.unwrap(), None);
    assert!(store.is_empty());
    assert_eq!(available(&store), n("10"));
    assert!(store.items("reservations").is_empty());
}

#[tokio::test]
async fn claim_transaction_on_a_held_key_returns_the_record_and_writes_nothing() {
    let store = claimed_store().await;
    let held = store.get(KEY).await.unwrap().unwrap();
    let outcome = store
        .claim_transaction(
            &claim_request("theirs"),
            &reserve("4").into_iter().collect(),
        )
        .await
        .unwrap();
    assert_eq!(outcome, TransactOutcome::Rejected(Some(held.clone())));
    assert_eq!(store.get(KEY).await.unwrap(), Some(held));
    assert_eq!(available(&store), n("10"));
}

#[tokio::test]
async fn claim_transaction_takes_over_a_claimable_record() {
    let store = claimed_store().await;
    let later = ClaimRequest {
        now_ms: NOW_MS + 120_000,
        lease_until_ms: NOW_MS + 180_000,
        ..claim_request("next")
    };
    let outcome = store
        .claim_transaction(&later, &reserve("4").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(outcome, TransactOutcome::Committed);
    let record = store.get(KEY).await.unwrap().unwrap();
    assert_eq!((record.token.as_str(), record.attempt), ("next", 2));
    assert_eq!(available(&store), n("6"));
}

/// `mine`'s claim, failed at once: claimable, with its claim-time writes in effect or not.
fn failed_record(writes_in_effect: bool) -> Record {
    Record {
        key: KEY.to_owned(),
        status: Status::Failed,
        token: "mine".to_owned(),
        attempt: 1,
        lease_until_ms: None,
        expires_at_s: NOW_MS / 1000 + 3600,
        fingerprint: None,
        response: None,
        error: Some("declined".to_owned()),
        replay_until_s: None,
        claim_writes_in_effect: writes_in_effect,
        completed_in: None,
        steps: None,
        released: Vec::new(),
        released_until_ms: None,
        released_through: None,
    }
}

/// A claim with writes never takes a record whose claim-time writes are still in effect, claimable as
/// it is: they would be applied twice.
#[tokio::test]
async fn claim_transaction_refuses_a_claimable_record_whose_writes_are_in_effect() {
    let store = store();
    store.insert(failed_record(true));
    let outcome = store
        .claim_transaction(&claim_request("next"), &reserve("4").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        TransactOutcome::Rejected(Some(failed_record(true)))
    );
    assert_eq!(store.get(KEY).await.unwrap(), Some(failed_record(true)));
    assert_eq!(available(&store), n("10"));
}

/// A claim with writes marks them in effect, and a plain claim that keeps them keeps the mark.
#[tokio::test]
async fn the_mark_that_claim_writes_are_in_effect_is_set_and_kept() {
    let store = store();
    let outcome = store
        .claim_transaction(&claim_request("mine"), &reserve("4").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(outcome, TransactOutcome::Committed);
    assert!(
        store
            .get(KEY)
            .await
            .unwrap()
            .unwrap()
            .claim_writes_in_effect
    );

    let store = self::store();
    store.insert(failed_record(true));
    let keeping = ClaimRequest {
        keep_claim_writes: true,
        ..claim_request("next")
    };
    assert_eq!(store.claim(&keeping).await.unwrap(), ClaimOutcome::Claimed);
    let record = store.get(KEY).await.unwrap().unwrap();
    assert_eq!((record.token.as_str(), record.attempt), ("next", 2));
    assert!(record.claim_writes_in_effect, "the mark was dropped");
}

/// A plain claim that keeps claim-time writes takes only a record whose writes are in effect: one whose
/// writes were undone meanwhile is refused (the caller then claims with the writes), and left as it was.
#[tokio::test]
async fn a_claim_keeping_writes_refuses_a_record_without_them() {
    let store = store();
    store.insert(failed_record(false));
    let keeping = ClaimRequest {
        keep_claim_writes: true,
        ..claim_request("next")
    };
    assert_eq!(
        store.claim(&keeping).await.unwrap(),
        ClaimOutcome::Existing(failed_record(false))
    );
    assert_eq!(store.get(KEY).await.unwrap(), Some(failed_record(false)));
    // A plain claim that does not keep them takes it.
    assert_eq!(
        store.claim(&claim_request("next")).await.unwrap(),
        ClaimOutcome::Claimed
    );
}

/// A compensation (a failure that releases claim-time writes) needs them still in effect: without them
/// it is rejected and nothing is undone.
#[tokio::test]
async fn a_compensation_without_claim_writes_in_effect_is_rejected() {
    let store = claimed_store().await;
    let before = store.get(KEY).await.unwrap();
    assert!(!before.as_ref().unwrap().claim_writes_in_effect);
    let compensate = Transition {
        key: KEY,
        token: "mine",
        change: Change::Fail {
            error: "declined",
            expires_at_s: NOW_MS / 1000 + 60,
            release_claim_writes: true,
        },
    };
    let outcome = store
        .transact_transition(&compensate, &reserve("3").into_iter().collect())
        .await
        .unwrap();
    assert_eq!(outcome, TransactOutcome::Rejected(before.clone()));
    assert_eq!(store.get(KEY).await.unwrap(), before);
    assert_eq!(available(&store), n("10"));
}

/// A plain transition is fenced like a transactional one: another claim's token is rejected with the
/// record, which stays as it was; our own lands.
#[tokio::test]
async fn a_transition_with_another_token_is_rejected_with_the_record() {
    let store = claimed_store().await;
    let before = store.get(KEY).await.unwrap();
    assert_eq!(
        store.transition(&complete("theirs")).await.unwrap(),
        WriteOutcome::Rejected(before.clone())
    );
    assert_eq!(store.get(KEY).await.unwrap(), before);
    assert_eq!(
        store.transition(&complete("mine")).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(
        store.get(KEY).await.unwrap().unwrap().status,
        Status::Completed
    );
}

/// The whole store contract on the memory store, inside the crate: the rules the model's store applies
/// (`claimed`, `transitioned`, `fenced`) are mutation-tested against the unit tests (`scripts/mutants`),
/// and each conformance case pins one of them. The suite also runs from `tests/` on both stores.
#[cfg(feature = "conformance")]
#[tokio::test]
async fn the_memory_store_keeps_the_whole_contract() {
    use crate::store::conformance::{
        self, BusinessTable, RECORD_CASES, Subject, TRANSACTION_CASES,
    };
    let report = conformance::check(|| async {
        let store = MemoryStore::new();
        store.create_table("business", "id", None).unwrap();
        Subject::new(store).with_business_table(BusinessTable::new("business", "id"))
    })
    .await;
    report.assert_complete();
    assert_eq!(
        report.cases().len(),
        RECORD_CASES.len() + TRANSACTION_CASES.len()
    );
}

/// The rule the model's store and the memory store's transactions apply: a release mark is written only
/// where there is no record (FAILED under the releasing call's token, its only released one); any
/// other transition on no record, or a mark on a record, writes nothing.
#[test]
fn a_release_mark_is_written_only_where_there_is_no_record() {
    let release = Transition {
        key: KEY,
        token: "gone",
        change: Change::Release {
            now_ms: NOW_MS,
            error: "released",
            expires_at_s: NOW_MS / 1000 + 60,
            released_until_ms: NOW_MS + 30_000,
        },
    };
    let mark = transitioned(None, &release).expect("a mark on no record");
    assert_eq!(
        (
            mark.status,
            mark.token.as_str(),
            mark.attempt,
            &mark.released[..]
        ),
        (Status::Failed, "gone", 0, &["gone".to_owned()][..])
    );
    assert_eq!(mark.expires_at_s, NOW_MS / 1000 + 60);
    assert_eq!(mark.released_until_ms, Some(NOW_MS + 30_000));
    assert_eq!(transitioned(None, &complete("gone")), None);
    assert_eq!(transitioned(Some(&mark), &release), None);
}
