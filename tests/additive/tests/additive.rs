//! A store written without the runtime's `dynamodb` feature, run where the feature is on.

use idempotent_additive_store::{Recoded, Row};
use idempotent_runtime::store::conformance;
use idempotent_runtime::store::{Change, ClaimOutcome, ClaimRequest, Transition, WriteOutcome};
use idempotent_runtime::{MemoryStore, Status, Store};

/// Every case of the contract passes, the transaction cases included: nothing of a record is lost
/// through the store's own format, and its pass-through of business writes holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_keeps_the_whole_contract() {
    let report = conformance::check(|| async { idempotent_additive_tests::subject() }).await;
    assert_eq!(report.store(), "recoded");
    report.assert_complete();
    let all = conformance::RECORD_CASES.len() + conformance::TRANSACTION_CASES.len();
    assert_eq!(report.cases().len(), all, "every case ran");
    assert!(
        report
            .cases()
            .iter()
            .all(|case| case.outcome == conformance::Outcome::Passed),
        "{report}"
    );
}

/// A claim and a completion through the public constructors, read back through the store's own
/// format: the record holds every field the requests set.
#[tokio::test]
async fn a_record_built_by_the_constructor_holds_what_was_written() {
    let store = Recoded::new(MemoryStore::new());
    let now_ms = 4_102_444_800_000;
    let mut claim = ClaimRequest::new("ns#k", "t-1", now_ms, now_ms + 60_000, now_ms / 1000 + 3600);
    claim.fingerprint = Some("fp");
    assert_eq!(store.claim(&claim).await.unwrap(), ClaimOutcome::Claimed);
    let complete = Transition::new(
        "ns#k",
        "t-1",
        Change::Complete {
            response: Some(b"\"ok\""),
            expires_at_s: now_ms / 1000 + 86_400,
            replay_until_s: None,
        },
    );
    assert_eq!(
        store.transition(&complete).await.unwrap(),
        WriteOutcome::Applied
    );

    let record = store.get("ns#k").await.unwrap().expect("the record");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.token, "t-1");
    assert_eq!(record.attempt, 1);
    assert_eq!(record.fingerprint.as_deref(), Some("fp"));
    assert_eq!(record.response.as_deref(), Some(&b"\"ok\""[..]));
    assert_eq!(record.expires_at_s, now_ms / 1000 + 86_400);
    assert_eq!(record.lease_until_ms, None);
    // The row's way back is lossless.
    assert_eq!(Row::of(record.clone()).into_record().unwrap(), record);

    // A duplicate claim finds the record, rebuilt the same way.
    let again = ClaimRequest::new("ns#k", "t-2", now_ms, now_ms + 60_000, now_ms / 1000 + 3600);
    assert_eq!(
        store.claim(&again).await.unwrap(),
        ClaimOutcome::Existing(record)
    );
}

/// A status the runtime does not write is a corrupt record, not a panic.
#[test]
fn an_unknown_status_is_corrupt() {
    let mut row = Row::of(idempotent_runtime::Record::new(
        "ns#k",
        Status::Failed,
        "t",
        1,
    ));
    row.status = "ARCHIVED".to_owned();
    let err = row.into_record().unwrap_err();
    assert!(
        matches!(&err, idempotent_runtime::StoreError::Corrupt(why) if why.contains("ARCHIVED")),
        "{err:?}"
    );
}
