//! Planning a transaction: every staged write checked, parsed and evaluated against the current items
//! before anything changes, so that [`Tables::commit`] applies all of them or none.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};

use super::expression::{
    Condition, ExpressionError, Item, Placeholders, SUPPORTED, Update, parse_condition,
    parse_update, validate_value,
};
use super::table::{Key, Table, canonical_item};
use super::{Cancellation, MAX_ACTIONS, Refused, Tables, invalid, no_table};

impl Tables {
    /// Checks and parses one staged write (everything that does not depend on the items).
    fn prepare<'w>(
        &'w self,
        index: usize,
        write: &'w TransactWriteItem,
    ) -> Result<Action<'w>, Refused> {
        let parts = Parts::of(write).ok_or_else(|| {
            invalid(format!(
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
fn check_one_action_per_item(actions: &[Action<'_>]) -> Result<(), Refused> {
    let mut seen: HashMap<(&str, &Key), usize> = HashMap::new();
    for action in actions {
        if let Some(first) = seen.insert((action.table_name, &action.key), action.index) {
            return Err(invalid(format!(
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

    fn error(&self, message: &str) -> Refused {
        invalid(format!("{}: {message}", self.describe()))
    }

    fn expression_error(&self, field: &str, source: &str, error: ExpressionError) -> Refused {
        let action = self.describe();
        invalid(match error {
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
    /// The index in the transaction (0 is the caller's own action).
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

/// The evaluated staged writes of one transaction, made by [`Tables::plan`] and applied (or not) by
/// [`Tables::commit`].
#[derive(Debug)]
pub(crate) struct Plan {
    steps: Vec<Step>,
}

impl Plan {
    /// Checks, parses and evaluates `writes` (transaction indexes 1.., after the caller's own action) against the
    /// current items of `tables`, changing nothing.
    pub(super) fn new(tables: &Tables, writes: &[TransactWriteItem]) -> Result<Self, Refused> {
        if writes.len() >= MAX_ACTIONS {
            return Err(invalid(format!(
                "{} staged writes: a DynamoDB transaction holds at most {MAX_ACTIONS} actions, one of them the idempotency record",
                writes.len(),
            )));
        }
        let actions = writes
            .iter()
            .enumerate()
            .map(|(i, write)| tables.prepare(i + 1, write))
            .collect::<Result<Vec<_>, _>>()?;
        check_one_action_per_item(&actions)?;
        Ok(Plan {
            steps: actions.into_iter().map(Action::evaluate).collect(),
        })
    }

    /// The item writes, in action order: a table, a key, and the new item (`None`: delete it).
    pub(super) fn into_writes(self) -> impl Iterator<Item = (String, Key, Option<Item>)> {
        self.steps.into_iter().filter_map(|step| match step {
            Step::Write { table, key, item } => Some((table, key, item)),
            Step::Check | Step::Failed { .. } => None,
        })
    }

    /// Whether every staged write holds, so the transaction may commit.
    pub(super) fn holds(&self) -> bool {
        !self.steps.iter().any(|s| matches!(s, Step::Failed { .. }))
    }

    /// One reason per action, DynamoDB's way: index 0 is the caller's own action, whose condition held
    /// (`"None"`), then every staged write (`"None"` when it was fine).
    pub(super) fn cancellation_reasons(self) -> Vec<Cancellation> {
        let fine = |index| Cancellation {
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
                        } => Cancellation {
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
