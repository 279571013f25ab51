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

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::primitives::Blob;

    use super::*;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    fn n(v: u64) -> AttributeValue {
        AttributeValue::N(v.to_string())
    }

    /// Names unlike the defaults, two of them of the same length as others.
    fn names() -> AttributeNames {
        AttributeNames {
            key: "id".into(),
            sort_key: "sk2".into(),
            status: "st".into(),
            token: "tk".into(),
            attempt: "at".into(),
            lease_until: "lu".into(),
            expires_at: "ttl".into(),
            fingerprint: "fp".into(),
            response: "rs".into(),
            error: "er".into(),
            replay_until: "ru".into(),
            claim_writes: "cw".into(),
            completed_in: "ci".into(),
        }
    }

    fn full_item(names: &AttributeNames) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (names.key.clone(), s("ns#00ff")),
            (names.status.clone(), s("COMPLETED")),
            (names.token.clone(), s("t-1")),
            (names.attempt.clone(), n(3)),
            (names.lease_until.clone(), n(5_000)),
            (names.expires_at.clone(), n(90)),
            (names.fingerprint.clone(), s("f")),
            (names.response.clone(), AttributeValue::B(Blob::new(*b"{}"))),
            (names.error.clone(), s("declined")),
            (names.replay_until.clone(), n(80)),
            (names.claim_writes.clone(), AttributeValue::Bool(true)),
            (names.completed_in.clone(), s("eu-west-1")),
            // Not the record's: ignored.
            ("status".to_owned(), s("FAILED")),
            ("business".to_owned(), n(1)),
        ])
    }

    #[test]
    fn every_attribute_is_read_under_the_configured_names_and_others_are_ignored() {
        let names = names();
        let record = parse_record(&names, &Layout::Key, &full_item(&names)).unwrap();
        assert_eq!(
            record,
            Record {
                key: "ns#00ff".into(),
                status: Status::Completed,
                token: "t-1".into(),
                attempt: 3,
                lease_until_ms: Some(5_000),
                expires_at_s: 90,
                fingerprint: Some("f".into()),
                response: Some(b"{}".to_vec()),
                error: Some("declined".into()),
                replay_until_s: Some(80),
                claim_writes_in_effect: true,
                completed_in: Some("eu-west-1".into()),
            }
        );
        // The tenant layout joins the two key attributes.
        let mut item = full_item(&names);
        item.insert(names.key.clone(), s("billing::charge"));
        item.insert(names.sort_key.clone(), s("00ff"));
        let record = parse_record(&names, &Layout::Tenant, &item).unwrap();
        assert_eq!(record.key, "billing::charge#00ff");
    }

    #[test]
    fn a_record_wrong_in_two_ways_is_reported_for_the_first_attribute_checked() {
        let names = names();
        let mut item = full_item(&names);
        item.remove(&names.token);
        item.insert(names.expires_at.clone(), s("soon"));
        assert!(matches!(
            parse_record(&names, &Layout::Key, &item),
            Err(StoreError::Corrupt(m)) if m == "attribute `tk` is missing"
        ));
        let mut item = full_item(&names);
        item.insert(names.attempt.clone(), s("3"));
        item.insert(names.claim_writes.clone(), s("yes"));
        assert!(matches!(
            parse_record(&names, &Layout::Key, &item),
            Err(StoreError::Corrupt(m)) if m == "attribute `at` is not a number"
        ));
    }

    #[test]
    fn names_set_to_the_same_attribute_each_read_it() {
        let mut names = names();
        names.error = names.completed_in.clone();
        let record = parse_record(&names, &Layout::Key, &full_item(&names)).unwrap();
        assert_eq!(record.error.as_deref(), Some("eu-west-1"));
        assert_eq!(record.completed_in.as_deref(), Some("eu-west-1"));
    }
}
