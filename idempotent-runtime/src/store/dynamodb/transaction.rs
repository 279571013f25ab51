//! [`Transaction`]: business writes staged by the body, committed atomically with the COMPLETED record;
//! and the limits of one `TransactWriteItems`, checked before anything is sent.

use std::collections::{HashMap, HashSet};

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, TransactWriteItem, Update,
};

use super::size::transact_item_size;
use crate::store::Writes;
use crate::store::writes::Staged;

/// Most writes one body may stage: DynamoDB allows 100 actions per transaction, and one is the record.
pub const MAX_STAGED_WRITES: usize = 99;

/// Writes staged by an `#[idempotent(transact = tx)]` body.
///
/// The body stages the SDK's own [`TransactWriteItem`] values (each with its own condition); when it
/// returns `Ok`, they are sent in one `TransactWriteItems` together with the fenced PENDING → COMPLETED
/// update of the record, so the business writes and the stored response commit together or not at all.
/// When the body returns `Err`, nothing staged is written.
///
/// Cheap to clone; clones share the staged writes.
#[derive(Debug, Clone, Default)]
pub struct Transaction {
    staged: Staged,
}

impl Transaction {
    /// An empty transaction.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Stages any action.
    pub fn push(&self, item: TransactWriteItem) {
        self.staged.lock().push(item);
    }

    /// Stages a `Put`.
    pub fn put(&self, put: Put) {
        self.push(TransactWriteItem::builder().put(put).build());
    }

    /// Stages an `Update`.
    pub fn update(&self, update: Update) {
        self.push(TransactWriteItem::builder().update(update).build());
    }

    /// Stages a `Delete`.
    pub fn delete(&self, delete: Delete) {
        self.push(TransactWriteItem::builder().delete(delete).build());
    }

    /// Stages a `ConditionCheck`: the transaction commits only if it holds.
    pub fn condition_check(&self, check: ConditionCheck) {
        self.push(TransactWriteItem::builder().condition_check(check).build());
    }

    /// How many writes are staged.
    #[must_use]
    pub fn len(&self) -> usize {
        self.staged.lock().len()
    }

    /// Whether nothing is staged.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.staged.lock().is_empty()
    }

    /// A copy of the staged writes.
    #[must_use]
    pub fn writes(&self) -> Vec<TransactWriteItem> {
        self.staged.lock().items().to_vec()
    }

    /// The shared staging area, which the state machine empties when the body returns `Ok`.
    pub(crate) fn staged(&self) -> &Staged {
        &self.staged
    }
}

/// Most bytes one transaction may carry (DynamoDB's aggregate limit).
pub const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

/// What a record's update adds to a transaction besides its key and its largest value (the fingerprint
/// of a claim, the response of a completion), counted generously.
const RECORD_UPDATE_BYTES: usize = 512;

impl Writes {
    /// Checks DynamoDB's limits of one transaction before anything is sent: at most
    /// [`MAX_STAGED_WRITES`] writes, at most [`MAX_TRANSACTION_BYTES`] in all (the record's own update
    /// included: its key, `record_value` bytes of fingerprint or response, and the rest of the update
    /// counted generously), and no two actions on one item (the record's own, keyed by `record_key`,
    /// included). The reason when they do not fit.
    pub(crate) fn check_limits(&self, record_key: &str, record_value: usize) -> Result<(), String> {
        let record_bytes = RECORD_UPDATE_BYTES
            .saturating_add(record_key.len())
            .saturating_add(record_value);
        let writes = self.items();
        if writes.len() > MAX_STAGED_WRITES {
            return Err(format!(
                "{} writes were staged on the transaction; at most {MAX_STAGED_WRITES} fit in one DynamoDB transaction with the idempotency record",
                writes.len()
            ));
        }
        let staged: usize = writes.iter().map(transact_item_size).sum();
        let bytes = staged.saturating_add(record_bytes);
        if bytes > MAX_TRANSACTION_BYTES {
            return Err(format!(
                "the staged writes carry about {staged} bytes and the idempotency record {record_bytes}; a DynamoDB transaction carries at most {MAX_TRANSACTION_BYTES}"
            ));
        }
        let mut seen = HashSet::new();
        for (index, write) in writes.iter().enumerate() {
            let Some(target) = target(write) else {
                continue;
            };
            if target
                .1
                .values()
                .any(|v| v.as_s().is_ok_and(|s| s == record_key))
            {
                return Err(format!(
                    "staged write {index} targets the idempotency record itself; stage writes on business items only"
                ));
            }
            let mut key: Vec<_> = target.1.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            key.sort();
            if !seen.insert((target.0.to_owned(), key)) {
                return Err(format!(
                    "staged write {index} touches an item another staged write already touches; DynamoDB allows one action per item in a transaction"
                ));
            }
        }
        Ok(())
    }
}

/// The table and key an `Update`, `Delete` or `ConditionCheck` targets (a Put's key attributes are not known
/// without the table's schema; DynamoDB itself rejects a Put that collides).
fn target(write: &TransactWriteItem) -> Option<(&str, &HashMap<String, AttributeValue>)> {
    if let Some(u) = write.update() {
        return Some((u.table_name(), u.key()));
    }
    if let Some(d) = write.delete() {
        return Some((d.table_name(), d.key()));
    }
    write.condition_check().map(|c| (c.table_name(), c.key()))
}

/// The table a staged write targets.
pub(super) fn table_of(write: &TransactWriteItem) -> Option<&str> {
    write
        .put()
        .map(Put::table_name)
        .or_else(|| target(write).map(|(table, _)| table))
}
