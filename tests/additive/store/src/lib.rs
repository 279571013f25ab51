//! A store written as a third party writes one: against `idempotent-runtime` without its default
//! features (no `dynamodb`, so no AWS SDK), through the public API only.
//!
//! [`Recoded`] keeps its records in a format of its own ([`Row`]), as a store over another database
//! does, and builds every [`Record`] it returns with [`Record::new`]: a struct expression cannot build
//! one outside the runtime. It leaves the decisions (which claim wins, what a transition needs) to the
//! store it wraps, so the contract's suite can check that nothing is lost on the way.
//!
//! The crate is also a build check: `idempotent-additive-tests` compiles it in one program with a
//! runtime whose `dynamodb` and `emulator` features are on. That build passes only while each feature
//! of the runtime adds items and changes none (a business write's type, a field of a public struct).

use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, TransactOutcome, Transition, WriteOutcome, Writes,
};
use idempotent_runtime::{Record, Status, Store, StoreError};

/// A record as [`Recoded`] keeps it: the status as its stored name, every other field as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The derived key.
    pub key: String,
    /// `PENDING`, `COMPLETED` or `FAILED`.
    pub status: String,
    /// The fencing token.
    pub token: String,
    /// Claims made so far.
    pub attempt: u64,
    /// End of a PENDING claim's lease (epoch milliseconds).
    pub lease_until_ms: Option<u64>,
    /// Expiry (epoch seconds).
    pub expires_at_s: u64,
    /// The payload's fingerprint.
    pub fingerprint: Option<String>,
    /// The encoded response.
    pub response: Option<Vec<u8>>,
    /// A FAILED call's error text.
    pub error: Option<String>,
    /// End of the replay window (epoch seconds).
    pub replay_until_s: Option<u64>,
    /// Whether claim-time writes are in effect.
    pub claim_writes_in_effect: bool,
    /// The region that completed the record.
    pub completed_in: Option<String>,
    /// The finished steps, encoded.
    pub steps: Option<Vec<u8>>,
    /// Released tokens.
    pub released: Vec<String>,
    /// Until when a claim under a released token can hold the key (epoch milliseconds).
    pub released_until_ms: Option<u64>,
    /// Every token up to this one is released.
    pub released_through: Option<String>,
}

impl Row {
    /// The row of `record`.
    #[must_use]
    pub fn of(record: Record) -> Self {
        Row {
            key: record.key,
            status: record.status.as_str().to_owned(),
            token: record.token,
            attempt: record.attempt,
            lease_until_ms: record.lease_until_ms,
            expires_at_s: record.expires_at_s,
            fingerprint: record.fingerprint,
            response: record.response,
            error: record.error,
            replay_until_s: record.replay_until_s,
            claim_writes_in_effect: record.claim_writes_in_effect,
            completed_in: record.completed_in,
            steps: record.steps,
            released: record.released,
            released_until_ms: record.released_until_ms,
            released_through: record.released_through,
        }
    }

    /// The record this row holds, built through the runtime's constructor.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] for a status the runtime does not write.
    pub fn into_record(self) -> Result<Record, StoreError> {
        let status = Status::parse(&self.status)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown status `{}`", self.status)))?;
        let mut record = Record::new(self.key, status, self.token, self.expires_at_s);
        record.attempt = self.attempt;
        record.lease_until_ms = self.lease_until_ms;
        record.fingerprint = self.fingerprint;
        record.response = self.response;
        record.error = self.error;
        record.replay_until_s = self.replay_until_s;
        record.claim_writes_in_effect = self.claim_writes_in_effect;
        record.completed_in = self.completed_in;
        record.steps = self.steps;
        record.released = self.released;
        record.released_until_ms = self.released_until_ms;
        record.released_through = self.released_through;
        Ok(record)
    }
}

/// A store that passes every record through its own format ([`Row`]) on the way out of the store it
/// wraps.
#[derive(Debug, Default)]
pub struct Recoded<S> {
    inner: S,
}

impl<S: Store> Recoded<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Recoded { inner }
    }

    fn record(record: Record) -> Result<Record, StoreError> {
        Row::of(record).into_record()
    }

    fn found(record: Option<Record>) -> Result<Option<Record>, StoreError> {
        record.map(Self::record).transpose()
    }

    fn transacted(outcome: TransactOutcome) -> Result<TransactOutcome, StoreError> {
        Ok(match outcome {
            TransactOutcome::Rejected(record) => TransactOutcome::Rejected(Self::found(record)?),
            // `Committed`, `Canceled`, and any outcome a later runtime adds: as they came.
            other => other,
        })
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for Recoded<S> {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        Ok(match self.inner.claim(request).await? {
            ClaimOutcome::Existing(record) => ClaimOutcome::Existing(Self::record(record)?),
            other => other,
        })
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        Ok(match self.inner.transition(transition).await? {
            WriteOutcome::Rejected(record) => WriteOutcome::Rejected(Self::found(record)?),
            other => other,
        })
    }

    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        Self::transacted(self.inner.transact_transition(transition, writes).await?)
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        Self::transacted(self.inner.claim_transaction(request, writes).await?)
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        Self::found(self.inner.get(key).await?)
    }

    fn response_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        self.inner.response_budget(key, fingerprint)
    }

    fn steps_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        self.inner.steps_budget(key, fingerprint)
    }

    fn kind(&self) -> &'static str {
        "recoded"
    }
}
