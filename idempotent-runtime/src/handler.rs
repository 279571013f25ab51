//! The state machine: claim → execute → complete or fail (DESIGN §5).

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cache::Cached;
use crate::codec;
use crate::config::Idempotency;
use crate::error::Error;
use crate::record::{Record, Status};
use crate::store::{Change, ClaimOutcome, ClaimRequest, StoreError, Transition, WriteOutcome};

/// What the attribute says about one function: its namespace and its durations (`None` = the handle's
/// default). Generated code keeps one in a `static`.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// The key namespace: `name = ".."`, or `module_path!()::fn_name`.
    pub namespace: &'static str,
    /// `ttl = ".."`.
    pub ttl: Option<Duration>,
    /// `lease = ".."`.
    pub lease: Option<Duration>,
    /// `wait = ".."`.
    pub wait: Option<Duration>,
    /// `missing_key = ".."`: what a key that serializes to `null` (or a tuple key with a `null` part) means.
    pub missing_key: MissingKey,
}

/// What to do with a *missing* key: one that serializes to `null` (an `Option` that is `None`), or a
/// top-level tuple or array key with a `null` element (`key = (tenant, order_id)` with no `order_id`).
///
/// Keyless calls must never share a record: the second would get the first one's response. So a missing
/// key is an error unless the function says otherwise. Empty strings, `0`, `false`, `[]` and `{}` are
/// values, never missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// [`Error::MissingKey`] before any I/O: no record, the body does not run (the default).
    #[default]
    Reject,
    /// `null` is a deliberate value: every call whose key is `null` shares one record.
    Allow,
    /// Run the body without idempotency (no record, no replay) and log a warning.
    Skip,
}

impl Call {
    /// A call in `namespace` with every duration left to the handle's defaults.
    #[must_use]
    pub const fn new(namespace: &'static str) -> Self {
        Self {
            namespace,
            ttl: None,
            lease: None,
            wait: None,
            missing_key: MissingKey::Reject,
        }
    }
}

/// Writes staged by a `transact = ..` body (an empty type without the DynamoDB feature).
#[cfg(feature = "dynamodb")]
pub(crate) use crate::transaction::Transaction as Staging;
/// Writes staged by a `transact = ..` body (an empty type without the DynamoDB feature).
#[cfg(not(feature = "dynamodb"))]
pub(crate) enum Staging {}

/// Maps a store failure to the crate's error, naming the namespace.
pub(crate) fn store_error(namespace: &str, err: StoreError) -> Error {
    let namespace = namespace.to_owned();
    match err {
        StoreError::Throttled(source) => Error::Throttled { namespace, source },
        StoreError::TableNotFound(table) => Error::TableNotFound { namespace, table },
        StoreError::Corrupt(detail) => Error::CorruptRecord { namespace, detail },
        StoreError::Invalid(source) | StoreError::Other(source) => {
            Error::Store { namespace, source }
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Epoch seconds of `now_ms + extra`, rounded up so a record never expires early.
fn expiry_s(now_ms: u64, extra: Duration) -> u64 {
    now_ms.saturating_add(millis(extra)).div_ceil(1000)
}

/// What a blocking record means for this call.
enum Found {
    /// Our own claim (a retried write whose first response was lost).
    Ours,
    /// A stored response to return.
    Replay(Record),
    /// Another call is running; its lease ends in this long.
    InProgress(Duration),
    /// The record became claimable after all; try to claim again.
    Claimable,
}

fn examine(
    call: &Call,
    record: Record,
    token: &str,
    fingerprint: Option<&str>,
    now_ms: u64,
) -> Result<Found, Error> {
    if record.token == token {
        return Ok(Found::Ours);
    }
    if let (Some(stored), Some(ours)) = (record.fingerprint.as_deref(), fingerprint)
        && stored != ours
    {
        return Err(Error::PayloadMismatch {
            namespace: call.namespace.to_owned(),
        });
    }
    if record.is_claimable(now_ms) {
        return Ok(Found::Claimable);
    }
    match record.status {
        Status::Completed
            if record
                .replay_until_s
                .is_some_and(|until| until < now_ms / 1000) =>
        {
            Err(Error::Expired {
                namespace: call.namespace.to_owned(),
            })
        }
        Status::Completed if record.response.is_none() => Err(Error::ResponseTooLarge {
            namespace: call.namespace.to_owned(),
        }),
        Status::Completed => Ok(Found::Replay(record)),
        Status::Pending => Ok(Found::InProgress(Duration::from_millis(
            record
                .lease_until_ms
                .unwrap_or(now_ms)
                .saturating_sub(now_ms),
        ))),
        // A FAILED record is always claimable.
        Status::Failed => Ok(Found::Claimable),
    }
}

/// First poll after this long, doubling up to [`MAX_POLL`], while waiting for an in-flight call.
const FIRST_POLL: Duration = Duration::from_millis(25);
const MAX_POLL: Duration = Duration::from_secs(1);

/// Business writes that commit with the claim (`claim_with`); nothing without the DynamoDB feature.
#[cfg(feature = "dynamodb")]
pub(crate) type ClaimWrites = Vec<aws_sdk_dynamodb::types::TransactWriteItem>;
/// Business writes that commit with the claim (`claim_with`); nothing without the DynamoDB feature.
#[cfg(not(feature = "dynamodb"))]
pub(crate) type ClaimWrites = ();

/// Everything about one call except the body.
pub(crate) struct Plan<'a> {
    pub(crate) call: &'a Call,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: Option<&'a str>,
    /// Writes the body stages, committed with the COMPLETED record.
    pub(crate) staging: Option<&'a Staging>,
    /// Writes committed with the claim.
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    pub(crate) claim_writes: ClaimWrites,
}

/// One claim attempt: a plain conditional write, or a transaction when business writes go with it.
async fn claim(
    idem: &Idempotency,
    plan: &Plan<'_>,
    request: &ClaimRequest<'_>,
) -> Result<ClaimOutcome, Error> {
    let namespace = plan.call.namespace;
    #[cfg(feature = "dynamodb")]
    if !plan.claim_writes.is_empty() {
        use crate::store::TransactOutcome;
        if let Err(detail) = crate::transaction::check_limits(plan.key, &plan.claim_writes) {
            return Err(Error::TooManyWrites {
                namespace: namespace.to_owned(),
                detail,
            });
        }
        return match idem
            .store()
            .claim_transaction(request, plan.claim_writes.clone())
            .await
            .map_err(|e| store_error(namespace, e))?
        {
            TransactOutcome::Committed => Ok(ClaimOutcome::Claimed),
            TransactOutcome::Rejected(Some(record)) => Ok(ClaimOutcome::Existing(record)),
            TransactOutcome::Rejected(None) => Err(Error::CorruptRecord {
                namespace: namespace.to_owned(),
                detail: "the claim condition failed but no item was returned".into(),
            }),
            TransactOutcome::Canceled(reasons) => Err(Error::TransactionCanceled {
                namespace: namespace.to_owned(),
                reasons,
            }),
        };
    }
    idem.store()
        .claim(request)
        .await
        .map_err(|e| store_error(namespace, e))
}

/// How the claim phase ended.
enum Acquired<T> {
    /// We hold the claim: run the body.
    Held,
    /// The answer is known without running the body (a replay).
    Done(T),
}

/// Claims the key, or finds the stored answer, or says why neither is possible; with `wait`, polls an
/// in-flight call until it finishes or the wait runs out.
async fn acquire<T: DeserializeOwned>(
    idem: &Idempotency,
    plan: &Plan<'_>,
    token: &str,
    lease: Duration,
    ttl: Duration,
) -> Result<Acquired<T>, Error> {
    let Plan {
        call,
        key,
        fingerprint,
        ..
    } = *plan;
    let namespace = call.namespace;
    let store = idem.store();
    let clock = idem.clock();
    let wait_until = call
        .wait
        .filter(|w| !w.is_zero())
        .map(|w| tokio::time::Instant::now() + w);

    if let Some(hit) = idem.cache().and_then(|c| c.get(key, clock.now_ms())) {
        if let (Some(stored), Some(ours)) = (hit.fingerprint.as_deref(), fingerprint)
            && stored != ours
        {
            return Err(Error::PayloadMismatch {
                namespace: namespace.to_owned(),
            });
        }
        tracing::debug!(namespace, "replaying cached response");
        return replay(namespace, &hit.response).map(Acquired::Done);
    }

    // Claim, or find out why not. Loops only when waiting, or when a record became claimable between
    // two reads.
    let mut poll = FIRST_POLL;
    let mut claimable_retries = 0;
    'claim: loop {
        let now_ms = clock.now_ms();
        let request = ClaimRequest {
            key,
            token,
            now_ms,
            lease_until_ms: now_ms.saturating_add(millis(lease)),
            expires_at_s: expiry_s(now_ms, lease + ttl),
            fingerprint,
        };
        let mut record = match claim(idem, plan, &request).await? {
            ClaimOutcome::Claimed => return Ok(Acquired::Held),
            ClaimOutcome::Existing(record) => record,
        };
        // Inspect the record; while waiting, keep re-reading it until it is done or claimable.
        loop {
            let now_ms = clock.now_ms();
            match examine(call, record, token, fingerprint, now_ms)? {
                Found::Ours => return Ok(Acquired::Held),
                Found::Replay(record) => {
                    tracing::debug!(namespace, "replaying stored response");
                    let response = record.response.unwrap_or_default();
                    let value = replay(namespace, &response)?;
                    if let Some(cache) = idem.cache() {
                        cache.insert(
                            key,
                            Cached {
                                response: response.into(),
                                fingerprint: record.fingerprint.map(Into::into),
                                replay_until_s: record
                                    .replay_until_s
                                    .unwrap_or(record.expires_at_s),
                            },
                        );
                    }
                    return Ok(Acquired::Done(value));
                }
                Found::Claimable => {
                    claimable_retries += 1;
                    if claimable_retries > 3 {
                        return Err(Error::CorruptRecord {
                            namespace: namespace.to_owned(),
                            detail: "the record stays claimable but every claim is refused".into(),
                        });
                    }
                    continue 'claim;
                }
                Found::InProgress(retry_after) => {
                    let Some(deadline) = wait_until.filter(|d| *d > tokio::time::Instant::now())
                    else {
                        return Err(Error::InProgress {
                            namespace: namespace.to_owned(),
                            retry_after,
                        });
                    };
                    tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + poll))
                        .await;
                    poll = (poll * 2).min(MAX_POLL);
                    match store
                        .get(key)
                        .await
                        .map_err(|e| store_error(namespace, e))?
                    {
                        Some(next) => record = next,
                        // Deleted (by TTL or by hand): the key is new.
                        None => continue 'claim,
                    }
                }
            }
        }
    }
}

/// Runs `body` at most once per key while its record lives; see DESIGN §5.
pub(crate) async fn run<T, E, F>(
    idem: &Idempotency,
    plan: Plan<'_>,
    describe: impl FnOnce(&E) -> String,
    body: F,
) -> Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let call = plan.call;
    let ttl = call.ttl.unwrap_or_else(|| idem.default_ttl());
    let lease = call.lease.unwrap_or_else(|| idem.default_lease());
    let token = uuid::Uuid::new_v4().to_string();
    if let Acquired::Done(value) = acquire(idem, &plan, &token, lease, ttl).await? {
        return Ok(value);
    }
    let Plan {
        key,
        fingerprint,
        staging,
        ..
    } = plan;
    let namespace = call.namespace;
    let store = idem.store();
    let clock = idem.clock();

    tracing::debug!(namespace, "claimed; running the body");
    let outcome = if idem.heartbeat() {
        with_heartbeat(idem, key, &token, lease, ttl, body).await
    } else {
        body.await
    };

    match outcome {
        Ok(value) => {
            let json = match codec::to_json(&value) {
                Ok(bytes) => bytes,
                Err(source) => {
                    fail(
                        idem,
                        call,
                        key,
                        &token,
                        &format!("the response did not serialize: {source}"),
                    )
                    .await;
                    return Err(Error::Serialize {
                        namespace: namespace.to_owned(),
                        what: "response",
                        source,
                    }
                    .into());
                }
            };
            let bytes = codec::pack(json);
            let fits = bytes.len() <= store.response_budget(key, fingerprint);
            if !fits {
                tracing::warn!(
                    namespace,
                    bytes = bytes.len(),
                    "response too large to store even compressed; duplicates will get ResponseTooLarge"
                );
            }
            // Taken before the write, so the cached window never outlasts the stored one.
            let replay_until_s = expiry_s(clock.now_ms(), ttl);
            let stored = fits.then_some(&bytes[..]);
            complete(idem, call, key, &token, ttl, stored, staging).await?;
            if let Some(cache) = idem.cache().filter(|_| fits) {
                cache.insert(
                    key,
                    Cached {
                        response: bytes.into(),
                        fingerprint: fingerprint.map(Into::into),
                        replay_until_s,
                    },
                );
            }
            Ok(value)
        }
        Err(err) => {
            fail(idem, call, key, &token, &describe(&err)).await;
            Err(err)
        }
    }
}

/// Decodes a stored response.
fn replay<T: DeserializeOwned>(namespace: &str, response: &[u8]) -> Result<T, Error> {
    codec::decode(response).map_err(|e| {
        let namespace = namespace.to_owned();
        match e {
            codec::DecodeError::Json(source) => Error::Deserialize { namespace, source },
            codec::DecodeError::Compression(e) => Error::CorruptRecord {
                namespace,
                detail: format!("the stored response does not decompress: {e}"),
            },
        }
    })
}

/// Moves our claim to COMPLETED with `bytes` (and the staged writes, in one transaction).
#[cfg_attr(not(feature = "dynamodb"), allow(clippy::unused_async))]
async fn complete(
    idem: &Idempotency,
    call: &Call,
    key: &str,
    token: &str,
    ttl: Duration,
    response: Option<&[u8]>,
    staging: Option<&Staging>,
) -> Result<(), Error> {
    let namespace = call.namespace;
    let now_ms = idem.clock().now_ms();
    let retain = idem.retain();
    let transition = Transition {
        key,
        token,
        change: Change::Complete {
            response,
            expires_at_s: expiry_s(now_ms, ttl + retain.unwrap_or_default()),
            replay_until_s: retain.map(|_| expiry_s(now_ms, ttl)),
        },
    };
    #[cfg(feature = "dynamodb")]
    if let Some(staging) = staging {
        let writes = staging.take();
        if !writes.is_empty() {
            return complete_transaction(idem, call, &transition, writes).await;
        }
    }
    #[cfg(not(feature = "dynamodb"))]
    let _ = staging;
    let outcome = idem
        .store()
        .transition(&transition)
        .await
        .map_err(|e| store_error(namespace, e))?;
    settle(call, token, outcome)
}

/// Whether a completion landed: applied, or rejected because our own earlier attempt already landed.
fn settle(call: &Call, token: &str, outcome: WriteOutcome) -> Result<(), Error> {
    match outcome {
        WriteOutcome::Applied => Ok(()),
        // Our own completion landed, and the response to it was lost.
        WriteOutcome::Rejected(Some(r)) if r.token == token && r.status == Status::Completed => {
            Ok(())
        }
        WriteOutcome::Rejected(_) => {
            tracing::warn!(
                namespace = call.namespace,
                "claim lost before completion; result not stored"
            );
            Err(Error::LeaseLost {
                namespace: call.namespace.to_owned(),
            })
        }
    }
}

#[cfg(feature = "dynamodb")]
async fn complete_transaction(
    idem: &Idempotency,
    call: &Call,
    transition: &Transition<'_>,
    writes: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
) -> Result<(), Error> {
    use crate::store::TransactOutcome;
    let namespace = call.namespace;
    let check = crate::transaction::check_limits(transition.key, &writes);
    if let Err(detail) = check {
        fail(idem, call, transition.key, transition.token, &detail).await;
        return Err(Error::TooManyWrites {
            namespace: namespace.to_owned(),
            detail,
        });
    }
    let outcome = match idem.store().complete_transaction(transition, writes).await {
        Ok(outcome) => outcome,
        // Refused before anything was written: the claim still holds, so release it for a retry.
        Err(StoreError::Invalid(source)) => {
            let detail = format!(
                "the transaction was refused: {}",
                crate::error::chain(source.as_ref())
            );
            fail(idem, call, transition.key, transition.token, &detail).await;
            return Err(Error::Store {
                namespace: namespace.to_owned(),
                source,
            });
        }
        Err(e) => return Err(store_error(namespace, e)),
    };
    match outcome {
        TransactOutcome::Committed => Ok(()),
        TransactOutcome::Rejected(record) => {
            settle(call, transition.token, WriteOutcome::Rejected(record))
        }
        TransactOutcome::Canceled(reasons) => {
            let summary = format!(
                "transaction canceled: {}",
                Error::TransactionCanceled {
                    namespace: namespace.to_owned(),
                    reasons: reasons.clone(),
                }
            );
            fail(idem, call, transition.key, transition.token, &summary).await;
            Err(Error::TransactionCanceled {
                namespace: namespace.to_owned(),
                reasons,
            })
        }
    }
}

/// Moves our claim to FAILED. The caller gets the body's own error whatever happens here; a failed
/// write only means the key stays PENDING until its lease runs out.
async fn fail(idem: &Idempotency, call: &Call, key: &str, token: &str, error: &str) {
    let now_ms = idem.clock().now_ms();
    let transition = Transition {
        key,
        token,
        change: Change::Fail {
            error,
            expires_at_s: expiry_s(now_ms, idem.failed_ttl()),
        },
    };
    match idem.store().transition(&transition).await {
        Ok(WriteOutcome::Applied) => {}
        // Our own earlier attempt landed; its response was lost.
        Ok(WriteOutcome::Rejected(Some(r))) if r.token == token && r.status == Status::Failed => {}
        Ok(WriteOutcome::Rejected(_)) => {
            tracing::warn!(
                namespace = call.namespace,
                "claim lost before the failure was recorded"
            );
        }
        Err(e) => {
            tracing::warn!(namespace = call.namespace, error = %e, "could not record the failure; the key is claimable after its lease");
        }
    }
}

/// Runs `body` while extending the lease every third of it, so a live worker is never taken over.
async fn with_heartbeat<F: Future>(
    idem: &Idempotency,
    key: &str,
    token: &str,
    lease: Duration,
    ttl: Duration,
    body: F,
) -> F::Output {
    let beat = async {
        let every = (lease / 3).max(Duration::from_millis(1));
        loop {
            tokio::time::sleep(every).await;
            let now_ms = idem.clock().now_ms();
            let transition = Transition {
                key,
                token,
                change: Change::ExtendLease {
                    lease_until_ms: now_ms.saturating_add(millis(lease)),
                    expires_at_s: expiry_s(now_ms, lease + ttl),
                },
            };
            match idem.store().transition(&transition).await {
                Ok(WriteOutcome::Applied) => {}
                Ok(WriteOutcome::Rejected(_)) => {
                    // Lost: completion will report it. Stop beating.
                    std::future::pending::<()>().await;
                }
                Err(e) => tracing::warn!(error = %e, "lease heartbeat failed; will retry"),
            }
        }
    };
    tokio::pin!(body);
    tokio::select! {
        biased;
        out = &mut body => out,
        _ = beat => unreachable!("the heartbeat never finishes"),
    }
}
