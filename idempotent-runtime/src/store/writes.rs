//! [`Writes`]: business writes that commit in one transaction with a record's transition.
//!
//! The state machine and the [`Store`](super::Store) trait pass them on without looking inside: only a
//! store that supports transactions reads them (`Writes::items`). The one place that knows what a
//! write is made of: DynamoDB's own `TransactWriteItem`. The limits of one transaction are DynamoDB's,
//! checked in `store::dynamodb::transaction`.
//!
//! The `dynamodb` feature only adds to this type: [`Writes::new`], [`len`](Writes::len) and
//! [`is_empty`](Writes::is_empty) are the same in every build, and what names the SDK's type (`items`,
//! `push`, `Extend`, `FromIterator`) exists only with the feature. So a store written without the
//! feature (whose `Writes` are always empty) compiles unchanged in a program where another crate turns
//! it on.

use std::sync::{Arc, Mutex, PoisonError};

#[cfg(feature = "dynamodb")]
use aws_sdk_dynamodb::types::TransactWriteItem;

/// One business write.
#[cfg(feature = "dynamodb")]
type Item = TransactWriteItem;
/// One business write: none exist without the `dynamodb` feature. Private: no public signature names
/// it, so no signature changes with the feature.
#[cfg(not(feature = "dynamodb"))]
type Item = std::convert::Infallible;

/// Business writes that commit atomically with a record's transition: claim-time writes
/// ([`Operation::claim_with`](crate::Operation::claim_with)), compensating writes
/// ([`Operation::compensate_with`](crate::Operation::compensate_with)) and writes a body staged on a
/// [`Transaction`](crate::Transaction).
///
/// A [`Store`](super::Store) receives them in
/// [`claim_transaction`](super::Store::claim_transaction) and
/// [`transact_transition`](super::Store::transact_transition), and reads them with `items` (DynamoDB's
/// `TransactWriteItem`s, each with its own condition; feature `dynamodb`). Without that feature there
/// are never any: a store built without it checks [`is_empty`](Self::is_empty), and keeps compiling
/// when another crate of the program turns the feature on (features only add methods here).
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
}

/// What names DynamoDB's `TransactWriteItem`: only with the `dynamodb` feature.
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
impl Writes {
    /// The writes, in the order they were given: the actions after the record's own in one
    /// `TransactWriteItems`.
    #[must_use]
    pub fn items(&self) -> &[TransactWriteItem] {
        &self.items
    }

    /// Adds a write at the end.
    pub fn push(&mut self, item: TransactWriteItem) {
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

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
impl Extend<TransactWriteItem> for Writes {
    fn extend<I: IntoIterator<Item = TransactWriteItem>>(&mut self, iter: I) {
        self.items.extend(iter);
    }
}

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
impl FromIterator<TransactWriteItem> for Writes {
    fn from_iter<I: IntoIterator<Item = TransactWriteItem>>(iter: I) -> Self {
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
