//! A record as a DynamoDB item, read back attribute by attribute with the configured [`AttributeNames`]
//! (items are written only by the updates in [`expression`](super::expression)).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{AttributeNames, Layout};
use crate::record::{Record, Status};
use crate::store::StoreError;

fn attr<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> Option<&'a AttributeValue> {
    item.get(name)
}

fn string(
    item: &HashMap<String, AttributeValue>,
    name: &str,
) -> Result<Option<String>, StoreError> {
    match attr(item, name) {
        None => Ok(None),
        Some(AttributeValue::S(v)) => Ok(Some(v.clone())),
        Some(_) => Err(StoreError::Corrupt(format!(
            "attribute `{name}` is not a string"
        ))),
    }
}

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> Result<Option<u64>, StoreError> {
    match attr(item, name) {
        None => Ok(None),
        Some(AttributeValue::N(v)) => v.parse().map(Some).map_err(|_| {
            StoreError::Corrupt(format!(
                "attribute `{name}` is not a non-negative integer: {v}"
            ))
        }),
        Some(_) => Err(StoreError::Corrupt(format!(
            "attribute `{name}` is not a number"
        ))),
    }
}

fn required<T>(value: Option<T>, name: &str) -> Result<T, StoreError> {
    value.ok_or_else(|| StoreError::Corrupt(format!("attribute `{name}` is missing")))
}

/// Turns a stored item of the default [`Layout::Key`] into a [`Record`] (see [`parse_record`]).
#[cfg(test)]
pub(crate) fn parse_item(
    names: &AttributeNames,
    item: &HashMap<String, AttributeValue>,
) -> Result<Record, StoreError> {
    parse_record(names, &Layout::Key, item)
}

/// Turns a stored item of `layout` into a [`Record`], or says what is wrong with it:
/// [`StoreError::Corrupt`] for a missing or mistyped attribute (the key attributes included), an unknown
/// status, or a PENDING record without a lease.
pub(crate) fn parse_record(
    names: &AttributeNames,
    layout: &Layout,
    item: &HashMap<String, AttributeValue>,
) -> Result<Record, StoreError> {
    let status_text = required(string(item, &names.status)?, &names.status)?;
    let status = Status::parse(&status_text).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "unknown status `{status_text}` in `{}`",
            names.status
        ))
    })?;
    let lease_until_ms = number(item, &names.lease_until)?;
    if status == Status::Pending && lease_until_ms.is_none() {
        return Err(StoreError::Corrupt(format!(
            "a PENDING record without `{}`",
            names.lease_until
        )));
    }
    let response = match attr(item, &names.response) {
        None => None,
        Some(AttributeValue::B(b)) => Some(b.as_ref().to_vec()),
        Some(_) => {
            return Err(StoreError::Corrupt(format!(
                "attribute `{}` is not binary",
                names.response
            )));
        }
    };
    Ok(Record {
        key: layout.record_key(names, item)?,
        status,
        token: required(string(item, &names.token)?, &names.token)?,
        attempt: number(item, &names.attempt)?.unwrap_or(0),
        lease_until_ms,
        expires_at_s: required(number(item, &names.expires_at)?, &names.expires_at)?,
        fingerprint: string(item, &names.fingerprint)?,
        response,
        error: string(item, &names.error)?,
        replay_until_s: number(item, &names.replay_until)?,
        claim_writes_in_effect: match attr(item, &names.claim_writes) {
            None => false,
            Some(AttributeValue::Bool(b)) => *b,
            Some(_) => {
                return Err(StoreError::Corrupt(format!(
                    "attribute `{}` is not a boolean",
                    names.claim_writes
                )));
            }
        },
        completed_in: string(item, &names.completed_in)?,
    })
}
