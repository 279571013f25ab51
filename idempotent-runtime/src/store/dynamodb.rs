//! [`DynamoDbStore`]: records in a DynamoDB table, one item per key.
//!
//! Every call is one request: a conditional `UpdateItem` (claim, complete, fail, heartbeat), a
//! `TransactWriteItems` (a claim, completion or failure that carries business writes), or a consistent
//! `GetItem` (waiting for an in-flight call). Conditional writes ask for
//! `ReturnValuesOnConditionCheckFailure=ALL_OLD`, so a failed condition hands back the blocking record in
//! the same round trip. [`DynamoDbStore::create_table`] creates the table (`CreateTable`, then
//! `DescribeTable` until it is active, then `UpdateTimeToLive`).
//!
//! # The protocol, request by request
//!
//! Placeholders stand for the configured [`AttributeNames`] (`#pk` key, `#st` status, `#tk` token, `#at`
//! attempt, `#lu` lease end, `#ex` expiry, `#fp` fingerprint, `#rs` response, `#er` error, `#ru` replay
//! end, `#cw` claim-time writes in effect). `:now_ms` is the caller's clock *less the clock-skew margin*
//! ([`Builder::clock_skew_margin`](crate::Builder::clock_skew_margin), 1 s by default) and `:now_s` the
//! same in seconds, so no caller whose clock runs ahead by less than the margin takes over a live claim or
//! treats a live record as expired.
//!
//! | request | update | condition |
//! |---|---|---|
//! | claim | `SET #st = PENDING, #tk = :tk, #lu = now + lease, #ex = now + lease + ttl[, #fp = :fp] ADD #at 1 REMOVE #rs, #er, #ru[, #fp]` | `attribute_not_exists(#pk) OR #ex < :now_s OR #st = FAILED OR (#st = PENDING AND #lu < :now_ms)` |
//! | claim with business writes (`claim_with`), in a `TransactWriteItems` with them | the claim's, plus `SET #cw = true` | `attribute_not_exists(#pk) OR #ex < :now_s OR ((#st = FAILED OR (#st = PENDING AND #lu < :now_ms)) AND attribute_not_exists(#cw))` |
//! | complete | `SET #st = COMPLETED, #ex = now + ttl [+ retain][, #rs = :rs][, #ru = now + ttl] REMOVE #lu[, #rs]` | `#st = PENDING AND #tk = :tk` |
//! | fail | `SET #st = FAILED, #er = :er, #ex = now + failed_ttl REMOVE #lu[, #cw]` (`#cw` when compensating writes go with it) | `#st = PENDING AND #tk = :tk` |
//! | heartbeat | `SET #lu = now + lease, #ex = now + lease + ttl` | `#st = PENDING AND #tk = :tk` |
//! | wait | consistent `GetItem` | — |
//!
//! A claim never touches `#cw` otherwise: claim-time writes stay in effect across a failure without
//! compensation and across a takeover, so a claim with writes that finds such a record is refused, and the
//! caller claims it with the plain claim above instead — the writes are in effect at most once per key.
//!
//! A completion, or a failure, that carries business writes is one `TransactWriteItems`: the record's
//! update (index 0) and the writes. Its `ClientRequestToken` is derived from (purpose, table, key, the
//! call's fencing token, and for claims the attempt number): DynamoDB applies one token once within **ten
//! minutes**, and refuses the same token with other parameters (`IdempotentParameterMismatch`). So the
//! SDK's retries of a request, and this crate's retries of a completion (built once, sent unchanged),
//! keep their token, while every claim attempt (each with its own time, lease and expiry) has its own.
//! `UpdateItem` takes no such token: a claim, completion or failure whose response was lost is recognised
//! by the fencing token in the record that its retry's failed condition returns.
//!
//! Error mapping: throttling after the SDK's retries is [`StoreError::Throttled`]; HTTP 5xx, timeouts,
//! broken connections and transaction conflicts are [`StoreError::Unavailable`]; validation errors are
//! [`StoreError::Invalid`]; a missing table is [`StoreError::TableNotFound`] (in a transaction, a missing
//! business table is [`StoreError::Invalid`] naming the candidates, since DynamoDB does not say which).

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::client::Waiters as _;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TimeToLiveSpecification,
    TransactWriteItem, Update,
};

use super::Writes;
use super::{
    Change, ClaimOutcome, ClaimRequest, Store, StoreError, TransactOutcome, Transition,
    WriteOutcome,
};
use crate::CancellationReason;
use crate::record::{Record, Status};
use crate::transaction::request_token;

pub use crate::record::AttributeNames;

const CLAIMABLE: &str = "attribute_not_exists(#pk) OR #ex < :now_s OR #st = :failed OR (#st = :pending AND #lu < :now_ms)";
const CLAIMABLE_WITH_WRITES: &str = "attribute_not_exists(#pk) OR #ex < :now_s OR ((#st = :failed OR (#st = :pending AND #lu < :now_ms)) AND attribute_not_exists(#cw))";
const HELD_BY_TOKEN: &str = "#st = :pending AND #tk = :tk";
const EXTEND_LEASE: &str = "SET #lu = :lu, #ex = :ex";

/// The `#placeholders` used in `expressions`, mapped to their attribute names (DynamoDB rejects
/// unused ones).
fn names_for(names: &AttributeNames, expressions: &[&str]) -> HashMap<String, String> {
    let mut map = HashMap::with_capacity(10);
    for expression in expressions {
        let mut rest = *expression;
        while let Some(start) = rest.find('#') {
            let tail = &rest[start..];
            let end = tail[1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(tail.len(), |i| i + 1);
            let placeholder = &tail[..end];
            if !map.contains_key(placeholder) {
                map.insert(
                    placeholder.to_owned(),
                    names.resolve(placeholder).to_owned(),
                );
            }
            rest = &tail[end..];
        }
    }
    map
}

/// Idempotency records in a DynamoDB table (partition key only, type S).
///
/// Cheap to clone. Create the table with [`DynamoDbStore::create_table`] or by hand: partition key `pk`
/// (String), any billing mode, TTL on `expires_at` (optional: expiry is enforced by the conditions, TTL
/// only reclaims space).
///
/// The client is used as it is configured (region, credentials, retries). [`with_retry_config`](Self::with_retry_config)
/// overrides its retry policy for this store's calls only.
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    client: Client,
    table: String,
    names: AttributeNames,
    retry: Option<RetryConfig>,
}

impl DynamoDbStore {
    /// A store on `table`, with the default attribute names.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self::with_attribute_names(client, table, AttributeNames::default())
    }

    /// A store on `table` whose records use the given attribute names.
    pub fn with_attribute_names(
        client: Client,
        table: impl Into<String>,
        names: AttributeNames,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                table: table.into(),
                names,
                retry: None,
            }),
        }
    }

    /// Overrides the client's retry policy for this store's calls (throttling and transient errors are
    /// retried by the SDK with exponential backoff and jitter; a failed condition never is). When
    /// retries run out, a call fails with [`Error::Throttled`](crate::Error::Throttled) (throttling) or
    /// [`Error::Unavailable`](crate::Error::Unavailable) (HTTP 5xx, timeouts, broken connections). A
    /// claim that fails so wrote nothing, or (its response lost) holds the key until its lease runs
    /// out. Once the body has run, its completion is retried on top of this policy for as long as the
    /// lease allows.
    ///
    /// ```
    /// use idempotent_runtime::aws_sdk_dynamodb::config::retry::RetryConfig;
    /// use idempotent_runtime::{DynamoDbStore, Idempotency};
    /// # fn f(client: idempotent_runtime::aws_sdk_dynamodb::Client) {
    /// let store = DynamoDbStore::new(client, "idempotency")
    ///     .with_retry_config(RetryConfig::adaptive().with_max_attempts(5));
    /// let idem = Idempotency::builder(store).build();
    /// # }
    /// ```
    #[must_use]
    pub fn with_retry_config(self, retry: RetryConfig) -> Self {
        let inner = Arc::unwrap_or_clone(self.inner);
        Self {
            inner: Arc::new(Inner {
                retry: Some(retry),
                ..inner
            }),
        }
    }

    /// The table's name.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The SDK client.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The attribute names in use.
    #[must_use]
    pub fn attribute_names(&self) -> &AttributeNames {
        &self.inner.names
    }

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

    /// The update expression, names and values of a claim; `with_writes`: a claim with business writes,
    /// which marks them as in effect.
    fn claim_parts(&self, request: &ClaimRequest<'_>, with_writes: bool) -> UpdateParts {
        let mut values = HashMap::with_capacity(10);
        values.insert(":pending".to_owned(), s(Status::Pending.as_str()));
        values.insert(":failed".to_owned(), s(Status::Failed.as_str()));
        values.insert(":tk".to_owned(), s(request.token));
        values.insert(":lu".to_owned(), n(request.lease_until_ms));
        values.insert(":ex".to_owned(), n(request.expires_at_s));
        values.insert(":one".to_owned(), n(1));
        values.insert(":now_s".to_owned(), n(request.now_ms / 1000));
        values.insert(":now_ms".to_owned(), n(request.now_ms));
        let mut set = String::from("SET #st = :pending, #tk = :tk, #lu = :lu, #ex = :ex");
        let mut remove = String::from(" REMOVE #rs, #er, #ru");
        match request.fingerprint {
            Some(fp) => {
                values.insert(":fp".to_owned(), s(fp));
                set.push_str(", #fp = :fp");
            }
            None => remove.push_str(", #fp"),
        }
        if with_writes {
            values.insert(":true".to_owned(), AttributeValue::Bool(true));
            set.push_str(", #cw = :true");
        }
        let update = set + " ADD #at :one" + &remove;
        let condition = if with_writes {
            CLAIMABLE_WITH_WRITES
        } else {
            CLAIMABLE
        };
        let names = names_for(&self.inner.names, &[&update, condition]);
        (update, names, values)
    }

    /// One conditional `UpdateItem` of the record (`op`: its name for metrics); a failed condition returns
    /// the item as it was. `claimed_at_s`: for a claim, the time its condition is evaluated at, so that
    /// (with the `metrics` feature) a claim that replaced an expired record is counted.
    async fn conditional_update(
        &self,
        op: &'static str,
        claimed_at_s: Option<u64>,
        key: &str,
        (update, names, values): UpdateParts,
        condition: &str,
    ) -> Result<WriteOutcome, StoreError> {
        let inner = &self.inner;
        let request = inner
            .client
            .update_item()
            .table_name(&inner.table)
            .key(&inner.names.key, key_value(key))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        // Asked for only with the feature: they cost response bytes (the old values of a claim include
        // the old response, which only an expired COMPLETED record still has).
        #[cfg(feature = "metrics")]
        let request = request
            .return_consumed_capacity(aws_sdk_dynamodb::types::ReturnConsumedCapacity::Total)
            .set_return_values(
                claimed_at_s.map(|_| aws_sdk_dynamodb::types::ReturnValue::UpdatedOld),
            );
        let result = send!(self, request);
        match result {
            Ok(output) => {
                #[cfg(feature = "metrics")]
                {
                    if let Some(units) = output
                        .consumed_capacity()
                        .and_then(aws_sdk_dynamodb::types::ConsumedCapacity::capacity_units)
                    {
                        crate::telemetry::consumed_wcu(op, units);
                    }
                    let old_expiry = output
                        .attributes()
                        .and_then(|old| old.get(&inner.names.expires_at))
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse::<u64>().ok());
                    if let (Some(expired), Some(now_s)) = (old_expiry, claimed_at_s)
                        && expired < now_s
                    {
                        crate::telemetry::expired_record_reclaimed();
                    }
                }
                #[cfg(not(feature = "metrics"))]
                let _ = (op, claimed_at_s, output);
                Ok(WriteOutcome::Applied)
            }
            Err(err) => match rejected(&err).map(|e| e.item()) {
                Some(item) => Ok(WriteOutcome::Rejected(
                    item.map(|i| parse_item(&inner.names, i)).transpose()?,
                )),
                None => Err(classify(&inner.table, err)),
            },
        }
    }

    /// The record's conditional update as a transaction action (index 0), failing with the old item.
    fn record_update(
        &self,
        key: &str,
        (update, names, values): UpdateParts,
        condition: &str,
    ) -> Result<Update, StoreError> {
        Update::builder()
            .table_name(&self.inner.table)
            .key(&self.inner.names.key, key_value(key))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| StoreError::Other(e.into()))
    }

    /// Sends `record` (index 0) and `writes` in one `TransactWriteItems` with an idempotent request token,
    /// and sorts out a cancellation.
    async fn transact(
        &self,
        op: &'static str,
        record: Update,
        writes: Vec<TransactWriteItem>,
        request_token: String,
    ) -> Result<TransactOutcome, StoreError> {
        let inner = &self.inner;
        // Named in the error if one of them does not exist (DynamoDB does not say which).
        let mut tables: Vec<String> = writes
            .iter()
            .filter_map(|w| crate::transaction::table_of(w).map(str::to_owned))
            .collect();
        tables.sort_unstable();
        tables.dedup();
        let mut items = Vec::with_capacity(writes.len() + 1);
        items.push(TransactWriteItem::builder().update(record).build());
        items.extend(writes);
        let request = inner
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(request_token);
        #[cfg(feature = "metrics")]
        let request = request
            .return_consumed_capacity(aws_sdk_dynamodb::types::ReturnConsumedCapacity::Total);
        let result = send!(self, request);
        let err = match result {
            Ok(output) => {
                #[cfg(feature = "metrics")]
                for consumed in output.consumed_capacity() {
                    if let Some(units) = consumed.capacity_units() {
                        crate::telemetry::consumed_wcu(op, units);
                    }
                }
                #[cfg(not(feature = "metrics"))]
                let _ = (op, output);
                return Ok(TransactOutcome::Committed);
            }
            Err(err) => err,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(canceled)) =
            err.as_service_error()
        else {
            // The missing table may be a business table: say so rather than blame the record's table.
            if err.code() == Some("ResourceNotFoundException") {
                return Err(StoreError::Invalid(
                    format!(
                        "a table in the transaction does not exist (the idempotency table `{}`, or one of `{}`): {}",
                        inner.table,
                        tables.join("`, `"),
                        crate::error::chain(&err)
                    )
                    .into(),
                ));
            }
            return Err(classify(&inner.table, err));
        };
        let reasons: Vec<CancellationReason> = canceled
            .cancellation_reasons()
            .iter()
            .enumerate()
            .map(|(index, r)| CancellationReason {
                index,
                code: r.code().unwrap_or("None").to_owned(),
                message: r.message().map(str::to_owned),
                item: r.item().cloned(),
            })
            .collect();
        match reasons.first() {
            Some(first) if first.code == "ConditionalCheckFailed" => Ok(TransactOutcome::Rejected(
                first
                    .item
                    .as_ref()
                    .map(|item| parse_item(&inner.names, item))
                    .transpose()?,
            )),
            // A business condition, or a conflict or throttling that may pass: the caller decides.
            _ => Ok(TransactOutcome::Canceled(reasons)),
        }
    }

    /// The update expression, names and values of a fenced transition.
    fn transition_parts(&self, transition: &Transition<'_>) -> UpdateParts {
        let mut values = HashMap::with_capacity(6);
        values.insert(":pending".to_owned(), s(Status::Pending.as_str()));
        values.insert(":tk".to_owned(), s(transition.token));
        let update = match transition.change {
            Change::Complete {
                response,
                expires_at_s,
                replay_until_s,
            } => {
                values.insert(":completed".to_owned(), s(Status::Completed.as_str()));
                values.insert(":ex".to_owned(), n(expires_at_s));
                let mut set = String::from("SET #st = :completed, #ex = :ex");
                let mut remove = String::from(" REMOVE #lu");
                if let Some(bytes) = response {
                    values.insert(":rs".to_owned(), AttributeValue::B(bytes.to_vec().into()));
                    set.push_str(", #rs = :rs");
                } else {
                    remove.push_str(", #rs");
                }
                if let Some(until) = replay_until_s {
                    values.insert(":ru".to_owned(), n(until));
                    set.push_str(", #ru = :ru");
                }
                set + &remove
            }
            Change::Fail {
                error,
                expires_at_s,
                release_claim_writes,
            } => {
                values.insert(":failed".to_owned(), s(Status::Failed.as_str()));
                values.insert(":er".to_owned(), s(error));
                values.insert(":ex".to_owned(), n(expires_at_s));
                let mut update = String::from("SET #st = :failed, #er = :er, #ex = :ex REMOVE #lu");
                if release_claim_writes {
                    update.push_str(", #cw");
                }
                update
            }
            Change::ExtendLease {
                lease_until_ms,
                expires_at_s,
            } => {
                values.insert(":lu".to_owned(), n(lease_until_ms));
                values.insert(":ex".to_owned(), n(expires_at_s));
                EXTEND_LEASE.to_owned()
            }
        };
        let names = names_for(&self.inner.names, &[&update, HELD_BY_TOKEN]);
        (update, names, values)
    }

    /// Turns a stored item into a [`Record`], or says what is wrong with it.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a missing or mistyped attribute or an unknown status.
    pub fn parse_item(&self, item: &HashMap<String, AttributeValue>) -> Result<Record, StoreError> {
        parse_item(&self.inner.names, item)
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

/// An update expression with its attribute names and values.
type UpdateParts = (
    String,
    HashMap<String, String>,
    HashMap<String, AttributeValue>,
);

/// Sends a fluent request, with the store's retry policy when it has one. Without one no override is
/// attached: an override costs the SDK a configuration merge on every request.
macro_rules! send {
    ($store:expr, $request:expr) => {
        match &$store.inner.retry {
            Some(retry) => {
                $request
                    .customize()
                    .config_override(
                        aws_sdk_dynamodb::config::Builder::new().retry_config(retry.clone()),
                    )
                    .send()
                    .await
            }
            None => $request.send().await,
        }
    };
}
use send;

fn key_value(key: &str) -> AttributeValue {
    AttributeValue::S(key.to_owned())
}

fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

#[async_trait::async_trait]
impl Store for DynamoDbStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let parts = self.claim_parts(request, false);
        let outcome = self
            .conditional_update(
                "claim",
                Some(request.now_ms / 1000),
                request.key,
                parts,
                CLAIMABLE,
            )
            .await?;
        match outcome {
            WriteOutcome::Applied => Ok(ClaimOutcome::Claimed),
            WriteOutcome::Rejected(Some(record)) => Ok(ClaimOutcome::Existing(record)),
            WriteOutcome::Rejected(None) => Err(StoreError::Corrupt(
                "the claim condition failed but no item was returned".to_owned(),
            )),
        }
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        let parts = self.transition_parts(transition);
        let op = transition.change.op(false);
        self.conditional_update(op, None, transition.key, parts, HELD_BY_TOKEN)
            .await
    }

    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let parts = self.transition_parts(transition);
        let record = self.record_update(transition.key, parts, HELD_BY_TOKEN)?;
        // The purpose is the plain request's name (`complete`, `fail`), as the tokens always were.
        let token = request_token(
            transition.change.op(false),
            &self.inner.table,
            transition.key,
            transition.token,
            0,
        );
        self.transact(
            transition.change.op(true),
            record,
            writes.items().to_vec(),
            token,
        )
        .await
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let parts = self.claim_parts(request, true);
        let record = self.record_update(request.key, parts, CLAIMABLE_WITH_WRITES)?;
        let token = request_token(
            "claim",
            &self.inner.table,
            request.key,
            request.token,
            request.attempt,
        );
        self.transact("claim_transaction", record, writes.items().to_vec(), token)
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let inner = &self.inner;
        let output = send!(
            self,
            inner
                .client
                .get_item()
                .table_name(&inner.table)
                .key(&inner.names.key, key_value(key))
                .consistent_read(true)
        )
        .map_err(|e| classify(&inner.table, e))?;
        output
            .item()
            .map(|item| parse_item(&inner.names, item))
            .transpose()
    }

    fn response_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        crate::size::response_budget(&self.inner.names, key, fingerprint)
    }

    fn kind(&self) -> &'static str {
        "dynamodb"
    }
}

/// The failed condition, when that is what the error is (it carries the old item, if there was one).
fn rejected<R>(
    err: &SdkError<UpdateItemError, R>,
) -> Option<&aws_sdk_dynamodb::types::error::ConditionalCheckFailedException> {
    match err.as_service_error()? {
        UpdateItemError::ConditionalCheckFailedException(e) => Some(e),
        _ => None,
    }
}

const THROTTLING_CODES: [&str; 4] = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "ThrottledException",
];

/// Service errors that may pass with a retry: the service's own trouble, and a collision with a
/// transaction on the same item (or with an earlier attempt of the same transaction, still running).
const TRANSIENT_CODES: [&str; 4] = [
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "TransactionInProgressException",
];

/// The service error code of an SDK error of one of the operations this store sends.
pub(crate) fn error_code<'e>(err: &'e (dyn std::error::Error + 'static)) -> Option<&'e str> {
    use aws_sdk_dynamodb::operation::get_item::GetItemError;
    macro_rules! code_of {
        ($($error:ty),*) => {$(
            if let Some(e) = err.downcast_ref::<SdkError<$error, HttpResponse>>() {
                return e.code();
            }
        )*};
    }
    code_of!(UpdateItemError, GetItemError, TransactWriteItemsError);
    None
}

/// Sorts an SDK error into the store's error kinds.
pub(crate) fn classify<E>(table: &str, err: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let transient = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => {
            service.raw().status().is_server_error()
                || err.code().is_some_and(|c| TRANSIENT_CODES.contains(&c))
        }
        _ => false,
    };
    match err.code() {
        Some("ResourceNotFoundException") => StoreError::TableNotFound(table.to_owned()),
        Some("ValidationException") => StoreError::Invalid(Box::new(err)),
        Some(code) if THROTTLING_CODES.contains(&code) => StoreError::Throttled(Box::new(err)),
        _ if transient => StoreError::Unavailable(Box::new(err)),
        _ => StoreError::Other(Box::new(err)),
    }
}

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

pub(crate) fn parse_item(
    names: &AttributeNames,
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
        key: required(string(item, &names.key)?, &names.key)?,
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
    })
}
