//! The store's table: [`DynamoDbStore::ensure_table`] creates and verifies it, [`DynamoDbStore::check`]
//! only verifies it ([`TableReport`]).
//!
//! The shape: the store's [`Layout`]'s key schema — a partition key of type S named as
//! [`AttributeNames::key`](super::AttributeNames::key), and in a layout with one, a sort key of type S
//! named as [`AttributeNames::sort_key`](super::AttributeNames::sort_key) — any billing mode (new tables
//! are on-demand), and TTL, when on, on [`AttributeNames::expires_at`](super::AttributeNames::expires_at).
//!
//! The global-table guard is described at [`Replication`].

use aws_sdk_dynamodb::client::Waiters as _;
use aws_sdk_dynamodb::error::ProvideErrorMetadata as _;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, MultiRegionConsistency,
    ScalarAttributeType, TableDescription, TimeToLiveSpecification,
};

use super::error::store_error;
use super::{DynamoDbStore, Layout};
use crate::store::StoreError;

impl DynamoDbStore {
    /// Same as [`ensure_table`](Self::ensure_table).
    ///
    /// # Errors
    /// As [`ensure_table`](Self::ensure_table).
    pub async fn create_table(&self) -> Result<(), StoreError> {
        self.ensure_table().await.map(|_| ())
    }

    /// Makes the table ready for this store, and verifies it: creates it if it does not exist (the
    /// [`Layout`]'s key schema: a partition key of type S named as the store's key attribute, and in a
    /// layout with one a sort key of type S named as its sort key attribute; on-demand billing), waits
    /// until it is `ACTIVE` (also when another process created it a moment ago), and enables TTL on the
    /// expiry attribute when TTL is off (also after an interrupted first run). Safe to call at every
    /// start-up and from several processes at once.
    ///
    /// # Errors
    /// [`StoreError::Schema`] when an existing table's key schema, or its TTL attribute, differs from the
    /// store's layout and attribute names (nothing is changed then), or as [`check`](Self::check) for a
    /// replicated table; the SDK's error when a request fails.
    pub async fn ensure_table(&self) -> Result<TableReport, StoreError> {
        let inner = &self.inner;
        let mut create = inner
            .client
            .create_table()
            .table_name(&inner.table)
            .billing_mode(BillingMode::PayPerRequest);
        for (attribute, key_type) in self.key_schema() {
            create = create
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(attribute)
                        .attribute_type(ScalarAttributeType::S)
                        .build()
                        .map_err(|e| StoreError::Other(e.into()))?,
                )
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name(attribute)
                        .key_type(key_type)
                        .build()
                        .map_err(|e| StoreError::Other(e.into()))?,
                );
        }
        let created = create.send().await;
        match created {
            Ok(_) => {}
            // It exists, or is being created by someone else: wait for it below and verify it.
            Err(e) if e.code() == Some("ResourceInUseException") => {}
            Err(e) => return Err(store_error(&inner.table, e)),
        }
        inner
            .client
            .wait_until_table_exists()
            .table_name(&inner.table)
            .wait(std::time::Duration::from_mins(2))
            .await
            .map_err(|e| StoreError::Other(e.into()))?;
        let report = self.check().await?;
        if report.ttl_attribute.is_some() {
            return Ok(report);
        }
        let enabled = inner
            .client
            .update_time_to_live()
            .table_name(&inner.table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(&inner.names.expires_at)
                    .build()
                    .map_err(|e| StoreError::Other(e.into()))?,
            )
            .send()
            .await;
        if let Err(e) = enabled {
            // Another process may have enabled it since we looked ("TimeToLive is already enabled"):
            // what counts is that it is on, on our attribute.
            let now = self.check().await?;
            return match now.ttl_attribute {
                Some(_) => Ok(now),
                None => Err(store_error(&inner.table, e)),
            };
        }
        Ok(TableReport {
            ttl_attribute: Some(inner.names.expires_at.clone()),
            ..report
        })
    }

    /// Verifies the table without changing it, in two cheap reads (`DescribeTable`,
    /// `DescribeTimeToLive`): it exists, is `ACTIVE`, has the key schema of the store's [`Layout`], and
    /// TTL, if on, is on the store's expiry attribute. TTL being off is reported, not an error: expiry is
    /// enforced by the conditions, TTL only reclaims space. It also reports the table's replicas, and
    /// applies the global-table guard (see [`Replication`]): a replicated, eventually consistent
    /// table used without home-region routing is logged as a `warn` event. For start-up health checks.
    ///
    /// # Errors
    /// [`StoreError::TableNotFound`]; [`StoreError::Schema`] when the table is not `ACTIVE`, or its key
    /// schema or TTL attribute differs from the store's layout and attribute names, or (with
    /// [`strict_replicas`](Self::strict_replicas)) it is [`Replication::Unrouted`]; the SDK's error
    /// otherwise.
    pub async fn check(&self) -> Result<TableReport, StoreError> {
        let inner = &self.inner;
        let described = inner
            .client
            .describe_table()
            .table_name(&inner.table)
            .send()
            .await
            .map_err(|e| store_error(&inner.table, e))?;
        let table = described.table().ok_or_else(|| {
            StoreError::Schema(format!(
                "DescribeTable returned no table for `{}`",
                inner.table
            ))
        })?;
        let status = table
            .table_status()
            .map_or_else(|| "UNKNOWN".to_owned(), |s| s.as_str().to_owned());
        if status != "ACTIVE" {
            return Err(StoreError::Schema(format!(
                "table `{}` is {status}, not ACTIVE",
                inner.table
            )));
        }
        self.verify_key_schema(table)?;
        let (replicas, replication) = self.guard_replicas(table)?;
        let ttl = inner
            .client
            .describe_time_to_live()
            .table_name(&inner.table)
            .send()
            .await
            .map_err(|e| store_error(&inner.table, e))?;
        let description = ttl.time_to_live_description();
        let ttl_status = description
            .and_then(|d| d.time_to_live_status())
            .map_or("DISABLED", |s| s.as_str());
        let ttl_attribute = description.and_then(|d| d.attribute_name());
        let ttl_attribute = match ttl_status {
            "ENABLED" | "ENABLING" => ttl_attribute.map(str::to_owned),
            _ => None,
        };
        if let Some(other) = ttl_attribute
            .as_deref()
            .filter(|a| *a != inner.names.expires_at)
        {
            return Err(StoreError::Schema(format!(
                "table `{}` has TTL on `{other}`; this store writes its expiry to `{}` (set `AttributeNames::expires_at` to `{other}`, or move the table's TTL)",
                inner.table, inner.names.expires_at
            )));
        }
        Ok(TableReport {
            table: inner.table.clone(),
            status,
            key_attribute: inner.names.key.clone(),
            sort_key_attribute: inner
                .layout
                .has_sort_key()
                .then(|| inner.names.sort_key.clone()),
            layout: inner.layout.clone(),
            replicas,
            replication,
            ttl_attribute,
            billing_mode: table
                .billing_mode_summary()
                .and_then(|b| b.billing_mode())
                .map_or_else(|| "PROVISIONED".to_owned(), |m| m.as_str().to_owned()),
            item_count: table.item_count().and_then(|n| u64::try_from(n).ok()),
        })
    }

    /// [`StoreError::Schema`] unless `table` has the key schema of the store's layout.
    fn verify_key_schema(&self, table: &TableDescription) -> Result<(), StoreError> {
        let inner = &self.inner;
        let mut keys: Vec<(&str, &str)> = table
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name(), k.key_type().as_str()))
            .collect();
        // HASH before RANGE, whatever order DynamoDB lists them in.
        keys.sort_by_key(|(_, key_type)| *key_type != "HASH");
        let expected = self.key_schema();
        let fits = keys.len() == expected.len()
            && keys
                .iter()
                .zip(&expected)
                .all(|((name, key_type), (want, want_type))| {
                    name == want && *key_type == want_type.as_str()
                })
            && expected.iter().all(|(attribute, _)| {
                table
                    .attribute_definitions()
                    .iter()
                    .find(|d| d.attribute_name() == *attribute)
                    .is_some_and(|d| d.attribute_type().as_str() == "S")
            });
        if !fits {
            let wanted = match &inner.layout {
                Layout::Key => format!(
                    "exactly one partition key `{}` of type S (set `AttributeNames::key` to the table's, or the layout that matches the table)",
                    inner.names.key
                ),
                layout => format!(
                    "a partition key `{}` and a sort key `{}`, both of type S, for the layout `{layout}` (set `AttributeNames::key` and `AttributeNames::sort_key` to the table's, or the layout that matches the table)",
                    inner.names.key, inner.names.sort_key
                ),
            };
            return Err(StoreError::Schema(format!(
                "table `{}` has the key schema {keys:?}; this store needs {wanted}",
                inner.table
            )));
        }
        Ok(())
    }

    /// The table's replicas and the global-table guard's decision; [`StoreError::Schema`] for
    /// [`Replication::Unrouted`] in strict mode (else a `warn` event).
    fn guard_replicas(
        &self,
        table: &TableDescription,
    ) -> Result<(Vec<String>, Replication), StoreError> {
        let inner = &self.inner;
        let replicas = replica_regions(table);
        let replication = replication(table, inner.region.as_deref());
        if replication == Replication::Unrouted {
            let message = format!(
                "table `{}` is a global table with replicas in {replicas:?} and eventual multi-region consistency, used without home-region routing: two regions can each accept a claim of the same key, and the body runs twice; route keys to a home region (`RoutedStore::dynamodb`, or `DynamoDbStore::with_region` on each region's store of a `RoutedStore`), or use multi-region strong consistency",
                inner.table
            );
            if inner.strict_replicas {
                return Err(StoreError::Schema(message));
            }
            tracing::warn!(table = %inner.table, ?replicas, "{message}");
        }
        Ok((replicas, replication))
    }

    /// The key schema of the store's layout: attribute names and key types, partition key first.
    fn key_schema(&self) -> Vec<(&str, KeyType)> {
        let names = &self.inner.names;
        let mut schema = vec![(names.key.as_str(), KeyType::Hash)];
        if self.inner.layout.has_sort_key() {
            schema.push((names.sort_key.as_str(), KeyType::Range));
        }
        schema
    }
}

/// How a table is replicated, as `DescribeTable` says, and whether this store's use of it keeps claims
/// linearizable ([`TableReport::replication`]).
///
/// # The global-table guard
///
/// [`DynamoDbStore::check`] also reads the table's replicas. A global table with replicas in other
/// regions and *eventual* multi-region consistency (the default kind) decides a conditional write in the
/// region that receives it only, so two regions can each accept a claim of one key and the body runs
/// twice. Such a table is safe only behind home-region routing ([`RoutedStore`](crate::RoutedStore), whose
/// DynamoDB stores know their region: [`DynamoDbStore::with_region`]). Used otherwise, `check` logs a
/// `warn` event, or with [`DynamoDbStore::strict_replicas`] fails. A table with multi-region *strong*
/// consistency decides conditional writes across regions and passes. See [`Replication`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Replication {
    /// No replicas: the table lives in one region.
    SingleRegion,
    /// Replicas, with multi-region strong consistency: a conditional write is decided across regions.
    Strong,
    /// Replicas, with eventual multi-region consistency, and the store serves one region of a
    /// home-region-routed store ([`DynamoDbStore::with_region`]): each key's claims race in one region.
    Routed,
    /// Replicas, with eventual multi-region consistency, and the store is not routed: claims of one key
    /// in two regions can both succeed. Logged as a `warn` event, or an error with
    /// [`DynamoDbStore::strict_replicas`].
    Unrouted,
}

/// The regions of a table's replicas (empty for a single-region table, and on DynamoDB Local).
fn replica_regions(table: &TableDescription) -> Vec<String> {
    table
        .replicas()
        .iter()
        .filter_map(|r| r.region_name().map(str::to_owned))
        .collect()
}

/// The global-table guard's decision for `table` used by a store serving `region` (`None`: not routed).
fn replication(table: &TableDescription, region: Option<&str>) -> Replication {
    if table.replicas().is_empty() {
        Replication::SingleRegion
    } else if table.multi_region_consistency() == Some(&MultiRegionConsistency::Strong) {
        Replication::Strong
    } else if region.is_some() {
        Replication::Routed
    } else {
        Replication::Unrouted
    }
}

/// What [`DynamoDbStore::check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableReport {
    /// The table's name.
    pub table: String,
    /// `ACTIVE` (anything else is an error).
    pub status: String,
    /// The partition key attribute (of type S).
    pub key_attribute: String,
    /// The sort key attribute (of type S), in a layout that has one.
    pub sort_key_attribute: Option<String>,
    /// The store's layout, which the table's key schema fits.
    pub layout: Layout,
    /// The regions of the table's replicas (empty: a single-region table; DynamoDB Local has none).
    pub replicas: Vec<String>,
    /// What the replicas mean for this store (the global-table guard's decision).
    pub replication: Replication,
    /// The attribute TTL deletes by, when TTL is on (`None`: TTL is off; expired records stay until
    /// deleted otherwise, still counted as absent).
    pub ttl_attribute: Option<String>,
    /// `PAY_PER_REQUEST` or `PROVISIONED`.
    pub billing_mode: String,
    /// DynamoDB's approximate item count (updated about every six hours).
    pub item_count: Option<u64>,
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::{ReplicaDescription, ReplicaStatus};

    use super::*;

    fn described(
        replicas: &[&str],
        consistency: Option<MultiRegionConsistency>,
    ) -> TableDescription {
        let mut table = TableDescription::builder().table_name("idempotency");
        for region in replicas {
            table = table.replicas(
                ReplicaDescription::builder()
                    .region_name(*region)
                    .replica_status(ReplicaStatus::Active)
                    .build(),
            );
        }
        table.set_multi_region_consistency(consistency).build()
    }

    #[test]
    fn a_replicated_eventually_consistent_table_needs_routing() {
        let global = described(&["us-east-1", "eu-west-1"], None);
        assert_eq!(replica_regions(&global), ["us-east-1", "eu-west-1"]);
        assert_eq!(replication(&global, None), Replication::Unrouted);
        assert_eq!(replication(&global, Some("us-east-1")), Replication::Routed);
        let eventual = described(&["us-east-1"], Some(MultiRegionConsistency::Eventual));
        assert_eq!(replication(&eventual, None), Replication::Unrouted);
    }

    #[test]
    fn single_region_and_strongly_consistent_tables_pass() {
        let single = described(&[], None);
        assert!(replica_regions(&single).is_empty());
        assert_eq!(replication(&single, None), Replication::SingleRegion);
        let strong = described(
            &["us-east-1", "us-east-2", "us-west-2"],
            Some(MultiRegionConsistency::Strong),
        );
        assert_eq!(replication(&strong, None), Replication::Strong);
    }
}
