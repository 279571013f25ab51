//! A DynamoDB emulator for transactions: business tables and the `TransactWriteItems` actions that
//! change them, evaluated in one process as DynamoDB evaluates them.
//!
//! It is an engine of its own: it knows DynamoDB's tables, expressions and transactions, and nothing of
//! idempotency. It names no other module of the crate (`scripts/check-layers` keeps it so): its errors are
//! [`Refused`], its cancellation reasons [`Cancellation`], and the memory store translates both into its
//! own. The memory store uses it (feature `emulator`, on by default) so that code staging business writes
//! can be unit-tested without DynamoDB. It interprets the SDK's own types (`TransactWriteItem`,
//! `AttributeValue`), so the feature implies `dynamodb`.
//!
//! # Interface
//!
//! [`Tables`] is all a caller sees: [`create_table`](Tables::create_table),
//! [`put_item`](Tables::put_item), [`get_item`](Tables::get_item) and [`items`](Tables::items) to seed
//! and read business tables, and [`plan`](Tables::plan) + [`commit`](Tables::commit) for a transaction.
//! A plan checks, parses and evaluates every staged write against the current items and changes nothing;
//! `commit` applies it only if every write held, so a transaction is all or nothing. The transaction's
//! first action (index 0) is the caller's own: between the two calls the caller decides whether it holds
//! (the memory store's idempotency record), holding one lock across both, which makes transactions
//! linearizable with the caller's own items.
//!
//! # What it models
//!
//! - The four actions, `Put`, `Update` (creating a missing item from its key, as DynamoDB does),
//!   `Delete` and `ConditionCheck`, each with `ReturnValuesOnConditionCheckFailure = ALL_OLD`; at most
//!   [`MAX_ACTIONS`] in all, the caller's own action at index 0 among them.
//! - Tables with a partition key and an optional sort key of type S, N or B (equal numbers are one key:
//!   `"1.0"` and `"1"`), created with their key schema (`table.rs`).
//! - Expressions (`expression.rs`): the forms listed in [`SUPPORTED`](expression::SUPPORTED), with
//!   `#name` and `:value` placeholders (an unused one is refused, as DynamoDB does), DynamoDB's reserved
//!   words (`reserved.rs`), and every attribute type with DynamoDB's comparison and set rules.
//! - Numbers as DynamoDB's exact 38-digit decimals (`number.rs`), stored in canonical text.
//! - Cancellation: one reason per action (`plan.rs`), index 0 the caller's, then `None`,
//!   `ConditionalCheckFailed` (with the `ALL_OLD` item when asked for) or `ValidationError`.
//!
//! # What it refuses
//!
//! Refused ([`Refused`]) naming the part, the expression and the action, never approximated: nested
//! paths (`a.b`, `a[0]`) and the functions `size`, `contains`, `attribute_type`, `list_append`. Requests
//! DynamoDB rejects before evaluating anything (an unknown table, a key that does not match the schema, a
//! syntax error, an undefined or unused placeholder, two actions on one item, more than 100 actions) are
//! refused the same way, with DynamoDB's message.
//!
//! Differs from DynamoDB Local, on purpose (nothing is written either way):
//! - two actions on one item are refused before any condition is evaluated, as DynamoDB documents;
//!   DynamoDB Local evaluates the conditions first and may cancel instead;
//! - an update of a key attribute is refused up front; DynamoDB Local cancels the transaction with a
//!   `ValidationError` reason (or `ConditionalCheckFailed`, if a condition fails first);
//! - an update that fails on the item's values (arithmetic on a missing attribute or a string, a sum
//!   beyond 38 digits) is a `ValidationError` cancellation reason, as DynamoDB documents; DynamoDB Local
//!   refuses the whole request with a `ValidationException`;
//! - a top-level number written by ADD to a missing attribute is read back in canonical text (`"1e2"` as
//!   `"100"`), like every other top-level number; DynamoDB Local keeps that one as written. Numbers inside
//!   lists and maps are kept as written by both.
//!
//! Not modelled, and not refused: DynamoDB rejects redundant parentheses (`((a = :v))`); the emulator
//! accepts them. Item size limits (400 KB) are not checked per item here; the caller checks its own
//! items' sizes (the memory store's records are checked for every store by `Writes::check_limits`).
//! Neither are `ClientRequestToken`s: the memory store never loses a response, so it never sees a retry.
//!
//! # Checked against DynamoDB Local
//!
//! `tests/tests/stores/differential.rs` sends thousands of generated transactions (every action,
//! condition and update form listed in [`SUPPORTED`](expression::SUPPORTED), placeholders, reserved
//! words, all attribute types, two-table batches, `ALL_OLD`) both to DynamoDB Local and, as a claim's
//! business writes, to a memory store, and compares the outcome, the cancellation reasons and every item
//! afterwards; numbers are compared by value. The deliberate differences above are the only ones it
//! tolerates. Run it with `scripts/test --test stores differential::` (or `cargo test -p
//! idempotent-tests --test stores differential::` with `IDEMPOTENT_DYNAMODB_ENDPOINT` set); it prints
//! its seed, and `IDEMPOTENT_DIFF_SEED` / `IDEMPOTENT_DIFF_CASE` replay one case. The unit tests (`tests.rs`) pin each rule and message.

mod expression;
mod number;
mod plan;
mod reserved;
mod table;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use aws_sdk_dynamodb::types::TransactWriteItem;

pub(crate) use self::expression::Item;
use self::expression::validate_value;
pub(crate) use self::plan::Plan;
use self::table::{Table, canonical_item};

/// Every business table of one emulated database (one memory store's), by name.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    tables: HashMap<String, Table>,
}

/// DynamoDB's limit on the actions of one transaction, the caller's own action (index 0) among them.
pub(crate) const MAX_ACTIONS: usize = 100;

/// A request the emulator refuses: one DynamoDB would refuse before writing anything, or one it does not
/// model (refused rather than approximated). The message names the part, the expression and the action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(String);

impl Refused {
    /// The message, for the caller's own error.
    pub(crate) fn into_message(self) -> String {
        self.0
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Why one action of a canceled transaction did not commit, DynamoDB's way.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cancellation {
    /// The action's index in the transaction (0 is the caller's own action).
    pub(crate) index: usize,
    /// DynamoDB's code: `None` for an action that was fine, `ConditionalCheckFailed`, `ValidationError`.
    pub(crate) code: String,
    /// DynamoDB's message, if any.
    pub(crate) message: Option<String>,
    /// The item as it was, when the action asked for `ALL_OLD` on a failed condition.
    pub(crate) item: Option<Item>,
}

fn invalid(message: String) -> Refused {
    Refused(message)
}

fn no_table(name: &str) -> String {
    format!(
        "the memory store has no table `{name}`; create it first with `MemoryStore::create_table(\"{name}\", <partition key>, <sort key or None>)`"
    )
}

impl Tables {
    /// Creates a table with its key schema (the partition key, and the sort key if any); creating it
    /// again with the same key schema keeps it and its items.
    ///
    /// # Errors
    /// [`Refused`] if a table of that name exists with another key schema.
    pub(crate) fn create_table(
        &mut self,
        name: &str,
        partition_key: &str,
        sort_key: Option<&str>,
    ) -> Result<(), Refused> {
        match self.tables.get(name) {
            Some(t) if t.partition_key == partition_key && t.sort_key.as_deref() == sort_key => {
                Ok(())
            }
            Some(t) => Err(invalid(format!(
                "the memory store already has a table `{name}` with the key ({}); it cannot be created again with the key ({})",
                t.key_names().collect::<Vec<_>>().join(", "),
                std::iter::once(partition_key)
                    .chain(sort_key)
                    .collect::<Vec<_>>()
                    .join(", "),
            ))),
            None => {
                self.tables
                    .insert(name.to_owned(), Table::new(partition_key, sort_key));
                Ok(())
            }
        }
    }

    /// Inserts or replaces an item, without conditions.
    ///
    /// # Errors
    /// [`Refused`] if the table was not created, the item lacks a key attribute, or a value
    /// is one DynamoDB rejects.
    pub(crate) fn put_item(&mut self, table: &str, item: Item) -> Result<(), Refused> {
        let target = self
            .tables
            .get_mut(table)
            .ok_or_else(|| invalid(no_table(table)))?;
        let key = target
            .key_of_item(&item)
            .map_err(|e| invalid(format!("put_item on table `{table}`: {e}")))?;
        for (name, value) in &item {
            validate_value(value).map_err(|e| {
                invalid(format!(
                    "put_item on table `{table}`: attribute {name}: {e}"
                ))
            })?;
        }
        target.items.insert(key, canonical_item(item));
        Ok(())
    }

    /// The item with the key attributes of `key` (other attributes in `key` are ignored).
    pub(crate) fn get_item(&self, table: &str, key: &Item) -> Option<Item> {
        let table = self.tables.get(table)?;
        table.items.get(&table.key_of_item(key).ok()?).cloned()
    }

    /// Every item of `table`, in key order.
    pub(crate) fn items(&self, table: &str) -> Vec<Item> {
        self.tables
            .get(table)
            .map(|t| t.items.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Checks, parses and evaluates the staged `writes` (transaction indexes 1.., after the caller's own action)
    /// against the current items, changing nothing.
    ///
    /// # Errors
    /// [`Refused`]: what DynamoDB would reject before evaluating anything (an unknown table,
    /// a key that does not match the schema, an invalid expression, two actions on one item, too many
    /// actions), and expressions the emulator does not model.
    pub(crate) fn plan(&self, writes: &[TransactWriteItem]) -> Result<Plan, Refused> {
        Plan::new(self, writes)
    }

    /// Applies `plan` if every staged write held; otherwise changes nothing and returns the
    /// cancellation reasons, one per action, index 0 being the caller's (`"None"`: the caller
    /// commits only once its own action held).
    ///
    /// The plan must have been made by [`plan`](Self::plan) on these tables under the same lock, with
    /// no change in between.
    pub(crate) fn commit(&mut self, plan: Plan) -> Result<(), Vec<Cancellation>> {
        if !plan.holds() {
            return Err(plan.cancellation_reasons());
        }
        for (table, key, item) in plan.into_writes() {
            // The plan was made against these tables under the same lock, so the table exists.
            let Some(table) = self.tables.get_mut(&table) else {
                continue;
            };
            match item {
                Some(item) => table.items.insert(key, item),
                None => table.items.remove(&key),
            };
        }
        Ok(())
    }
}
