//! DynamoDB item sizes, computed before writing: attribute names count, as DynamoDB counts them.

#[cfg(feature = "dynamodb")]
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use crate::record::AttributeNames;

/// DynamoDB's item size limit, attribute names included.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// The largest size DynamoDB may count for a number attribute (38 digits of precision).
const MAX_NUMBER_BYTES: usize = 21;
/// A fencing token (a hyphenated UUID).
const TOKEN_BYTES: usize = 36;

/// The most bytes a response may have so that a COMPLETED record for `key` fits in one item: the limit
/// minus every other attribute, names included (counted generously).
pub(crate) fn response_budget(
    names: &AttributeNames,
    key: &str,
    fingerprint: Option<&str>,
) -> usize {
    let overhead = names.key.len()
        + key.len()
        + names.status.len()
        + "COMPLETED".len()
        + names.token.len()
        + TOKEN_BYTES
        + names.attempt.len()
        + names.expires_at.len()
        + names.replay_until.len()
        + names.claim_writes.len()
        + 1
        + 2 * MAX_NUMBER_BYTES
        + MAX_NUMBER_BYTES
        + fingerprint.map_or(0, |f| names.fingerprint.len() + f.len())
        + names.response.len();
    MAX_ITEM_BYTES.saturating_sub(overhead)
}

/// The size of an attribute value, by DynamoDB's rules (numbers are approximated by their text length).
#[cfg(feature = "dynamodb")]
pub(crate) fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Ss(v) | AttributeValue::Ns(v) => v.iter().map(String::len).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(v) => 3 + v.iter().map(|x| 1 + value_size(x)).sum::<usize>(),
        AttributeValue::M(m) => 3 + item_size(m) + m.len(),
        _ => 1,
    }
}

/// The size of an item: every attribute's name plus its value.
#[cfg(feature = "dynamodb")]
pub(crate) fn item_size(item: &std::collections::HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// An estimate of what one staged write adds to a transaction's payload.
#[cfg(feature = "dynamodb")]
pub(crate) fn transact_item_size(write: &TransactWriteItem) -> usize {
    let values =
        |v: Option<&std::collections::HashMap<String, AttributeValue>>| v.map_or(0, item_size);
    if let Some(p) = write.put() {
        return item_size(p.item()) + values(p.expression_attribute_values());
    }
    if let Some(u) = write.update() {
        return item_size(u.key())
            + u.update_expression().len()
            + values(u.expression_attribute_values());
    }
    if let Some(d) = write.delete() {
        return item_size(d.key()) + values(d.expression_attribute_values());
    }
    write.condition_check().map_or(0, |c| {
        item_size(c.key())
            + c.condition_expression().len()
            + values(c.expression_attribute_values())
    })
}
