//! [`MemoryStore`]: the same semantics as DynamoDB, in one process.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Change, ClaimOutcome, ClaimRequest, Store, StoreError, Transition, WriteOutcome};
use crate::record::{Record, Status};

/// An in-process store with the same conditions as [`DynamoDbStore`](super::dynamodb::DynamoDbStore),
/// linearizable (one mutex), for tests, local runs and single-process services.
///
/// Records are never evicted by time: like a DynamoDB table whose TTL has not run yet, an expired record
/// stays readable and simply counts as absent. Call [`MemoryStore::purge_expired`] to drop them.
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<HashMap<String, Record>>,
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Record>> {
        // A panic while holding the lock cannot leave a half-written record (every write is one insert),
        // so a poisoned lock is still consistent.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of every record, in no particular order.
    #[must_use]
    pub fn records(&self) -> Vec<Record> {
        self.lock().values().cloned().collect()
    }

    /// How many records are held (expired ones included).
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Replaces (or inserts) a record as it is, bypassing every condition: for tests that need a record in
    /// a particular state.
    pub fn insert(&self, record: Record) {
        self.lock().insert(record.key.clone(), record);
    }

    /// Drops the records that expired before `now_ms` (what DynamoDB's TTL does, eventually).
    pub fn purge_expired(&self, now_ms: u64) {
        self.lock().retain(|_, r| !r.is_expired(now_ms));
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut records = self.lock();
        let attempt = match records.get(request.key) {
            Some(old) if !old.is_claimable(request.now_ms) => {
                return Ok(ClaimOutcome::Existing(old.clone()));
            }
            Some(old) => old.attempt + 1,
            None => 1,
        };
        records.insert(
            request.key.to_owned(),
            Record {
                key: request.key.to_owned(),
                status: Status::Pending,
                token: request.token.to_owned(),
                attempt,
                lease_until_ms: Some(request.lease_until_ms),
                expires_at_s: request.expires_at_s,
                fingerprint: request.fingerprint.map(str::to_owned),
                response: None,
                error: None,
                replay_until_s: None,
            },
        );
        Ok(ClaimOutcome::Claimed)
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        let mut records = self.lock();
        let Some(record) = records
            .get_mut(transition.key)
            .filter(|r| r.status == Status::Pending && r.token == transition.token)
        else {
            return Ok(WriteOutcome::Rejected(records.get(transition.key).cloned()));
        };
        match transition.change {
            Change::Complete {
                response,
                expires_at_s,
                replay_until_s,
            } => {
                record.status = Status::Completed;
                record.response = response.map(<[u8]>::to_vec);
                record.expires_at_s = expires_at_s;
                record.replay_until_s = replay_until_s;
                record.lease_until_ms = None;
            }
            Change::Fail {
                error,
                expires_at_s,
            } => {
                record.status = Status::Failed;
                record.error = Some(error.to_owned());
                record.expires_at_s = expires_at_s;
                record.lease_until_ms = None;
            }
            Change::ExtendLease {
                lease_until_ms,
                expires_at_s,
            } => {
                record.lease_until_ms = Some(lease_until_ms);
                record.expires_at_s = expires_at_s;
            }
        }
        Ok(WriteOutcome::Applied)
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(key).cloned())
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
