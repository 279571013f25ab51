//! The store's table: [`DynamoDbStore::ensure_table`] creates and verifies it, [`DynamoDbStore::check`]
//! only verifies it ([`TableReport`]).
//!
//! The shape: one partition key of type S named as [`AttributeNames::key`](super::AttributeNames::key),
//! any billing mode (new tables are on-demand), and TTL, when on, on
//! [`AttributeNames::expires_at`](super::AttributeNames::expires_at).

use aws_sdk_dynamodb::client::Waiters as _;
use aws_sdk_dynamodb::error::ProvideErrorMetadata as _;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TimeToLiveSpecification,
};

use super::DynamoDbStore;
use super::error::classify;
use crate::store::StoreError;

impl DynamoDbStore {
    /// Same as [`ensure_table`](Self::ensure_table).
    ///
    /// # Errors
    /// As [`ensure_table`](Self::ensure_table).
    pub async fn create_table(&self) -> Result<(), StoreError> {
        self.ensure_table().await.map(|_| ())
    }

    /// Makes the table ready for this store, and verifies it: creates it if it does not exist (partition
    /// key of type S named as the store's key attribute, on-demand billing), waits until it is `ACTIVE`
    /// (also when another process created it a moment ago), and enables TTL on the expiry attribute when
    /// TTL is off (also after an interrupted first run). Safe to call at every start-up and from several
    /// processes at once.
    ///
    /// # Errors
    /// [`StoreError::Schema`] when an existing table's key schema, or its TTL attribute, differs from the
    /// store's attribute names (nothing is changed then); the SDK's error when a request fails.
    pub async fn ensure_table(&self) -> Result<TableReport, StoreError> {
        let inner = &self.inner;
        let created = inner
            .client
            .create_table()
            .table_name(&inner.table)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(&inner.names.key)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(|e| StoreError::Other(e.into()))?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(&inner.names.key)
                    .key_type(KeyType::Hash)
                    .build()
                    .map_err(|e| StoreError::Other(e.into()))?,
            )
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {}
            // It exists, or is being created by someone else: wait for it below and verify it.
            Err(e) if e.code() == Some("ResourceInUseException") => {}
            Err(e) => return Err(classify(&inner.table, e)),
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
                None => Err(classify(&inner.table, e)),
            };
        }
        Ok(TableReport {
            ttl_attribute: Some(inner.names.expires_at.clone()),
            ..report
        })
    }

    /// Verifies the table without changing it, in two cheap reads (`DescribeTable`,
    /// `DescribeTimeToLive`): it exists, is `ACTIVE`, has the store's key schema, and TTL, if on, is on
    /// the store's expiry attribute. TTL being off is reported, not an error: expiry is enforced by the
    /// conditions, TTL only reclaims space. For start-up health checks.
    ///
    /// # Errors
    /// [`StoreError::TableNotFound`]; [`StoreError::Schema`] when the table is not `ACTIVE`, or its key
    /// schema or TTL attribute differs from the store's attribute names; the SDK's error otherwise.
    pub async fn check(&self) -> Result<TableReport, StoreError> {
        let inner = &self.inner;
        let described = inner
            .client
            .describe_table()
            .table_name(&inner.table)
            .send()
            .await
            .map_err(|e| classify(&inner.table, e))?;
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
        let keys: Vec<(&str, &str)> = table
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name(), k.key_type().as_str()))
            .collect();
        let key_type = table
            .attribute_definitions()
            .iter()
            .find(|d| d.attribute_name() == inner.names.key)
            .map(|d| d.attribute_type().as_str());
        if keys != [(inner.names.key.as_str(), "HASH")] || key_type != Some("S") {
            return Err(StoreError::Schema(format!(
                "table `{}` has the key schema {keys:?}; this store needs exactly one partition key `{}` of type S (set `AttributeNames::key` to the table's)",
                inner.table, inner.names.key
            )));
        }
        let ttl = inner
            .client
            .describe_time_to_live()
            .table_name(&inner.table)
            .send()
            .await
            .map_err(|e| classify(&inner.table, e))?;
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
            ttl_attribute,
            billing_mode: table
                .billing_mode_summary()
                .and_then(|b| b.billing_mode())
                .map_or_else(|| "PROVISIONED".to_owned(), |m| m.as_str().to_owned()),
            item_count: table.item_count().and_then(|n| u64::try_from(n).ok()),
        })
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
    /// The attribute TTL deletes by, when TTL is on (`None`: TTL is off; expired records stay until
    /// deleted otherwise, still counted as absent).
    pub ttl_attribute: Option<String>,
    /// `PAY_PER_REQUEST` or `PROVISIONED`.
    pub billing_mode: String,
    /// DynamoDB's approximate item count (updated about every six hours).
    pub item_count: Option<u64>,
}
