//! The conformance suite catches broken stores: each wrapper around `MemoryStore` breaks one rule of the
//! store contract, and the suite must fail exactly the cases that check it, by name, saying why.

use idempotent_runtime::store::conformance::{
    self, BusinessTable, Delegating, Outcome, Override, Report, Subject, TRANSACTION_CASES,
};
use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, Store, TransactOutcome, Transition, WriteOutcome, Writes,
};
use idempotent_runtime::{MemoryStore, Status, StoreError};

/// A memory store broken by `with`.
fn broken<O: Override<MemoryStore>>(with: O) -> Delegating<MemoryStore, O> {
    Delegating::new(MemoryStore::new(), with)
}

/// The names of the cases `report` failed.
fn failed(report: &Report) -> Vec<&'static str> {
    report.failed().map(|c| c.name).collect()
}

/// Breaks fencing: a transition of a PENDING record applies whatever its token.
#[derive(Debug, Default)]
struct IgnoresTheToken;

#[async_trait::async_trait]
impl Override<MemoryStore> for IgnoresTheToken {
    fn kind(&self) -> &'static str {
        "ignores-the-token"
    }

    async fn transition(
        &self,
        inner: &MemoryStore,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        match inner.get(transition.key).await? {
            Some(held) if held.status == Status::Pending => {
                let mut as_holder = *transition;
                as_holder.token = &held.token;
                inner.transition(&as_holder).await
            }
            _ => inner.transition(transition).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_ignores_the_fencing_token_fails_the_fencing_cases() {
    let report = conformance::check(|| async { broken(IgnoresTheToken) }).await;
    assert_eq!(
        failed(&report),
        [
            "complete_is_guarded_by_the_token",
            "fail_is_guarded_by_the_token",
            "a_heartbeat_extends_only_its_own_lease",
            "a_stale_token_cannot_complete_or_fail_after_a_takeover",
            "steps_are_stored_under_the_token_and_removed_by_completion",
            "a_token_released_on_a_record_is_refused_by_it",
            "transitions_keep_the_record_until_its_released_tokens_end",
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

/// Breaks resuming: a claim of an operation with steps is made as if it had none (a store written
/// before steps, which would let a call run finished steps again).
#[derive(Debug, Default)]
struct IgnoresSteps;

#[async_trait::async_trait]
impl Override<MemoryStore> for IgnoresSteps {
    fn kind(&self) -> &'static str {
        "ignores-steps"
    }

    async fn claim(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut request = *request;
        request.steps = idempotent_runtime::store::StepsClaim::Untouched;
        inner.claim(&request).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_ignores_steps_in_claims_fails_the_steps_cases() {
    let report = conformance::check(|| async { broken(IgnoresSteps) }).await;
    assert_eq!(
        failed(&report),
        [
            "steps_are_stored_under_the_token_and_removed_by_completion",
            // The claim stored no steps, so no step's write extends them.
            "a_step_write_is_made_only_on_the_steps_it_extends",
            "a_fresh_claim_with_steps_is_refused_by_live_steps",
            "a_claim_that_starts_a_new_operation_removes_its_steps",
            "a_resume_needs_exactly_the_steps_it_read",
        ],
        "{report}"
    );
}

/// Breaks ordered steps: a step's write is a plain overwrite under the token, whatever steps it
/// extends (so a late copy of an earlier step's write moves the steps back).
#[derive(Debug, Default)]
struct OverwritesSteps;

#[async_trait::async_trait]
impl Override<MemoryStore> for OverwritesSteps {
    fn kind(&self) -> &'static str {
        "overwrites-steps"
    }

    async fn transition(
        &self,
        inner: &MemoryStore,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let Change::SaveSteps { steps, .. } = transition.change else {
            return inner.transition(transition).await;
        };
        let held = inner.get(transition.key).await?;
        let previous = held
            .as_ref()
            .and_then(|r| r.steps.clone())
            .unwrap_or_default();
        let mut overwrite = *transition;
        overwrite.change = Change::SaveSteps {
            steps,
            previous: &previous,
        };
        inner.transition(&overwrite).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_overwrites_steps_fails_the_ordered_steps_case() {
    let report = conformance::check(|| async { broken(OverwritesSteps) }).await;
    assert_eq!(
        failed(&report),
        ["a_step_write_is_made_only_on_the_steps_it_extends"],
        "{report}"
    );
    let Some(Outcome::Failed(why)) =
        report.outcome("a_step_write_is_made_only_on_the_steps_it_extends")
    else {
        panic!("{report}")
    };
    assert!(
        why.starts_with(
            "a late copy of an earlier step's write (its `previous` is no longer stored): \
             expected Rejected(Some(Record {"
        ),
        "{why}"
    );
    assert!(why.ends_with("got Applied"), "{why}");
}

/// Breaks linearizability: a claim takes a key whose PENDING claim is still live.
#[derive(Debug, Default)]
struct TwoWinners;

#[async_trait::async_trait]
impl Override<MemoryStore> for TwoWinners {
    fn kind(&self) -> &'static str {
        "two-winners"
    }

    async fn claim(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        match inner.claim(request).await? {
            ClaimOutcome::Existing(held)
                if held.status == Status::Pending && held.token != request.token =>
            {
                let mut taken = held;
                request.token.clone_into(&mut taken.token);
                taken.attempt += 1;
                taken.lease_until_ms = Some(request.lease_until_ms);
                taken.expires_at_s = request.expires_at_s;
                taken.fingerprint = request.fingerprint.map(str::to_owned);
                inner.insert(taken);
                Ok(ClaimOutcome::Claimed)
            }
            outcome => Ok(outcome),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_lets_two_claims_win_fails_the_claim_cases() {
    let report = conformance::check(|| async { broken(TwoWinners) }).await;
    assert_eq!(
        failed(&report),
        [
            "duplicate_claim_returns_the_old_record",
            "a_heartbeat_extends_only_its_own_lease",
            "expiry_is_decided_by_the_claims_clock",
            "a_pending_record_is_claimable_once_its_lease_ran_out",
            "a_token_released_on_a_record_is_refused_by_it",
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
struct HalfTransactions;

#[async_trait::async_trait]
impl Override<MemoryStore> for HalfTransactions {
    fn kind(&self) -> &'static str {
        "half-transactions"
    }

    async fn claim_transaction(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        inner.claim_transaction(request, writes).await
    }
}

#[tokio::test]
async fn a_store_with_half_the_transactions_fails_the_first_transaction_case() {
    let report = conformance::check(|| async {
        let store = MemoryStore::new();
        store.create_table("business", "id", None).unwrap();
        Subject::new(Delegating::new(store, HalfTransactions))
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
struct NotAtomic;

#[async_trait::async_trait]
impl Override<MemoryStore> for NotAtomic {
    fn kind(&self) -> &'static str {
        "not-atomic"
    }

    async fn claim_transaction(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let outcome = inner.claim_transaction(request, writes).await?;
        if matches!(outcome, TransactOutcome::Canceled(_)) {
            inner.claim(request).await?;
        }
        Ok(outcome)
    }

    async fn transact_transition(
        &self,
        inner: &MemoryStore,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        inner.transact_transition(transition, writes).await
    }
}

#[tokio::test]
async fn a_store_whose_canceled_claims_land_fails_the_all_or_nothing_case() {
    let report = conformance::check(|| async {
        let store = MemoryStore::new();
        store.create_table("business", "id", None).unwrap();
        Subject::new(Delegating::new(store, NotAtomic))
            .with_business_table(BusinessTable::new("business", "id"))
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
