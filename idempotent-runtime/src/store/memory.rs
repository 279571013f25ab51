//! [`MemoryStore`]: the same semantics as DynamoDB, in one process.

#[cfg(feature = "emulator")]
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

#[cfg(feature = "emulator")]
use aws_sdk_dynamodb::types::AttributeValue;

#[cfg(feature = "emulator")]
use super::TransactOutcome;
#[cfg(feature = "emulator")]
use super::Writes;
use super::{
    Change, ClaimOutcome, ClaimRequest, Marking, StepsClaim, Store, StoreError, Transition,
    WriteOutcome,
};
#[cfg(feature = "emulator")]
use crate::CancellationReason;
#[cfg(feature = "emulator")]
use crate::emulator::{Cancellation, Plan, Refused, Tables};
use crate::record::{Record, Status};
use packed::Records;

mod packed;

/// An in-process store with the same conditions as [`DynamoDbStore`](super::dynamodb::DynamoDbStore),
/// linearizable (one mutex), for tests, local runs and single-process services.
///
/// Records are never evicted by time: like a DynamoDB table whose TTL has not run yet, an expired record
/// stays readable and simply counts as absent. Call [`MemoryStore::purge_expired`] to drop them. Each
/// record is held packed in one allocation (its key once, its numbers as variable-length integers): a
/// record with a 79-byte key, a token, a fingerprint and a 100-byte response takes about 280 resident
/// bytes (measured in `BENCHMARKS.md`).
///
/// With the `emulator` feature (on by default) it also holds business tables, so that functions with
/// `transact = tx` (and claims with business writes) can be unit-tested: create each table with
/// [`create_table`](MemoryStore::create_table), seed it with [`put_item`](MemoryStore::put_item), and the
/// staged `Put`, `Update`, `Delete` and `ConditionCheck` actions are applied to it atomically with the
/// record, their conditions evaluated as DynamoDB does by the crate's DynamoDB emulator (differential-tested
/// against DynamoDB Local; `src/emulator/mod.rs` lists what it models). Expressions beyond what it models
/// (nested paths, `size`, `contains`, `attribute_type`, `list_append`) are an error that names the part;
/// test those against DynamoDB Local.
///
/// Without the `emulator` feature it holds records only: `transact`, `claim_with` and `compensate_with`
/// on it fail with [`Error::Unsupported`](crate::Error::Unsupported) (the [`Store`] trait's defaults),
/// before the body runs for a claim.
///
/// ```
/// # #[cfg(feature = "emulator")] {
/// use std::collections::HashMap;
/// use idempotent_runtime::MemoryStore;
/// use idempotent_runtime::aws_sdk_dynamodb::types::AttributeValue;
///
/// let store = MemoryStore::new();
/// store.create_table("inventory", "sku", None)?;
/// store.put_item(
///     "inventory",
///     HashMap::from([
///         ("sku".to_owned(), AttributeValue::S("apple".into())),
///         ("available".to_owned(), AttributeValue::N("10".into())),
///     ]),
/// )?;
/// let key = HashMap::from([("sku".to_owned(), AttributeValue::S("apple".into()))]);
/// assert_eq!(store.get_item("inventory", &key).unwrap()["available"], AttributeValue::N("10".into()));
/// # }
/// # Ok::<(), idempotent_runtime::StoreError>(())
/// ```
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

/// Everything behind the store's one lock, so that a transaction sees and changes records and business
/// items as one.
#[derive(Debug, Default)]
struct State {
    records: Records,
    #[cfg(feature = "emulator")]
    tables: Tables,
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-written state (every change is planned first
        // and then applied with inserts and removals that do not panic), so a poisoned lock is still
        // consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of every record, in no particular order.
    #[must_use]
    pub fn records(&self) -> Vec<Record> {
        self.lock().records.all()
    }

    /// How many records are held (expired ones included).
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lock().records.len() == 0
    }

    /// Replaces (or inserts) a record as it is, bypassing every condition: for tests that need a record in
    /// a particular state.
    pub fn insert(&self, record: Record) {
        self.lock().records.insert(record);
    }

    /// Drops the records that expired before `now_ms` (what DynamoDB's TTL does, eventually).
    pub fn purge_expired(&self, now_ms: u64) {
        self.lock().records.retain(|r| !r.is_expired(now_ms));
    }
}

/// Business tables, for staged writes (`transact = tx`, claims with business writes): feature `emulator`.
#[cfg(feature = "emulator")]
#[cfg_attr(docsrs, doc(cfg(feature = "emulator")))]
impl MemoryStore {
    /// Creates a business table with the given key schema (the partition key, and the sort key if any),
    /// which tells the store which attributes of a `Put`'s item are its key. Creating a table again with
    /// the same key schema keeps it and its items.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] if a table of that name exists with another key schema.
    pub fn create_table(
        &self,
        name: &str,
        partition_key: &str,
        sort_key: Option<&str>,
    ) -> Result<(), StoreError> {
        self.lock()
            .tables
            .create_table(name, partition_key, sort_key)
            .map_err(StoreError::from)
    }

    /// Inserts or replaces an item, without conditions: for seeding a table before a test.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] if the table was not created, the item lacks a key attribute, or a value is
    /// one DynamoDB rejects (a number that is not one, an empty set).
    pub fn put_item(
        &self,
        table: &str,
        item: HashMap<String, AttributeValue>,
    ) -> Result<(), StoreError> {
        Ok(self.lock().tables.put_item(table, item)?)
    }

    /// The item whose key attributes are those of `key` (other attributes of `key` are ignored, so an
    /// item can be looked up by itself); `None` if there is none or the table does not exist.
    #[must_use]
    pub fn get_item(
        &self,
        table: &str,
        key: &HashMap<String, AttributeValue>,
    ) -> Option<HashMap<String, AttributeValue>> {
        self.lock().tables.get_item(table, key)
    }

    /// A copy of every item of `table` in key order (empty if the table does not exist).
    #[must_use]
    pub fn items(&self, table: &str) -> Vec<HashMap<String, AttributeValue>> {
        self.lock().tables.items(table)
    }
}

#[cfg(feature = "emulator")]
impl State {
    /// Writes `record` and applies `plan` if every staged write holds; otherwise changes nothing.
    fn commit(&mut self, record: Record, plan: Plan) -> TransactOutcome {
        match self.tables.commit(plan) {
            Ok(()) => {
                self.records.insert(record);
                TransactOutcome::Committed
            }
            Err(reasons) => TransactOutcome::Canceled(
                reasons.into_iter().map(CancellationReason::from).collect(),
            ),
        }
    }
}

/// The emulator refuses what DynamoDB refuses before writing anything: an invalid request.
#[cfg(feature = "emulator")]
impl From<Refused> for StoreError {
    fn from(refused: Refused) -> Self {
        StoreError::Invalid(refused.into_message().into())
    }
}

#[cfg(feature = "emulator")]
impl From<Cancellation> for CancellationReason {
    fn from(reason: Cancellation) -> Self {
        let Cancellation {
            index,
            code,
            message,
            item,
        } = reason;
        CancellationReason {
            index,
            code,
            message,
            item,
        }
    }
}

/// The record a claim writes, or `Err(old)` when `old` blocks the claim: the one rule behind both
/// [`Store::claim`] and (`with_writes`) `Store::claim_transaction`. (A claim that keeps claim-time
/// writes is refused by an absent record too, which the caller checks: see [`vanished`].)
pub(crate) fn claimed<'r>(
    old: Option<&'r Record>,
    request: &ClaimRequest<'_>,
    with_writes: bool,
) -> Result<Record, &'r Record> {
    let attempt = match old {
        // A call's own released claim (see `Change::Release`, `Change::MarkReleased`): a late claim
        // of that call never lands.
        Some(old) if old.released_token(request.token) => return Err(old),
        Some(old) if with_writes && !old.is_claimable_with_writes(request.now_ms) => {
            return Err(old);
        }
        Some(old)
            if !with_writes
                && request.keep_claim_writes
                && !old.is_claimable_keeping_writes(request.now_ms) =>
        {
            return Err(old);
        }
        Some(old) if !old.is_claimable(request.now_ms) => return Err(old),
        Some(old) if !old.allows_steps_claim(request.now_ms, request.steps) => return Err(old),
        Some(old) => old.attempt + 1,
        None => 1,
    };
    Ok(Record {
        key: request.key.to_owned(),
        status: Status::Pending,
        token: request.token.to_owned(),
        attempt,
        lease_until_ms: Some(request.lease_until_ms),
        // No earlier than the end of the released tokens it keeps: a claim still in flight under one
        // of them may land until then.
        expires_at_s: old.map_or(request.expires_at_s, |o| {
            o.outlives_released(request.expires_at_s)
        }),
        fingerprint: request.fingerprint.map(str::to_owned),
        response: None,
        error: None,
        replay_until_s: None,
        // Like DynamoDB's update, a plain claim leaves the attribute as it was.
        claim_writes_in_effect: with_writes || old.is_some_and(|o| o.claim_writes_in_effect),
        completed_in: None,
        // A fresh start replaces them; a resume keeps them, and so does a claim of an operation
        // without steps, unless the record expired: the claim starts a new operation, which must not
        // inherit the old one's steps.
        steps: match request.steps {
            StepsClaim::Fresh { initial, .. } => Some(initial.to_vec()),
            StepsClaim::Resume { .. } => old.and_then(|o| o.steps.clone()),
            StepsClaim::Untouched => old
                .filter(|o| !o.is_expired(request.now_ms))
                .and_then(|o| o.steps.clone()),
        },
        // Like DynamoDB's update, a claim leaves them as they were: a claim still in flight under one
        // of them may land later.
        released: old.map(|o| o.released.clone()).unwrap_or_default(),
        released_until_ms: old.and_then(|o| o.released_until_ms),
        released_through: old.and_then(|o| o.released_through.clone()),
    })
}

/// The record after `transition`, or `None` when `old` is not PENDING under the transition's token: the
/// rule of `Store::transact_transition` and the model's (`Store::transition` applies the same
/// [`fenced`] and [`applied`] to the record it unpacked, without copying it again).
#[cfg(any(test, feature = "emulator"))]
pub(crate) fn transitioned(old: Option<&Record>, transition: &Transition<'_>) -> Option<Record> {
    match old {
        Some(r) if fenced(r, transition) => Some(applied(r.clone(), transition)),
        None if matches!(transition.change, Change::Release { .. }) => Some(tombstone(transition)),
        _ => None,
    }
}

/// Whether the transition may be made on `record`: it is PENDING under the transition's token; a
/// failure that releases claim-time writes (its compensation) also needs them still in effect, and a
/// step's write the steps it extends (its `previous`), so that a late copy of an earlier one is
/// refused. The exceptions: a release mark needs no record, or an expired one, and a
/// [`Change::MarkReleased`] any live record *not* PENDING under the token nor COMPLETED that its
/// [`Marking`] fits (or, for [`Marking::KeepCompleted`], a live COMPLETED one).
fn fenced(record: &Record, transition: &Transition<'_>) -> bool {
    let held = record.status == Status::Pending && record.token == transition.token;
    match transition.change {
        Change::Release { now_ms, .. } => record.is_expired(now_ms),
        Change::MarkReleased {
            now_ms,
            seen_until_ms,
            seen_expires_at_s,
            marking,
            ..
        } => {
            let seen = !record.is_expired(now_ms)
                && record.released_until_ms == seen_until_ms
                && record.expires_at_s == seen_expires_at_s;
            if marking == Marking::KeepCompleted {
                return seen && record.status == Status::Completed;
            }
            !held
                && record.status != Status::Completed
                && seen
                && match marking {
                    Marking::Join => record.released.len() < crate::MAX_RELEASED,
                    Marking::Replace => {
                        record.released_until_ms.is_some_and(|until| until < now_ms)
                    }
                    Marking::Through => {
                        record.released.len() >= crate::MAX_RELEASED
                            && record
                                .released_through
                                .as_deref()
                                .is_none_or(|through| through < transition.token)
                    }
                    Marking::Extend => record.marks_released(transition.token),
                    Marking::KeepCompleted => unreachable!("decided above"),
                }
        }
        Change::Fail {
            release_claim_writes: true,
            ..
        } => held && record.claim_writes_in_effect,
        Change::SaveSteps { previous, .. } => held && record.steps.as_deref() == Some(previous),
        _ => held,
    }
}

/// The record a [`Change::Release`] writes where there was none (or an expired one): FAILED under the
/// releasing call's token, so that the call's own claim, if it lands later, is refused by it.
pub(crate) fn tombstone(transition: &Transition<'_>) -> Record {
    let Change::Release {
        error,
        expires_at_s,
        released_until_ms,
        ..
    } = transition.change
    else {
        unreachable!("only a release writes a record where there is none")
    };
    Record {
        key: transition.key.to_owned(),
        status: Status::Failed,
        token: transition.token.to_owned(),
        attempt: 0,
        lease_until_ms: None,
        expires_at_s,
        fingerprint: None,
        response: None,
        error: Some(error.to_owned()),
        replay_until_s: None,
        claim_writes_in_effect: false,
        completed_in: None,
        steps: None,
        released: vec![transition.token.to_owned()],
        released_until_ms: Some(released_until_ms),
        released_through: None,
    }
}

/// The error of a claim that keeps claim-time writes and finds no record at all: like DynamoDB's failed
/// condition without an item.
pub(crate) fn vanished() -> StoreError {
    StoreError::Corrupt("the claim condition failed but no item was returned".to_owned())
}

/// Whether `request` is refused when no record is there ([`vanished`]): a claim that keeps claim-time
/// writes, or that resumes steps, is conditioned on the record it saw.
pub(crate) fn needs_record(request: &ClaimRequest<'_>) -> bool {
    request.keep_claim_writes || matches!(request.steps, StepsClaim::Resume { .. })
}

/// `record` after `transition` (which [`fenced`] allows).
fn applied(mut record: Record, transition: &Transition<'_>) -> Record {
    match transition.change {
        Change::Complete {
            response,
            expires_at_s,
            replay_until_s,
        } => {
            record.status = Status::Completed;
            record.response = response.map(<[u8]>::to_vec);
            record.steps = None;
            // No earlier than the released tokens' end, which the record outlives though it drops
            // them: a claim they kept out lands on a live COMPLETED record and is refused.
            record.expires_at_s = record.outlives_released(expires_at_s);
            record.replay_until_s = replay_until_s;
            record.lease_until_ms = None;
            // Final until it expires: no claim lands on it, released or not.
            record.released.clear();
            record.released_until_ms = None;
            record.released_through = None;
        }
        // On an expired record: replaced, as where there is none.
        Change::Release { .. } => return tombstone(transition),
        Change::MarkReleased {
            released_until_ms,
            expires_at_s,
            marking,
            ..
        } => {
            if marking == Marking::KeepCompleted {
                record.expires_at_s = expires_at_s;
                return record;
            }
            match marking {
                Marking::Join | Marking::Extend | Marking::KeepCompleted => {}
                Marking::Replace => {
                    record.released.clear();
                    record.released_through = None;
                }
                Marking::Through => record.released_through = Some(transition.token.to_owned()),
            }
            if matches!(marking, Marking::Join | Marking::Replace)
                && !record.released.iter().any(|t| t == transition.token)
            {
                record.released.push(transition.token.to_owned());
            }
            record.released_until_ms = Some(released_until_ms);
            record.expires_at_s = expires_at_s;
        }
        Change::Fail {
            error,
            expires_at_s,
            release_claim_writes,
        } => {
            record.status = Status::Failed;
            record.error = Some(error.to_owned());
            record.expires_at_s = record.outlives_released(expires_at_s);
            record.lease_until_ms = None;
            if release_claim_writes {
                record.claim_writes_in_effect = false;
            }
        }
        Change::SaveSteps { steps, .. } => record.steps = Some(steps.to_vec()),
        Change::ExtendLease {
            lease_until_ms,
            expires_at_s,
        } => {
            record.lease_until_ms = Some(lease_until_ms);
            record.expires_at_s = record.outlives_released(expires_at_s);
        }
    }
    record
}

/// The outcome that reports `old` as the record that blocked a claim (a claim is only refused by one).
fn blocked<T>(old: Option<Record>, outcome: impl FnOnce(Record) -> T) -> T {
    outcome(old.expect("a claim is only refused by a record"))
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut state = self.lock();
        let old = state.records.get(request.key);
        if old.is_none() && needs_record(request) {
            return Err(vanished());
        }
        let Ok(record) = claimed(old.as_ref(), request, false).map_err(drop) else {
            return Ok(blocked(old, ClaimOutcome::Existing));
        };
        if old.is_some_and(|o| o.is_expired(request.now_ms)) {
            crate::telemetry::expired_record_reclaimed();
        }
        state.records.insert(record);
        Ok(ClaimOutcome::Claimed)
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        let mut state = self.lock();
        // Unpacked for this call alone: changed in place rather than copied.
        match state.records.get(transition.key) {
            Some(old) if fenced(&old, transition) => {
                state.records.insert(applied(old, transition));
                Ok(WriteOutcome::Applied)
            }
            None if matches!(transition.change, Change::Release { .. }) => {
                state.records.insert(tombstone(transition));
                Ok(WriteOutcome::Applied)
            }
            old => Ok(WriteOutcome::Rejected(old)),
        }
    }

    #[cfg(feature = "emulator")]
    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let mut state = self.lock();
        // Like DynamoDB, a request that is invalid as a whole fails before any condition is evaluated.
        let plan = state.tables.plan(writes.items())?;
        let old = state.records.get(transition.key);
        let Some(record) = transitioned(old.as_ref(), transition) else {
            return Ok(TransactOutcome::Rejected(old));
        };
        Ok(state.commit(record, plan))
    }

    #[cfg(feature = "emulator")]
    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let mut state = self.lock();
        let plan = state.tables.plan(writes.items())?;
        let old = state.records.get(request.key);
        // A resume finds no record: its condition fails without an item, as DynamoDB's does.
        if matches!(request.steps, StepsClaim::Resume { .. }) && old.is_none() {
            return Ok(TransactOutcome::Rejected(None));
        }
        let Ok(record) = claimed(old.as_ref(), request, true).map_err(drop) else {
            return Ok(blocked(old, |record| {
                TransactOutcome::Rejected(Some(record))
            }));
        };
        Ok(state.commit(record, plan))
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().records.get(key))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(all(test, feature = "emulator"))]
mod tests;
#[cfg(all(test, feature = "dynamodb", not(feature = "emulator")))]
mod without_emulator;
