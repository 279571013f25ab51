//! A store that forwards every request to another except the ones its [`Override`] changes: for tests
//! that break one rule of the contract, or make one region fail, without writing the rest again
//! (hidden: not part of the API; re-exported by `conformance`).

use super::{
    ClaimOutcome, ClaimRequest, Store, StoreError, TransactOutcome, Transition, WriteOutcome,
    Writes,
};
use crate::record::Record;

/// `inner`, with the requests `with` overrides answered by `with`. It derefs to `with`, so a test
/// reaches its switches directly.
#[derive(Debug, Default)]
pub struct Delegating<S, O> {
    /// The store every request not overridden goes to.
    pub inner: S,
    /// What changes.
    pub with: O,
}

impl<S, O> Delegating<S, O> {
    /// `inner` with the changes of `with`.
    pub fn new(inner: S, with: O) -> Self {
        Delegating { inner, with }
    }
}

impl<S, O> std::ops::Deref for Delegating<S, O> {
    type Target = O;

    fn deref(&self) -> &O {
        &self.with
    }
}

/// What a [`Delegating`] store changes, given the store it wraps (`S`). Every method forwards by default, except the two transactions,
/// which are the [`Store`] trait's own defaults (`StoreError::Unsupported`, naming [`kind`](Self::kind))
/// unless overridden: a store has transactions only when it says so.
#[async_trait::async_trait]
pub trait Override<S: Store>: std::fmt::Debug + Send + Sync + 'static {
    /// The store's [`kind`](Store::kind).
    fn kind(&self) -> &'static str;

    /// Checked before every claim, transition and get (not the transactions, which an override forwards
    /// itself): an error here is the request's, and nothing is sent.
    ///
    /// # Errors
    /// The error the request fails with.
    fn fault(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// [`Store::claim`].
    async fn claim(
        &self,
        inner: &S,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        inner.claim(request).await
    }

    /// [`Store::transition`].
    async fn transition(
        &self,
        inner: &S,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        inner.transition(transition).await
    }

    /// [`Store::claim_transaction`]: unsupported unless overridden.
    async fn claim_transaction(
        &self,
        inner: &S,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let _ = inner;
        Defaults(self.kind())
            .claim_transaction(request, writes)
            .await
    }

    /// [`Store::transact_transition`]: unsupported unless overridden.
    async fn transact_transition(
        &self,
        inner: &S,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let _ = inner;
        Defaults(self.kind())
            .transact_transition(transition, writes)
            .await
    }

    /// [`Store::get`].
    async fn get(&self, inner: &S, key: &str) -> Result<Option<Record>, StoreError> {
        inner.get(key).await
    }
}

#[async_trait::async_trait]
impl<S: Store, O: Override<S>> Store for Delegating<S, O> {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.with.fault()?;
        self.with.claim(&self.inner, request).await
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        self.with.fault()?;
        self.with.transition(&self.inner, transition).await
    }

    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        self.with
            .transact_transition(&self.inner, transition, writes)
            .await
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        self.with
            .claim_transaction(&self.inner, request, writes)
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.with.fault()?;
        self.with.get(&self.inner, key).await
    }

    fn response_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        self.inner.response_budget(key, fingerprint)
    }

    fn steps_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        self.inner.steps_budget(key, fingerprint)
    }

    fn kind(&self) -> &'static str {
        self.with.kind()
    }
}

/// A store of only the required methods, never called: what the [`Store`] trait's defaults answer for
/// a store of this kind.
#[derive(Debug)]
struct Defaults(&'static str);

#[async_trait::async_trait]
impl Store for Defaults {
    async fn claim(&self, _: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        unreachable!("only the trait's default transactions are asked of `Defaults`")
    }

    async fn transition(&self, _: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        unreachable!("only the trait's default transactions are asked of `Defaults`")
    }

    async fn get(&self, _: &str) -> Result<Option<Record>, StoreError> {
        unreachable!("only the trait's default transactions are asked of `Defaults`")
    }

    fn kind(&self) -> &'static str {
        self.0
    }
}
