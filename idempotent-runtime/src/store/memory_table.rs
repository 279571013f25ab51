//! The memory store's business tables, so that code staging `TransactWriteItem`s can be unit-tested
//! without DynamoDB.
//!
//! A transaction is planned first — every action parsed, checked and its condition evaluated against the
//! current items — and applied only if every action holds, so it is all or nothing. The caller holds the
//! store's one lock across planning and applying, which makes transactions linearizable with the records.
//!
//! # Checked against DynamoDB Local
//!
//! `tests/tests/differential.rs` sends thousands of generated transactions (every action, condition and
//! update form listed in [`SUPPORTED`](expression::SUPPORTED), placeholders, reserved words, all attribute
//! types, two-table batches, `ALL_OLD`) to both and compares the outcome, the cancellation reasons and
//! every item afterwards; numbers are compared by value.
//!
//! # What it deliberately does not do
//!
//! Refused with [`StoreError::Invalid`] naming the part, never approximated:
//! - nested paths (`a.b`, `a[0]`) and the functions `size`, `contains`, `attribute_type`, `list_append`.
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
//! accepts them. Item size limits (400 KB) are not checked per item here; the record's size is checked by
//! the handler for every store.

#![cfg(feature = "dynamodb")]

mod expression;
mod number;
mod reserved;

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};

use self::expression::{
    Condition, ExpressionError, Item, Placeholders, SUPPORTED, Update, parse_condition,
    parse_update, validate_value,
};
use self::number::Number;
use super::StoreError;
use crate::CancellationReason;

/// Every business table of one memory store, by name.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    tables: HashMap<String, Table>,
}

#[derive(Debug)]
struct Table {
    partition_key: String,
    sort_key: Option<String>,
    /// In key order, so that listings are deterministic.
    items: BTreeMap<Key, Item>,
}

/// A key attribute's value in a comparable, hashable form (`AttributeValue` is neither). Numbers are
/// normalized, so `"1.0"` and `"1"` are the same key, as in DynamoDB.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum KeyValue {
    S(String),
    N(Number),
    B(Vec<u8>),
}

/// An item's primary key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    partition: KeyValue,
    sort: Option<KeyValue>,
}

/// `item` as DynamoDB stores it: top-level numbers and number sets in canonical text (`"1e2"` reads back
/// as `"100"`, `"0.10"` as `"0.1"`); numbers inside lists and maps are kept as written, as DynamoDB Local
/// keeps them. Found by the differential tests.
fn canonical_item(item: Item) -> Item {
    // Values were validated before they get here; an unparsable number is kept as it is.
    let number = |n: String| Number::parse(&n).map_or(n, |v| v.to_string());
    item.into_iter()
        .map(|(k, v)| {
            let v = match v {
                AttributeValue::N(n) => AttributeValue::N(number(n)),
                AttributeValue::Ns(set) => {
                    AttributeValue::Ns(set.into_iter().map(number).collect())
                }
                other => other,
            };
            (k, v)
        })
        .collect()
}

/// Every error of the table model is a request DynamoDB would refuse before writing anything.
fn other(message: String) -> StoreError {
    StoreError::Invalid(message.into())
}

fn no_table(name: &str) -> String {
    format!(
        "the memory store has no table `{name}`; create it first with `MemoryStore::create_table(\"{name}\", <partition key>, <sort key or None>)`"
    )
}

impl Table {
    fn key_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.partition_key.as_str()).chain(self.sort_key.as_deref())
    }

    fn is_key(&self, attribute: &str) -> bool {
        self.key_names().any(|k| k == attribute)
    }

    /// The key of a whole item (a Put, or a seeded item): its key attributes, with type S, N or B.
    fn key_of_item(&self, item: &Item) -> Result<Key, String> {
        let part = |name: &str| -> Result<KeyValue, String> {
            match item.get(name) {
                Some(AttributeValue::S(s)) => Ok(KeyValue::S(s.clone())),
                Some(AttributeValue::N(n)) => Number::parse(n).map(KeyValue::N),
                Some(AttributeValue::B(b)) => Ok(KeyValue::B(b.as_ref().to_vec())),
                Some(_) => Err(format!(
                    "One or more parameter values were invalid: the key attribute {name} must be a string, number or binary"
                )),
                None => Err(format!(
                    "One or more parameter values were invalid: Missing the key {name} in the item"
                )),
            }
        };
        Ok(Key {
            partition: part(&self.partition_key)?,
            sort: self.sort_key.as_deref().map(part).transpose()?,
        })
    }

    /// The key of a `Key` map (Update, Delete, ConditionCheck): exactly the key attributes.
    fn key_of_key(&self, key: &Item) -> Result<Key, String> {
        if key.len() != self.key_names().count() {
            return Err("The number of conditions on the keys is invalid".to_owned());
        }
        self.key_of_item(key)
            .map_err(|_| "The provided key element does not match the schema".to_owned())
    }
}

impl Tables {
    /// Creates a table; creating it again with the same key schema keeps it and its items.
    pub(crate) fn create(
        &mut self,
        name: &str,
        partition_key: &str,
        sort_key: Option<&str>,
    ) -> Result<(), StoreError> {
        match self.tables.get(name) {
            Some(t) if t.partition_key == partition_key && t.sort_key.as_deref() == sort_key => {
                Ok(())
            }
            Some(t) => Err(other(format!(
                "the memory store already has a table `{name}` with the key ({}); it cannot be created again with the key ({})",
                t.key_names().collect::<Vec<_>>().join(", "),
                std::iter::once(partition_key)
                    .chain(sort_key)
                    .collect::<Vec<_>>()
                    .join(", "),
            ))),
            None => {
                self.tables.insert(
                    name.to_owned(),
                    Table {
                        partition_key: partition_key.to_owned(),
                        sort_key: sort_key.map(str::to_owned),
                        items: BTreeMap::new(),
                    },
                );
                Ok(())
            }
        }
    }

    /// Inserts or replaces an item, without conditions.
    pub(crate) fn put_item(&mut self, table: &str, item: Item) -> Result<(), StoreError> {
        let target = self
            .tables
            .get_mut(table)
            .ok_or_else(|| other(no_table(table)))?;
        let key = target
            .key_of_item(&item)
            .map_err(|e| other(format!("put_item on table `{table}`: {e}")))?;
        for (name, value) in &item {
            validate_value(value).map_err(|e| {
                other(format!(
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

    /// Checks, parses and evaluates the staged `writes` (transaction indexes 1.., after the record)
    /// against the current items, changing nothing.
    ///
    /// # Errors
    /// What DynamoDB would reject before evaluating anything (an unknown table, a key that does not match
    /// the schema, an invalid expression, two actions on one item), and expressions the memory store does
    /// not model.
    pub(crate) fn plan(&self, writes: &[TransactWriteItem]) -> Result<Plan, StoreError> {
        if writes.len() > crate::MAX_STAGED_WRITES {
            return Err(other(format!(
                "{} staged writes: a DynamoDB transaction holds at most {} actions, one of them the idempotency record",
                writes.len(),
                crate::MAX_STAGED_WRITES + 1
            )));
        }
        let actions = writes
            .iter()
            .enumerate()
            .map(|(i, write)| self.prepare(i + 1, write))
            .collect::<Result<Vec<_>, _>>()?;
        check_one_action_per_item(&actions)?;
        Ok(Plan {
            steps: actions.into_iter().map(Action::evaluate).collect(),
        })
    }

    /// Applies a plan made by [`plan`](Self::plan) under the same lock.
    pub(crate) fn apply(&mut self, plan: Plan) {
        for step in plan.steps {
            let Step::Write { table, key, item } = step else {
                continue;
            };
            // The plan was made against these tables under the same lock, so the table exists.
            let Some(table) = self.tables.get_mut(&table) else {
                continue;
            };
            match item {
                Some(item) => table.items.insert(key, item),
                None => table.items.remove(&key),
            };
        }
    }

    /// Checks and parses one staged write (everything that does not depend on the items).
    fn prepare<'w>(
        &'w self,
        index: usize,
        write: &'w TransactWriteItem,
    ) -> Result<Action<'w>, StoreError> {
        let parts = Parts::of(write).ok_or_else(|| {
            other(format!(
                "action {index}: a TransactWriteItem must set exactly one of Put, Update, Delete or ConditionCheck"
            ))
        })?;
        let context = Context {
            index,
            verb: parts.verb,
            table: parts.table,
        };
        let table = self
            .tables
            .get(parts.table)
            .ok_or_else(|| context.error(&no_table(parts.table)))?;
        let key = if parts.verb == Verb::Put {
            table.key_of_item(parts.item)
        } else {
            table.key_of_key(parts.item)
        }
        .map_err(|e| context.error(&e))?;
        for (name, value) in parts.item {
            validate_value(value).map_err(|e| context.error(&format!("attribute {name}: {e}")))?;
        }

        let mut placeholders = Placeholders::new(parts.names, parts.values);
        let condition = match parts.condition {
            Some(source) => Some(
                parse_condition(source, &mut placeholders)
                    .map_err(|e| context.expression_error("ConditionExpression", source, e))?,
            ),
            None => None,
        };
        let update = match parts.update {
            Some(source) => {
                let update = parse_update(source, &mut placeholders)
                    .map_err(|e| context.expression_error("UpdateExpression", source, e))?;
                if let Some(key_attribute) = update.targets().find(|t| table.is_key(t)) {
                    return Err(context.error(&format!(
                        "One or more parameter values were invalid: Cannot update attribute {key_attribute}. \
                         This attribute is part of the key"
                    )));
                }
                Some(update)
            }
            None => None,
        };
        placeholders
            .check_all_used()
            .map_err(|e| context.expression_error("expressions", "", e))?;

        let change = match (parts.verb, update) {
            (Verb::Put, _) => Change::Put(parts.item),
            (Verb::Update, Some(update)) => Change::Update {
                update,
                key: parts.item,
            },
            (Verb::Delete, _) => Change::Delete,
            (Verb::ConditionCheck | Verb::Update, _) => Change::None,
        };
        Ok(Action {
            index,
            table_name: parts.table,
            table,
            key,
            condition,
            change,
            return_old: parts.return_old,
        })
    }
}

/// DynamoDB rejects a transaction with two actions on one item, before evaluating anything.
fn check_one_action_per_item(actions: &[Action<'_>]) -> Result<(), StoreError> {
    let mut seen: HashMap<(&str, &Key), usize> = HashMap::new();
    for action in actions {
        if let Some(first) = seen.insert((action.table_name, &action.key), action.index) {
            return Err(other(format!(
                "Transaction request cannot include multiple operations on one item (actions {first} and {} on table `{}`)",
                action.index, action.table_name
            )));
        }
    }
    Ok(())
}

/// The four actions of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Put,
    Update,
    Delete,
    ConditionCheck,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Verb::Put => "Put",
            Verb::Update => "Update",
            Verb::Delete => "Delete",
            Verb::ConditionCheck => "ConditionCheck",
        }
    }
}

/// The fields of a `TransactWriteItem`, whichever action it holds.
struct Parts<'w> {
    verb: Verb,
    table: &'w str,
    /// The item of a Put; the key of the others.
    item: &'w Item,
    condition: Option<&'w str>,
    update: Option<&'w str>,
    names: Option<&'w HashMap<String, String>>,
    values: Option<&'w HashMap<String, AttributeValue>>,
    return_old: bool,
}

impl<'w> Parts<'w> {
    fn of(write: &'w TransactWriteItem) -> Option<Self> {
        let all_old = |r: Option<&ReturnValuesOnConditionCheckFailure>| {
            r == Some(&ReturnValuesOnConditionCheckFailure::AllOld)
        };
        let set = [
            write.put().is_some(),
            write.update().is_some(),
            write.delete().is_some(),
            write.condition_check().is_some(),
        ];
        if set.iter().filter(|s| **s).count() != 1 {
            return None;
        }
        if let Some(p) = write.put() {
            return Some(Self {
                verb: Verb::Put,
                table: p.table_name(),
                item: p.item(),
                condition: p.condition_expression(),
                update: None,
                names: p.expression_attribute_names(),
                values: p.expression_attribute_values(),
                return_old: all_old(p.return_values_on_condition_check_failure()),
            });
        }
        if let Some(u) = write.update() {
            return Some(Self {
                verb: Verb::Update,
                table: u.table_name(),
                item: u.key(),
                condition: u.condition_expression(),
                update: Some(u.update_expression()),
                names: u.expression_attribute_names(),
                values: u.expression_attribute_values(),
                return_old: all_old(u.return_values_on_condition_check_failure()),
            });
        }
        if let Some(d) = write.delete() {
            return Some(Self {
                verb: Verb::Delete,
                table: d.table_name(),
                item: d.key(),
                condition: d.condition_expression(),
                update: None,
                names: d.expression_attribute_names(),
                values: d.expression_attribute_values(),
                return_old: all_old(d.return_values_on_condition_check_failure()),
            });
        }
        let c = write.condition_check()?;
        Some(Self {
            verb: Verb::ConditionCheck,
            table: c.table_name(),
            item: c.key(),
            condition: Some(c.condition_expression()),
            update: None,
            names: c.expression_attribute_names(),
            values: c.expression_attribute_values(),
            return_old: all_old(c.return_values_on_condition_check_failure()),
        })
    }
}

/// Which action an error is about, for messages.
struct Context<'w> {
    index: usize,
    verb: Verb,
    table: &'w str,
}

impl Context<'_> {
    fn describe(&self) -> String {
        format!(
            "action {} (a staged {} on table `{}`)",
            self.index,
            self.verb.as_str(),
            self.table
        )
    }

    fn error(&self, message: &str) -> StoreError {
        other(format!("{}: {message}", self.describe()))
    }

    fn expression_error(&self, field: &str, source: &str, error: ExpressionError) -> StoreError {
        let action = self.describe();
        other(match error {
            ExpressionError::Unsupported { what, part } => format!(
                "the memory store does not support {what} `{part}` in the {field} `{source}` of {action}; it models {SUPPORTED}. \
                 DynamoDB Local is the reference for the rest: run this test against it (`scripts/test`)"
            ),
            ExpressionError::Invalid(message) if source.is_empty() => {
                format!("invalid {field} of {action}: {message} (DynamoDB rejects it too)")
            }
            ExpressionError::Invalid(message) => format!(
                "invalid {field} `{source}` of {action}: {message} (DynamoDB rejects it too)"
            ),
        })
    }
}

/// One staged write, checked and parsed.
struct Action<'w> {
    /// The index in the transaction (0 is the idempotency record).
    index: usize,
    table_name: &'w str,
    table: &'w Table,
    key: Key,
    condition: Option<Condition>,
    change: Change<'w>,
    return_old: bool,
}

/// What an action writes when its condition holds.
enum Change<'w> {
    /// Replace the item with this one.
    Put(&'w Item),
    /// Update the item, or create it from `key` (as DynamoDB does) if it does not exist.
    Update {
        update: Update,
        key: &'w Item,
    },
    Delete,
    /// A `ConditionCheck`: nothing.
    None,
}

impl Action<'_> {
    /// Evaluates the condition against the current item and computes the write.
    fn evaluate(self) -> Step {
        let old = self.table.items.get(&self.key);
        if let Some(condition) = &self.condition
            && !condition.holds(old)
        {
            return Step::Failed {
                code: "ConditionalCheckFailed",
                message: "The conditional request failed".to_owned(),
                item: if self.return_old { old.cloned() } else { None },
            };
        }
        let item = match &self.change {
            Change::Put(item) => Some((*item).clone()),
            Change::Delete => None,
            Change::Update { update, key } => match update.apply(old.unwrap_or(key)) {
                Ok(new) => Some(new),
                Err(message) => {
                    return Step::Failed {
                        code: "ValidationError",
                        message,
                        item: None,
                    };
                }
            },
            Change::None => return Step::Check,
        };
        Step::Write {
            table: self.table_name.to_owned(),
            key: self.key,
            item: item.map(canonical_item),
        }
    }
}

/// What one staged write will do.
#[derive(Debug)]
enum Step {
    /// Replace (`Some`) or delete (`None`) one item.
    Write {
        table: String,
        key: Key,
        item: Option<Item>,
    },
    /// A `ConditionCheck` that held.
    Check,
    /// The action fails, and with it the transaction.
    Failed {
        code: &'static str,
        message: String,
        item: Option<Item>,
    },
}

/// The evaluated staged writes of one transaction.
#[derive(Debug)]
pub(crate) struct Plan {
    steps: Vec<Step>,
}

impl Plan {
    /// Whether every staged write holds, so the transaction may commit.
    pub(crate) fn holds(&self) -> bool {
        !self.steps.iter().any(|s| matches!(s, Step::Failed { .. }))
    }

    /// One reason per action, DynamoDB's way: index 0 is the idempotency record, whose condition held
    /// (`"None"`), then every staged write (`"None"` when it was fine).
    pub(crate) fn cancellation_reasons(self) -> Vec<CancellationReason> {
        let fine = |index| CancellationReason {
            index,
            code: "None".to_owned(),
            message: None,
            item: None,
        };
        std::iter::once(fine(0))
            .chain(
                self.steps
                    .into_iter()
                    .enumerate()
                    .map(|(i, step)| match step {
                        Step::Failed {
                            code,
                            message,
                            item,
                        } => CancellationReason {
                            index: i + 1,
                            code: code.to_owned(),
                            message: Some(message),
                            item,
                        },
                        Step::Write { .. } | Step::Check => fine(i + 1),
                    }),
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::{ConditionCheck, Delete, Put, Update as UpdateAction};

    use super::*;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    fn n(v: &str) -> AttributeValue {
        AttributeValue::N(v.to_owned())
    }

    fn item(pairs: &[(&str, AttributeValue)]) -> Item {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    fn sku(name: &str) -> Item {
        item(&[("sku", s(name))])
    }

    fn values(pairs: &[(&str, AttributeValue)]) -> Option<Item> {
        (!pairs.is_empty()).then(|| item(pairs))
    }

    /// `inventory` (key `sku`) with 10 apples and 1 pear, and `orders` (key `customer`, `order_id`), empty.
    fn tables() -> Tables {
        let mut tables = Tables::default();
        tables.create("inventory", "sku", None).unwrap();
        tables
            .create("orders", "customer", Some("order_id"))
            .unwrap();
        for (name, count) in [("apple", "10"), ("pear", "1")] {
            let stock = item(&[("sku", s(name)), ("available", n(count))]);
            tables.put_item("inventory", stock).unwrap();
        }
        tables
    }

    fn put(
        table: &str,
        item: Item,
        condition: Option<&str>,
        values: &[(&str, AttributeValue)],
    ) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(table)
            .set_item(Some(item))
            .set_condition_expression(condition.map(str::to_owned))
            .set_expression_attribute_values(self::values(values))
            .build()
            .unwrap();
        TransactWriteItem::builder().put(put).build()
    }

    fn update(
        table: &str,
        key: Item,
        expression: &str,
        condition: Option<&str>,
        values: &[(&str, AttributeValue)],
    ) -> TransactWriteItem {
        let update = UpdateAction::builder()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(expression)
            .set_condition_expression(condition.map(str::to_owned))
            .set_expression_attribute_values(self::values(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .unwrap();
        TransactWriteItem::builder().update(update).build()
    }

    fn delete(
        table: &str,
        key: Item,
        condition: &str,
        values: &[(&str, AttributeValue)],
    ) -> TransactWriteItem {
        let delete = Delete::builder()
            .table_name(table)
            .set_key(Some(key))
            .condition_expression(condition)
            .set_expression_attribute_values(self::values(values))
            .build()
            .unwrap();
        TransactWriteItem::builder().delete(delete).build()
    }

    fn check(
        table: &str,
        key: Item,
        condition: &str,
        values: &[(&str, AttributeValue)],
        all_old: bool,
    ) -> TransactWriteItem {
        let check = ConditionCheck::builder()
            .table_name(table)
            .set_key(Some(key))
            .condition_expression(condition)
            .set_expression_attribute_values(self::values(values))
            .set_return_values_on_condition_check_failure(
                all_old.then_some(ReturnValuesOnConditionCheckFailure::AllOld),
            )
            .build()
            .unwrap();
        TransactWriteItem::builder().condition_check(check).build()
    }

    /// Takes `quantity` apples if there are that many.
    fn reserve(quantity: &str) -> TransactWriteItem {
        update(
            "inventory",
            sku("apple"),
            "SET available = available - :q",
            Some("available >= :q"),
            &[(":q", n(quantity))],
        )
    }

    fn error_text(result: Result<Plan, StoreError>) -> String {
        match result {
            Err(StoreError::Invalid(e)) => e.to_string(),
            Err(e) => panic!("expected an invalid request, got {e:?}"),
            Ok(plan) => panic!("expected an error, got {plan:?}"),
        }
    }

    fn available(tables: &Tables, name: &str) -> AttributeValue {
        tables.get_item("inventory", &sku(name)).unwrap()["available"].clone()
    }

    #[test]
    fn a_plan_changes_nothing_until_applied() {
        let mut tables = tables();
        let plan = tables.plan(&[reserve("3")]).unwrap();
        assert!(plan.holds());
        assert_eq!(available(&tables, "apple"), n("10"));
        tables.apply(plan);
        assert_eq!(available(&tables, "apple"), n("7"));
    }

    #[test]
    fn put_replaces_the_whole_item_found_by_the_key_schema() {
        let mut tables = tables();
        let order = |id: &str, extra: (&str, AttributeValue)| {
            item(&[("customer", s("ada")), ("order_id", s(id)), extra])
        };
        let writes = [
            put("orders", order("o-1", ("total", n("5"))), None, &[]),
            put("orders", order("o-2", ("total", n("6"))), None, &[]),
        ];
        tables.apply(tables.plan(&writes).unwrap());
        let replace = put(
            "orders",
            order("o-1", ("note", s("gift"))),
            Some("attribute_exists(order_id)"),
            &[],
        );
        tables.apply(tables.plan(&[replace]).unwrap());
        let items = tables.items("orders");
        assert_eq!(items.len(), 2);
        assert_eq!(
            items[0],
            order("o-1", ("note", s("gift"))),
            "the old `total` is gone"
        );
        assert_eq!(items[1]["total"], n("6"));
    }

    #[test]
    fn update_creates_a_missing_item_from_its_key() {
        let mut tables = tables();
        let upsert = update(
            "inventory",
            sku("plum"),
            "ADD available :n",
            None,
            &[(":n", n("4"))],
        );
        tables.apply(tables.plan(&[upsert]).unwrap());
        assert_eq!(
            tables.get_item("inventory", &sku("plum")),
            Some(item(&[("sku", s("plum")), ("available", n("4"))]))
        );
    }

    #[test]
    fn delete_removes_the_item_and_condition_check_writes_nothing() {
        let mut tables = tables();
        let writes = [
            delete(
                "inventory",
                sku("apple"),
                "available = :ten",
                &[(":ten", n("10"))],
            ),
            check(
                "inventory",
                sku("pear"),
                "attribute_exists(sku)",
                &[],
                false,
            ),
        ];
        tables.apply(tables.plan(&writes).unwrap());
        assert_eq!(tables.get_item("inventory", &sku("apple")), None);
        assert_eq!(
            tables.items("inventory"),
            [item(&[("sku", s("pear")), ("available", n("1"))])]
        );
    }

    #[test]
    fn failed_conditions_give_one_reason_per_action() {
        let tables = tables();
        let writes = [
            reserve("3"),
            check(
                "inventory",
                sku("pear"),
                "available > :many",
                &[(":many", n("100"))],
                true,
            ),
            put("inventory", sku("plum"), Some("attribute_exists(sku)"), &[]),
        ];
        let plan = tables.plan(&writes).unwrap();
        assert!(!plan.holds());
        let reasons = plan.cancellation_reasons();
        let codes: Vec<_> = reasons.iter().map(|r| (r.index, r.code.as_str())).collect();
        assert_eq!(
            codes,
            [
                (0, "None"),
                (1, "None"),
                (2, "ConditionalCheckFailed"),
                (3, "ConditionalCheckFailed")
            ]
        );
        assert_eq!(
            reasons[2].message.as_deref(),
            Some("The conditional request failed")
        );
        assert_eq!(
            reasons[2].item,
            Some(item(&[("sku", s("pear")), ("available", n("1"))])),
            "ALL_OLD returns the item as it was"
        );
        assert_eq!(reasons[3].item, None, "no ALL_OLD asked, and no item");
        assert_eq!(available(&tables, "apple"), n("10"));
    }

    #[test]
    fn an_update_that_fails_on_the_data_is_a_validation_error() {
        let bad = update(
            "inventory",
            sku("apple"),
            "SET available = absent + :q",
            None,
            &[(":q", n("1"))],
        );
        let reasons = tables().plan(&[bad]).unwrap().cancellation_reasons();
        assert_eq!(reasons[1].code, "ValidationError");
        assert_eq!(
            reasons[1].message.as_deref(),
            Some("The provided expression refers to an attribute that does not exist in the item")
        );
    }

    #[test]
    fn two_actions_on_one_item_are_refused_before_evaluation() {
        let tables = tables();
        let message = error_text(tables.plan(&[reserve("1"), reserve("2")]));
        assert_eq!(
            message,
            "Transaction request cannot include multiple operations on one item (actions 1 and 2 on table `inventory`)"
        );
        // A Put's key comes from its item and the table's key schema.
        let replace = put(
            "inventory",
            item(&[("sku", s("apple")), ("x", n("1"))]),
            None,
            &[],
        );
        let message = error_text(tables.plan(&[reserve("1"), replace]));
        assert!(
            message.contains("multiple operations on one item"),
            "{message}"
        );
    }

    #[test]
    fn equal_numbers_are_one_key() {
        let mut tables = Tables::default();
        tables.create("counters", "id", None).unwrap();
        tables
            .put_item("counters", item(&[("id", n("1.0")), ("hits", n("1"))]))
            .unwrap();
        let bump = update(
            "counters",
            item(&[("id", n("1"))]),
            "ADD hits :one",
            None,
            &[(":one", n("1"))],
        );
        tables.apply(tables.plan(&[bump]).unwrap());
        let items = tables.items("counters");
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["hits"], n("2"));
    }

    #[test]
    fn a_write_to_an_unknown_table_names_it_and_create_table() {
        let message = error_text(tables().plan(&[put("stock", sku("a"), None, &[])]));
        assert_eq!(
            message,
            "action 1 (a staged Put on table `stock`): the memory store has no table `stock`; create it first \
             with `MemoryStore::create_table(\"stock\", <partition key>, <sort key or None>)`"
        );
        let seeded = tables()
            .put_item("stock", sku("a"))
            .unwrap_err()
            .to_string();
        assert!(seeded.contains("create_table(\"stock\""), "{seeded}");
    }

    #[test]
    fn an_unsupported_expression_names_the_part_the_expression_and_the_reference() {
        let nested = update(
            "inventory",
            sku("pear"),
            "SET stock.shelf = :q",
            None,
            &[(":q", n("1"))],
        );
        let message = error_text(tables().plan(&[reserve("1"), nested]));
        assert!(
            message.starts_with(
                "the memory store does not support a nested attribute path `stock.shelf` in the UpdateExpression \
                 `SET stock.shelf = :q` of action 2 (a staged Update on table `inventory`); it models top-level"
            ),
            "{message}"
        );
        assert!(
            message.ends_with(
                "DynamoDB Local is the reference for the rest: run this test against it (`scripts/test`)"
            ),
            "{message}"
        );
        let sized = check(
            "inventory",
            sku("apple"),
            "size(tags) > :q",
            &[(":q", n("1"))],
            false,
        );
        let message = error_text(tables().plan(&[sized]));
        assert!(
            message.contains(
                "the function `size` `size(tags)` in the ConditionExpression `size(tags) > :q` of action 1 \
                 (a staged ConditionCheck on table `inventory`)"
            ),
            "{message}"
        );
    }

    #[test]
    fn an_invalid_expression_says_dynamodb_rejects_it_too() {
        let incomplete = update(
            "inventory",
            sku("apple"),
            "SET available = :q",
            Some("available >="),
            &[(":q", n("1"))],
        );
        assert_eq!(
            error_text(tables().plan(&[incomplete])),
            "invalid ConditionExpression `available >=` of action 1 (a staged Update on table `inventory`): \
             syntax error: expected an attribute name, found the end of the expression (DynamoDB rejects it too)"
        );
        let unused = update(
            "inventory",
            sku("apple"),
            "SET available = :q",
            None,
            &[(":q", n("1")), (":spare", n("2"))],
        );
        assert_eq!(
            error_text(tables().plan(&[unused])),
            "invalid expressions of action 1 (a staged Update on table `inventory`): Value provided in \
             ExpressionAttributeValues unused in expressions: keys: {:spare} (DynamoDB rejects it too)"
        );
    }

    #[test]
    fn keys_must_match_the_schema_and_stay_unchanged() {
        let tables = tables();
        let set_amount = |key| update("orders", key, "SET amount = :q", None, &[(":q", n("1"))]);
        let half_key = set_amount(item(&[("customer", s("ada"))]));
        assert!(
            error_text(tables.plan(&[half_key]))
                .ends_with("The number of conditions on the keys is invalid")
        );
        let extra = set_amount(item(&[
            ("customer", s("ada")),
            ("order_id", s("o")),
            ("x", n("1")),
        ]));
        assert!(
            error_text(tables.plan(&[extra]))
                .ends_with("The number of conditions on the keys is invalid")
        );
        let misnamed = set_amount(item(&[("customer", s("ada")), ("order", s("o"))]));
        assert!(
            error_text(tables.plan(&[misnamed]))
                .ends_with("The provided key element does not match the schema")
        );
        let keyless = put("orders", item(&[("customer", s("ada"))]), None, &[]);
        assert!(
            error_text(tables.plan(&[keyless])).ends_with("Missing the key order_id in the item")
        );
        let rekey = update(
            "inventory",
            sku("apple"),
            "SET sku = :s",
            None,
            &[(":s", s("plum"))],
        );
        assert!(
            error_text(tables.plan(&[rekey]))
                .ends_with("Cannot update attribute sku. This attribute is part of the key")
        );
    }

    #[test]
    fn create_table_again_keeps_items_or_refuses_another_schema() {
        let mut tables = tables();
        tables.create("inventory", "sku", None).unwrap();
        assert_eq!(available(&tables, "apple"), n("10"));
        let message = tables
            .create("inventory", "id", Some("sku"))
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("already has a table `inventory` with the key (sku)"),
            "{message}"
        );
    }

    #[test]
    fn at_most_99_staged_writes() {
        let tables = tables();
        let writes: Vec<_> = (0..100)
            .map(|i| put("inventory", sku(&format!("sku-{i}")), None, &[]))
            .collect();
        assert!(error_text(tables.plan(&writes)).contains("at most 100 actions"));
        assert!(tables.plan(&writes[..99]).is_ok());
    }

    #[test]
    fn an_empty_action_is_refused() {
        let message = error_text(tables().plan(&[TransactWriteItem::builder().build()]));
        assert!(
            message.contains("exactly one of Put, Update, Delete or ConditionCheck"),
            "{message}"
        );
    }

    /// Found by the differential tests: DynamoDB reads back top-level numbers in canonical text.
    #[test]
    fn numbers_are_stored_in_canonical_text() {
        let mut tables = tables();
        let mut apple = sku("apple");
        apple.insert("available".to_owned(), n("1e2"));
        apple.insert(
            "sizes".to_owned(),
            AttributeValue::Ns(vec!["0.10".into(), "2E1".into()]),
        );
        tables.put_item("inventory", apple).unwrap();
        let stored = tables.get_item("inventory", &sku("apple")).unwrap();
        assert_eq!(stored["available"], n("100"));
        assert_eq!(
            stored["sizes"],
            AttributeValue::Ns(vec!["0.1".into(), "20".into()])
        );
    }
}
