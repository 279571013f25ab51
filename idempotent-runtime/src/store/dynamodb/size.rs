//! DynamoDB's size rules for the values of staged writes, to check a transaction's
//! [`MAX_TRANSACTION_BYTES`](crate::MAX_TRANSACTION_BYTES) before anything is sent.
//!
//! The record's own budget ([`MAX_ITEM_BYTES`](crate::MAX_ITEM_BYTES), and how much of it a response may
//! take) is in `crate::size`, outside this folder: every store applies it, with or without the SDK.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

/// The size of an attribute value, by DynamoDB's rules (numbers are approximated by their text length).
fn value_size(value: &AttributeValue) -> usize {
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
fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// An estimate of what one staged write adds to a transaction's payload.
pub(super) fn transact_item_size(write: &TransactWriteItem) -> usize {
    let values = |v: Option<&HashMap<String, AttributeValue>>| v.map_or(0, item_size);
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
