//! A record as a DynamoDB item, read back attribute by attribute with the configured [`AttributeNames`]
//! (items are written only by the updates in [`expression`](super::expression)).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{AttributeNames, Layout};
use crate::record::{Record, Status};
use crate::store::StoreError;

/// A stored item being read into a [`Record`]: borrowed (each value read is copied), or owned and taken
/// apart (each value read is moved out, and once every attribute is read the rest are known to be absent
/// without a look-up). Owned only when the store's attribute names are distinct: an attribute named
/// twice must be read twice.
pub(crate) enum Item<'a> {
    /// Read in place.
    Borrowed(&'a HashMap<String, AttributeValue>),
    /// Taken apart as it is read: its attributes moved out of the map into a list, once, and each found
    /// there by comparing names. A record's item has a handful of attributes, and a look-up in the SDK's
    /// map hashes the name with `SipHash` first, several times the cost of the comparisons.
    Owned(Vec<(String, AttributeValue)>),
}

/// One attribute's value: moved out of an owned item, or seen in a borrowed one.
enum Attr<'a> {
    Moved(AttributeValue),
    Seen(&'a AttributeValue),
}

impl Attr<'_> {
    fn value(&self) -> &AttributeValue {
        match self {
            Attr::Moved(v) => v,
            Attr::Seen(v) => v,
        }
    }
}

impl Item<'_> {
    /// `item`, to be taken apart as it is read.
    pub(crate) fn owned(item: HashMap<String, AttributeValue>) -> Self {
        Item::Owned(item.into_iter().collect())
    }

    /// The attribute `name`: seen in a borrowed item, moved out of an owned one.
    fn take(&mut self, name: &str) -> Option<Attr<'_>> {
        match self {
            Item::Borrowed(item) => item.get(name).map(Attr::Seen),
            // An emptied item has nothing left to compare.
            Item::Owned(attributes) => {
                let at = attributes.iter().position(|(n, _)| n == name)?;
                Some(Attr::Moved(attributes.swap_remove(at).1))
            }
        }
    }

    fn string(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Moved(AttributeValue::S(v))) => Ok(Some(v)),
            Some(Attr::Seen(AttributeValue::S(v))) => Ok(Some(v.clone())),
            Some(_) => Err(not_a(name, "a string")),
        }
    }

    fn number(&mut self, name: &str) -> Result<Option<u64>, StoreError> {
        match self.take(name).as_ref().map(Attr::value) {
            None => Ok(None),
            Some(AttributeValue::N(v)) => v.parse().map(Some).map_err(|_| {
                StoreError::Corrupt(format!(
                    "attribute `{name}` is not a non-negative integer: {v}"
                ))
            }),
            Some(_) => Err(not_a(name, "a number")),
        }
    }

    fn binary(&mut self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.take(name) {
            None => Ok(None),
            Some(Attr::Moved(AttributeValue::B(b))) => Ok(Some(b.into_inner())),
            Some(Attr::Seen(AttributeValue::B(b))) => Ok(Some(b.as_ref().to_vec())),
            Some(_) => Err(not_a(name, "binary")),
        }
    }

    fn string_set(&mut self, name: &str) -> Result<Vec<String>, StoreError> {
        match self.take(name) {
            None => Ok(Vec::new()),
            Some(Attr::Moved(AttributeValue::Ss(v))) => Ok(v),
            Some(Attr::Seen(AttributeValue::Ss(v))) => Ok(v.clone()),
            Some(_) => Err(not_a(name, "a string set")),
        }
    }

    fn boolean(&mut self, name: &str) -> Result<Option<bool>, StoreError> {
        match self.take(name).as_ref().map(Attr::value) {
            None => Ok(None),
            Some(AttributeValue::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(not_a(name, "a boolean")),
        }
    }

    /// A key attribute's text (see [`Layout::record_key`]).
    pub(super) fn key_part(&mut self, name: &str) -> Result<String, StoreError> {
        required(self.string(name)?, name)
    }

    /// The status, read without copying its text.
    fn status(&mut self, name: &str) -> Result<Status, StoreError> {
        let attr = self.take(name).ok_or_else(|| missing(name))?;
        let AttributeValue::S(text) = attr.value() else {
            return Err(not_a(name, "a string"));
        };
        Status::parse(text).ok_or_else(|| {
            // The item's own text, shown to operators and logged: escaped.
            let text = crate::telemetry::escaped(text);
            StoreError::Corrupt(format!("unknown status `{text}` in `{name}`"))
        })
    }
}

/// `what`: "a string", "binary", ..
#[cold]
fn not_a(name: &str, what: &str) -> StoreError {
    StoreError::Corrupt(format!("attribute `{name}` is not {what}"))
}

#[cold]
fn missing(name: &str) -> StoreError {
    StoreError::Corrupt(format!("attribute `{name}` is missing"))
}

fn required<T>(value: Option<T>, name: &str) -> Result<T, StoreError> {
    value.ok_or_else(|| missing(name))
}

/// Turns a stored item of the default [`Layout::Key`] into a [`Record`] (see [`parse_record`]).
#[cfg(test)]
pub(crate) fn parse_item(
    names: &AttributeNames,
    item: &HashMap<String, AttributeValue>,
) -> Result<Record, StoreError> {
    parse_record(names, &Layout::Key, Item::Borrowed(item))
}

/// Turns a stored item of `layout` into a [`Record`], or says what is wrong with it:
/// [`StoreError::Corrupt`] for a missing or mistyped attribute (the key attributes included), an unknown
/// status, or a PENDING record without a lease.
///
/// The attributes are read in the order a completed record holds them, the ones only other records hold
/// last: an owned item of a completed record is empty by then, and its absent attributes cost nothing.
pub(crate) fn parse_record(
    names: &AttributeNames,
    layout: &Layout,
    mut item: Item<'_>,
) -> Result<Record, StoreError> {
    let status = item.status(&names.status)?;
    let key = layout.record_key(names, &mut item)?;
    let token = required(item.string(&names.token)?, &names.token)?;
    let attempt = item.number(&names.attempt)?.unwrap_or(0);
    let expires_at_s = required(item.number(&names.expires_at)?, &names.expires_at)?;
    let fingerprint = item.string(&names.fingerprint)?;
    let response = item.binary(&names.response)?;
    // Read after the attributes a completed record holds: a completed record has no lease, and its
    // owned item is empty by now, so looking for one costs nothing.
    let lease_until_ms = item.number(&names.lease_until)?;
    if status == Status::Pending && lease_until_ms.is_none() {
        return Err(StoreError::Corrupt(format!(
            "a PENDING record without `{}`",
            names.lease_until
        )));
    }
    Ok(Record {
        key,
        status,
        token,
        attempt,
        lease_until_ms,
        expires_at_s,
        fingerprint,
        response,
        error: item.string(&names.error)?,
        replay_until_s: item.number(&names.replay_until)?,
        claim_writes_in_effect: item.boolean(&names.claim_writes)?.unwrap_or(false),
        completed_in: item.string(&names.completed_in)?,
        steps: item.binary(&names.steps)?,
        released: item.string_set(&names.released)?,
        released_until_ms: item.number(&names.released_until)?,
        released_through: item.string(&names.released_through)?,
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
            steps: "sp".into(),
            released: "rl".into(),
            released_until: "rd".into(),
            released_through: "rt".into(),
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
            (names.steps.clone(), AttributeValue::B(Blob::new(*b"steps"))),
            (
                names.released.clone(),
                AttributeValue::Ss(vec!["t-0".into()]),
            ),
            (names.released_until.clone(), n(7_000)),
            (names.released_through.clone(), s("t-9")),
            // Not the record's: ignored.
            ("status".to_owned(), s("FAILED")),
            ("business".to_owned(), n(1)),
        ])
    }

    /// The record of `item` read both ways: borrowed, and owned (taken apart); both must agree.
    fn parse_both(
        names: &AttributeNames,
        layout: &Layout,
        item: &HashMap<String, AttributeValue>,
    ) -> Result<Record, StoreError> {
        let borrowed = parse_record(names, layout, Item::Borrowed(item));
        let owned = parse_record(names, layout, Item::owned(item.clone()));
        match (&borrowed, &owned) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(StoreError::Corrupt(a)), Err(StoreError::Corrupt(b))) => assert_eq!(a, b),
            _ => panic!("borrowed {borrowed:?} but owned {owned:?}"),
        }
        borrowed
    }

    #[test]
    fn every_attribute_is_read_under_the_configured_names_and_others_are_ignored() {
        let names = names();
        let record = parse_both(&names, &Layout::Key, &full_item(&names)).unwrap();
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
                steps: Some(b"steps".to_vec()),
                released: vec!["t-0".into()],
                released_until_ms: Some(7_000),
                released_through: Some("t-9".into()),
            }
        );
        // The tenant layout joins the two key attributes.
        let mut item = full_item(&names);
        item.insert(names.key.clone(), s("billing::charge"));
        item.insert(names.sort_key.clone(), s("00ff"));
        let record = parse_both(&names, &Layout::Tenant, &item).unwrap();
        assert_eq!(record.key, "billing::charge#00ff");
    }

    #[test]
    fn a_completed_record_taken_apart_reads_the_same_as_in_place() {
        // What a duplicate gets back: a completed record, without the attributes only other records
        // hold, so the owned item is empty before they are looked up.
        let names = names();
        let mut item = full_item(&names);
        for absent in [
            &names.lease_until,
            &names.error,
            &names.replay_until,
            &names.claim_writes,
            &names.completed_in,
            &names.steps,
        ] {
            item.remove(absent);
        }
        item.remove("status");
        item.remove("business");
        let record = parse_both(&names, &Layout::Key, &item).unwrap();
        assert_eq!(record.lease_until_ms, None);
        assert_eq!(record.error, None);
        assert_eq!(record.replay_until_s, None);
        assert!(!record.claim_writes_in_effect);
        assert_eq!(record.completed_in, None);
        assert_eq!(record.steps, None);
        assert_eq!(record.response.as_deref(), Some(&b"{}"[..]));
    }

    #[test]
    fn a_record_wrong_in_two_ways_is_reported_for_the_first_attribute_checked() {
        let names = names();
        let mut item = full_item(&names);
        item.remove(&names.token);
        item.insert(names.expires_at.clone(), s("soon"));
        assert!(matches!(
            parse_both(&names, &Layout::Key, &item),
            Err(StoreError::Corrupt(m)) if m == "attribute `tk` is missing"
        ));
        let mut item = full_item(&names);
        item.insert(names.attempt.clone(), s("3"));
        item.insert(names.claim_writes.clone(), s("yes"));
        assert!(matches!(
            parse_both(&names, &Layout::Key, &item),
            Err(StoreError::Corrupt(m)) if m == "attribute `at` is not a number"
        ));
        let mut item = full_item(&names);
        item.insert(names.status.clone(), s("DONE"));
        assert!(matches!(
            parse_both(&names, &Layout::Key, &item),
            Err(StoreError::Corrupt(m)) if m == "unknown status `DONE` in `st`"
        ));
        for (name, value, message) in [
            (&names.response, s("x"), "attribute `rs` is not binary"),
            (
                &names.claim_writes,
                s("x"),
                "attribute `cw` is not a boolean",
            ),
            (&names.token, n(1), "attribute `tk` is not a string"),
            (&names.status, n(1), "attribute `st` is not a string"),
        ] {
            let mut item = full_item(&names);
            item.insert(name.clone(), value);
            assert!(matches!(
                parse_both(&names, &Layout::Key, &item),
                Err(StoreError::Corrupt(m)) if m == message
            ));
        }
    }

    #[test]
    fn names_set_to_the_same_attribute_each_read_it() {
        let mut names = names();
        names.error = names.completed_in.clone();
        assert!(!names.are_distinct());
        assert!(super::super::AttributeNames::default().are_distinct());
        let record =
            parse_record(&names, &Layout::Key, Item::Borrowed(&full_item(&names))).unwrap();
        assert_eq!(record.error.as_deref(), Some("eu-west-1"));
        assert_eq!(record.completed_in.as_deref(), Some("eu-west-1"));
    }
}
