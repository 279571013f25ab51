//! The transaction cases: [`Store::claim_transaction`] and [`Store::transact_transition`] with
//! business writes, which commit together with the record or not at all.

use std::future::Future;

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
    Update,
};

use super::{
    BusinessTable, Case, CaseFuture, ClaimOutcome, Context, IntoSubject, LEASE, NOW, Outcome,
    Store, StoreError, TRANSACTION_CASES, Violation, claim, complete, dispatch, ensure, ensure_eq,
    fail, mark_released, run, run_task,
};
use crate::CancellationReason;
use crate::record::{Record, Status};
use crate::store::{Change, ClaimRequest, TransactOutcome, Transition, WriteOutcome, Writes};

/// Runs the transaction cases: the first decides whether the store supports transactions; the others
/// run if it does, and are reported skipped (and why) if it refuses them.
pub(super) async fn run_all<F, Fut>(factory: &mut F, cases: &mut Vec<Case>)
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: IntoSubject,
{
    let (&gate, rest) = TRANSACTION_CASES.split_first().unwrap_or((&"", &[]));
    let context = Context::new(factory().await.into_subject());
    let store = context.store.kind();
    let has_table = context.business_table.is_some();
    let (outcome, others) = match run_task(support(context)).await {
        Ok(Support::Unsupported) => (
            Outcome::Passed,
            Some(Outcome::Skipped(format!(
                "the {store} store does not support transactions (`claim_transaction` and \
                 `transact_transition` return `StoreError::Unsupported`)"
            ))),
        ),
        Ok(Support::Supported) if !has_table => (
            Outcome::Passed,
            Some(Outcome::Failed(format!(
                "the {store} store supports transactions, but the factory gave no business table to \
                 test them with: return `Subject::new(store).with_business_table(BusinessTable::new(name, \
                 key_attribute))`"
            ))),
        ),
        Ok(Support::Supported) => (Outcome::Passed, None),
        Err(why) => (
            Outcome::Failed(why),
            Some(Outcome::Skipped(format!("`{gate}` failed"))),
        ),
    };
    cases.push(Case {
        name: gate,
        outcome,
    });
    for &name in rest {
        let outcome = if let Some(outcome) = &others {
            outcome.clone()
        } else {
            let context = Context::new(factory().await.into_subject());
            run(transaction_case(name, context)).await
        };
        cases.push(Case { name, outcome });
    }
}

/// Whether a store supports transactions.
enum Support {
    Supported,
    Unsupported,
}

dispatch!(
    transaction_case:
    claim_transaction_commits_the_claim_and_the_writes_together,
    claim_transaction_with_a_failing_write_writes_nothing,
    transact_transition_commits_the_transition_and_the_writes_together,
    transact_transition_with_a_failing_write_writes_nothing,
    transact_transition_is_fenced_by_the_token,
    a_retried_transaction_is_not_applied_twice,
    claim_transaction_refuses_a_record_whose_claim_writes_are_in_effect,
    claim_transaction_claims_an_expired_record_again,
    released_claim_writes_are_applied_by_the_next_claim,
    a_claim_keeping_writes_needs_them_in_effect,
    a_compensation_needs_the_claim_writes_in_effect,
    a_transaction_keeps_the_record_until_its_released_tokens_end,
);

fn build_error(e: &impl std::fmt::Display) -> Violation {
    Violation(format!("the suite could not build a business write: {e}"))
}

impl<S: Store> Context<S> {
    /// The business table, or (for a store given none) one that does not exist: a store with
    /// transactions fails on it, one without refuses before looking.
    fn table(&self) -> BusinessTable {
        self.business_table
            .clone()
            .unwrap_or_else(|| BusinessTable::new("idempotent-conformance-no-table", "id"))
    }

    /// The key of the business item `name`, unique to this case.
    fn id(&self, name: &str) -> AttributeValue {
        AttributeValue::S(format!("{}-{name}", self.prefix))
    }

    /// Puts the item `name`, if there is none.
    fn put_new(&self, name: &str) -> Result<TransactWriteItem, Violation> {
        let table = self.table();
        let put = Put::builder()
            .table_name(table.name)
            .item(&table.key_attribute, self.id(name))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", table.key_attribute)
            .build()
            .map_err(|e| build_error(&e))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// Adds `n` to the item `name`'s `hits` (creating the item if there is none).
    fn add_hits(&self, name: &str, n: i64) -> Result<TransactWriteItem, Violation> {
        let table = self.table();
        let update = Update::builder()
            .table_name(table.name)
            .key(table.key_attribute, self.id(name))
            .update_expression("ADD hits :n")
            .expression_attribute_values(":n", AttributeValue::N(n.to_string()))
            .build()
            .map_err(|e| build_error(&e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// A `ConditionCheck` of `condition` (`#k` is the key attribute) on the item `name`, returning the
    /// item if it fails when `all_old`.
    fn check(
        &self,
        name: &str,
        condition: &str,
        value: Option<(&str, AttributeValue)>,
        all_old: bool,
    ) -> Result<TransactWriteItem, Violation> {
        let table = self.table();
        let mut check = ConditionCheck::builder()
            .table_name(table.name)
            .key(&table.key_attribute, self.id(name))
            .condition_expression(condition);
        if condition.contains("#k") {
            check = check.expression_attribute_names("#k", table.key_attribute);
        }
        if let Some((placeholder, value)) = value {
            check = check.expression_attribute_values(placeholder, value);
        }
        if all_old {
            check = check.return_values_on_condition_check_failure(
                ReturnValuesOnConditionCheckFailure::AllOld,
            );
        }
        let check = check.build().map_err(|e| build_error(&e))?;
        Ok(TransactWriteItem::builder().condition_check(check).build())
    }

    /// A claim of `key` by `token` at `now_ms`, with `writes`.
    async fn claim_with(
        &self,
        key: &str,
        token: &str,
        now_ms: u64,
        writes: Vec<TransactWriteItem>,
    ) -> Result<TransactOutcome, Violation> {
        let writes: Writes = writes.into_iter().collect();
        Ok(self
            .store
            .claim_transaction(&claim(key, token, now_ms), &writes)
            .await?)
    }

    /// Whether `condition` holds on the business item `name`, read through the store itself: a claim
    /// of a fresh key with a `ConditionCheck`.
    async fn holds(
        &self,
        name: &str,
        condition: &str,
        value: Option<(&str, AttributeValue)>,
    ) -> Result<bool, Violation> {
        let key = self.probe_key();
        let check = self.check(name, condition, value, false)?;
        match self.claim_with(&key, &key, NOW, vec![check]).await? {
            TransactOutcome::Committed => Ok(true),
            TransactOutcome::Canceled(reasons)
                if reasons
                    .get(1)
                    .is_some_and(|r| r.code == "ConditionalCheckFailed") =>
            {
                Ok(false)
            }
            other => Err(Violation(format!(
                "reading the business item `{name}` back (a claim of a fresh key with a ConditionCheck \
                 `{condition}`): expected Committed, or Canceled with ConditionalCheckFailed at index 1, \
                 got {other:?}"
            ))),
        }
    }

    /// A claim of `key` by `token` at `now_ms` with `writes`, which must commit (`what`: which claim).
    async fn committed(
        &self,
        key: &str,
        token: &str,
        now_ms: u64,
        writes: Vec<TransactWriteItem>,
        what: &str,
    ) -> Result<(), Violation> {
        ensure_eq!(
            self.claim_with(key, token, now_ms, writes).await?,
            TransactOutcome::Committed,
            "{what}"
        );
        Ok(())
    }

    /// The record of `key`, which must be PENDING under `token` at `attempt` with its claim-time writes
    /// in effect (`what`: after which claim).
    async fn pending_with_writes(
        &self,
        key: &str,
        token: &str,
        attempt: u64,
        what: &str,
    ) -> Result<Record, Violation> {
        let r = self.record(key).await?;
        ensure_eq!(
            (
                r.status,
                r.token.as_str(),
                r.attempt,
                r.claim_writes_in_effect
            ),
            (Status::Pending, token, attempt, true),
            "{what}"
        );
        Ok(r)
    }

    /// Whether the business item `name` exists.
    async fn exists(&self, name: &str) -> Result<bool, Violation> {
        self.holds(name, "attribute_exists(#k)", None).await
    }

    /// Whether the business item `name` has `hits` = `n`.
    async fn has_hits(&self, name: &str, n: i64) -> Result<bool, Violation> {
        let value = AttributeValue::N(n.to_string());
        self.holds(name, "hits = :n", Some((":n", value))).await
    }
}

/// The reasons of a transaction of `actions` actions (the record's and the writes) canceled by the
/// write at `failing` alone; a violation otherwise.
fn canceled_at(
    outcome: TransactOutcome,
    actions: usize,
    failing: usize,
    what: &str,
) -> Result<Vec<CancellationReason>, Violation> {
    let TransactOutcome::Canceled(reasons) = outcome else {
        return Err(Violation(format!(
            "{what}: expected Canceled (action {failing}'s condition fails), got {outcome:?}"
        )));
    };
    let codes: Vec<(usize, &str)> = reasons.iter().map(|r| (r.index, r.code.as_str())).collect();
    let expected: Vec<(usize, &str)> = (0..actions)
        .map(|i| {
            let code = if i == failing {
                "ConditionalCheckFailed"
            } else {
                "None"
            };
            (i, code)
        })
        .collect();
    ensure_eq!(
        codes,
        expected,
        "{what}: one cancellation reason per action (index, code), index 0 the record"
    );
    Ok(reasons)
}

/// Both transactional calls, with a write each: both must work, or both be `Unsupported` and write
/// nothing.
async fn support<S: Store>(c: Context<S>) -> Result<Support, Violation> {
    let claim_writes: Writes = [c.put_new("support-claim")?].into_iter().collect();
    let claimed = c
        .store
        .claim_transaction(&claim("claimed", "t1", NOW), &claim_writes)
        .await;
    c.pending("held", "t2").await?;
    let held = c.record("held").await?;
    let writes: Writes = [c.put_new("support-transition")?].into_iter().collect();
    let transacted = c
        .store
        .transact_transition(&complete("held", "t2", b"{}", NOW / 1000 + 3600), &writes)
        .await;
    let unsupported =
        |r: &Result<TransactOutcome, StoreError>| matches!(r, Err(StoreError::Unsupported { .. }));
    match (unsupported(&claimed), unsupported(&transacted)) {
        (false, false) => Ok(Support::Supported),
        (true, true) => {
            ensure_eq!(
                c.store.get("claimed").await?,
                None,
                "`claim_transaction` returned `StoreError::Unsupported`, so it must write no record"
            );
            ensure_eq!(
                c.record("held").await?,
                held,
                "`transact_transition` returned `StoreError::Unsupported`, so it must not change the record"
            );
            Ok(Support::Unsupported)
        }
        (true, false) => Err(Violation(format!(
            "`claim_transaction` returned `StoreError::Unsupported` but `transact_transition` returned \
             {transacted:?}: a store supports both or neither"
        ))),
        (false, true) => Err(Violation(format!(
            "`transact_transition` returned `StoreError::Unsupported` but `claim_transaction` returned \
             {claimed:?}: a store supports both or neither"
        ))),
    }
}

async fn claim_transaction_commits_the_claim_and_the_writes_together<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    let writes = vec![c.put_new("a")?, c.add_hits("counter", 1)?];
    c.committed(
        "k",
        "t1",
        NOW,
        writes,
        "a claim of an absent key with two writes that hold",
    )
    .await?;
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.token.as_str(), r.attempt, r.lease_until_ms),
        (Status::Pending, "t1", 1, Some(NOW + LEASE)),
        "status, token, attempt and lease after a claim with writes"
    );
    ensure_eq!(
        r.expires_at_s,
        (NOW + LEASE) / 1000 + 3600,
        "`expires_at_s`"
    );
    ensure_eq!(r.fingerprint.as_deref(), Some("fp-1"), "the fingerprint");
    ensure!(
        r.claim_writes_in_effect,
        "a claim with writes must mark them as in effect (`claim_writes_in_effect`)"
    );
    ensure!(
        c.exists("a").await?,
        "the claim's Put must be written with it"
    );
    ensure!(
        c.has_hits("counter", 1).await?,
        "the claim's Update must be applied with it, once"
    );
    Ok(())
}

async fn claim_transaction_with_a_failing_write_writes_nothing<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    let writes = vec![
        c.put_new("b")?,
        c.check("missing", "attribute_exists(#k)", None, false)?,
    ];
    let outcome = c.claim_with("k", "t1", NOW, writes).await?;
    canceled_at(
        outcome,
        3,
        2,
        "a claim whose second write's condition fails",
    )?;
    ensure_eq!(
        c.store.get("k").await?,
        None,
        "a canceled claim must write no record"
    );
    ensure!(
        !c.exists("b").await?,
        "a canceled claim must not write the Put whose condition held"
    );
    Ok(())
}

async fn transact_transition_commits_the_transition_and_the_writes_together<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let writes: Writes = [c.put_new("a")?, c.add_hits("counter", 1)?]
        .into_iter()
        .collect();
    let expires = NOW / 1000 + 86_400;
    ensure_eq!(
        c.store
            .transact_transition(&complete("k", "t1", br#"{"ok":true}"#, expires), &writes)
            .await?,
        TransactOutcome::Committed,
        "the holder's completion with two writes that hold"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.token.as_str(), r.lease_until_ms, r.expires_at_s),
        (Status::Completed, "t1", None, expires),
        "status, token, lease and expiry after a completion with writes"
    );
    ensure_eq!(
        r.response.as_deref(),
        Some(&br#"{"ok":true}"#[..]),
        "the stored response"
    );
    ensure!(
        c.exists("a").await?,
        "the completion's Put must be written with it"
    );
    ensure!(
        c.has_hits("counter", 1).await?,
        "the completion's Update must be applied with it, once"
    );
    Ok(())
}

async fn transact_transition_with_a_failing_write_writes_nothing<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.committed(
        "seed",
        "s1",
        NOW,
        vec![c.put_new("seeded")?],
        "a claim that writes the item the failing condition reads",
    )
    .await?;
    c.pending("k", "t1").await?;
    let before = c.record("k").await?;
    let writes: Writes = [
        c.put_new("b")?,
        c.check("seeded", "attribute_not_exists(#k)", None, true)?,
        c.put_new("d")?,
    ]
    .into_iter()
    .collect();
    let outcome = c
        .store
        .transact_transition(&complete("k", "t1", b"{}", NOW / 1000 + 3600), &writes)
        .await?;
    let reasons = canceled_at(
        outcome,
        4,
        2,
        "a completion whose second of three writes fails",
    )?;
    let key = c.table().key_attribute;
    ensure_eq!(
        reasons[2].item.as_ref().and_then(|item| item.get(&key)),
        Some(&c.id("seeded")),
        "the failed ConditionCheck asked for ALL_OLD: its reason carries the item as it was"
    );
    ensure_eq!(
        c.record("k").await?,
        before,
        "a canceled completion must leave the record PENDING under our token"
    );
    ensure!(
        !c.exists("b").await? && !c.exists("d").await?,
        "a canceled completion must not write the Puts whose conditions held"
    );
    Ok(())
}

async fn transact_transition_is_fenced_by_the_token<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let before = c.record("k").await?;
    let writes: Writes = [c.put_new("a")?].into_iter().collect();
    ensure_eq!(
        c.store
            .transact_transition(&complete("k", "t2", b"{}", NOW / 1000 + 3600), &writes)
            .await?,
        TransactOutcome::Rejected(Some(before.clone())),
        "a completion with another token must be rejected, returning the record as it was"
    );
    // A write that fails too: the record's fence is what the caller hears about.
    let failing: Writes = [c.check("missing", "attribute_exists(#k)", None, false)?]
        .into_iter()
        .collect();
    ensure_eq!(
        c.store
            .transact_transition(&fail("k", "t3"), &failing)
            .await?,
        TransactOutcome::Rejected(Some(before.clone())),
        "a failure with another token and a failing write must be rejected, returning the record"
    );
    ensure_eq!(
        c.record("k").await?,
        before,
        "rejected transitions must change nothing"
    );
    ensure!(
        !c.exists("a").await?,
        "a rejected transition must not write its business writes"
    );
    let writes: Writes = [c.put_new("b")?].into_iter().collect();
    ensure_eq!(
        c.store
            .transact_transition(&complete("absent", "t1", b"{}", NOW / 1000 + 3600), &writes)
            .await?,
        TransactOutcome::Rejected(None),
        "a completion of an absent key"
    );
    ensure_eq!(
        c.store.get("absent").await?,
        None,
        "a rejected transition must not create a record"
    );
    ensure!(
        !c.exists("b").await?,
        "a rejected transition must not write its business writes"
    );
    Ok(())
}

async fn a_retried_transaction_is_not_applied_twice<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    let claim_writes: Writes = [c.add_hits("claimed", 1)?].into_iter().collect();
    let request = claim("k1", "t1", NOW);
    ensure_eq!(
        c.store.claim_transaction(&request, &claim_writes).await?,
        TransactOutcome::Committed,
        "a claim with a write"
    );
    // The same request again, as after a lost response.
    let again = c.store.claim_transaction(&request, &claim_writes).await?;
    ensure!(
        match &again {
            TransactOutcome::Committed => true,
            TransactOutcome::Rejected(Some(r)) => r.token == "t1" && r.status == Status::Pending,
            _ => false,
        },
        "a claim with writes sent again after it landed: expected Committed (a replayed request) or \
         Rejected with the record showing our token, got {again:?}"
    );
    ensure!(
        c.has_hits("claimed", 1).await?,
        "a claim's writes sent again after it landed must be applied once"
    );

    c.pending("k2", "t2").await?;
    let writes: Writes = [c.add_hits("completed", 1)?].into_iter().collect();
    let completion = complete("k2", "t2", b"first", NOW / 1000 + 3600);
    ensure_eq!(
        c.store.transact_transition(&completion, &writes).await?,
        TransactOutcome::Committed,
        "the holder's completion with a write"
    );
    let again = c.store.transact_transition(&completion, &writes).await?;
    ensure!(
        match &again {
            TransactOutcome::Committed => true,
            TransactOutcome::Rejected(Some(r)) => r.token == "t2" && r.status == Status::Completed,
            _ => false,
        },
        "a completion with writes sent again after it landed: expected Committed (a replayed request) \
         or Rejected with the record showing our token, got {again:?}"
    );
    ensure!(
        c.has_hits("completed", 1).await?,
        "a completion's writes sent again after it landed must be applied once"
    );
    ensure_eq!(
        c.record("k2").await?.response.as_deref(),
        Some(&b"first"[..]),
        "the stored response"
    );
    Ok(())
}

async fn claim_transaction_refuses_a_record_whose_claim_writes_are_in_effect<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    let writes = || -> Result<_, Violation> { Ok(vec![c.add_hits("held", 1)?]) };
    c.committed("k", "t1", NOW, writes()?, "a claim with a write")
        .await?;
    c.store.transition(&fail("k", "t1")).await?;
    let failed = c.record("k").await?;
    ensure!(
        failed.status == Status::Failed && failed.claim_writes_in_effect,
        "a failure without compensation must keep the claim-time writes in effect, got {failed:?}"
    );
    // A release's mark leaves the rest of the record as it is: the writes stay in effect.
    ensure_eq!(
        c.store
            .transition(&mark_released("k", "t0", NOW, Some(&failed), NOW + LEASE))
            .await?,
        WriteOutcome::Applied,
        "a release's mark on a FAILED record whose claim-time writes are in effect"
    );
    let failed = c.record("k").await?;
    ensure!(
        failed.claim_writes_in_effect && failed.released == ["t0"],
        "a release's mark must keep the claim-time writes in effect, got {failed:?}"
    );
    ensure_eq!(
        c.claim_with("k", "t2", NOW + 1, writes()?).await?,
        TransactOutcome::Rejected(Some(failed)),
        "a claim with writes of a FAILED record whose claim-time writes are in effect must be refused"
    );
    ensure_eq!(
        c.store.claim(&claim("k", "t2", NOW + 1)).await?,
        ClaimOutcome::Claimed,
        "a plain claim of the FAILED record"
    );
    c.pending_with_writes(
        "k",
        "t2",
        2,
        "status, token, attempt and `claim_writes_in_effect` after a plain claim (which keeps the flag)",
    )
    .await?;
    let lapsed = NOW + 1 + LEASE + 1;
    let outcome = c.claim_with("k", "t3", lapsed, writes()?).await?;
    ensure!(
        matches!(&outcome, TransactOutcome::Rejected(Some(r)) if r.token == "t2"),
        "a claim with writes of a lapsed claim whose claim-time writes are in effect must be refused \
         with the record, got {outcome:?}"
    );
    ensure!(
        c.has_hits("held", 1).await?,
        "refused claims must not apply their writes"
    );
    Ok(())
}

async fn claim_transaction_claims_an_expired_record_again<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.committed(
        "k",
        "t1",
        NOW,
        vec![c.add_hits("again", 1)?],
        "a claim with a write",
    )
    .await?;
    let expires_s = NOW / 1000 + 10;
    c.store
        .transition(&complete("k", "t1", b"1", expires_s))
        .await?;
    let later = (expires_s + 1) * 1000;
    c.committed("k", "t2", later, vec![c.add_hits("again", 1)?], "a claim with writes of an expired record whose claim-time writes are in effect (a new operation)").await?;
    let r = c
        .pending_with_writes(
            "k",
            "t2",
            2,
            "status, token, attempt and `claim_writes_in_effect` after claiming an expired record",
        )
        .await?;
    ensure_eq!(r.response, None, "a new claim clears the old response");
    ensure!(
        c.has_hits("again", 2).await?,
        "the new operation's claim applies its writes again"
    );
    Ok(())
}

async fn released_claim_writes_are_applied_by_the_next_claim<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.committed(
        "k",
        "t1",
        NOW,
        vec![c.add_hits("released", 1)?],
        "a claim with a write",
    )
    .await?;
    let release = Transition::new(
        "k",
        "t1",
        Change::Fail {
            error: "declined",
            expires_at_s: NOW / 1000 + 60,
            release_claim_writes: true,
        },
    );
    let compensation: Writes = [c.add_hits("released", -1)?].into_iter().collect();
    ensure_eq!(
        c.store.transact_transition(&release, &compensation).await?,
        TransactOutcome::Committed,
        "a failure with compensating writes"
    );
    let r = c.record("k").await?;
    ensure!(
        r.status == Status::Failed && !r.claim_writes_in_effect,
        "a failure with `release_claim_writes` must clear `claim_writes_in_effect`, got {r:?}"
    );
    ensure!(
        c.has_hits("released", 0).await?,
        "the compensating write must be applied with the failure"
    );
    c.committed(
        "k",
        "t2",
        NOW + 1,
        vec![c.add_hits("released", 1)?],
        "a claim with writes after the writes were released",
    )
    .await?;
    c.pending_with_writes(
        "k",
        "t2",
        2,
        "status, token, attempt and `claim_writes_in_effect` after the next claim",
    )
    .await?;
    ensure!(
        c.has_hits("released", 1).await?,
        "the next claim applies the writes again"
    );
    Ok(())
}

async fn a_claim_keeping_writes_needs_them_in_effect<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    let keeping = |key, token, now_ms| {
        let mut r = claim(key, token, now_ms);
        r.keep_claim_writes = true;
        r.steps = crate::store::StepsClaim::Untouched;
        r
    };
    // No record at all: refused (the caller claims with its writes instead), nothing written.
    let outcome = c.store.claim(&keeping("absent", "t0", NOW)).await;
    ensure!(
        matches!(outcome, Err(StoreError::Corrupt(_))),
        "a claim keeping writes of an absent key must be refused with `StoreError::Corrupt`, got {outcome:?}"
    );
    ensure!(
        c.store.get("absent").await?.is_none(),
        "a refused claim keeping writes must write nothing"
    );
    // A FAILED record without claim-time writes in effect: refused with the record.
    c.pending("plain", "t1").await?;
    c.store.transition(&fail("plain", "t1")).await?;
    let failed = c.record("plain").await?;
    ensure_eq!(
        c.store.claim(&keeping("plain", "t2", NOW + 1)).await?,
        ClaimOutcome::Existing(failed),
        "a claim keeping writes of a FAILED record whose writes are not in effect"
    );
    // A FAILED record whose writes are in effect: claimed, the mark kept.
    c.committed(
        "k",
        "t1",
        NOW,
        vec![c.add_hits("kept", 1)?],
        "a claim with a write",
    )
    .await?;
    c.store.transition(&fail("k", "t1")).await?;
    let expires_s = c.record("k").await?.expires_at_s;
    let past = (expires_s + 1) * 1000;
    let expired = c.store.claim(&keeping("k", "t2", past)).await?;
    ensure!(
        matches!(&expired, ClaimOutcome::Existing(r) if r.token == "t1"),
        "a claim keeping writes of an expired record (a new operation) must be refused, got {expired:?}"
    );
    ensure_eq!(
        c.store.claim(&keeping("k", "t3", NOW + 1)).await?,
        ClaimOutcome::Claimed,
        "a claim keeping writes of a FAILED record whose writes are in effect"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.token.as_str(), r.claim_writes_in_effect),
        (Status::Pending, "t3", true),
        "status, token and `claim_writes_in_effect` after a claim keeping writes"
    );
    ensure!(
        c.has_hits("kept", 1).await?,
        "a claim keeping writes applies none"
    );
    Ok(())
}

async fn a_compensation_needs_the_claim_writes_in_effect<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    // The business item, at 1 hit.
    c.committed(
        "seed",
        "t0",
        NOW,
        vec![c.add_hits("undone", 1)?],
        "a claim with a write",
    )
    .await?;
    // PENDING under our token, but claimed plainly: no claim-time writes in effect.
    c.pending("k", "t1").await?;
    let pending = c.record("k").await?;
    let release = Transition::new(
        "k",
        "t1",
        Change::Fail {
            error: "declined",
            expires_at_s: NOW / 1000 + 60,
            release_claim_writes: true,
        },
    );
    let compensation: Writes = [c.add_hits("undone", -1)?].into_iter().collect();
    ensure_eq!(
        c.store.transact_transition(&release, &compensation).await?,
        TransactOutcome::Rejected(Some(pending.clone())),
        "a failure with compensating writes of a record whose claim-time writes are not in effect"
    );
    ensure_eq!(
        c.record("k").await?,
        pending,
        "a refused compensation must leave the record as it was"
    );
    ensure!(
        c.has_hits("undone", 1).await?,
        "a refused compensation must apply none of its writes"
    );
    Ok(())
}

/// A completion with business writes gives the record an expiry no earlier than the end of its
/// released tokens, as a plain one does, and commits its writes once.
async fn a_transaction_keeps_the_record_until_its_released_tokens_end<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    // A millisecond past a whole second: the expiry is the next second.
    let until = NOW + 2 * LEASE + 1;
    c.pending("k", "t1").await?;
    let seen = c.record("k").await?;
    c.store
        .transition(&mark_released("k", "r1", NOW, Some(&seen), until))
        .await?;
    let writes: Writes = [c.add_hits("counter", 1)?].into_iter().collect();
    ensure_eq!(
        c.store
            .transact_transition(&complete("k", "t1", b"{}", NOW / 1000 + 5), &writes)
            .await?,
        TransactOutcome::Committed,
        "a completion with writes whose expiry is before the released tokens' end"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.expires_at_s, r.released_until_ms),
        (Status::Completed, until.div_ceil(1000), None),
        "the completion keeps the record until the released tokens' end"
    );
    ensure!(
        c.has_hits("counter", 1).await?,
        "the completion's writes are applied once"
    );
    // A claim with writes of a FAILED record whose released tokens end after its own expiry keeps
    // the record until then, and applies its writes once.
    c.pending("failed", "t1").await?;
    let seen = c.record("failed").await?;
    c.store
        .transition(&mark_released("failed", "r1", NOW, Some(&seen), until))
        .await?;
    c.store.transition(&fail("failed", "t1")).await?;
    let short = ClaimRequest::new("failed", "t2", NOW, NOW + LEASE, NOW / 1000 + 5);
    let writes: Writes = [c.add_hits("claimed", 1)?].into_iter().collect();
    ensure_eq!(
        c.store.claim_transaction(&short, &writes).await?,
        TransactOutcome::Committed,
        "a claim with writes whose expiry is before the released tokens' end"
    );
    let r = c.record("failed").await?;
    ensure_eq!(
        (
            r.status,
            r.token.as_str(),
            r.expires_at_s,
            r.released.clone()
        ),
        (
            Status::Pending,
            "t2",
            until.div_ceil(1000),
            vec!["r1".to_owned()]
        ),
        "the claim keeps the record, and the released token, until their end"
    );
    ensure!(
        c.has_hits("claimed", 1).await?,
        "the claim's writes are applied once"
    );
    Ok(())
}
