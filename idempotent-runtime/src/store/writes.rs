//! [`Writes`]: business writes that commit in one transaction with a record's transition.
//!
//! The state machine and the [`Store`](super::Store) trait pass them on without looking inside: only a
//! store that supports transactions reads them ([`Writes::items`]). The one place that knows what a
//! write is made of: with the `dynamodb` feature, DynamoDB's own `TransactWriteItem`; without it, there
//! are never any (a write is `Infallible`, so the same methods compile, and none can be added). The limits
//! of one transaction are DynamoDB's, checked in `store::dynamodb::transaction`.

use std::sync::{Arc, Mutex, PoisonError};

/// One business write.
#[cfg(feature = "dynamodb")]
type Item = aws_sdk_dynamodb::types::TransactWriteItem;
/// One business write: none exist without the `dynamodb` feature.
#[cfg(not(feature = "dynamodb"))]
type Item = std::convert::Infallible;

/// Business writes that commit atomically with a record's transition: claim-time writes
/// ([`Operation::claim_with`](crate::Operation::claim_with)), compensating writes
/// ([`Operation::compensate_with`](crate::Operation::compensate_with)) and writes a body staged on a
/// [`Transaction`](crate::Transaction).
///
/// A [`Store`](super::Store) receives them in
/// [`claim_transaction`](super::Store::claim_transaction) and
/// [`transact_transition`](super::Store::transact_transition), and reads them with
/// [`items`](Self::items) (DynamoDB's `TransactWriteItem`s, each with its own condition).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Writes {
    items: Vec<Item>,
}

impl Writes {
    /// No writes.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many writes there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The writes, in the order they were given: the actions after the record's own in one
    /// `TransactWriteItems`.
    #[must_use]
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    /// Adds a write at the end.
    pub fn push(&mut self, item: Item) {
        self.items.push(item);
    }
}

/// Without the `dynamodb` feature there is no write, so no limit to check.
#[cfg(not(feature = "dynamodb"))]
impl Writes {
    #[allow(clippy::unused_self, clippy::unnecessary_wraps)]
    pub(crate) fn check_limits(&self, record_key: &str, record_value: usize) -> Result<(), String> {
        let _ = (record_key, record_value);
        Ok(())
    }
}

impl Extend<Item> for Writes {
    fn extend<I: IntoIterator<Item = Item>>(&mut self, iter: I) {
        self.items.extend(iter);
    }
}

impl FromIterator<Item> for Writes {
    fn from_iter<I: IntoIterator<Item = Item>>(iter: I) -> Self {
        Self {
            items: iter.into_iter().collect(),
        }
    }
}

/// Writes a body stages while it runs, shared between the body's handle and the state machine, which
/// takes them when the body returns `Ok`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Staged(Arc<Mutex<Writes>>);

impl Staged {
    /// The writes, locked (a panic in another holder leaves them as they were).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Writes> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes and returns the staged writes.
    pub(crate) fn take(&self) -> Writes {
        std::mem::take(&mut *self.lock())
    }
}
