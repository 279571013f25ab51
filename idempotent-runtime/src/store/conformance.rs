//! The store contract as a suite any [`Store`] runs with one call (feature `conformance`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # #[cfg(feature = "emulator")] {
//! use idempotent_runtime::MemoryStore;
//! use idempotent_runtime::store::conformance::{self, BusinessTable, Subject};
//!
//! // A fresh, empty store per case, with the business table its transactions write to.
//! let report = conformance::check(|| async {
//!     let store = MemoryStore::new();
//!     store.create_table("business", "id", None).unwrap();
//!     Subject::new(store).with_business_table(BusinessTable::new("business", "id"))
//! })
//! .await;
//! report.assert_complete();
//! # }
//! # }
//! ```
//!
//! A store without transactions needs no table: `conformance::check(|| async { MyStore::new() })`.
//!
//! [`check`] calls the factory once per case, runs the case on the store it gets, and returns a
//! [`Report`] with one [`Outcome`] per case, named as in the lists below: it fails a case, never the
//! whole run, so one broken rule does not hide the others. [`Report::assert_passed`] panics with every
//! failed case's name and reason; [`Report::assert_complete`] also refuses skipped cases. The suite needs a
//! Tokio runtime (each case runs in its own task, so a case that panics is reported as failed) and uses
//! fixed times in 2100 (`now_ms` = 4 102 444 800 000), so a store must take every time from the request,
//! never from its own clock — which the contract requires anyway.
//!
//! # Writing a store that keeps passing
//!
//! Build the records a store returns with [`Record::new`] and set the other (public) fields on the
//! result; build requests for a store's own tests with [`ClaimRequest::new`] and
//! [`Transition::new`]. Those types are `#[non_exhaustive]`, so a field they gain in a later release
//! breaks no store; a field the store does not know yet keeps its empty value. [`ClaimOutcome`],
//! [`WriteOutcome`] and [`TransactOutcome`](super::TransactOutcome) are `#[non_exhaustive]` too: a
//! store that wraps another passes an outcome it does not know on as it came. [`Change`] and
//! [`StepsClaim`] are exhaustive on purpose: a store applies every one of them.
//!
//! # Records: [`RECORD_CASES`]
//!
//! | case | the rule |
//! |---|---|
//! | `claim_of_a_new_key_writes_a_pending_record` | a claim of an absent key writes PENDING with every field of the request |
//! | `duplicate_claim_returns_the_old_record` | a claim of a held key is [`ClaimOutcome::Existing`] with the record, and changes nothing |
//! | `a_retried_claim_finds_its_own_token` | a claim repeated with the same token finds the record with that token; once the lease ran out, it claims it again |
//! | `complete_is_guarded_by_the_token` | fencing: another token's completion is rejected and returns the record as it was |
//! | `fail_is_guarded_by_the_token` | fencing, for a failure |
//! | `a_heartbeat_extends_only_its_own_lease` | fencing, for a heartbeat; the extended lease blocks claims |
//! | `transitions_of_an_absent_key_are_rejected_without_a_record` | [`WriteOutcome::Rejected`]`(None)`, nothing written |
//! | `a_retried_transition_that_landed_is_rejected_with_our_token` | tokens: a completion or failure sent again after it landed is rejected, and the record shows our token (the caller treats it as landed) |
//! | `a_failed_record_is_claimable_at_once` | FAILED is claimable; the claim clears the error and counts the attempt |
//! | `an_expired_record_is_claimable` | expiry: live in its expiry second, claimable after it; the claim clears the response |
//! | `expiry_is_decided_by_the_claims_clock` | TTL vs condition: a record past `expires_at_s` at the request's `now_ms` is claimable even while its lease runs and the store still holds it |
//! | `a_pending_record_is_claimable_once_its_lease_ran_out` | takeover only after `lease_until_ms` (live up to and including it) |
//! | `a_stale_token_cannot_complete_or_fail_after_a_takeover` | the old holder is fenced out after a takeover |
//! | `a_claim_without_a_fingerprint_clears_the_old_one` | a claim writes the request's fingerprint, or none |
//! | `a_plain_claim_keeps_claim_writes_in_effect_as_they_were` | [`Store::claim`] never sets [`Record::claim_writes_in_effect`] |
//! | `steps_are_stored_under_the_token_and_removed_by_completion` | a fresh claim with steps ([`StepsClaim::Fresh`]) stores its `initial` steps; [`Change::SaveSteps`] is fenced by the token like every transition and keeps the record PENDING; a completion removes the steps |
//! | `a_step_write_is_made_only_on_the_steps_it_extends` | ordered steps: [`Change::SaveSteps`] is made only while the record holds exactly its `previous`; a late copy of an earlier step's write, the same write sent again after it landed, a write on steps never stored, or on a record without steps, is [`WriteOutcome::Rejected`] with the record as it is (holding the later steps), nothing written |
//! | `a_fresh_claim_with_steps_is_refused_by_live_steps` | a fresh claim is refused by a claimable record whose steps live on (unless the record expired, or it restarts after the failure of exactly the steps stored), and replaces them when made |
//! | `a_claim_that_starts_a_new_operation_removes_its_steps` | a claim without steps ([`StepsClaim::Untouched`]) is refused by a record whose steps live on (not expired), and removes those of an expired one (a new operation), as every claim that starts afresh does |
//! | `a_resume_needs_exactly_the_steps_it_read` | a resume ([`StepsClaim::Resume`]) is made only while the record is unexpired and holds exactly the steps given, and keeps them; one that restarts after a failure is refused by a FAILED record and made on a lapsed PENDING one; an absent key is [`StoreError::Corrupt`], nothing written |
//! | `a_release_before_its_claim_landed_refuses_that_claim` | [`Change::Release`] on an absent key writes a FAILED mark under the token; that token's claim, landing late, is refused by it (returned as blocking), another token's claim takes the key at once; any record at all rejects the mark, returned as it is |
//! | `a_token_released_on_a_record_is_refused_by_it` | [`Change::MarkReleased`] adds the token to a record not PENDING under it (FAILED, another call's live claim, an expired COMPLETED one), sets their end and the record's expiry as given and changes nothing else; an expired record takes no mark, and a release replaces it with its own, nothing of the old record left; every claim under a released token is refused, other claims keep the tokens and their end, a completion removes both; a mark computed from a record that changed since, a live COMPLETED record, the token's own claim and no record reject it; on a full record (`MAX_RELEASED`) whose tokens can still hold the key, the token becomes its `released_through` if greater (every claim under a token up to it refused; kept by a claim, removed by a completion); on a full record whose tokens' end has passed, the token replaces them and removes `released_through` |
//! | `of_32_racing_claims_exactly_one_wins` | linearizable claims: five rounds of 32 concurrent claims, one winner each |
//!
//! # Transactions: [`TRANSACTION_CASES`]
//!
//! [`Store::claim_transaction`] and [`Store::transact_transition`] with business [`Writes`](super::Writes). A store
//! without transactions returns [`StoreError::Unsupported`] from both and writes nothing — the first
//! case checks exactly that — and the others are then reported as [`Outcome::Skipped`], saying so; a
//! store that supports one and refuses the other fails the first case.
//!
//! The business writes go to a table the factory provides: return
//! `Subject::new(store).with_business_table(BusinessTable::new(name, key_attribute))`, a table with a
//! string partition key `key_attribute` (on [`MemoryStore`](crate::MemoryStore):
//! `create_table(name, key_attribute, None)`; on DynamoDB, a real table). The suite writes items whose
//! keys start with a fresh random prefix, so one table may serve every case and every run, and reads
//! them back through the store itself, with a `ConditionCheck` in a claim of a fresh key: it needs no
//! client of its own. A store that supports transactions but was given no table fails the transaction
//! cases with a message saying so.
//!
//! | case | the rule |
//! |---|---|
//! | `transactions_are_supported_or_refused_as_unsupported` | both transactional calls work, or both are [`StoreError::Unsupported`] and write nothing |
//! | `claim_transaction_commits_the_claim_and_the_writes_together` | all: the claim (with `claim_writes_in_effect`) and the writes |
//! | `claim_transaction_with_a_failing_write_writes_nothing` | nothing: [`TransactOutcome::Canceled`](super::TransactOutcome::Canceled), no record, no write |
//! | `transact_transition_commits_the_transition_and_the_writes_together` | all: COMPLETED and the writes |
//! | `transact_transition_with_a_failing_write_writes_nothing` | nothing; one reason per action, index 0 the record, `ConditionalCheckFailed` at the failing index, `None` elsewhere, the `ALL_OLD` item when asked |
//! | `transact_transition_is_fenced_by_the_token` | another token, or no record: [`TransactOutcome::Rejected`](super::TransactOutcome::Rejected) with the record as it was, no write |
//! | `a_retried_transaction_is_not_applied_twice` | tokens: sent again after it landed, it is `Committed` (a replayed request token) or `Rejected` with our token, and the writes are applied once |
//! | `claim_transaction_refuses_a_record_whose_claim_writes_are_in_effect` | FAILED without compensation, or a lapsed claim: `Rejected`, no write; a plain claim takes it and keeps the flag |
//! | `claim_transaction_claims_an_expired_record_again` | an expired record is a new operation: claimed, writes applied again |
//! | `released_claim_writes_are_applied_by_the_next_claim` | a failure with compensating writes (`release_claim_writes`) clears the flag; the next `claim_transaction` applies the writes |
//! | `a_claim_keeping_writes_needs_them_in_effect` | a plain claim with [`keep_claim_writes`](super::ClaimRequest::keep_claim_writes) takes only a claimable, unexpired record whose writes are in effect, and keeps the flag; an absent key is [`StoreError::Corrupt`], nothing written |
//! | `a_compensation_needs_the_claim_writes_in_effect` | a failure with `release_claim_writes` of a record whose writes are not in effect is `Rejected` with the record, no write |
//!
//! # `StoreError::Unsupported`
//!
//! A store without transactions keeps the trait's default [`Store::claim_transaction`] and
//! [`Store::transact_transition`], which return [`StoreError::Unsupported`]. The state machine reports
//! it as [`Error::Unsupported`](crate::Error::Unsupported): a call with claim-time writes
//! ([`Operation::claim_with`](crate::Operation::claim_with)) fails before its body runs; a call whose
//! body staged writes (`transact = tx`) fails at completion. Plain calls are unaffected. Never return
//! `Unsupported` for a request the store could serve: the caller does not retry it.

#[doc(hidden)]
pub mod request;
#[doc(hidden)]
pub use super::delegating::{Delegating, Override};
#[cfg(feature = "dynamodb")]
mod transaction;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{
    Change, ClaimOutcome, ClaimRequest, Marking, StepsClaim, Store, StoreError, Transition,
    WriteOutcome,
};
use crate::record::{Record, Status};
use request::{LEASE, NOW, claim, complete, extend, fail, mark_released, release};

/// How long one case may take before it is reported as hanging.
const CASE_TIMEOUT: Duration = Duration::from_mins(2);

/// A business table for the transaction cases: its name, and its partition key (type S).
///
/// Built with [`BusinessTable::new`]; `#[non_exhaustive]`, so a setting added later (a sort key, say)
/// breaks no caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BusinessTable {
    /// The table's name, as the store's business writes name it.
    pub name: String,
    /// The partition key's attribute name (a string; the table has no sort key).
    pub key_attribute: String,
}

impl BusinessTable {
    /// The table `name` with partition key `key_attribute`.
    pub fn new(name: impl Into<String>, key_attribute: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            key_attribute: key_attribute.into(),
        }
    }
}

/// What a case runs against: a fresh, empty store, and the business table its transactions write to.
#[derive(Debug)]
pub struct Subject<S> {
    store: S,
    business_table: Option<BusinessTable>,
}

impl<S: Store> Subject<S> {
    /// `store`, without a business table (enough for a store without transactions).
    pub fn new(store: S) -> Self {
        Self {
            store,
            business_table: None,
        }
    }

    /// The table the transaction cases write business items to.
    #[must_use]
    pub fn with_business_table(mut self, table: BusinessTable) -> Self {
        self.business_table = Some(table);
        self
    }
}

/// What a factory given to [`check`] may return: a store, or a [`Subject`].
pub trait IntoSubject {
    /// The store under test.
    type Store: Store;

    /// The subject of one case.
    fn into_subject(self) -> Subject<Self::Store>;
}

impl<S: Store> IntoSubject for S {
    type Store = S;

    fn into_subject(self) -> Subject<S> {
        Subject::new(self)
    }
}

impl<S: Store> IntoSubject for Subject<S> {
    type Store = S;

    fn into_subject(self) -> Subject<S> {
        self
    }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The store kept the rule.
    Passed,
    /// The store broke the rule: what was expected and what came instead.
    Failed(String),
    /// The case did not run, and why (a store without transactions, say).
    Skipped(String),
}

/// One case of a [`Report`].
///
/// Built only by [`check`]; `#[non_exhaustive]`, so what a case reports may grow (its duration, say)
/// without breaking a caller that reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Case {
    /// The case's name, from [`RECORD_CASES`] or [`TRANSACTION_CASES`].
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
}

/// The outcome of every case of one [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    store: &'static str,
    cases: Vec<Case>,
}

impl Report {
    /// The store's [`kind`](Store::kind).
    #[must_use]
    pub fn store(&self) -> &'static str {
        self.store
    }

    /// Every case, in the order they ran.
    #[must_use]
    pub fn cases(&self) -> &[Case] {
        &self.cases
    }

    /// How the case `name` ended; `None` if there is no such case.
    #[must_use]
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.cases
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.outcome)
    }

    /// The cases the store failed.
    pub fn failed(&self) -> impl Iterator<Item = &Case> {
        self.cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
    }

    /// The cases that did not run.
    pub fn skipped(&self) -> impl Iterator<Item = &Case> {
        self.cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Skipped(_)))
    }

    /// Whether no case failed (skipped ones aside).
    #[must_use]
    pub fn passed(&self) -> bool {
        self.failed().next().is_none()
    }

    /// Panics unless every case passed or was skipped.
    ///
    /// # Panics
    /// With the report, naming every failed case and why, when one failed.
    #[track_caller]
    pub fn assert_passed(&self) {
        assert!(
            self.passed(),
            "the {} store breaks the store contract:\n{self}",
            self.store
        );
    }

    /// Panics unless every case ran and passed: for a store that supports everything, transactions
    /// included.
    ///
    /// # Panics
    /// With the report, when a case failed or was skipped.
    #[track_caller]
    pub fn assert_complete(&self) {
        self.assert_passed();
        assert!(
            self.skipped().next().is_none(),
            "the {} store skipped cases of the store contract:\n{self}",
            self.store
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for case in &self.cases {
            match &case.outcome {
                Outcome::Passed => writeln!(f, "  ok      {}", case.name)?,
                Outcome::Failed(why) => writeln!(f, "  FAILED  {}: {why}", case.name)?,
                Outcome::Skipped(why) => writeln!(f, "  skipped {}: {why}", case.name)?,
            }
        }
        let count = |p: fn(&Outcome) -> bool| self.cases.iter().filter(|c| p(&c.outcome)).count();
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            count(|o| matches!(o, Outcome::Passed)),
            count(|o| matches!(o, Outcome::Failed(_))),
            count(|o| matches!(o, Outcome::Skipped(_))),
        )
    }
}

/// Runs every case of the store contract, each against a fresh store from `factory`, and reports how
/// each ended.
///
/// `factory` returns a store, or a [`Subject`] with the business table the transaction cases write to;
/// it is called once per case, and must give a fresh, empty store each time (a new table, say).
/// Needs a Tokio runtime.
///
/// ```no_run
/// # async fn run(client: idempotent_runtime::aws_sdk_dynamodb::Client) {
/// use idempotent_runtime::DynamoDbStore;
/// use idempotent_runtime::store::conformance::{self, BusinessTable, Subject};
///
/// let report = conformance::check(|| async {
///     let store = DynamoDbStore::new(client.clone(), format!("idem-{}", uuid()));
///     store.create_table().await.unwrap();
///     // `business` exists, with a string partition key `id`.
///     Subject::new(store).with_business_table(BusinessTable::new("business", "id"))
/// })
/// .await;
/// report.assert_complete();
/// # }
/// # fn uuid() -> u32 { 0 }
/// ```
pub async fn check<F, Fut>(mut factory: F) -> Report
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: IntoSubject,
{
    let mut store = "unknown";
    let mut cases = Vec::with_capacity(RECORD_CASES.len() + TRANSACTION_CASES.len());
    for &name in RECORD_CASES {
        let context = Context::new(factory().await.into_subject());
        store = context.store.kind();
        cases.push(Case {
            name,
            outcome: run(record_case(name, context)).await,
        });
    }
    #[cfg(feature = "dynamodb")]
    transaction::run_all(&mut factory, &mut cases).await;
    #[cfg(not(feature = "dynamodb"))]
    cases.extend(TRANSACTION_CASES.iter().map(|&name| Case {
        name,
        outcome: Outcome::Skipped(
            "built without the `dynamodb` feature: business writes are DynamoDB's TransactWriteItems"
                .to_owned(),
        ),
    }));
    Report { store, cases }
}

/// Runs one case in its own task.
async fn run(case: CaseFuture) -> Outcome {
    match run_task(case).await {
        Ok(()) => Outcome::Passed,
        Err(why) => Outcome::Failed(why),
    }
}

/// Runs `case` in its own task, so that a panic or a hang is that case's failure: why it failed.
async fn run_task<T: Send + 'static>(
    case: impl Future<Output = Result<T, Violation>> + Send + 'static,
) -> Result<T, String> {
    match tokio::spawn(tokio::time::timeout(CASE_TIMEOUT, case)).await {
        Ok(Ok(result)) => result.map_err(|Violation(why)| why),
        Ok(Err(_)) => Err(format!(
            "did not finish within {} s",
            CASE_TIMEOUT.as_secs()
        )),
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            Err(format!("panicked: {message}"))
        }
        Err(e) => Err(format!("the case's task did not finish: {e}")),
    }
}

/// Why a case failed.
#[derive(Debug)]
struct Violation(String);

impl From<StoreError> for Violation {
    fn from(e: StoreError) -> Self {
        Violation(format!("the store returned an error: {e}"))
    }
}

type CaseFuture = Pin<Box<dyn Future<Output = Result<(), Violation>> + Send>>;

/// Fails the case with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(Violation(format!($($arg)+)));
        }
    };
}
#[cfg(feature = "dynamodb")]
use ensure;

/// Fails the case unless `actual == expected`, saying what was expected and what came.
macro_rules! ensure_eq {
    ($actual:expr, $expected:expr, $($arg:tt)+) => {
        // A `match`, as in `assert_eq!`, so that temporaries live until the comparison is made.
        match (&$actual, &$expected) {
            (actual, expected) => {
                if actual != expected {
                    return Err(Violation(format!(
                        "{}: expected {expected:?}, got {actual:?}",
                        format_args!($($arg)+)
                    )));
                }
            }
        }
    };
}
#[cfg(feature = "dynamodb")]
use ensure_eq;

/// The function that runs one case of a group by its name.
macro_rules! dispatch {
    ($dispatch:ident: $($name:ident),+ $(,)?) => {
        /// The case `name` on `context`.
        fn $dispatch<S: Store>(name: &str, context: Context<S>) -> CaseFuture {
            match name {
                $(stringify!($name) => Box::pin($name(context)),)+
                other => {
                    let why = format!("there is no case named `{other}`");
                    Box::pin(std::future::ready(Err(Violation(why))))
                }
            }
        }
    };
}
#[cfg(feature = "dynamodb")]
use dispatch;

/// The cases of claims, transitions and reads, which every store must pass.
pub const RECORD_CASES: &[&str] = &[
    "claim_of_a_new_key_writes_a_pending_record",
    "duplicate_claim_returns_the_old_record",
    "a_retried_claim_finds_its_own_token",
    "complete_is_guarded_by_the_token",
    "fail_is_guarded_by_the_token",
    "a_heartbeat_extends_only_its_own_lease",
    "transitions_of_an_absent_key_are_rejected_without_a_record",
    "a_retried_transition_that_landed_is_rejected_with_our_token",
    "a_failed_record_is_claimable_at_once",
    "an_expired_record_is_claimable",
    "expiry_is_decided_by_the_claims_clock",
    "a_pending_record_is_claimable_once_its_lease_ran_out",
    "a_stale_token_cannot_complete_or_fail_after_a_takeover",
    "a_claim_without_a_fingerprint_clears_the_old_one",
    "a_plain_claim_keeps_claim_writes_in_effect_as_they_were",
    "steps_are_stored_under_the_token_and_removed_by_completion",
    "a_step_write_is_made_only_on_the_steps_it_extends",
    "a_fresh_claim_with_steps_is_refused_by_live_steps",
    "a_claim_that_starts_a_new_operation_removes_its_steps",
    "a_resume_needs_exactly_the_steps_it_read",
    "a_release_before_its_claim_landed_refuses_that_claim",
    "a_token_released_on_a_record_is_refused_by_it",
    "transitions_keep_the_record_until_its_released_tokens_end",
    "a_completed_record_is_kept_until_a_released_claims_end",
    "of_32_racing_claims_exactly_one_wins",
];

dispatch!(
    record_case:
    claim_of_a_new_key_writes_a_pending_record,
    duplicate_claim_returns_the_old_record,
    a_retried_claim_finds_its_own_token,
    complete_is_guarded_by_the_token,
    fail_is_guarded_by_the_token,
    a_heartbeat_extends_only_its_own_lease,
    transitions_of_an_absent_key_are_rejected_without_a_record,
    a_retried_transition_that_landed_is_rejected_with_our_token,
    a_failed_record_is_claimable_at_once,
    an_expired_record_is_claimable,
    expiry_is_decided_by_the_claims_clock,
    a_pending_record_is_claimable_once_its_lease_ran_out,
    a_stale_token_cannot_complete_or_fail_after_a_takeover,
    a_claim_without_a_fingerprint_clears_the_old_one,
    a_plain_claim_keeps_claim_writes_in_effect_as_they_were,
    steps_are_stored_under_the_token_and_removed_by_completion,
    a_step_write_is_made_only_on_the_steps_it_extends,
    a_fresh_claim_with_steps_is_refused_by_live_steps,
    a_claim_that_starts_a_new_operation_removes_its_steps,
    a_resume_needs_exactly_the_steps_it_read,
    a_release_before_its_claim_landed_refuses_that_claim,
    a_token_released_on_a_record_is_refused_by_it,
    transitions_keep_the_record_until_its_released_tokens_end,
    a_completed_record_is_kept_until_a_released_claims_end,
    of_32_racing_claims_exactly_one_wins,
);

/// The cases of transactions with business writes ([`Store::claim_transaction`],
/// [`Store::transact_transition`]). The first checks that a store supports both or refuses both with
/// [`StoreError::Unsupported`]; the others are skipped, and reported so, for a store that refuses them.
pub const TRANSACTION_CASES: &[&str] = &[
    "transactions_are_supported_or_refused_as_unsupported",
    "claim_transaction_commits_the_claim_and_the_writes_together",
    "claim_transaction_with_a_failing_write_writes_nothing",
    "transact_transition_commits_the_transition_and_the_writes_together",
    "transact_transition_with_a_failing_write_writes_nothing",
    "transact_transition_is_fenced_by_the_token",
    "a_retried_transaction_is_not_applied_twice",
    "claim_transaction_refuses_a_record_whose_claim_writes_are_in_effect",
    "claim_transaction_claims_an_expired_record_again",
    "released_claim_writes_are_applied_by_the_next_claim",
    "a_claim_keeping_writes_needs_them_in_effect",
    "a_compensation_needs_the_claim_writes_in_effect",
    "a_transaction_keeps_the_record_until_its_released_tokens_end",
];

/// One case's store and business table.
struct Context<S> {
    store: Arc<S>,
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    business_table: Option<BusinessTable>,
    /// Prefixes business items' keys, so that cases and runs sharing a table never meet.
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    prefix: String,
    /// Fresh keys for the claims that read business items back.
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    probes: AtomicUsize,
}

impl<S: Store> Context<S> {
    fn new(subject: Subject<S>) -> Self {
        Self {
            store: Arc::new(subject.store),
            business_table: subject.business_table,
            prefix: format!("conformance-{}", uuid::Uuid::new_v4().simple()),
            probes: AtomicUsize::new(0),
        }
    }

    /// A fresh key, for a claim that reads business items back.
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    fn probe_key(&self) -> String {
        format!("probe-{}", self.probes.fetch_add(1, Ordering::Relaxed))
    }

    /// Claims `key` for `token` at [`NOW`], which must succeed.
    async fn pending(&self, key: &str, token: &str) -> Result<(), Violation> {
        let outcome = self.store.claim(&claim(key, token, NOW)).await?;
        ensure_eq!(
            outcome,
            ClaimOutcome::Claimed,
            "a claim of `{key}` (absent or claimable) by `{token}`"
        );
        Ok(())
    }

    /// The record of `key`, which must exist.
    async fn record(&self, key: &str) -> Result<Record, Violation> {
        self.store
            .get(key)
            .await?
            .ok_or_else(|| Violation(format!("`get(\"{key}\")` found no record")))
    }
}

fn is_existing(outcome: &ClaimOutcome) -> bool {
    matches!(outcome, ClaimOutcome::Existing(_))
}

async fn claim_of_a_new_key_writes_a_pending_record<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let r = c.record("k").await?;
    ensure_eq!(r.key, "k", "the record's key");
    ensure_eq!(r.status, Status::Pending, "the status of a new claim");
    ensure_eq!(r.token, "t1", "the token of a new claim");
    ensure_eq!(r.attempt, 1, "the attempt count of a new claim");
    ensure_eq!(r.lease_until_ms, Some(NOW + LEASE), "`lease_until_ms`");
    ensure_eq!(
        r.expires_at_s,
        (NOW + LEASE) / 1000 + 3600,
        "`expires_at_s`"
    );
    ensure_eq!(r.fingerprint.as_deref(), Some("fp-1"), "the fingerprint");
    ensure_eq!(r.response, None, "the response of a new claim");
    ensure_eq!(r.error, None, "the error of a new claim");
    ensure_eq!(r.replay_until_s, None, "`replay_until_s` of a new claim");
    Ok(())
}

async fn duplicate_claim_returns_the_old_record<S: Store>(c: Context<S>) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let held = c.record("k").await?;
    let outcome = c.store.claim(&claim("k", "t2", NOW + 1)).await?;
    ensure_eq!(
        outcome,
        ClaimOutcome::Existing(held.clone()),
        "a claim of a live PENDING key must return the record that blocked it"
    );
    ensure_eq!(
        c.record("k").await?,
        held,
        "the losing claim must change nothing"
    );
    Ok(())
}

async fn a_retried_claim_finds_its_own_token<S: Store>(c: Context<S>) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let outcome = c.store.claim(&claim("k", "t1", NOW)).await?;
    ensure!(
        matches!(&outcome, ClaimOutcome::Existing(r) if r.token == "t1" && r.status == Status::Pending),
        "a claim sent again by the same caller must find the record with its own token, got {outcome:?}"
    );
    // Once its lease ran out, the same token claims the record again (a call whose claim was answered
    // too late claims again under its token), like any other claim of a lapsed lease.
    ensure_eq!(
        c.store.claim(&claim("k", "t1", NOW + LEASE + 1)).await?,
        ClaimOutcome::Claimed,
        "a claim under the record's own token after its lease ran out"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.token.as_str(), r.status, r.attempt),
        ("t1", Status::Pending, 2),
        "token, status and attempt after claiming again under the same token"
    );
    Ok(())
}

async fn complete_is_guarded_by_the_token<S: Store>(c: Context<S>) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let before = c.record("k").await?;
    let rejected = c
        .store
        .transition(&complete("k", "other", b"{}", 1))
        .await?;
    ensure_eq!(
        rejected,
        WriteOutcome::Rejected(Some(before.clone())),
        "a completion with another token must be rejected, returning the record as it was"
    );
    ensure_eq!(
        c.record("k").await?,
        before,
        "the rejected completion must change nothing"
    );
    let expires = NOW / 1000 + 86_400;
    let applied = c
        .store
        .transition(&complete("k", "t1", br#"{"id":7}"#, expires))
        .await?;
    ensure_eq!(applied, WriteOutcome::Applied, "the holder's completion");
    let r = c.record("k").await?;
    ensure_eq!(r.status, Status::Completed, "the status after completion");
    ensure_eq!(
        r.response.as_deref(),
        Some(&br#"{"id":7}"#[..]),
        "the stored response"
    );
    ensure_eq!(r.expires_at_s, expires, "`expires_at_s` after completion");
    ensure_eq!(r.lease_until_ms, None, "a COMPLETED record has no lease");
    ensure_eq!(r.token, "t1", "a completion keeps the token");
    ensure_eq!(r.attempt, 1, "a completion keeps the attempt count");
    Ok(())
}

async fn fail_is_guarded_by_the_token<S: Store>(c: Context<S>) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let before = c.record("k").await?;
    let rejected = c.store.transition(&fail("k", "other")).await?;
    ensure_eq!(
        rejected,
        WriteOutcome::Rejected(Some(before.clone())),
        "a failure with another token must be rejected, returning the record as it was"
    );
    ensure_eq!(
        c.record("k").await?.status,
        Status::Pending,
        "the rejected failure must change nothing"
    );
    ensure_eq!(
        c.store.transition(&fail("k", "t1")).await?,
        WriteOutcome::Applied,
        "the holder's failure"
    );
    let r = c.record("k").await?;
    ensure_eq!(r.status, Status::Failed, "the status after a failure");
    ensure_eq!(r.error.as_deref(), Some("declined"), "the stored error");
    ensure_eq!(r.lease_until_ms, None, "a FAILED record has no lease");
    ensure_eq!(
        r.expires_at_s,
        NOW / 1000 + 60,
        "`expires_at_s` after a failure"
    );
    Ok(())
}

async fn a_heartbeat_extends_only_its_own_lease<S: Store>(c: Context<S>) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let before = c.record("k").await?;
    ensure_eq!(
        c.store.transition(&extend("k", "other")).await?,
        WriteOutcome::Rejected(Some(before)),
        "a heartbeat with another token must be rejected, returning the record as it was"
    );
    ensure_eq!(
        c.store.transition(&extend("k", "t1")).await?,
        WriteOutcome::Applied,
        "the holder's heartbeat"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.lease_until_ms, r.expires_at_s),
        (Status::Pending, Some(NOW + 5 * LEASE), NOW / 1000 + 9_999),
        "status, lease and expiry after a heartbeat"
    );
    let outcome = c.store.claim(&claim("k", "t2", NOW + LEASE + 1)).await?;
    ensure!(
        is_existing(&outcome),
        "the extended lease must hold off a claim that the original lease would have let through, got {outcome:?}"
    );
    Ok(())
}

async fn transitions_of_an_absent_key_are_rejected_without_a_record<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    for transition in [
        complete("nope", "t1", b"1", 1),
        fail("nope", "t1"),
        extend("nope", "t1"),
    ] {
        ensure_eq!(
            c.store.transition(&transition).await?,
            WriteOutcome::Rejected(None),
            "a {} of an absent key",
            transition.change.op(false)
        );
    }
    ensure_eq!(
        c.store.get("nope").await?,
        None,
        "a rejected transition must not create a record"
    );
    Ok(())
}

async fn a_retried_transition_that_landed_is_rejected_with_our_token<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    let expires = NOW / 1000 + 86_400;
    c.pending("done", "t1").await?;
    c.store
        .transition(&complete("done", "t1", b"first", expires))
        .await?;
    // Sent again (its response was lost, say): the record is no longer PENDING, and it shows that our
    // own completion landed.
    let again = c
        .store
        .transition(&complete("done", "t1", b"second", expires))
        .await?;
    ensure!(
        matches!(&again, WriteOutcome::Rejected(Some(r))
            if r.status == Status::Completed && r.token == "t1" && r.response.as_deref() == Some(&b"first"[..])),
        "a completion sent again after it landed must be rejected with the record showing our token and first response, got {again:?}"
    );
    ensure_eq!(
        c.record("done").await?.response.as_deref(),
        Some(&b"first"[..]),
        "the first completion's response stays"
    );

    c.pending("failed", "t1").await?;
    c.store.transition(&fail("failed", "t1")).await?;
    let again = c.store.transition(&fail("failed", "t1")).await?;
    ensure!(
        matches!(&again, WriteOutcome::Rejected(Some(r)) if r.status == Status::Failed && r.token == "t1"),
        "a failure sent again after it landed must be rejected with the record showing our token, got {again:?}"
    );
    Ok(())
}

async fn a_failed_record_is_claimable_at_once<S: Store>(c: Context<S>) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    c.store.transition(&fail("k", "t1")).await?;
    ensure_eq!(
        c.store.claim(&claim("k", "t2", NOW + 1)).await?,
        ClaimOutcome::Claimed,
        "a claim of a FAILED key"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.token.as_str(), r.attempt),
        (Status::Pending, "t2", 2),
        "status, token and attempt after claiming a FAILED key"
    );
    ensure_eq!(r.error, None, "a new claim clears the old error");
    ensure_eq!(
        r.lease_until_ms,
        Some(NOW + 1 + LEASE),
        "the new claim's lease"
    );
    Ok(())
}

async fn an_expired_record_is_claimable<S: Store>(c: Context<S>) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let expires_s = NOW / 1000 + 10;
    c.store
        .transition(&complete("k", "t1", b"1", expires_s))
        .await?;
    let outcome = c.store.claim(&claim("k", "t2", expires_s * 1000)).await?;
    ensure!(
        is_existing(&outcome),
        "a record is live in its expiry second, got {outcome:?}"
    );
    let later = (expires_s + 1) * 1000;
    ensure_eq!(
        c.store.claim(&claim("k", "t3", later)).await?,
        ClaimOutcome::Claimed,
        "a claim of a COMPLETED record after its `expires_at_s`"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.token.as_str(), r.attempt),
        (Status::Pending, "t3", 2),
        "status, token and attempt after claiming an expired key"
    );
    ensure_eq!(r.response, None, "a new claim clears the old response");
    Ok(())
}

async fn expiry_is_decided_by_the_claims_clock<S: Store>(c: Context<S>) -> Result<(), Violation> {
    // A record that expires while its lease still runs: expiry alone makes it claimable, whatever the
    // store's own clock or TTL process thinks (it still holds the record).
    let expires_s = NOW / 1000 + 10;
    let mut request = claim("k", "t1", NOW);
    request.lease_until_ms = NOW + 100 * LEASE;
    request.expires_at_s = expires_s;
    ensure_eq!(
        c.store.claim(&request).await?,
        ClaimOutcome::Claimed,
        "a claim of a new key"
    );
    let outcome = c
        .store
        .claim(&claim("k", "t2", expires_s * 1000 + 999))
        .await?;
    ensure!(
        is_existing(&outcome),
        "a record is live up to the end of its expiry second, got {outcome:?}"
    );
    ensure_eq!(
        c.store
            .claim(&claim("k", "t3", (expires_s + 1) * 1000))
            .await?,
        ClaimOutcome::Claimed,
        "a claim after `expires_at_s` of a PENDING record whose lease still runs"
    );
    ensure_eq!(c.record("k").await?.token, "t3", "the new holder's token");
    Ok(())
}

async fn a_pending_record_is_claimable_once_its_lease_ran_out<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    let outcome = c.store.claim(&claim("k", "t2", NOW + LEASE)).await?;
    ensure!(
        is_existing(&outcome),
        "the lease is live up to and including `lease_until_ms`, got {outcome:?}"
    );
    ensure_eq!(
        c.store.claim(&claim("k", "t2", NOW + LEASE + 1)).await?,
        ClaimOutcome::Claimed,
        "a claim one millisecond after the lease ran out"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.token.as_str(), r.attempt),
        ("t2", 2),
        "token and attempt after a takeover"
    );
    Ok(())
}

async fn a_stale_token_cannot_complete_or_fail_after_a_takeover<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.pending("k", "old").await?;
    ensure_eq!(
        c.store.claim(&claim("k", "new", NOW + LEASE + 1)).await?,
        ClaimOutcome::Claimed,
        "a takeover after the lease"
    );
    let taken = c.record("k").await?;
    let late = c
        .store
        .transition(&complete("k", "old", b"old", u64::MAX / 2))
        .await?;
    ensure_eq!(
        late,
        WriteOutcome::Rejected(Some(taken.clone())),
        "the old holder's completion after a takeover"
    );
    ensure_eq!(
        c.store.transition(&fail("k", "old")).await?,
        WriteOutcome::Rejected(Some(taken)),
        "the old holder's failure after a takeover"
    );
    ensure_eq!(
        c.store
            .transition(&complete("k", "new", b"new", u64::MAX / 2))
            .await?,
        WriteOutcome::Applied,
        "the new holder's completion"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.token.as_str(), r.response.as_deref()),
        ("new", Some(&b"new"[..])),
        "the new holder's result is stored"
    );
    Ok(())
}

async fn a_claim_without_a_fingerprint_clears_the_old_one<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    c.store.transition(&fail("k", "t1")).await?;
    let mut request = claim("k", "t2", NOW + 1);
    request.fingerprint = None;
    ensure_eq!(
        c.store.claim(&request).await?,
        ClaimOutcome::Claimed,
        "a claim of a FAILED key"
    );
    ensure_eq!(
        c.record("k").await?.fingerprint,
        None,
        "a claim without a fingerprint"
    );
    Ok(())
}

async fn a_plain_claim_keeps_claim_writes_in_effect_as_they_were<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.pending("k", "t1").await?;
    ensure!(
        !c.record("k").await?.claim_writes_in_effect,
        "a plain claim must not mark claim-time writes as in effect"
    );
    c.store.transition(&fail("k", "t1")).await?;
    c.store.claim(&claim("k", "t2", NOW + 1)).await?;
    ensure!(
        !c.record("k").await?.claim_writes_in_effect,
        "a plain re-claim must not mark claim-time writes as in effect"
    );
    Ok(())
}

/// A claim of an operation with steps that starts afresh, with `initial` as its steps.
fn fresh<'a>(key: &'a str, token: &'a str, now_ms: u64, initial: &'a [u8]) -> ClaimRequest<'a> {
    let mut request = claim(key, token, now_ms);
    request.steps = StepsClaim::Fresh {
        initial,
        restarts: None,
    };
    request
}

/// A claim of an operation with steps that resumes the steps `seen`.
fn resume<'a>(key: &'a str, token: &'a str, now_ms: u64, seen: &'a [u8]) -> ClaimRequest<'a> {
    let mut request = claim(key, token, now_ms);
    request.steps = StepsClaim::Resume {
        steps: seen,
        restart_failed: false,
    };
    request
}

/// A step's write of `steps`, in place of `previous`.
fn save_steps<'a>(
    key: &'a str,
    token: &'a str,
    previous: &'a [u8],
    steps: &'a [u8],
) -> Transition<'a> {
    Transition::new(key, token, Change::SaveSteps { steps, previous })
}

async fn steps_are_stored_under_the_token_and_removed_by_completion<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    ensure_eq!(
        c.store.claim(&fresh("k", "t1", NOW, b"origin")).await?,
        ClaimOutcome::Claimed,
        "a fresh claim with steps of a new key"
    );
    ensure_eq!(
        c.record("k").await?.steps.as_deref(),
        Some(&b"origin"[..]),
        "the steps a fresh claim stores"
    );
    ensure_eq!(
        c.store
            .transition(&save_steps("k", "t1", b"origin", b"one"))
            .await?,
        WriteOutcome::Applied,
        "a step's write by the claim's own token"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.token.as_str(), r.steps.as_deref()),
        (Status::Pending, "t1", Some(&b"one"[..])),
        "status, token and steps after a step's write"
    );
    let rejected = c
        .store
        .transition(&save_steps("k", "t2", b"one", b"two"))
        .await?;
    ensure_eq!(
        rejected,
        WriteOutcome::Rejected(Some(r)),
        "a step's write under another token"
    );
    c.store
        .transition(&complete("k", "t1", b"{}", NOW / 1000 + 60))
        .await?;
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.steps),
        (Status::Completed, None),
        "a completion removes the steps"
    );
    Ok(())
}

async fn a_step_write_is_made_only_on_the_steps_it_extends<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.store.claim(&fresh("k", "t1", NOW, b"origin")).await?;
    ensure_eq!(
        c.store
            .transition(&save_steps("k", "t1", b"origin", b"one"))
            .await?,
        WriteOutcome::Applied,
        "a step's write on the steps the claim stored"
    );
    ensure_eq!(
        c.store
            .transition(&save_steps("k", "t1", b"one", b"two"))
            .await?,
        WriteOutcome::Applied,
        "the next step's write, on the steps the first one stored"
    );
    let r = c.record("k").await?;
    // The first write's copy that the caller gave up on, applied late: it must not move the steps
    // back (the caller resuming from them would run the second step again).
    ensure_eq!(
        c.store
            .transition(&save_steps("k", "t1", b"origin", b"one"))
            .await?,
        WriteOutcome::Rejected(Some(r.clone())),
        "a late copy of an earlier step's write (its `previous` is no longer stored)"
    );
    // The second write sent again after it landed: rejected, with the record holding its steps
    // under its token, from which the caller knows that it landed.
    ensure_eq!(
        c.store
            .transition(&save_steps("k", "t1", b"one", b"two"))
            .await?,
        WriteOutcome::Rejected(Some(r.clone())),
        "a step's write sent again after it landed"
    );
    ensure_eq!(
        c.store
            .transition(&save_steps("k", "t1", b"never", b"three"))
            .await?,
        WriteOutcome::Rejected(Some(r.clone())),
        "a step's write on steps the record never held"
    );
    ensure_eq!(
        c.record("k").await?,
        r,
        "the record after the rejected step writes"
    );
    // A record without steps (claimed by an operation without them) takes no step write.
    c.store.claim(&claim("plain", "t2", NOW)).await?;
    let plain = c.record("plain").await?;
    ensure_eq!(
        c.store
            .transition(&save_steps("plain", "t2", b"origin", b"one"))
            .await?,
        WriteOutcome::Rejected(Some(plain)),
        "a step's write on a record without steps"
    );
    Ok(())
}

async fn a_fresh_claim_with_steps_is_refused_by_live_steps<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.store.claim(&fresh("k", "t1", NOW, b"origin")).await?;
    c.store
        .transition(&save_steps("k", "t1", b"origin", b"one"))
        .await?;
    c.store.transition(&fail("k", "t1")).await?;
    let failed = c.record("k").await?;
    ensure_eq!(
        c.store.claim(&fresh("k", "t2", NOW + 1, b"again")).await?,
        ClaimOutcome::Existing(failed.clone()),
        "a fresh claim with steps of a FAILED record whose steps live on"
    );
    // A restart after a failure replaces exactly the steps it judged restartable: not others (a
    // late copy of a claim, after another call restarted or pinned the operation).
    let restart = |seen: &'static [u8]| {
        let mut r = claim("k", "t4", NOW + 2);
        r.steps = StepsClaim::Fresh {
            initial: b"anew",
            restarts: Some(seen),
        };
        r
    };
    ensure_eq!(
        c.store.claim(&restart(b"origin")).await?,
        ClaimOutcome::Existing(failed.clone()),
        "a fresh claim that restarts after a failure whose steps are no longer those stored"
    );
    ensure_eq!(
        c.store.claim(&restart(b"one")).await?,
        ClaimOutcome::Claimed,
        "a fresh claim that restarts after a failure, of the FAILED record with the steps it saw"
    );
    ensure_eq!(
        c.record("k").await?.steps.as_deref(),
        Some(&b"anew"[..]),
        "the steps after a fresh claim replaced them"
    );
    // Expired: a new operation, whose fresh claim replaces the steps.
    c.store
        .transition(&save_steps("k", "t4", b"anew", b"old"))
        .await?;
    c.store.transition(&fail("k", "t4")).await?;
    let past = (c.record("k").await?.expires_at_s + 1) * 1000;
    ensure_eq!(
        c.store.claim(&fresh("k", "t5", past, b"new")).await?,
        ClaimOutcome::Claimed,
        "a fresh claim with steps of an expired record"
    );
    ensure_eq!(
        c.record("k").await?.steps.as_deref(),
        Some(&b"new"[..]),
        "the steps of an expired record after a fresh claim"
    );
    Ok(())
}

async fn a_claim_that_starts_a_new_operation_removes_its_steps<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    c.store.claim(&fresh("k", "t1", NOW, b"origin")).await?;
    c.store
        .transition(&save_steps("k", "t1", b"origin", b"one"))
        .await?;
    c.store.transition(&fail("k", "t1")).await?;
    // Not expired: code without steps (another deploy, a job) never takes over an operation run
    // with steps, whose finished steps its body would run again; the steps stay for a call with
    // steps to resume.
    let failed = c.record("k").await?;
    ensure_eq!(
        c.store.claim(&claim("k", "t2", NOW + 1)).await?,
        ClaimOutcome::Existing(failed.clone()),
        "a claim without steps of a FAILED record whose steps live on"
    );
    ensure_eq!(
        c.record("k").await?,
        failed,
        "the record after a refused claim without steps"
    );
    // Expired: the claim starts a new operation, which must not inherit the old one's steps.
    let past = (failed.expires_at_s + 1) * 1000;
    ensure_eq!(
        c.store.claim(&claim("k", "t3", past)).await?,
        ClaimOutcome::Claimed,
        "a claim without steps of an expired record with steps"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.token.as_str(), r.steps),
        (Status::Pending, "t3", None),
        "status, token and steps after a claim without steps of an expired record"
    );
    Ok(())
}

async fn a_resume_needs_exactly_the_steps_it_read<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    let outcome = c.store.claim(&resume("absent", "t0", NOW, b"one")).await;
    ensure!(
        matches!(outcome, Err(StoreError::Corrupt(_))),
        "a resume of an absent key must be refused with `StoreError::Corrupt`, got {outcome:?}"
    );
    ensure!(
        c.store.get("absent").await?.is_none(),
        "a refused resume must write nothing"
    );
    c.store.claim(&fresh("k", "t1", NOW, b"origin")).await?;
    c.store
        .transition(&save_steps("k", "t1", b"origin", b"one"))
        .await?;
    c.store.transition(&fail("k", "t1")).await?;
    let failed = c.record("k").await?;
    ensure_eq!(
        c.store
            .claim(&resume("k", "t2", NOW + 1, b"origin"))
            .await?,
        ClaimOutcome::Existing(failed.clone()),
        "a resume whose steps are not those stored (a step was stored since they were read)"
    );
    let past = (failed.expires_at_s + 1) * 1000;
    ensure_eq!(
        c.store.claim(&resume("k", "t2", past, b"one")).await?,
        ClaimOutcome::Existing(failed.clone()),
        "a resume of an expired record (a new operation)"
    );
    ensure_eq!(
        c.store
            .claim(&restarting(resume("k", "t2", NOW + 1, b"one")))
            .await?,
        ClaimOutcome::Existing(failed),
        "a resume of a FAILED record by an operation that restarts after a failure"
    );
    ensure_eq!(
        c.store.claim(&resume("k", "t3", NOW + 1, b"one")).await?,
        ClaimOutcome::Claimed,
        "a resume with the steps stored"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.token.as_str(), r.steps.as_deref()),
        (Status::Pending, "t3", Some(&b"one"[..])),
        "status, token and steps after a resume"
    );
    // A worker that stopped holding them: its lapsed claim is resumed, even by an operation that
    // restarts after a failure (a lapsed claim is no failure).
    ensure_eq!(
        c.store
            .claim(&restarting(resume("k", "t4", NOW + 1 + LEASE + 1, b"one")))
            .await?,
        ClaimOutcome::Claimed,
        "a resume of a lapsed PENDING record by an operation that restarts after a failure"
    );
    ensure_eq!(
        c.record("k").await?.steps.as_deref(),
        Some(&b"one"[..]),
        "the steps after resuming a lapsed claim"
    );
    Ok(())
}

/// `request` for an operation that restarts from scratch after a failure
/// (`restart_steps_after_failure`).
fn restarting(mut request: ClaimRequest<'_>) -> ClaimRequest<'_> {
    let steps = match request.steps {
        StepsClaim::Fresh { initial, .. } => StepsClaim::Fresh {
            initial,
            restarts: None,
        },
        StepsClaim::Resume { steps, .. } => StepsClaim::Resume {
            steps,
            restart_failed: true,
        },
        StepsClaim::Untouched => StepsClaim::Untouched,
    };
    request.steps = steps;
    request
}

/// A release mark ([`Change::Release`](crate::store::Change::Release)) sent by a call whose claim is
/// still in flight: on an absent record it writes a FAILED one under the call's token, which the call's
/// claim, landing afterwards, does not overwrite; another call's claim takes the key at once. Any
/// record at all rejects a mark, returned as it is.
async fn a_release_before_its_claim_landed_refuses_that_claim<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    ensure_eq!(
        c.store.transition(&release("gone", "t1")).await?,
        WriteOutcome::Applied,
        "a release mark on an absent key"
    );
    let mark = c.record("gone").await?;
    ensure!(
        mark.status == Status::Failed
            && mark.token == "t1"
            && mark.released == ["t1"]
            && mark.released_until_ms == Some(NOW + LEASE),
        "the mark is FAILED under the releasing call's token, its only released one, until the \
         claim's end, got {mark:?}"
    );
    let late = c.store.claim(&claim("gone", "t1", NOW)).await?;
    ensure!(
        matches!(&late, ClaimOutcome::Existing(r) if r.status == Status::Failed && r.token == "t1"),
        "the released call's late claim must be refused by its mark, got {late:?}"
    );
    ensure_eq!(
        c.store.claim(&claim("gone", "t2", NOW)).await?,
        ClaimOutcome::Claimed,
        "another call claims the released key at once"
    );
    ensure_eq!(
        c.record("gone").await?.attempt,
        1,
        "the mark is no claim attempt: the next claim is the first"
    );

    for (key, holder) in [("mine", "t1"), ("theirs", "t2")] {
        c.pending(key, holder).await?;
        let rejected = c.store.transition(&release(key, "t1")).await?;
        ensure!(
            matches!(&rejected, WriteOutcome::Rejected(Some(r)) if r.token == holder && r.status == Status::Pending),
            "a release mark on a record (here {holder}'s claim) is rejected with it, got {rejected:?}"
        );
    }
    Ok(())
}

#[allow(
    clippy::too_many_lines,
    reason = "one contract, case by case in the order a record meets them"
)]
async fn a_token_released_on_a_record_is_refused_by_it<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    // Until when each released call's claim can hold the key.
    let (until_1, until_4) = (NOW + LEASE, NOW + 2 * LEASE);
    // On another call's FAILED record: the token joins the released ones, their end and the
    // record's expiry reach the claim's end, nothing else changes; the released call's claim is
    // refused, another call's is not, and keeps the token and its end.
    c.pending("failed", "t2").await?;
    c.store.transition(&fail("failed", "t2")).await?;
    let before = c.record("failed").await?;
    ensure_eq!(
        c.store
            .transition(&mark_released("failed", "t1", NOW, Some(&before), until_1))
            .await?,
        WriteOutcome::Applied,
        "a token left on another call's FAILED record"
    );
    let marked = c.record("failed").await?;
    let mut expected = before.clone();
    expected.released = vec!["t1".to_owned()];
    expected.released_until_ms = Some(until_1);
    expected.expires_at_s = before.expires_at_s.max(until_1.div_ceil(1000));
    ensure_eq!(marked, expected, "a released token changes nothing else");
    let late = c.store.claim(&claim("failed", "t1", NOW)).await?;
    ensure!(
        matches!(&late, ClaimOutcome::Existing(r) if r.token == "t2"),
        "a claim under a released token must be refused, got {late:?}"
    );
    c.pending("failed", "t3").await?;
    let claimed = c.record("failed").await?;
    ensure!(
        claimed.released == ["t1"] && claimed.released_until_ms == Some(until_1),
        "a claim keeps the released tokens and their end, got {claimed:?}"
    );
    // On a live claim of another call: the token waits there until the claim lapses; the claim's
    // lease, token, status and expiry are left as they are.
    ensure_eq!(
        c.store
            .transition(&mark_released("failed", "t4", NOW, Some(&claimed), until_4))
            .await?,
        WriteOutcome::Applied,
        "a token left on another call's live claim"
    );
    let record = c.record("failed").await?;
    let mut expected = claimed.clone();
    expected.released = vec!["t1".to_owned(), "t4".to_owned()];
    expected.released_until_ms = Some(until_4);
    expected.expires_at_s = claimed.expires_at_s.max(until_4.div_ceil(1000));
    let mut got = record.clone();
    got.released.sort();
    ensure_eq!(
        got,
        expected,
        "a mark on a live claim changes nothing but the released tokens and their end (its expiry \
         is already later)"
    );
    let after_lease = NOW + LEASE + 1;
    let late = c.store.claim(&claim("failed", "t4", after_lease)).await?;
    ensure!(
        matches!(&late, ClaimOutcome::Existing(r) if r.token == "t3"),
        "a claim under a released token must be refused after the lease too, got {late:?}"
    );
    // A mark computed from a record that has changed since (its end, or its expiry alone: a claim
    // made since sets a later one, which the mark must not cut short) is rejected with it.
    ensure_eq!(
        c.store
            .transition(&mark_released("failed", "t6", NOW, Some(&claimed), until_1))
            .await?,
        WriteOutcome::Rejected(Some(record.clone())),
        "a mark computed from an earlier read of the record"
    );
    let mut earlier = record.clone();
    earlier.expires_at_s = record.expires_at_s - 1;
    ensure_eq!(
        c.store
            .transition(&mark_released("failed", "t6", NOW, Some(&earlier), until_4))
            .await?,
        WriteOutcome::Rejected(Some(record.clone())),
        "a mark computed from a read of the record with another expiry"
    );
    // Left twice, it is held once.
    c.store
        .transition(&mark_released("failed", "t4", NOW, Some(&record), until_4))
        .await?;
    let record = c.record("failed").await?;
    ensure_eq!(record.released.len(), 2, "each token once: {record:?}");
    // A completion removes them: the record is final until it expires.
    c.store
        .transition(&complete("failed", "t3", b"{}", NOW / 1000 + 60))
        .await?;
    let completed = c.record("failed").await?;
    ensure!(
        completed.released.is_empty()
            && completed.released_until_ms.is_none()
            && completed.expires_at_s == until_4.div_ceil(1000),
        "a completion removes the released tokens and their end, and keeps the record until that \
         end, got {completed:?}"
    );
    // Rejected, returned as they are: a token on a live COMPLETED record, a claim under the token
    // itself, no record.
    let joining = Transition::new(
        "failed",
        "t5",
        Change::MarkReleased {
            now_ms: NOW,
            released_until_ms: until_1,
            expires_at_s: completed.expires_at_s,
            seen_until_ms: None,
            seen_expires_at_s: completed.expires_at_s,
            marking: Marking::Join,
        },
    );
    ensure_eq!(
        c.store.transition(&joining).await?,
        WriteOutcome::Rejected(Some(completed.clone())),
        "a live COMPLETED record is final: it takes no released token"
    );
    c.pending("mine", "t1").await?;
    let mine = c.record("mine").await?;
    ensure_eq!(
        c.store
            .transition(&mark_released("mine", "t1", NOW, Some(&mine), until_1))
            .await?,
        WriteOutcome::Rejected(Some(mine)),
        "a claim under the token itself landed: it is failed, not marked"
    );
    ensure_eq!(
        c.store
            .transition(&mark_released("absent", "t1", NOW, None, until_1))
            .await?,
        WriteOutcome::Rejected(None),
        "no record: a release mark is written instead"
    );
    // An expired record takes no mark (raising its expiry would bring it back: a new operation
    // would find the old response): a release replaces it, as where there is none, with nothing of
    // the old record left.
    let expired_ms = (completed.expires_at_s + 1) * 1000;
    let until_5 = expired_ms + LEASE;
    ensure_eq!(
        c.store
            .transition(&mark_released(
                "failed",
                "t5",
                expired_ms,
                Some(&completed),
                until_5
            ))
            .await?,
        WriteOutcome::Rejected(Some(completed.clone())),
        "an expired COMPLETED record takes no released token"
    );
    let release = Transition::new(
        "failed",
        "t5",
        Change::Release {
            now_ms: expired_ms,
            error: "released",
            expires_at_s: until_5.div_ceil(1000) + 60,
            released_until_ms: until_5,
        },
    );
    ensure_eq!(
        c.store.transition(&release).await?,
        WriteOutcome::Applied,
        "a release replaces an expired COMPLETED record"
    );
    let replaced = c.record("failed").await?;
    let mut expected = Record::new("failed", Status::Failed, "t5", until_5.div_ceil(1000) + 60);
    expected.attempt = 0;
    expected.error = Some("released".to_owned());
    expected.released = vec!["t5".to_owned()];
    expected.released_until_ms = Some(until_5);
    ensure_eq!(
        replaced,
        expected,
        "the release's mark in place of the expired record, nothing of it left"
    );
    ensure_eq!(
        c.store.transition(&release).await?,
        WriteOutcome::Rejected(Some(replaced.clone())),
        "a live record rejects a release"
    );
    // A record holding MAX_RELEASED tokens, some of which can still hold the key, takes one more as
    // its `released_through` (every token up to it refused), which only rises; once all of them are
    // stale, a mark replaces them and removes it.
    let full = fill_released(&c, "full", false).await?;
    ensure_eq!(
        c.store
            .transition(&mark_released("full", "r20", NOW, Some(&full), until_4))
            .await?,
        WriteOutcome::Applied,
        "a record holding MAX_RELEASED tokens that can still hold the key takes one more as its \
         released_through"
    );
    let through = c.record("full").await?;
    let mut expected = full.clone();
    expected.released_through = Some("r20".to_owned());
    expected.released_until_ms = Some(until_4);
    expected.expires_at_s = full.expires_at_s.max(until_4.div_ceil(1000));
    ensure_eq!(
        through,
        expected,
        "a raise of released_through changes nothing else"
    );
    let Change::MarkReleased {
        now_ms,
        released_until_ms,
        expires_at_s,
        seen_until_ms,
        seen_expires_at_s,
        ..
    } = mark_released("full", "r19", NOW, Some(&through), until_4).change
    else {
        unreachable!("a mark")
    };
    let lower = Change::MarkReleased {
        now_ms,
        released_until_ms,
        expires_at_s,
        seen_until_ms,
        seen_expires_at_s,
        marking: Marking::Through,
    };
    ensure_eq!(
        c.store
            .transition(&Transition::new("full", "r19", lower))
            .await?,
        WriteOutcome::Rejected(Some(through.clone())),
        "a token no greater than released_through is refused already: no mark lowers it"
    );
    ensure_eq!(
        c.store
            .transition(&mark_released("full", "r25", NOW, Some(&through), until_4))
            .await?,
        WriteOutcome::Applied,
        "a greater token raises released_through"
    );
    let raised = c.record("full").await?;
    ensure!(
        raised.released_through.as_deref() == Some("r25")
            && raised.released.len() == crate::MAX_RELEASED,
        "released_through raised to the greater token, the tokens kept, got {raised:?}"
    );
    // A token greater than released_through (one no greater is refused already: its end is raised).
    let stale_ms = until_4 + 1;
    ensure_eq!(
        c.store
            .transition(&mark_released(
                "full",
                "s-more",
                stale_ms,
                Some(&raised),
                stale_ms + LEASE
            ))
            .await?,
        WriteOutcome::Applied,
        "once every released token is stale, a mark replaces them"
    );
    let replaced = c.record("full").await?;
    ensure!(
        replaced.released == ["s-more"]
            && replaced.released_until_ms == Some(stale_ms + LEASE)
            && replaced.released_through.is_none(),
        "the stale tokens and released_through replaced by the new token, got {replaced:?}"
    );
    let late = c
        .store
        .claim(&claim("full", "s-more", stale_ms + 1))
        .await?;
    ensure!(
        matches!(&late, ClaimOutcome::Existing(r) if r.token == "owner"),
        "a claim under the new token is refused, got {late:?}"
    );
    // On a claimable record: a claim under any token up to released_through is refused, a greater
    // one claims it and keeps it; a completion removes it.
    let full = fill_released(&c, "through", true).await?;
    c.store
        .transition(&mark_released("through", "r20", NOW, Some(&full), until_1))
        .await?;
    for token in ["r00", "r18", "r20"] {
        let late = c.store.claim(&claim("through", token, NOW)).await?;
        ensure!(
            matches!(&late, ClaimOutcome::Existing(r) if r.token == "owner" && r.status == Status::Failed),
            "a claim under `{token}`, no greater than released_through `r20`, must be refused, got {late:?}"
        );
    }
    // A release whose token the record refuses already, but not until its claim's end, raises the
    // end and the expiry alone.
    let raised = c.record("through").await?;
    ensure_eq!(
        c.store
            .transition(&mark_released(
                "through",
                "r18",
                NOW,
                Some(&raised),
                until_4
            ))
            .await?,
        WriteOutcome::Applied,
        "a token refused already raises the end and the expiry"
    );
    let extended = c.record("through").await?;
    let mut expected = raised.clone();
    expected.released_until_ms = Some(until_4);
    expected.expires_at_s = raised.expires_at_s.max(until_4.div_ceil(1000));
    ensure_eq!(extended, expected, "raising the end changes nothing else");
    c.pending("through", "r21").await?;
    let claimed = c.record("through").await?;
    ensure!(
        claimed.released_through.as_deref() == Some("r20")
            && claimed.released.len() == crate::MAX_RELEASED,
        "a claim keeps released_through and the released tokens, got {claimed:?}"
    );
    c.store
        .transition(&complete("through", "r21", b"{}", NOW / 1000 + 60))
        .await?;
    let completed = c.record("through").await?;
    ensure!(
        completed.released.is_empty()
            && completed.released_until_ms.is_none()
            && completed.released_through.is_none(),
        "a completion removes released_through with the tokens, got {completed:?}"
    );
    Ok(())
}

/// A heartbeat, a failure, a claim and a completion each give the record an expiry no earlier than
/// the end of its released tokens, though they ask for an earlier one (a short `failed_ttl`, a `ttl`
/// shorter than a lease, a lease cut by a deadline): TTL must not delete the record, and with it the marks, while a claim they keep out could
/// still land. A completion drops the marks (a live COMPLETED record refuses every claim) and keeps
/// that expiry.
async fn transitions_keep_the_record_until_its_released_tokens_end<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    // A millisecond past a whole second: the expiry is the next second.
    let until = NOW + 2 * LEASE + 1;
    let outliving = until.div_ceil(1000);
    c.pending("k", "t1").await?;
    let seen = c.record("k").await?;
    c.store
        .transition(&mark_released("k", "r1", NOW, Some(&seen), until))
        .await?;
    let short = NOW / 1000 + 5;
    let heartbeat = Transition::new(
        "k",
        "t1",
        Change::ExtendLease {
            lease_until_ms: NOW + LEASE,
            expires_at_s: short,
        },
    );
    ensure_eq!(
        c.store.transition(&heartbeat).await?,
        WriteOutcome::Applied,
        "a heartbeat whose expiry is before the released tokens' end"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.lease_until_ms, r.expires_at_s, r.released_until_ms),
        (Some(NOW + LEASE), outliving, Some(until)),
        "a heartbeat keeps the record until its released tokens' end"
    );
    let failure = Transition::new(
        "k",
        "t1",
        Change::Fail {
            error: "declined",
            expires_at_s: short,
            release_claim_writes: false,
        },
    );
    ensure_eq!(
        c.store.transition(&failure).await?,
        WriteOutcome::Applied,
        "a failure whose expiry is before the released tokens' end"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.expires_at_s, r.released.clone()),
        (Status::Failed, outliving, vec!["r1".to_owned()]),
        "a failure keeps the record, and the released token, until their end"
    );
    // A takeover whose own expiry is earlier (a short ttl, or a lease cut by a deadline) keeps the
    // released tokens and the record until their end.
    let short_claim = ClaimRequest::new("k", "t2", NOW, NOW + LEASE, short);
    ensure_eq!(
        c.store.claim(&short_claim).await?,
        ClaimOutcome::Claimed,
        "a takeover of the FAILED record whose expiry is before the released tokens' end"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (r.status, r.expires_at_s, r.released.clone()),
        (Status::Pending, outliving, vec!["r1".to_owned()]),
        "a claim keeps the record, and the released token, until their end"
    );
    ensure_eq!(
        c.store
            .transition(&complete("k", "t2", b"{}", short))
            .await?,
        WriteOutcome::Applied,
        "a completion whose expiry is before the released tokens' end"
    );
    let r = c.record("k").await?;
    ensure_eq!(
        (
            r.status,
            r.expires_at_s,
            r.released.len(),
            r.released_until_ms
        ),
        (Status::Completed, outliving, 0, None),
        "a completion drops the released tokens and keeps the record until their end"
    );
    later_expiries_and_other_tokens_are_left_alone(&c, until, short).await
}

/// The rest of [`transitions_keep_the_record_until_its_released_tokens_end`]: an expiry later than
/// the released tokens' end is kept as asked, and the rule lets no other token through.
async fn later_expiries_and_other_tokens_are_left_alone<S: Store>(
    c: &Context<S>,
    until: u64,
    short: u64,
) -> Result<(), Violation> {
    let outliving = until.div_ceil(1000);
    // An expiry already past the end is kept as asked.
    c.pending("later", "t1").await?;
    let seen = c.record("later").await?;
    c.store
        .transition(&mark_released("later", "r1", NOW, Some(&seen), until))
        .await?;
    ensure_eq!(
        c.store
            .transition(&complete("later", "t1", b"{}", outliving + 600))
            .await?,
        WriteOutcome::Applied,
        "a completion that outlives the released tokens"
    );
    ensure_eq!(
        c.record("later").await?.expires_at_s,
        outliving + 600,
        "the completion's own expiry, later than the end"
    );
    // The rule does not let another token through.
    c.pending("other", "t1").await?;
    let seen = c.record("other").await?;
    c.store
        .transition(&mark_released("other", "r1", NOW, Some(&seen), until))
        .await?;
    let held = c.record("other").await?;
    ensure_eq!(
        c.store
            .transition(&complete("other", "t9", b"{}", short))
            .await?,
        WriteOutcome::Rejected(Some(held)),
        "a completion under another token, refused as before"
    );
    Ok(())
}

/// A release that finds a live COMPLETED record expiring before its claim's end keeps the record
/// until then ([`Marking::KeepCompleted`]): only the expiry changes, and only on a live COMPLETED
/// record still holding the expiry the release read; any other record refuses it.
async fn a_completed_record_is_kept_until_a_released_claims_end<S: Store>(
    c: Context<S>,
) -> Result<(), Violation> {
    // A millisecond past a whole second: the expiry is the next second.
    let until = NOW + 2 * LEASE + 1;
    c.pending("k", "t1").await?;
    c.store
        .transition(&complete("k", "t1", b"{}", NOW / 1000 + 5))
        .await?;
    let completed = c.record("k").await?;
    let keep = mark_released("k", "r1", NOW, Some(&completed), until);
    ensure!(
        matches!(
            keep.change,
            Change::MarkReleased {
                marking: Marking::KeepCompleted,
                ..
            }
        ),
        "a release on a COMPLETED record keeps it: {keep:?}"
    );
    ensure_eq!(
        c.store.transition(&keep).await?,
        WriteOutcome::Applied,
        "a live COMPLETED record expiring before the claim's end"
    );
    let kept = c.record("k").await?;
    let mut expected = completed.clone();
    expected.expires_at_s = until.div_ceil(1000);
    ensure_eq!(
        kept,
        expected,
        "only the expiry is raised, to the claim's end"
    );
    ensure_eq!(
        c.store.transition(&keep).await?,
        WriteOutcome::Rejected(Some(kept.clone())),
        "a keep computed from another expiry"
    );
    // Expired: a release replaces it instead.
    let expired_ms = (kept.expires_at_s + 1) * 1000;
    let late = mark_released("k", "r2", expired_ms, Some(&kept), expired_ms + LEASE);
    ensure_eq!(
        c.store.transition(&late).await?,
        WriteOutcome::Rejected(Some(kept.clone())),
        "an expired COMPLETED record is not kept"
    );
    // Any other record refuses it: PENDING, FAILED.
    c.pending("pending", "t1").await?;
    let pending = c.record("pending").await?;
    let wrong = Transition::new(
        "pending",
        "r1",
        Change::MarkReleased {
            now_ms: NOW,
            released_until_ms: until,
            expires_at_s: until.div_ceil(1000),
            seen_until_ms: pending.released_until_ms,
            seen_expires_at_s: pending.expires_at_s,
            marking: Marking::KeepCompleted,
        },
    );
    ensure_eq!(
        c.store.transition(&wrong).await?,
        WriteOutcome::Rejected(Some(pending)),
        "a PENDING record is not kept as a COMPLETED one"
    );
    c.store.transition(&fail("pending", "t1")).await?;
    let failed = c.record("pending").await?;
    let wrong = Transition::new(
        "pending",
        "r1",
        Change::MarkReleased {
            now_ms: NOW,
            released_until_ms: until,
            expires_at_s: until.div_ceil(1000),
            seen_until_ms: failed.released_until_ms,
            seen_expires_at_s: failed.expires_at_s,
            marking: Marking::KeepCompleted,
        },
    );
    ensure_eq!(
        c.store.transition(&wrong).await?,
        WriteOutcome::Rejected(Some(failed)),
        "a FAILED record is not kept as a COMPLETED one"
    );
    Ok(())
}

/// Claims `key` under `owner` (and fails it if `failed`), then leaves [`MAX_RELEASED`](crate::MAX_RELEASED)
/// released tokens on it (`r00` to `r15`, each a claim that can hold the key until a lease after
/// [`NOW`]), and returns the record.
async fn fill_released<S: Store>(
    c: &Context<S>,
    key: &str,
    failed: bool,
) -> Result<Record, Violation> {
    c.pending(key, "owner").await?;
    if failed {
        c.store.transition(&fail(key, "owner")).await?;
    }
    for i in 0..crate::MAX_RELEASED {
        let seen = c.record(key).await?;
        c.store
            .transition(&mark_released(
                key,
                &format!("r{i:02}"),
                NOW,
                Some(&seen),
                NOW + LEASE,
            ))
            .await?;
    }
    let full = c.record(key).await?;
    ensure_eq!(full.released.len(), crate::MAX_RELEASED, "{full:?}");
    Ok(full)
}

async fn of_32_racing_claims_exactly_one_wins<S: Store>(c: Context<S>) -> Result<(), Violation> {
    for round in 0..5 {
        let key = format!("race-{round}");
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let store = c.store.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let token = format!("t{i}");
                    store.claim(&claim(&key, &token, NOW)).await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            let outcome = task
                .await
                .map_err(|e| Violation(format!("a racing claim's task failed: {e}")))??;
            if outcome == ClaimOutcome::Claimed {
                winners += 1;
            }
        }
        ensure_eq!(
            winners,
            1,
            "claims that won round {round} of 32 racing claims"
        );
    }
    Ok(())
}
