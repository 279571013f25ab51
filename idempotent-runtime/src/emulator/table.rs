//! One business table: its key schema and its items, keyed the way DynamoDB keys them.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::expression::Item;
use super::number::Number;

/// A table's key schema and items.
#[derive(Debug)]
pub(super) struct Table {
    pub(super) partition_key: String,
    pub(super) sort_key: Option<String>,
    /// In key order, so that listings are deterministic.
    pub(super) items: BTreeMap<Key, Item>,
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
pub(super) struct Key {
    partition: KeyValue,
    sort: Option<KeyValue>,
}

/// `item` as DynamoDB stores it: top-level numbers and number sets in canonical text (`"1e2"` reads back
/// as `"100"`, `"0.10"` as `"0.1"`); numbers inside lists and maps are kept as written, as DynamoDB Local
/// keeps them. Found by the differential tests.
pub(super) fn canonical_item(item: Item) -> Item {
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

impl Table {
    /// An empty table with this key schema.
    pub(super) fn new(partition_key: &str, sort_key: Option<&str>) -> Self {
        Table {
            partition_key: partition_key.to_owned(),
            sort_key: sort_key.map(str::to_owned),
            items: BTreeMap::new(),
        }
    }

    /// The key attributes' names: the partition key, then the sort key if any.
    pub(super) fn key_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.partition_key.as_str()).chain(self.sort_key.as_deref())
    }

    /// Whether `attribute` is one of the key attributes.
    pub(super) fn is_key(&self, attribute: &str) -> bool {
        self.key_names().any(|k| k == attribute)
    }

    /// The key of a whole item (a Put, or a seeded item): its key attributes, with type S, N or B.
    pub(super) fn key_of_item(&self, item: &Item) -> Result<Key, String> {
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
    pub(super) fn key_of_key(&self, key: &Item) -> Result<Key, String> {
        if key.len() != self.key_names().count() {
            return Err("The number of conditions on the keys is invalid".to_owned());
        }
        self.key_of_item(key)
            .map_err(|_| "The provided key element does not match the schema".to_owned())
    }
}
