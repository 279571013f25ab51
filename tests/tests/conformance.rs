//! The store contract, `idempotent_runtime::store::conformance`, run against both built-in stores, a store
//! without transactions, and deliberately broken stores, which it must catch by name; then what only the
//! DynamoDB store can show (round trips, custom attribute names).

use idempotent_runtime::store::conformance::{
    self, BusinessTable, Outcome, RECORD_CASES, Report, Subject, TRANSACTION_CASES,
};
use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, Store, TransactOutcome, Transition, WriteOutcome, Writes,
};
use idempotent_runtime::{MemoryStore, Record, Status, StoreError};
use idempotent_tests::{RecordsOnly, create_plain_table, dynamodb_store, unique_table};

const NOW: u64 = 1_800_000_000_000;
const LEASE: u64 = 60_000;

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

/// The names of the cases `report` failed.
fn failed(report: &Report) -> Vec<&'static str> {
    report.failed().map(|c| c.name).collect()
}

/// Breaks fencing: a transition of a PENDING record applies whatever its token.
#[derive(Debug, Default)]
struct IgnoresTheToken(MemoryStore);

#[async_trait::async_trait]
impl Store for IgnoresTheToken {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(request).await
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        match self.0.get(transition.key).await? {
            Some(held) if held.status == Status::Pending => {
                let as_holder = Transition {
                    token: &held.token,
                    ..*transition
                };
                self.0.transition(&as_holder).await
            }
            _ => self.0.transition(transition).await,
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }

    fn kind(&self) -> &'static str {
        "ignores-the-token"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_ignores_the_fencing_token_fails_the_fencing_cases() {
    let report = conformance::check(|| async { IgnoresTheToken::default() }).await;
    assert_eq!(
        failed(&report),
        [
            "complete_is_guarded_by_the_token",
            "fail_is_guarded_by_the_token",
            "a_heartbeat_extends_only_its_own_lease",
            "a_stale_token_cannot_complete_or_fail_after_a_takeover",
        ],
        "{report}"
    );
    let Some(Outcome::Failed(why)) = report.outcome("complete_is_guarded_by_the_token") else {
        panic!("{report}")
    };
    assert!(
        why.starts_with(
            "a completion with another token must be rejected, returning the record as it was: \
             expected Rejected(Some(Record {"
        ),
        "{why}"
    );
    assert!(why.ends_with("got Applied"), "{why}");
    let panicked = std::panic::catch_unwind(|| report.assert_passed())
        .expect_err("a failed case fails `assert_passed`");
    let message = panicked.downcast_ref::<String>().unwrap();
    assert!(
        message.starts_with("the ignores-the-token store breaks the store contract:"),
        "{message}"
    );
    assert!(
        message.contains("FAILED  fail_is_guarded_by_the_token: "),
        "{message}"
    );
}

/// Breaks linearizability: a claim takes a key whose PENDING claim is still live.
#[derive(Debug, Default)]
struct TwoWinners(MemoryStore);

#[async_trait::async_trait]
impl Store for TwoWinners {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        match self.0.claim(request).await? {
            ClaimOutcome::Existing(held)
                if held.status == Status::Pending && held.token != request.token =>
            {
                self.0.insert(Record {
                    token: request.token.to_owned(),
                    attempt: held.attempt + 1,
                    lease_until_ms: Some(request.lease_until_ms),
                    expires_at_s: request.expires_at_s,
                    fingerprint: request.fingerprint.map(str::to_owned),
                    ..held
                });
                Ok(ClaimOutcome::Claimed)
            }
            outcome => Ok(outcome),
        }
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        self.0.transition(transition).await
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }

    fn kind(&self) -> &'static str {
        "two-winners"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_lets_two_claims_win_fails_the_claim_cases() {
    let report = conformance::check(|| async { TwoWinners::default() }).await;
    assert_eq!(
        failed(&report),
        [
            "duplicate_claim_returns_the_old_record",
            "a_heartbeat_extends_only_its_own_lease",
            "expiry_is_decided_by_the_claims_clock",
            "a_pending_record_is_claimable_once_its_lease_ran_out",
            "of_32_racing_claims_exactly_one_wins",
        ],
        "{report}"
    );
    assert_eq!(
        report.outcome("of_32_racing_claims_exactly_one_wins"),
        Some(&Outcome::Failed(
            "claims that won round 0 of 32 racing claims: expected 1, got 32".to_owned()
        )),
        "{report}"
    );
}

/// Supports half of the transactions: `claim_transaction`, not `transact_transition`.
#[derive(Debug, Default)]
struct HalfTransactions(MemoryStore);

#[async_trait::async_trait]
impl Store for HalfTransactions {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(request).await
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        self.0.claim_transaction(request, writes).await
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        self.0.transition(transition).await
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }

    fn kind(&self) -> &'static str {
        "half-transactions"
    }
}

#[tokio::test]
async fn a_store_with_half_the_transactions_fails_the_first_transaction_case() {
    let report = conformance::check(|| async {
        let store = MemoryStore::new();
        store.create_table("business", "id", None).unwrap();
        Subject::new(HalfTransactions(store))
            .with_business_table(BusinessTable::new("business", "id"))
    })
    .await;
    assert_eq!(
        failed(&report),
        ["transactions_are_supported_or_refused_as_unsupported"],
        "{report}"
    );
    let Some(Outcome::Failed(why)) =
        report.outcome("transactions_are_supported_or_refused_as_unsupported")
    else {
        panic!("{report}")
    };
    assert!(
        why.starts_with(
            "`transact_transition` returned `StoreError::Unsupported` but `claim_transaction` returned Ok(Committed)"
        ),
        "{why}"
    );
    assert_eq!(report.skipped().count(), TRANSACTION_CASES.len() - 1);
}

/// Breaks atomicity: a claim whose business writes are canceled is written anyway.
#[derive(Debug, Default)]
struct NotAtomic(MemoryStore);

#[async_trait::async_trait]
impl Store for NotAtomic {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(request).await
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let outcome = self.0.claim_transaction(request, writes).await?;
        if matches!(outcome, TransactOutcome::Canceled(_)) {
            self.0.claim(request).await?;
        }
        Ok(outcome)
    }

    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        self.0.transact_transition(transition, writes).await
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        self.0.transition(transition).await
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }

    fn kind(&self) -> &'static str {
        "not-atomic"
    }
}

#[tokio::test]
async fn a_store_whose_canceled_claims_land_fails_the_all_or_nothing_case() {
    let report = conformance::check(|| async {
        let store = MemoryStore::new();
        store.create_table("business", "id", None).unwrap();
        Subject::new(NotAtomic(store)).with_business_table(BusinessTable::new("business", "id"))
    })
    .await;
    assert_eq!(
        failed(&report),
        ["claim_transaction_with_a_failing_write_writes_nothing"],
        "{report}"
    );
    let Some(Outcome::Failed(why)) =
        report.outcome("claim_transaction_with_a_failing_write_writes_nothing")
    else {
        panic!("{report}")
    };
    assert!(
        why.starts_with("a canceled claim must write no record: expected None, got Some(Record {"),
        "{why}"
    );
}

#[tokio::test]
async fn a_store_with_transactions_and_no_business_table_is_told_to_give_one() {
    let report = conformance::check(|| async { MemoryStore::new() }).await;
    let failed = failed(&report);
    assert_eq!(failed, TRANSACTION_CASES[1..], "{report}");
    let Some(Outcome::Failed(why)) = report.outcome(TRANSACTION_CASES[1]) else {
        panic!("{report}")
    };
    assert!(why.contains("with_business_table"), "{why}");
}

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
