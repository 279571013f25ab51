//! A record as a DynamoDB item, read back attribute by attribute with the configured [`AttributeNames`]
//! (items are written only by the updates in [`expression`](super::expression)).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{AttributeNames, Layout};
use crate::record::{Record, Status};
use crate::store::StoreError;

/// The attributes a record is read from, in the order of [`Attributes::names`].
const KEY: usize = 0;
const SORT_KEY: usize = 1;
const STATUS: usize = 2;
const TOKEN: usize = 3;
const ATTEMPT: usize = 4;
const LEASE_UNTIL: usize = 5;
const EXPIRES_AT: usize = 6;
const FINGERPRINT: usize = 7;
const RESPONSE: usize = 8;
const ERROR: usize = 9;
const REPLAY_UNTIL: usize = 10;
const CLAIM_WRITES: usize = 11;
const COMPLETED_IN: usize = 12;
const FIELDS: usize = 13;

/// A record's attributes, moved out of an item in one pass over it: no attribute name is hashed and no
/// value copied (an item has a handful of attributes, and each is compared with the configured names,
/// which mostly differ in length). Attributes that are not the record's are dropped.
struct Attributes<'n> {
    names: [&'n str; FIELDS],
    values: [Option<AttributeValue>; FIELDS],
}

impl<'n> Attributes<'n> {
    fn take(names: &'n AttributeNames, item: HashMap<String, AttributeValue>) -> Self {
        let names = [
            names.key.as_str(),
            &names.sort_key,
            &names.status,
            &names.token,
            &names.attempt,
            &names.lease_until,
            &names.expires_at,
            &names.fingerprint,
            &names.response,
            &names.error,
            &names.replay_until,
            &names.claim_writes,
            &names.completed_in,
        ];
        let mut values = [const { None }; FIELDS];
        for (name, value) in item {
            let mut fields = (0..FIELDS).filter(|&i| names[i] == name);
            if let Some(first) = fields.next() {
                // Names set to the same attribute (no table can hold such records) each read it.
                for other in fields {
                    values[other] = Some(value.clone());
                }
                values[first] = Some(value);
            }
        }
        Self { names, values }
    }

    fn value(&mut self, field: usize) -> (Option<AttributeValue>, &'n str) {
        (self.values[field].take(), self.names[field])
    }

    fn string(&mut self, field: usize) -> Result<Option<String>, StoreError> {
        match self.value(field) {
            (None, _) => Ok(None),
            (Some(AttributeValue::S(v)), _) => Ok(Some(v)),
            (Some(_), name) => Err(StoreError::Corrupt(format!(
                "attribute `{name}` is not a string"
            ))),
        }
    }

    fn number(&mut self, field: usize) -> Result<Option<u64>, StoreError> {
        match self.value(field) {
            (None, _) => Ok(None),
            (Some(AttributeValue::N(v)), name) => v.parse().map(Some).map_err(|_| {
                StoreError::Corrupt(format!(
                    "attribute `{name}` is not a non-negative integer: {v}"
                ))
            }),
            (Some(_), name) => Err(StoreError::Corrupt(format!(
                "attribute `{name}` is not a number"
            ))),
        }
    }

    fn required<T>(&self, value: Option<T>, field: usize) -> Result<T, StoreError> {
        let name = self.names[field];
        value.ok_or_else(|| StoreError::Corrupt(format!("attribute `{name}` is missing")))
    }
}

/// Turns a stored item of the default [`Layout::Key`] into a [`Record`] (see [`parse_record`]).
#[cfg(test)]
pub(crate) fn parse_item(
    names: &AttributeNames,
    item: &HashMap<String, AttributeValue>,
) -> Result<Record, StoreError> {
    parse_record(names, &Layout::Key, item.clone())
}

/// Turns a stored item of `layout` into a [`Record`], or says what is wrong with it:
/// [`StoreError::Corrupt`] for a missing or mistyped attribute (the key attributes included), an unknown
/// status, or a PENDING record without a lease. The item is taken apart: the record keeps its values.
pub(crate) fn parse_record(
    names: &AttributeNames,
    layout: &Layout,
    item: HashMap<String, AttributeValue>,
) -> Result<Record, StoreError> {
    let mut a = Attributes::take(names, item);
    let status_text = a.string(STATUS)?;
    let status_text = a.required(status_text, STATUS)?;
    let status = Status::parse(&status_text).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "unknown status `{status_text}` in `{}`",
            names.status
        ))
    })?;
    let lease_until_ms = a.number(LEASE_UNTIL)?;
    if status == Status::Pending && lease_until_ms.is_none() {
        return Err(StoreError::Corrupt(format!(
            "a PENDING record without `{}`",
            names.lease_until
        )));
    }
    let response = match a.value(RESPONSE) {
        (None, _) => None,
        (Some(AttributeValue::B(b)), _) => Some(b.into_inner()),
        (Some(_), name) => {
            return Err(StoreError::Corrupt(format!(
                "attribute `{name}` is not binary"
            )));
        }
    };
    // In the order the attributes were always checked in, so that a record wrong in two ways is
    // reported the same.
    let key = layout.record_key(names, a.value(KEY).0, a.value(SORT_KEY).0)?;
    let token = a.string(TOKEN)?;
    let token = a.required(token, TOKEN)?;
    let attempt = a.number(ATTEMPT)?.unwrap_or(0);
    let expires_at_s = a.number(EXPIRES_AT)?;
    let expires_at_s = a.required(expires_at_s, EXPIRES_AT)?;
    Ok(Record {
        key,
        status,
        token,
        attempt,
        lease_until_ms,
        expires_at_s,
        fingerprint: a.string(FINGERPRINT)?,
        response,
        error: a.string(ERROR)?,
        replay_until_s: a.number(REPLAY_UNTIL)?,
        claim_writes_in_effect: match a.value(CLAIM_WRITES) {
            (None, _) => false,
            (Some(AttributeValue::Bool(b)), _) => b,
            (Some(_), name) => {
                return Err(StoreError::Corrupt(format!(
                    "attribute `{name}` is not a boolean"
                )));
            }
        },
        completed_in: a.string(COMPLETED_IN)?,
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
        let record = parse_record(&names, &Layout::Key, full_item(&names)).unwrap();
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
        let record = parse_record(&names, &Layout::Tenant, item).unwrap();
        assert_eq!(record.key, "billing::charge#00ff");
    }

    #[test]
    fn a_record_wrong_in_two_ways_is_reported_for_the_first_attribute_checked() {
        let names = names();
        let mut item = full_item(&names);
        item.remove(&names.token);
        item.insert(names.expires_at.clone(), s("soon"));
        assert!(matches!(
            parse_record(&names, &Layout::Key, item),
            Err(StoreError::Corrupt(m)) if m == "attribute `tk` is missing"
        ));
        let mut item = full_item(&names);
        item.insert(names.attempt.clone(), s("3"));
        item.insert(names.claim_writes.clone(), s("yes"));
        assert!(matches!(
            parse_record(&names, &Layout::Key, item),
            Err(StoreError::Corrupt(m)) if m == "attribute `at` is not a number"
        ));
    }

    #[test]
    fn names_set_to_the_same_attribute_each_read_it() {
        let mut names = names();
        names.error = names.completed_in.clone();
        let record = parse_record(&names, &Layout::Key, full_item(&names)).unwrap();
        assert_eq!(record.error.as_deref(), Some("eu-west-1"));
        assert_eq!(record.completed_in.as_deref(), Some("eu-west-1"));
    }
}
