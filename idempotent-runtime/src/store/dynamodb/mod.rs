//! [`DynamoDbStore`]: records in a DynamoDB table, one item per key.
//!
//! Every call is one request: a conditional `UpdateItem` (claim, complete, fail, step, heartbeat), a
//! `TransactWriteItems` (a claim, completion or failure that carries business writes), or a consistent
//! `GetItem` (waiting for an in-flight call). Conditional writes ask for
//! `ReturnValuesOnConditionCheckFailure=ALL_OLD`, so a failed condition hands back the blocking record in
//! the same round trip. [`DynamoDbStore::ensure_table`] creates the table (`CreateTable`, then
//! `DescribeTable` until it is active, then `UpdateTimeToLive`) and verifies it; call it at start-up.
//!
//! # The protocol, request by request
//!
//! Placeholders stand for the configured [`AttributeNames`] (`#pk` key, `#st` status, `#tk` token, `#at`
//! attempt, `#lu` lease end, `#ex` expiry, `#fp` fingerprint, `#rs` response, `#er` error, `#ru` replay
//! end, `#cw` claim-time writes in effect, `#ci` the region that completed the record, `#sp` the finished
//! steps of an operation run with steps). `:now_ms` is the
//! caller's clock *less the clock-skew margin*
//! ([`Builder::clock_skew_margin`](crate::Builder::clock_skew_margin), 1 s by default) and `:now_s` the
//! same in seconds, so no caller whose clock runs ahead by less than the margin takes over a live claim or
//! treats a live record as expired. The exact text of every expression, as sent, is in [`expression`].
//!
//! Every claim's condition below also ends `AND NOT (#st = FAILED AND #tk = :tk) AND NOT contains(#rl, :tk)
//! AND (attribute_not_exists(#rt) OR #rt < :tk)` ([`NOT_RELEASED`](expression::NOT_RELEASED)): a
//! record its own call released, that holds the call's token among its released ones (`#rl`, a string
//! set), or whose `released_through` (`#rt`) is no less than the token refuses that call's claim when
//! it lands late.
//!
//! | request | update | condition |
//! |---|---|---|
//! | claim | `SET #st = PENDING, #tk = :tk, #lu = now + lease, #ex = now + lease + ttl[, #fp = :fp] ADD #at 1 REMOVE #rs, #er, #ru, #ci[, #fp]` | `(attribute_not_exists(#pk) OR #ex < :now_s OR #st = FAILED OR (#st = PENDING AND #lu < :now_ms)) AND attribute_not_exists(#sp)` (an operation without steps never takes over a live record with steps) |
//! | claim without steps, sent again when an expired record with steps refused it (any of the claims without steps) | the claim's, plus `REMOVE .., #sp` (a new operation does not inherit the old one's steps) | the claim's, `AND (#ex < :now_s)` |
//! | claim with business writes (`claim_with`), in a `TransactWriteItems` with them | the claim's, plus `SET #cw = true` | `attribute_not_exists(#pk) OR #ex < :now_s OR ((#st = FAILED OR (#st = PENDING AND #lu < :now_ms)) AND attribute_not_exists(#cw))` |
//! | claim keeping claim-time writes (after a claim with writes was refused for them) | the claim's | `attribute_exists(#cw) AND #ex >= :now_s AND (#st = FAILED OR (#st = PENDING AND #lu < :now_ms))` |
//! | claim of an operation with steps, afresh (`.steps()`) | the claim's (any of the three above), plus `SET #sp = :sp` (the new operation's origin, no step finished) | the claim's, `AND (attribute_not_exists(#sp) OR #ex < :now_s[ OR (#st = FAILED AND #sp = :seen)])` (with `restart_steps_after_failure`; `:seen`: the steps of the failure the caller judged restartable) |
//! | claim of an operation with steps, resuming (after the fresh claim was refused by live steps) | the claim's (any of the three above) | the claim's, `AND #sp = :sp AND #ex >= :now_s[ AND #st = PENDING]` (`:sp`: the steps the caller read, which it replays) |
//! | step (a step of a body run with steps finished, or an at-most-once step started, or a value that could not be stored) | `SET #sp = :sp` (every finished step's value, and the marks) | `#st = PENDING AND #tk = :tk AND #sp = :prev` (`:prev`: the steps it extends, so that a late copy of an earlier step's write is refused; refused with the record holding exactly `:sp` under `:tk`, it is the call's own earlier copy, which landed) |
//! | complete | `SET #st = COMPLETED, #ex = now + ttl [+ retain][, #rs = :rs][, #ru = now + ttl][, #ci = region] REMOVE #lu[, #rs], #sp, #rl, #rd` (`#ci` with [`with_region`](DynamoDbStore::with_region)) | `#st = PENDING AND #tk = :tk` |
//! | fail | `SET #st = FAILED, #er = :er, #ex = now + failed_ttl REMOVE #lu[, #cw]` (`#cw` when compensating writes go with it; `now + ttl [+ retain]` when claim-time writes stay in effect, or steps are kept for a resume) | `#st = PENDING AND #tk = :tk[ AND attribute_exists(#cw)]` (with compensating writes) |
//! | heartbeat | `SET #lu = now + lease, #ex = now + lease + ttl` | `#st = PENDING AND #tk = :tk` |
//! | operator's release of a record with steps (`idempotent key release`) | `SET #lu = 0, #ex = :ex` (the lease lapses; the record stays PENDING with its steps) | `#st = PENDING AND #tk = :tk` |
//! | release (a call dropped while claiming, or whose claim's answer never came) | first the fail above (`released: ..`); where it finds no item or an expired one, a mark in its place: `SET #st = FAILED, #tk = :tk, #er = :er, #ex = now + lease + ttl, #at = 0, #rl = {:tk}, #rd = now + lease + margin REMOVE #lu, #fp, #rs, #ru, #cw, #ci, #sp, #rt`; on any other item (the fail applied, or another call's record), the token left on it, with `#rd` and `#ex` made no earlier than the claim's end: `ADD #rl {:tk} SET #rd = :rd, #ex = :ex`, or, on a full set whose `#rd` has passed, `SET #rl = {:tk}, #rd = :rd, #ex = :ex REMOVE #rt`, or, on a full set whose `#rd` has not, `SET #rt = :tk, #rd = :rd, #ex = :ex` (every token up to the call's is refused) | the fail's; the mark's `attribute_not_exists(#pk) OR #ex < :now_s`; the token's `attribute_exists(#pk) AND NOT (#st = PENDING AND #tk = :tk) AND #st <> COMPLETED AND #ex >= :now_s AND #ex = :seen_ex AND (attribute_not_exists(#rd) OR #rd = :seen_rd) AND (attribute_not_exists(#rl) OR size(#rl) < 16)` (the replacement: `.. AND #rd = :seen_rd AND #rd < :now_ms`; the raise: `.. AND size(#rl) >= 16 AND (attribute_not_exists(#rt) OR #rt < :tk)`; on a record that refuses the token already but not until its claim's end, `SET #rd = :rd, #ex = :ex` on `.. AND (contains(#rl, :tk) OR #rt >= :tk)`) |
//! | wait | consistent `GetItem` | — |
//!
//! Every request names its item by the full primary key of the store's [`Layout`]: `pk` = the record
//! key by default; `pk` = a constant and `sk` = the record key ([`Layout::StaticPartition`]); `pk` = the
//! namespace and `sk` = the key's hash ([`Layout::Tenant`]). `#pk` is always the partition key
//! attribute, and `attribute_not_exists(#pk)` holds exactly when no item with the request's full key
//! exists: DynamoDB evaluates a condition on the one item the key names, not on its partition.
//!
//! A claim never touches `#cw` otherwise: claim-time writes stay in effect across a failure without
//! compensation and across a takeover, so a claim with writes that finds such a record is refused, and the
//! caller claims it with the claim that keeps them instead — the writes are in effect at most once per
//! key. That claim, and a failure that compensates, are each conditioned on `#cw`: a caller whose
//! decision another caller made stale (by compensating meanwhile) is refused, and claims with its writes
//! again, rather than running without them or undoing them twice.
//!
//! A completion, or a failure, that carries business writes is one `TransactWriteItems`: the record's
//! update (index 0) and the writes. Its `ClientRequestToken` is derived from (purpose, table, key, the
//! call's fencing token, and for claims the attempt number): DynamoDB applies one token once within **ten
//! minutes**, and refuses the same token with other parameters (`IdempotentParameterMismatch`). So the
//! SDK's retries of a request, and this crate's retries of a completion (built once, sent unchanged),
//! keep their token, while every claim attempt (each with its own time, lease and expiry) has its own.
//! `UpdateItem` takes no such token: a claim, completion or failure whose response was lost is recognised
//! by the fencing token in the record that its retry's failed condition returns (a step's write, by the
//! token and its own steps there).
//!
//! Error mapping: throttling after the SDK's retries is [`StoreError::Throttled`]; HTTP 5xx, timeouts,
//! broken connections and transaction conflicts are [`StoreError::Unavailable`]; validation errors are
//! [`StoreError::Invalid`]; a missing table is [`StoreError::TableNotFound`] (in a transaction, a missing
//! business table is [`StoreError::Invalid`] naming the candidates, since DynamoDB does not say which).

// Everything DynamoDB-specific lives in this folder; the rest of the crate speaks `Record`, `Writes` and
// `StoreError`. (DynamoDB's 400 KB item limit is in `crate::size`, outside: every store applies it.)
mod error; // SDK errors → `StoreError`, and `StoreError::code`
pub mod expression; // every condition and update expression, and the placeholders
mod item; // item → `Record`
mod layout; // `Layout`: record key → the table's primary key
mod request_token; // `ClientRequestToken`s of transactions
mod size; // DynamoDB's size rules for staged writes
mod table; // create/ensure/check the table, `TableReport`
pub(crate) mod transaction; // `Transaction` and the limits of one `TransactWriteItems`

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::error::ProvideErrorMetadata as _;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use super::Writes;
use super::{
    ClaimOutcome, ClaimRequest, Store, StoreError, TransactOutcome, Transition, WriteOutcome,
};
use crate::record::Record;
pub(crate) use error::store_error;
use error::{canceled, cancellation_reasons, key_schema_mismatch, rejected};
use expression::{PreparedNames, RecordUpdate};
use request_token::request_token;

pub use crate::record::AttributeNames;
#[cfg(test)]
pub(crate) use item::parse_item;
use item::{Item, parse_record};
pub use layout::{DEFAULT_STATIC_PARTITION, Layout, ParseLayoutError};
pub use table::{Replication, TableReport};

/// Idempotency records in a DynamoDB table, one item per key.
///
/// Cheap to clone. Create the table at start-up with [`DynamoDbStore::ensure_table`] (or the
/// `idempotent table create` command), or by hand: by default
/// ([`Layout::Key`]) partition key `pk` (String) only; with [`with_layout`](Self::with_layout), the
/// layout's key schema (partition key `pk` and sort key `sk`, both String). Any billing mode, TTL on
/// `expires_at` (optional: expiry is enforced by the conditions, TTL only reclaims space).
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
    /// No two of `names` are the same attribute, so a returned item can be taken apart as its record
    /// is read ([`Item::Owned`]).
    distinct_names: bool,
    /// The `ExpressionAttributeNames` of every record update, from `names`.
    prepared: PreparedNames,
    /// How record keys map onto the table's primary key.
    layout: Layout,
    /// With [`DynamoDbStore::with_region`]: the region this store serves, written by completions.
    region: Option<String>,
    /// With [`DynamoDbStore::strict_replicas`]: a replicated table without routing is an error.
    strict_replicas: bool,
    /// With [`DynamoDbStore::with_retry_config`]: the configuration override of every request, holding
    /// the store's retry policy and nothing else (unset settings keep the client's). Built once.
    retry_override: Option<aws_sdk_dynamodb::config::Builder>,
}

impl Inner {
    /// The record of an item the store was handed back, taken apart as it is read when the names allow.
    fn parse_owned(&self, item: HashMap<String, AttributeValue>) -> Result<Record, StoreError> {
        if self.distinct_names {
            parse_record(&self.names, &self.layout, Item::owned(item))
        } else {
            parse_record(&self.names, &self.layout, Item::Borrowed(&item))
        }
    }
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
                prepared: PreparedNames::new(&names),
                distinct_names: names.are_distinct(),
                names,
                layout: Layout::Key,
                region: None,
                strict_replicas: false,
                retry_override: None,
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
        let retry_override = Some(aws_sdk_dynamodb::Config::builder().retry_config(retry));
        self.map_inner(|inner| Inner {
            retry_override,
            ..inner
        })
    }

    /// The same store with records laid out as `layout` (see [`Layout`] and the `guide::regions`
    /// module); the table must have the layout's key schema, which [`ensure_table`](Self::ensure_table)
    /// creates and [`check`](Self::check) verifies.
    ///
    /// ```
    /// use idempotent_runtime::{DynamoDbStore, Layout};
    /// # fn f(client: idempotent_runtime::aws_sdk_dynamodb::Client) {
    /// // Every record in partition `orders`, the record key as the sort key.
    /// let store = DynamoDbStore::new(client, "idempotency")
    ///     .with_layout(Layout::static_partition("orders"));
    /// # }
    /// ```
    #[must_use]
    pub fn with_layout(self, layout: Layout) -> Self {
        self.map_inner(|inner| Inner { layout, ..inner })
    }

    /// The same store, serving the region named `name` (as [`RoutedStore`](crate::RoutedStore) names
    /// it): completions record it in the record's `completed_in` attribute, and the global-table guard
    /// of [`check`](Self::check) counts the store as routed.
    /// [`RoutedStore::dynamodb`](crate::RoutedStore::dynamodb) sets it on each region's store; set it
    /// yourself on stores you give to [`RoutedStore::new`](crate::RoutedStore::new).
    #[must_use]
    pub fn with_region(self, name: impl Into<String>) -> Self {
        let region = Some(name.into());
        self.map_inner(|inner| Inner { region, ..inner })
    }

    /// Whether [`check`](Self::check) and [`ensure_table`](Self::ensure_table) refuse a global table
    /// with replicas in several regions that this store uses without home-region routing (no
    /// [`with_region`](Self::with_region)), and whose consistency is not multi-region strong (off by
    /// default: such a table is logged as a `warn` event). See [`Replication`].
    #[must_use]
    pub fn strict_replicas(self, strict: bool) -> Self {
        self.map_inner(|inner| Inner {
            strict_replicas: strict,
            ..inner
        })
    }

    fn map_inner(self, change: impl FnOnce(Inner) -> Inner) -> Self {
        Self {
            inner: Arc::new(change(Arc::unwrap_or_clone(self.inner))),
        }
    }

    /// The table layout in use.
    #[must_use]
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The region this store serves, if it was given one ([`with_region`](Self::with_region)).
    #[must_use]
    pub fn region(&self) -> Option<&str> {
        self.inner.region.as_deref()
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

    /// One conditional `UpdateItem` of the record (`op`: its name for metrics); a failed condition returns
    /// the item as it was. `claimed_at_s`: for a claim, the time its condition is evaluated at, so that
    /// (with the `metrics` feature) a claim that replaced an expired record is counted.
    async fn conditional_update(
        &self,
        op: &'static str,
        claimed_at_s: Option<u64>,
        key: &str,
        update: RecordUpdate,
    ) -> Result<WriteOutcome, StoreError> {
        let inner = &self.inner;
        let request = inner
            .client
            .update_item()
            .table_name(&inner.table)
            .set_key(Some(inner.layout.item_key(&inner.names, key)?))
            .update_expression(update.update)
            .condition_expression(update.condition)
            .set_expression_attribute_names(Some(update.names))
            .set_expression_attribute_values(Some(update.values))
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
            Err(err) if rejected(&err).is_some() => {
                let item = match err.into_service_error() {
                    UpdateItemError::ConditionalCheckFailedException(e) => e.item,
                    _ => None,
                };
                Ok(WriteOutcome::Rejected(
                    item.map(|item| inner.parse_owned(item)).transpose()?,
                ))
            }
            Err(err) => Err(store_error(&inner.table, err)),
        }
    }

    /// The record's conditional update as a transaction action (index 0), failing with the old item.
    fn record_update(&self, key: &str, update: RecordUpdate) -> Result<Update, StoreError> {
        Update::builder()
            .table_name(&self.inner.table)
            .set_key(Some(self.inner.layout.item_key(&self.inner.names, key)?))
            .update_expression(update.update)
            .condition_expression(update.condition)
            .set_expression_attribute_names(Some(update.names))
            .set_expression_attribute_values(Some(update.values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| StoreError::Other(e.into()))
    }

    /// Sends `record` (index 0) and `writes` in one `TransactWriteItems` with an idempotent request token,
    /// and sorts out a cancellation.
    async fn transact(
        &self,
        op: &'static str,
        key: &str,
        record: Update,
        writes: Vec<TransactWriteItem>,
        request_token: String,
    ) -> Result<TransactOutcome, StoreError> {
        let inner = &self.inner;
        // Named in the error if one of them does not exist (DynamoDB does not say which).
        let mut tables: Vec<String> = writes
            .iter()
            .filter_map(|w| transaction::table_of(w).map(str::to_owned))
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
        let Some(canceled) = canceled(&err) else {
            // DynamoDB does not say whose key missed its table's key schema: if the record's own table
            // has another one, that is the setup error every call gets (the business writes may be fine).
            if key_schema_mismatch(&err)
                && let Err(schema @ StoreError::Schema(_)) = Box::pin(self.get(key)).await
            {
                return Err(schema);
            }
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
            return Err(store_error(&inner.table, err));
        };
        let reasons = cancellation_reasons(canceled);
        match reasons.first() {
            Some(first) if first.code == "ConditionalCheckFailed" => Ok(TransactOutcome::Rejected(
                first
                    .item
                    .as_ref()
                    .map(|item| parse_record(&inner.names, &inner.layout, Item::Borrowed(item)))
                    .transpose()?,
            )),
            // A business condition, or a conflict or throttling that may pass: the caller decides.
            _ => Ok(TransactOutcome::Canceled(reasons)),
        }
    }

    /// Turns a stored item into a [`Record`], or says what is wrong with it.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a missing or mistyped attribute or an unknown status.
    pub fn parse_item(&self, item: &HashMap<String, AttributeValue>) -> Result<Record, StoreError> {
        parse_record(&self.inner.names, &self.inner.layout, Item::Borrowed(item))
    }

    /// The item key (the request's `Key`) of the record key `key` in this store's [`Layout`]: to read or
    /// write a record's item directly.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] when the layout cannot place `key` (see [`Layout::item_key`]).
    pub fn item_key(&self, key: &str) -> Result<HashMap<String, AttributeValue>, StoreError> {
        self.inner.layout.item_key(&self.inner.names, key)
    }
}

/// Sends a fluent request, with the store's retry policy when it has one, through the SDK's per-operation
/// override (`customize().config_override(..)`): the client and its configuration stay as they are, and
/// are shared with the user's own calls. Without a policy no override is attached, which spares the SDK a
/// configuration merge per request. (A macro: each operation's fluent builder is its own type, and the
/// SDK's trait for sending a customized one is private.)
macro_rules! send {
    ($store:expr, $request:expr) => {
        match &$store.inner.retry_override {
            Some(retry) => {
                $request
                    .customize()
                    .config_override(retry.clone())
                    .send()
                    .await
            }
            None => $request.send().await,
        }
    };
}
use send;

/// Whether a claim refused by `record` is to be sent again removing its steps: a claim without steps
/// ([`StepsClaim::Untouched`](crate::store::StepsClaim::Untouched)) of an expired record that holds
/// some (refused by [`STEPS_UNTOUCHED`](expression::STEPS_UNTOUCHED)). The claim starts a new
/// operation, which must not inherit the old one's steps; the resend is conditioned on the record
/// being expired still. One more request, only on such a record.
fn clears_steps(request: &ClaimRequest<'_>, record: &Record) -> bool {
    matches!(request.steps, crate::store::StepsClaim::Untouched)
        && !request.keep_claim_writes
        && record.steps.is_some()
        && record.is_expired(request.now_ms)
}

/// The transition to send again when `record` refused it: one out of (or within) PENDING, refused
/// only because its expiry is earlier than the end of the record's released tokens
/// ([`HELD_BY_TOKEN`](expression::HELD_BY_TOKEN)'s last clause); the resend's expiry is that end
/// ([`Record::outlives_released`], the memory store's rule in one step). A record PENDING under
/// another token, or in another state, refuses it for good. Each resend is refused again only by a
/// later end, written by another call's release in between: there are finitely many.
fn outliving<'a>(transition: &Transition<'a>, record: &Record) -> Option<Transition<'a>> {
    if record.status != crate::record::Status::Pending || record.token != transition.token {
        return None;
    }
    let change = transition.change.outliving_released(record)?;
    Some(Transition {
        change,
        ..*transition
    })
}

/// The claim to send again when `record` refused it only because its expiry is earlier than the end
/// of the record's released tokens ([`OUTLIVES_RELEASED`](expression::OUTLIVES_RELEASED)): the same
/// claim, expiring at that end, if the record admits it (the memory store's rule, `claimed`, which
/// applies both in one step). `None` when the record refuses the claim anyway, or its released tokens
/// end earlier (the common case: one comparison).
fn claim_outliving<'a>(
    request: &ClaimRequest<'a>,
    record: &Record,
    with_writes: bool,
) -> Option<ClaimRequest<'a>> {
    let expires_at_s = record.outlives_released(request.expires_at_s);
    if expires_at_s == request.expires_at_s {
        return None;
    }
    let raised = ClaimRequest {
        expires_at_s,
        ..*request
    };
    crate::store::memory::claimed(Some(record), &raised, with_writes)
        .is_ok()
        .then_some(raised)
}

/// A request's future, put in its box as it is made: `make` calls a function that is never inlined
/// and returns the future (the `*_future` functions below), so the compiler has it write the future
/// straight into the box. Built in the caller's frame instead, as `Box::pin(async move { .. })`
/// does, the future is made on the stack and copied into the box whole: about 7 KB for a claim, most
/// of it the SDK's request future, not yet started and not yet written.
fn boxed<'a, T, F: Future<Output = T> + Send + 'a>(
    make: impl FnOnce() -> F,
) -> Pin<Box<dyn Future<Output = T> + Send + 'a>> {
    let slot = Box::<F>::new_uninit();
    let future: Box<F> = Box::write(slot, make());
    Box::into_pin(future)
}

// The requests of the `Store` methods a call makes every time (a claim; a completion or failure),
// each behind a function that makes its future (`boxed`).
impl DynamoDbStore {
    #[inline(never)]
    fn claim_future<'a>(
        &'a self,
        request: &'a ClaimRequest<'_>,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send + 'a {
        self.claim_request(request)
    }

    async fn claim_request(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut request = *request;
        let mut clearing_steps = false;
        let outcome = loop {
            let update = RecordUpdate::claim(&self.inner.prepared, &request, false, clearing_steps);
            let outcome = self
                .conditional_update("claim", Some(request.now_ms / 1000), request.key, update)
                .await?;
            let WriteOutcome::Rejected(Some(record)) = &outcome else {
                break outcome;
            };
            if !clearing_steps && clears_steps(&request, record) {
                clearing_steps = true;
            } else if let Some(raised) = claim_outliving(&request, record, false) {
                request = raised;
            } else {
                break outcome;
            }
        };
        match outcome {
            WriteOutcome::Applied => Ok(ClaimOutcome::Claimed),
            WriteOutcome::Rejected(Some(record)) => Ok(ClaimOutcome::Existing(record)),
            WriteOutcome::Rejected(None) => Err(StoreError::Corrupt(
                "the claim condition failed but no item was returned".to_owned(),
            )),
        }
    }

    #[inline(never)]
    fn transition_future<'a>(
        &'a self,
        transition: &'a Transition<'_>,
    ) -> impl Future<Output = Result<WriteOutcome, StoreError>> + Send + 'a {
        self.transition_request(transition)
    }

    async fn transition_request(
        &self,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let op = transition.change.op(false);
        let mut transition = *transition;
        loop {
            let update = RecordUpdate::transition(&self.inner.prepared, &transition, self.region());
            let outcome = self
                .conditional_update(op, None, transition.key, update)
                .await?;
            match &outcome {
                WriteOutcome::Rejected(Some(record)) => match outliving(&transition, record) {
                    Some(raised) => transition = raised,
                    None => return Ok(outcome),
                },
                _ => return Ok(outcome),
            }
        }
    }
}

#[async_trait::async_trait]
impl Store for DynamoDbStore {
    fn claim<'s, 'r, 'k, 'f>(
        &'s self,
        request: &'r ClaimRequest<'k>,
    ) -> Pin<Box<dyn Future<Output = Result<ClaimOutcome, StoreError>> + Send + 'f>>
    where
        's: 'f,
        'r: 'f,
        'k: 'f,
    {
        boxed(|| self.claim_future(request))
    }

    fn transition<'s, 't, 'k, 'f>(
        &'s self,
        transition: &'t Transition<'k>,
    ) -> Pin<Box<dyn Future<Output = Result<WriteOutcome, StoreError>> + Send + 'f>>
    where
        's: 'f,
        't: 'f,
        'k: 'f,
    {
        boxed(|| self.transition_future(transition))
    }

    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let mut transition = *transition;
        let mut resent = false;
        loop {
            let update = RecordUpdate::transition(&self.inner.prepared, &transition, self.region());
            let record = self.record_update(transition.key, update)?;
            // The purpose is the plain request's name (`complete`, `fail`), as the tokens always were;
            // a resend with a raised expiry is another request, whose token names that expiry (a
            // token always stands for the same request, however often the call retries).
            let op = transition.change.op(false);
            let purpose = match transition.change {
                crate::store::Change::Complete { expires_at_s, .. }
                | crate::store::Change::Fail { expires_at_s, .. }
                    if resent =>
                {
                    std::borrow::Cow::Owned(format!("{op}_until_{expires_at_s}"))
                }
                _ => std::borrow::Cow::Borrowed(op),
            };
            let token = request_token(
                &purpose,
                &self.inner.table,
                transition.key,
                transition.token,
                0,
            );
            let outcome = self
                .transact(
                    transition.change.op(true),
                    transition.key,
                    record,
                    writes.items().to_vec(),
                    token,
                )
                .await?;
            match &outcome {
                TransactOutcome::Rejected(Some(record)) => match outliving(&transition, record) {
                    Some(raised) => {
                        transition = raised;
                        resent = true;
                    }
                    None => return Ok(outcome),
                },
                _ => return Ok(outcome),
            }
        }
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        let original = request.expires_at_s;
        let mut request = *request;
        let mut clearing_steps = false;
        loop {
            let update = RecordUpdate::claim(&self.inner.prepared, &request, true, clearing_steps);
            let record = self.record_update(request.key, update)?;
            // Each resend is another request, with a token of its own, derived from what differs.
            let purpose = match (clearing_steps, request.expires_at_s == original) {
                (false, true) => "claim".to_owned(),
                (true, true) => "claim_clearing_steps".to_owned(),
                (clearing, false) => format!(
                    "claim{}_until_{}",
                    if clearing { "_clearing_steps" } else { "" },
                    request.expires_at_s
                ),
            };
            let token = request_token(
                &purpose,
                &self.inner.table,
                request.key,
                request.token,
                request.attempt,
            );
            let outcome = self
                .transact(
                    "claim_transaction",
                    request.key,
                    record,
                    writes.items().to_vec(),
                    token,
                )
                .await?;
            let TransactOutcome::Rejected(Some(old)) = &outcome else {
                return Ok(outcome);
            };
            if !clearing_steps && clears_steps(&request, old) {
                // The same claim, removing the expired record's steps.
                clearing_steps = true;
            } else if let Some(raised) = claim_outliving(&request, old, true) {
                request = raised;
            } else {
                return Ok(outcome);
            }
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let inner = &self.inner;
        let output = send!(
            self,
            inner
                .client
                .get_item()
                .table_name(&inner.table)
                .set_key(Some(inner.layout.item_key(&inner.names, key)?))
                .consistent_read(true)
        )
        .map_err(|e| store_error(&inner.table, e))?;
        output.item.map(|item| inner.parse_owned(item)).transpose()
    }

    /// The common budget ([`Store::response_budget`]), less what this store's items carry besides: the
    /// layout's sort key, and the region that completed the record.
    fn response_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        let inner = &self.inner;
        let region = inner
            .region
            .as_ref()
            .map_or(0, |r| inner.names.completed_in.len() + r.len());
        crate::size::response_budget(&inner.names, key, fingerprint)
            .saturating_sub(inner.layout.extra_key_bytes(&inner.names) + region)
    }

    /// The common budget ([`Store::steps_budget`]) under this store's attribute names, less the
    /// layout's sort key.
    fn steps_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        let inner = &self.inner;
        crate::size::steps_budget(&inner.names, key, fingerprint)
            .saturating_sub(inner.layout.extra_key_bytes(&inner.names))
    }

    fn kind(&self) -> &'static str {
        "dynamodb"
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::primitives::Blob;

    use super::*;
    use crate::record::Status;

    fn client() -> Client {
        Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .build(),
        )
    }

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    #[test]
    fn a_returned_item_is_taken_apart_only_when_no_attribute_is_named_twice() {
        let item = |names: &AttributeNames| {
            HashMap::from([
                (names.key.clone(), s("ns#00ff")),
                (names.status.clone(), s("FAILED")),
                (names.token.clone(), s("t-1")),
                (names.expires_at.clone(), AttributeValue::N("90".into())),
                (names.response.clone(), AttributeValue::B(Blob::new(*b"{}"))),
                (names.error.clone(), s("declined")),
            ])
        };
        let distinct = DynamoDbStore::new(client(), "t");
        assert!(distinct.inner.distinct_names);
        let record = distinct
            .inner
            .parse_owned(item(&AttributeNames::default()))
            .unwrap();
        assert_eq!(record.status, Status::Failed);
        assert_eq!(record.error.as_deref(), Some("declined"));
        // The error and the completing region in one attribute: both read it, which taking the
        // attribute out at its first read would not allow.
        let names = AttributeNames {
            completed_in: "error".into(),
            ..AttributeNames::default()
        };
        let shared = DynamoDbStore::with_attribute_names(client(), "t", names.clone());
        assert!(!shared.inner.distinct_names);
        let record = shared.inner.parse_owned(item(&names)).unwrap();
        assert_eq!(record.error.as_deref(), Some("declined"));
        assert_eq!(record.completed_in.as_deref(), Some("declined"));
    }
}
