//! A memory store with scripted faults, to show on the memory store what the fault proxy shows on
//! DynamoDB Local: transient cancellations and unavailability when the outcome is stored, and a key
//! that keeps changing hands.

use std::sync::{Arc, Mutex};

use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, Store, StoreError, TransactOutcome, Transition,
    WriteOutcome, Writes,
};
use idempotent_runtime::{CancellationReason, MemoryStore, Record, Status};

/// Faults still to inject, each counted down as it fires.
#[derive(Debug, Default)]
pub(crate) struct Script {
    /// Transactional transitions answered with a `TransactionConflict` cancellation.
    pub(crate) conflicts: usize,
    /// Completions (plain or transactional) and failures answered with `StoreError::Unavailable`.
    pub(crate) unavailable: usize,
    /// Every claim answers with a FAILED record (claimable, yet the claim was refused).
    pub(crate) always_taken: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Flaky {
    pub(crate) inner: Arc<MemoryStore>,
    pub(crate) script: Mutex<Script>,
}

fn conflict() -> Vec<CancellationReason> {
    ["TransactionConflict", "None"]
        .iter()
        .enumerate()
        .map(|(index, code)| CancellationReason::new(index, *code, None))
        .collect()
}

impl Flaky {
    fn take(&self, pick: impl FnOnce(&mut Script) -> &mut usize) -> bool {
        let mut script = self.script.lock().unwrap();
        let left = pick(&mut script);
        let fire = *left > 0;
        *left = left.saturating_sub(1);
        fire
    }

    fn unavailable(&self, transition: &Transition<'_>) -> Result<(), StoreError> {
        let stores_outcome = matches!(
            transition.change,
            Change::Complete { .. } | Change::Fail { .. }
        );
        if stores_outcome && self.take(|s| &mut s.unavailable) {
            return Err(StoreError::Unavailable("injected: HTTP 503".into()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for Flaky {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        if self.script.lock().unwrap().always_taken {
            let mut taken = Record::new(
                request.key,
                Status::Failed,
                "someone-else",
                request.expires_at_s,
            );
            taken.error = Some("failed".to_owned());
            return Ok(ClaimOutcome::Existing(taken));
        }
        self.inner.claim(request).await
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        self.unavailable(transition)?;
        self.inner.transition(transition).await
    }

    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        if self.take(|s| &mut s.conflicts) {
            return Ok(TransactOutcome::Canceled(conflict()));
        }
        self.unavailable(transition)?;
        self.inner.transact_transition(transition, writes).await
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        self.inner.claim_transaction(request, writes).await
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    fn kind(&self) -> &'static str {
        "flaky memory"
    }
}
