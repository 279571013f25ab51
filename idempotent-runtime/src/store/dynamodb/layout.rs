//! [`Layout`]: how a record key maps onto the table's primary key.
//!
//! (The table of layouts and how requests address items are in [`Layout`]'s docs.)

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use aws_sdk_dynamodb::types::AttributeValue;

use super::AttributeNames;
use super::item::Item;
use crate::store::StoreError;

/// The constant partition key value of [`Layout::StaticPartition`] when none is given (`static-pk` on
/// the command line).
pub const DEFAULT_STATIC_PARTITION: &str = "idempotency";

/// How a record key maps onto the table's primary key (also the `guide::regions` module).
///
/// The record key the store is given is `"{namespace}#{hex(sha256(key))}"` (see
/// [`derive_key`](crate::derive_key)). A layout decides which attribute values hold it:
///
/// | layout | partition key (`AttributeNames::key`) | sort key (`AttributeNames::sort_key`) |
/// |---|---|---|
/// | [`Layout::Key`] (default) | the record key | — |
/// | [`Layout::StaticPartition`] | the layout's constant `value` | the record key |
/// | [`Layout::Tenant`] | the namespace (the record key before its last `#`) | the key's hash (after it) |
///
/// Every request addresses one item by its full primary key, and every condition is evaluated
/// against that one item: `attribute_not_exists(#pk)` on the partition key attribute says "no item with
/// this partition key *and sort key*", also when other items share the partition (DynamoDB evaluates a
/// condition on the item the request's `Key` names, or on nothing when there is none; the layout tests
/// on DynamoDB Local check it). So the protocol is the same in every layout.
///
/// Set with [`DynamoDbStore::with_layout`](super::DynamoDbStore::with_layout); the table must have
/// the layout's key schema ([`DynamoDbStore::ensure_table`](super::DynamoDbStore::ensure_table)
/// creates it). A table is written in one layout for its whole life: records written in one layout are
/// not found in another.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Layout {
    /// Partition key only (type S): the record key. Every key is its own partition, so load spreads
    /// evenly whatever the traffic. The default, and the right choice unless you need to query keys
    /// together.
    #[default]
    Key,
    /// Partition key (S) = `value`, the same for every record; sort key (S) = the record key. As
    /// Powertools' `static_pk_value`, for tables laid out that way. Every record of the store is in
    /// one partition: at most 1,000 write units and 3,000 read units per second for all keys together
    /// (beyond that DynamoDB throttles, until it may in time split the partition by sort-key
    /// ranges). One store per tenant, each with the tenant as `value`, gives per-tenant partitions that
    /// a `Query` lists.
    ///
    /// Built by [`Layout::static_partition`]; `#[non_exhaustive]`: match it with `..`.
    #[non_exhaustive]
    StaticPartition {
        /// The partition key value of every record (1 to 2,048 bytes).
        value: String,
    },
    /// Partition key (S) = the namespace (the record key before its last `#`, the function's
    /// `name = ".."` or `module::path::fn_name`), sort key (S) = the key's hash: a `Query` on the
    /// namespace lists the keys of one function. Every call of one function writes to one partition
    /// (the same 1,000 WCU / 3,000 RCU per second limit); a tenant gets its own partition only through
    /// a namespace of its own.
    Tenant,
}

impl Layout {
    /// A [`Layout::StaticPartition`] with the partition key value `value`.
    #[must_use]
    pub fn static_partition(value: impl Into<String>) -> Self {
        Layout::StaticPartition {
            value: value.into(),
        }
    }

    /// Whether the layout's table has a sort key.
    #[must_use]
    pub fn has_sort_key(&self) -> bool {
        !matches!(self, Layout::Key)
    }

    /// The item key (`Key` of a request) of `key`: the partition key and, if the layout has one, the
    /// sort key.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] when `key` cannot be split as the layout needs ([`Layout::Tenant`]: a
    /// key with no `#`, or an empty namespace or hash), or an empty static value.
    pub fn item_key(
        &self,
        names: &AttributeNames,
        key: &str,
    ) -> Result<HashMap<String, AttributeValue>, StoreError> {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        match self {
            Layout::Key => Ok(HashMap::from([(names.key.clone(), s(key))])),
            Layout::StaticPartition { value } => {
                if value.is_empty() {
                    return Err(StoreError::Invalid(
                        "the static partition key value is empty; DynamoDB needs 1 to 2048 bytes"
                            .into(),
                    ));
                }
                Ok(HashMap::from([
                    (names.key.clone(), s(value)),
                    (names.sort_key.clone(), s(key)),
                ]))
            }
            Layout::Tenant => {
                let (namespace, hash) = split(key)?;
                Ok(HashMap::from([
                    (names.key.clone(), s(namespace)),
                    (names.sort_key.clone(), s(hash)),
                ]))
            }
        }
    }

    /// The record key of a stored item, from its key attributes (the inverse of
    /// [`item_key`](Self::item_key)).
    pub(super) fn record_key(
        &self,
        names: &AttributeNames,
        item: &mut Item<'_>,
    ) -> Result<String, StoreError> {
        match self {
            Layout::Key => item.key_part(&names.key),
            Layout::StaticPartition { .. } => item.key_part(&names.sort_key),
            Layout::Tenant => {
                let namespace = item.key_part(&names.key)?;
                let hash = item.key_part(&names.sort_key)?;
                Ok(format!("{namespace}#{hash}"))
            }
        }
    }

    /// The key attributes' bytes (names and values) beyond the partition key attribute holding the
    /// whole record key, which every store's response budget already counts.
    pub(super) fn extra_key_bytes(&self, names: &AttributeNames) -> usize {
        match self {
            Layout::Key => 0,
            Layout::StaticPartition { value } => names.sort_key.len() + value.len(),
            // The `#` between namespace and hash is not stored.
            Layout::Tenant => names.sort_key.len(),
        }
    }
}

/// `"{namespace}#{hash}"` split at its last `#`.
fn split(key: &str) -> Result<(&str, &str), StoreError> {
    match key.rsplit_once('#') {
        Some((namespace, hash)) if !namespace.is_empty() && !hash.is_empty() => {
            Ok((namespace, hash))
        }
        _ => Err(StoreError::Invalid(
            format!(
                "the tenant layout needs a record key `{{namespace}}#{{hash}}` with both parts non-empty (as `derive_key` makes them), not `{key}`"
            )
            .into(),
        )),
    }
}

impl fmt::Display for Layout {
    /// The command line's spelling: `key`, `static-pk=VALUE`, `tenant`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Key => f.write_str("key"),
            Layout::StaticPartition { value } => write!(f, "static-pk={value}"),
            Layout::Tenant => f.write_str("tenant"),
        }
    }
}

/// A layout spelled as on the command line was not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown layout `{0}`; expected `key`, `static-pk`, `static-pk=VALUE` (a non-empty value) or `tenant`"
)]
pub struct ParseLayoutError(String);

impl FromStr for Layout {
    type Err = ParseLayoutError;

    /// `key`, `static-pk` (the value [`DEFAULT_STATIC_PARTITION`]), `static-pk=VALUE`, or `tenant`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "key" => Ok(Layout::Key),
            "tenant" => Ok(Layout::Tenant),
            "static-pk" => Ok(Layout::static_partition(DEFAULT_STATIC_PARTITION)),
            _ => match s.strip_prefix("static-pk=") {
                Some(value) if !value.is_empty() => Ok(Layout::static_partition(value)),
                _ => Err(ParseLayoutError(s.to_owned())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "billing::charge#00ff";

    #[test]
    fn every_layout_maps_a_key_to_an_item_key_and_back() {
        let names = AttributeNames::default();
        for layout in [
            Layout::Key,
            Layout::static_partition("idempotency"),
            Layout::Tenant,
        ] {
            let item = layout.item_key(&names, KEY).unwrap();
            assert_eq!(item.len(), if layout.has_sort_key() { 2 } else { 1 });
            let borrowed = layout.record_key(&names, &mut Item::Borrowed(&item));
            assert_eq!(borrowed.unwrap(), KEY, "{layout}");
            let mut owned = Item::owned(item.clone());
            assert_eq!(
                layout.record_key(&names, &mut owned).unwrap(),
                KEY,
                "{layout}"
            );
            // Taken out, but for the static partition value, which is not part of the record key.
            let left = usize::from(matches!(layout, Layout::StaticPartition { .. }));
            assert!(
                matches!(owned, Item::Owned(rest) if rest.len() == left),
                "{layout}"
            );
        }
        let tenant = Layout::Tenant.item_key(&names, KEY).unwrap();
        assert_eq!(tenant["pk"], AttributeValue::S("billing::charge".into()));
        assert_eq!(tenant["sk"], AttributeValue::S("00ff".into()));
        let fixed = Layout::static_partition("p").item_key(&names, KEY).unwrap();
        assert_eq!(fixed["pk"], AttributeValue::S("p".into()));
        assert_eq!(fixed["sk"], AttributeValue::S(KEY.into()));
    }

    #[test]
    fn the_tenant_layout_splits_at_the_last_hash_sign() {
        let names = AttributeNames::default();
        let item = Layout::Tenant.item_key(&names, "a#b#cafe").unwrap();
        assert_eq!(item["pk"], AttributeValue::S("a#b".into()));
        assert_eq!(item["sk"], AttributeValue::S("cafe".into()));
        for bad in ["no-hash", "#cafe", "ns#"] {
            assert!(
                matches!(
                    Layout::Tenant.item_key(&names, bad),
                    Err(StoreError::Invalid(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            Layout::static_partition("").item_key(&names, KEY),
            Err(StoreError::Invalid(_))
        ));
    }

    #[test]
    fn layouts_parse_as_the_command_line_spells_them() {
        for (text, layout) in [
            ("key", Layout::Key),
            ("tenant", Layout::Tenant),
            ("static-pk", Layout::static_partition("idempotency")),
            ("static-pk=orders", Layout::static_partition("orders")),
        ] {
            assert_eq!(text.parse::<Layout>().unwrap(), layout);
        }
        assert_eq!(
            Layout::static_partition("orders").to_string(),
            "static-pk=orders"
        );
        for bad in ["", "static-pk=", "pk", "Key"] {
            assert!(bad.parse::<Layout>().is_err(), "{bad}");
        }
    }
}
