//! Settling a claim: the fenced writes that store a body's outcome ([`Held::complete`],
//! [`Held::fail`]) and its steps, retried through transient faults while the lease allows.

#[allow(
    clippy::wildcard_imports,
    reason = "the state machine's parts share its vocabulary"
)]
use super::*;

/// Retries of a write that must land once the body has run (its result is in memory and the claim is
/// still ours): jittered exponential backoff until a deadline. On top of the SDK's own retries, which
/// give up after a few attempts.
pub(super) struct Persist {
    pub(super) deadline: tokio::time::Instant,
    pub(super) delay: Duration,
}

/// First pause between two attempts of a write that must land, doubling up to [`MAX_RETRY_DELAY`].
pub(super) const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
pub(super) const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

impl Persist {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            deadline: tokio::time::Instant::now() + window.min(crate::config::MAX_DURATION),
            delay: FIRST_RETRY_DELAY,
        }
    }

    /// Waits before the next attempt; `false` when the window is spent.
    async fn again(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now >= self.deadline {
            return false;
        }
        // "Equal jitter": half the delay, plus a random part of the other half, so that callers that
        // collided do not collide again.
        let half = self.delay / 2;
        let random = u64::try_from(uuid::Uuid::new_v4().as_u128() % u128::from(millis(half) + 1))
            .unwrap_or(0);
        let pause = (half + Duration::from_millis(random)).min(self.deadline - now);
        // Boxed: only a retry waits, and every completion's future would carry the timer otherwise.
        Box::pin(tokio::time::sleep(pause)).await;
        self.delay = (self.delay * 2).min(MAX_RETRY_DELAY);
        true
    }
}

/// One attempt at a fenced transition, as the store reported it.
#[allow(
    clippy::large_enum_variant,
    reason = "returned by value on every rejected write: boxing the record would allocate there"
)]
pub(super) enum Written {
    Applied,
    Rejected(Option<Record>),
    Canceled(Vec<CancellationReason>),
}

/// What ended a run of attempts at a transition.
pub(super) enum Stored {
    Applied,
    /// Boxed: a rejection is rare, and the record would make every `Stored` its size.
    Rejected(Option<Box<Record>>),
    /// A business condition (or another reason that does not pass) canceled the transaction.
    Canceled(Vec<CancellationReason>),
    /// The transaction was refused as a whole, before any condition.
    Refused(crate::BoxError),
    /// The store has no transactions, and there were writes to commit with the transition.
    Unsupported(Error),
    /// Transient faults outlasted the window; the last one.
    GaveUp(Error),
    /// A fault that does not pass with a retry.
    Failed(Error),
}

/// A body's `Ok` value as stored ([`Held::encode`]), not generic: what a completion needs of it.
pub(crate) struct Encoded {
    /// The response (JSON, compressed when large), or why there is none (not serialized).
    pub(super) bytes: Vec<u8>,
    /// Whether the response fits in the record (and within `max_response_bytes`).
    pub(super) fits: bool,
    /// The value does not serialize, or not into JSON that reads back: stored as not serialized,
    /// and the caller hears why.
    pub(super) unserializable: Option<serde_json::Error>,
}

/// A claim we hold: the body has run, and its outcome must be stored.
pub(crate) struct Held<'a> {
    pub(super) idem: &'a Idempotency,
    pub(super) plan: &'a Plan<'a>,
    pub(super) token: &'a str,
    pub(super) ttl: Duration,
    /// The call's hold on its key's flight, when it leads one: the stored record is passed on to
    /// the calls that follow it; dropped with the claim, it hands the flight over if nothing landed.
    pub(super) lead: Option<flight::Lead<'a>>,
}

impl Held<'_> {
    pub(super) fn namespace(&self) -> &'static str {
        self.plan.call.namespace
    }

    /// The lead on the key's flight, owned, for a detached body's task to take up.
    pub(super) fn hand_lead_over(&mut self) -> Option<flight::OwnedLead> {
        let flights = self.idem.flights()?;
        self.lead.take().map(|lead| lead.into_owned(flights))
    }

    /// Sends `transition` (with `writes`, in one transaction, when there are any) until it lands, is
    /// rejected or canceled for good, or transient faults outlast `persist`. Every attempt is the same
    /// request, so a store that recognises repeated requests (DynamoDB's `ClientRequestToken`) applies
    /// it once.
    async fn store(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
        persist: &mut Persist,
    ) -> Stored {
        let namespace = self.namespace();
        loop {
            let last = match self.write_once(transition, writes).await {
                Ok(Written::Applied) => return Stored::Applied,
                Ok(Written::Rejected(record)) => return Stored::Rejected(record.map(Box::new)),
                Ok(Written::Canceled(reasons))
                    if crate::error::transient_cancellation(&reasons) =>
                {
                    Error::TransactionCanceled {
                        namespace: namespace.to_owned(),
                        reasons,
                    }
                }
                Ok(Written::Canceled(reasons)) => return Stored::Canceled(reasons),
                Err(StoreError::Invalid(source)) if !writes.is_empty() => {
                    return Stored::Refused(source);
                }
                Err(e @ StoreError::Unsupported { .. }) if !writes.is_empty() => {
                    return Stored::Unsupported(store_error(namespace, e));
                }
                Err(
                    e @ (StoreError::Throttled(_)
                    | StoreError::Unavailable(_)
                    | StoreError::RegionUnavailable { .. }),
                ) => store_error(namespace, e),
                Err(e) => return Stored::Failed(store_error(namespace, e)),
            };
            tracing::debug!(namespace, error = %last, "transient fault while storing the outcome; retrying");
            if !persist.again().await {
                return Stored::GaveUp(last);
            }
        }
    }

    async fn write_once(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<Written, StoreError> {
        if !writes.is_empty() {
            let request = self.idem.store().transact_transition(transition, writes);
            return Ok(
                match telemetry::observe(transition.change.op(true), request).await? {
                    TransactOutcome::Committed => Written::Applied,
                    TransactOutcome::Rejected(record) => Written::Rejected(record),
                    TransactOutcome::Canceled(reasons) => Written::Canceled(reasons),
                },
            );
        }
        let request = self.idem.store().transition(transition);
        Ok(
            match telemetry::observe(transition.change.op(false), request).await? {
                WriteOutcome::Applied => Written::Applied,
                WriteOutcome::Rejected(record) => Written::Rejected(record),
            },
        )
    }

    /// A body's `Ok` value as [`complete`](Self::complete) stores it, from its JSON (made for each
    /// value type by the call's shim), and the panic of its `Serialize` impl, if it
    /// panicked.
    ///
    /// A value that does not serialize is still a success, and final: the record is COMPLETED with the
    /// reason instead of the value, duplicates get `ResponseNotSerialized`, and the body never runs
    /// again. Only this caller hears the serialization error. A panic in the value's `Serialize` impl
    /// is caught the same way: the body has run, so the record is COMPLETED with `panicked: <message>`
    /// in place of the value, and the panic is handed back for the caller to resume.
    #[inline(never)]
    pub(super) fn encoded(
        &self,
        json: std::thread::Result<Result<Vec<u8>, serde_json::Error>>,
    ) -> (Encoded, Option<Panic>) {
        match json {
            Ok(Ok(json)) => {
                let (bytes, fits) = self.pack(json);
                (
                    Encoded {
                        bytes,
                        fits,
                        unserializable: None,
                    },
                    None,
                )
            }
            Ok(Err(source)) => (
                Encoded {
                    bytes: codec::not_serialized(&source.to_string()),
                    fits: true,
                    unserializable: Some(source),
                },
                None,
            ),
            Err(panic) => {
                let detail = panicked(&*panic);
                (
                    Encoded {
                        bytes: codec::not_serialized(&detail),
                        fits: true,
                        unserializable: None,
                    },
                    Some(panic),
                )
            }
        }
    }

    /// Stores `encoded` as the response: PENDING → COMPLETED (with the staged writes, in one
    /// transaction), retried while the lease allows.
    pub(super) async fn complete(
        &self,
        encoded: Encoded,
        persist: &mut Persist,
    ) -> Result<(), Error> {
        let Plan {
            call,
            key,
            fingerprint,
            staging,
            ..
        } = *self.plan;
        let namespace = call.namespace;
        let Encoded {
            bytes,
            fits,
            unserializable,
        } = encoded;
        let response = fits.then_some(&bytes[..]);
        let now_ms = self.idem.clock().now_ms();
        // Taken before the write, so the cached window never outlasts the stored one.
        let replay_until_s = expiry_s(now_ms, self.ttl);
        let retain = self.idem.retain();
        // Built once: every retry sends the same request.
        let transition = Transition {
            key,
            token: self.token,
            change: Change::Complete {
                response,
                expires_at_s: expiry_s(now_ms, self.ttl.saturating_add(retain.unwrap_or_default())),
                replay_until_s: retain.map(|_| replay_until_s),
            },
        };
        let writes = staging.map(Staged::take).unwrap_or_default();
        if !writes.is_empty()
            && let Err(detail) = writes.check_limits(key, response.map_or(0, <[u8]>::len))
        {
            self.fail_boxed(&detail, persist).await;
            return Err(Error::TooManyWrites {
                namespace: namespace.to_owned(),
                detail,
            });
        }
        match self.store(&transition, &writes, persist).await {
            Stored::Applied => {}
            Stored::Rejected(record) => self.settle(record.as_deref())?,
            Stored::Canceled(reasons) => {
                let error = Error::TransactionCanceled {
                    namespace: namespace.to_owned(),
                    reasons,
                };
                self.fail_boxed(&format!("transaction canceled: {error}"), persist)
                    .await;
                return Err(error);
            }
            Stored::Refused(source) => {
                let error = Error::WriteRejected {
                    namespace: namespace.to_owned(),
                    source,
                };
                self.fail_boxed(&error.to_string(), persist).await;
                return Err(error);
            }
            Stored::GaveUp(last) => {
                tracing::warn!(namespace, error = %last, "could not store the result while the lease allowed; the key is claimable after its lease");
                return Err(Error::ResultNotStored {
                    namespace: namespace.to_owned(),
                    source: Box::new(last),
                });
            }
            // Without its writes the result must not be stored: the failure is recorded instead (with no
            // writes), so that the key is free at once rather than blocked until the lease runs out.
            Stored::Unsupported(error) => {
                self.fail_boxed(&error.to_string(), persist).await;
                return Err(error);
            }
            Stored::Failed(error) => {
                // As at claim time: an operator must act (credentials that expired during the body).
                if error.is_setup() {
                    setup_error(&error);
                }
                return Err(error);
            }
        }
        // Stored: what the record holds (the response, the reason it is not serialized, or nothing
        // when too large) is what the calls following this one get.
        if let Some(lead) = &self.lead {
            lead.land(|| flight::Landed {
                response: fits.then(|| std::sync::Arc::from(&bytes[..])),
                fingerprint: fingerprint.map(std::sync::Arc::from),
            });
        }
        if let Some(source) = unserializable {
            return Err(unserializable_response(namespace, source));
        }
        if fits {
            remember(self.idem, key, bytes, fingerprint, replay_until_s);
        }
        Ok(())
    }

    /// [`Held::fail`] on a completion's error paths, boxed: awaited in place, its future would be part of
    /// every completion's, which the response already makes large (see `future_size`).
    async fn fail_boxed(&self, error: &str, persist: &mut Persist) {
        Box::pin(self.fail_as(error, persist, true)).await;
    }

    /// The response as stored (JSON, compressed when large), and whether it fits in the record.
    fn pack(&self, json: Vec<u8>) -> (Vec<u8>, bool) {
        let json_len = json.len();
        let bytes = codec::pack(json);
        let budget = self
            .idem
            .store()
            .response_budget(self.plan.key, self.plan.fingerprint);
        // Over `max_response_bytes`, it would not be replayed: not stored, as if over the item limit.
        let fits = bytes.len() <= budget && json_len <= self.idem.max_response_bytes();
        if !fits {
            tracing::warn!(
                namespace = self.namespace(),
                bytes = bytes.len(),
                "response too large to store (over the item limit even compressed, or over `max_response_bytes`); duplicates will get ResponseTooLarge"
            );
        }
        (bytes, fits)
    }

    /// Whether a completion that was rejected had landed after all: our own earlier attempt, whose
    /// response was lost.
    fn settle(&self, record: Option<&Record>) -> Result<(), Error> {
        if decide::after_rejected_complete(record, self.token)
            == decide::AfterRejectedComplete::Stored
        {
            return Ok(());
        }
        tracing::warn!(
            namespace = self.namespace(),
            "claim lost before completion; result not stored"
        );
        Err(Error::LeaseLost {
            namespace: self.namespace().to_owned(),
        })
    }

    /// Moves our claim to FAILED (with the compensating writes, which release the claim-time writes),
    /// retried while the lease allows. The caller gets the body's own error whatever happens here; a
    /// FAILED write that never lands only means the key stays PENDING until its lease runs out.
    pub(super) async fn fail(&self, error: &str, persist: &mut Persist) {
        self.fail_as(error, persist, false).await;
    }

    /// [`fail`](Self::fail); `completing`: the body returned `Ok`, and its completion failed (a
    /// canceled transaction, refused or unsupported writes), which under the restart policy is no
    /// failure of the body's ([`Steps::lapses_after_failure`]).
    async fn fail_as(&self, error: &str, persist: &mut Persist, completing: bool) {
        let namespace = self.namespace();
        let error = truncate(error, MAX_ERROR_BYTES);
        let now_ms = self.idem.clock().now_ms();
        let compensate = !self.plan.claim_writes.is_empty() && !self.plan.compensation.is_empty();
        // Under the restart policy, a failure that is not the body's own (a step's error of the
        // library's, a step write in doubt, a completion that failed after the body's `Ok`) must not
        // start the operation over: its claim lapses instead (a fenced write of a lease already over,
        // the record staying PENDING with its steps), and the next call resumes, as after a crash.
        let lapse = self.plan.steps.is_some_and(|steps| {
            steps.lapses_after_failure(completing) && !super::steps::is_panic(&error)
        });
        if lapse {
            tracing::warn!(
                namespace,
                %error,
                "the failure is not the body's own (a step's error, or its completion's); its claim lapses for the next call to resume"
            );
        }
        let mut writes = if compensate && !lapse {
            self.plan.compensation.clone()
        } else {
            Writes::new()
        };
        loop {
            // A failure that leaves claim-time writes in effect keeps the record (and with it the mark)
            // for the operation's ttl and retain, not the short `failed_ttl`: once it expired, a retry
            // would be a new operation and apply the writes again.
            // Likewise the steps of a body that resumes after a failure: once the record expired, a
            // retry would run them all again.
            let keeps_writes = failure_keeps_record(
                !self.plan.claim_writes.is_empty() && writes.is_empty(),
                self.plan.steps,
                super::steps::is_panic(&error),
            );
            let lifetime = failed_lifetime(
                self.idem.failed_ttl(),
                keeps_writes.then(|| writes_lifetime(self.idem, self.plan, self.ttl)),
            );
            let change = if lapse {
                Change::ExtendLease {
                    lease_until_ms: 0,
                    expires_at_s: expiry_s(now_ms, writes_lifetime(self.idem, self.plan, self.ttl)),
                }
            } else {
                Change::Fail {
                    error: &error,
                    expires_at_s: expiry_s(now_ms, lifetime),
                    release_claim_writes: !writes.is_empty(),
                }
            };
            let transition = Transition {
                key: self.plan.key,
                token: self.token,
                change,
            };
            let problem = match self.store(&transition, &writes, persist).await {
                Stored::Applied => return,
                Stored::Rejected(record) => {
                    match decide::after_rejected_fail(
                        record.as_deref(),
                        self.token,
                        !writes.is_empty(),
                    ) {
                        // Our own earlier attempt landed; its response was lost.
                        decide::AfterRejectedFail::Recorded => return,
                        // Still ours, but the claim-time writes are not in effect (the compensation
                        // is conditioned on them): there is nothing to undo, and undoing it would
                        // undo another caller's writes.
                        decide::AfterRejectedFail::WithoutCompensation => {
                            tracing::warn!(
                                namespace,
                                "claim-time writes not in effect; failure recorded without compensation"
                            );
                            writes = Writes::new();
                            continue;
                        }
                        decide::AfterRejectedFail::Lost => {
                            tracing::warn!(namespace, "claim lost before the failure was recorded");
                            return;
                        }
                    }
                }
                Stored::Canceled(reasons) => Error::TransactionCanceled {
                    namespace: namespace.to_owned(),
                    reasons,
                },
                Stored::Refused(source) => Error::WriteRejected {
                    namespace: namespace.to_owned(),
                    source,
                },
                Stored::Unsupported(e) => e,
                Stored::GaveUp(e) | Stored::Failed(e) => {
                    tracing::warn!(namespace, error = %e, "could not record the failure; the key is claimable after its lease");
                    return;
                }
            };
            // The compensating writes cannot commit: record the failure without them, so the key is
            // free at once and its claim-time writes stay in effect (a retry does not apply them again).
            tracing::warn!(namespace, error = %problem, "compensating writes refused; the claim-time writes stay in effect");
            writes = Writes::new();
        }
    }
}

/// Stores an operation's finished steps (`steps`, encoded) in its record in place of `previous` (the
/// steps it holds, as the claim or the call's last step write left them), fenced by the call's claim
/// (`token`): retried through transient faults while a lease allows (heartbeats extend it meanwhile).
/// A rejection that finds `steps` there under the token is this write's own earlier copy, which
/// landed; any other means the claim is no longer ours: [`Error::LeaseLost`], and the body stops at
/// its step.
pub(crate) async fn save_steps(
    idem: &Idempotency,
    namespace: &'static str,
    key: &str,
    token: &str,
    previous: &[u8],
    steps: &[u8],
    lease: Duration,
) -> Result<(), Error> {
    let transition = Transition {
        key,
        token,
        change: Change::SaveSteps { steps, previous },
    };
    let mut persist = Persist::new(lease);
    loop {
        // The same request every time: a retry after a lost response is refused (the steps it
        // extends are gone), and the record it gets back shows that it landed.
        let last = match telemetry::observe("step", idem.store().transition(&transition)).await {
            Ok(WriteOutcome::Applied) => return Ok(()),
            Ok(WriteOutcome::Rejected(record))
                if decide::after_rejected_steps(record.as_ref(), token, steps)
                    == decide::AfterRejectedSteps::Stored =>
            {
                return Ok(());
            }
            Ok(WriteOutcome::Rejected(_)) => {
                tracing::warn!(
                    namespace,
                    "claim lost while the body ran; the step's value was not stored and the body stops"
                );
                return Err(Error::LeaseLost {
                    namespace: namespace.to_owned(),
                });
            }
            Err(
                e @ (StoreError::Throttled(_)
                | StoreError::Unavailable(_)
                | StoreError::RegionUnavailable { .. }),
            ) => store_error(namespace, e),
            Err(e) => return Err(store_error(namespace, e)),
        };
        tracing::debug!(namespace, error = %last, "transient fault while storing a step; retrying");
        if !persist.again().await {
            return Err(Error::ResultNotStored {
                namespace: namespace.to_owned(),
                source: Box::new(last),
            });
        }
    }
}

/// `text`, cut on a character boundary to at most `max` bytes, saying how long it was.
pub(super) fn truncate(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let suffix = format!("… ({} bytes in all)", text.len());
    let cut = text.floor_char_boundary(max.saturating_sub(suffix.len()));
    format!("{}{suffix}", &text[..cut]).into()
}

#[cfg(test)]
mod serialize_panic {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::{Error, Idempotency, ManualClock, MemoryStore};

    /// A value whose `Serialize` impl panics.
    #[derive(Debug, serde::Deserialize)]
    pub(super) struct Bomb;

    impl serde::Serialize for Bomb {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            panic!("bomb went off while serializing");
        }
    }

    /// A body that returned `Ok` has run: a panic in its value's `Serialize` impl must not leave the
    /// key PENDING, to be run again once the lease lapses. The record is COMPLETED (duplicates get
    /// `ResponseNotSerialized`), and the panic reaches the caller unchanged.
    #[tokio::test]
    async fn a_panic_while_serializing_the_value_is_still_final() {
        let clock = ManualClock::new(1_000_000);
        let store = Arc::new(MemoryStore::new());
        let idem = Idempotency::builder_arc(store.clone())
            .clock(clock.clone())
            .build();
        let runs = Arc::new(AtomicUsize::new(0));
        let call = |idem: Idempotency, runs: Arc<AtomicUsize>| async move {
            idem.operation("tests::bomb", "k")
                .lease(std::time::Duration::from_secs(10))
                .run(|_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(Bomb)
                })
                .await
        };
        let first = tokio::spawn(call(idem.clone(), runs.clone())).await;
        let panic = first.expect_err("the caller panics").into_panic();
        assert_eq!(
            panic.downcast_ref::<&str>(),
            Some(&"bomb went off while serializing")
        );
        // Long past the lease.
        clock.advance(std::time::Duration::from_mins(1));
        let second = call(idem.clone(), runs.clone()).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran twice");
        assert!(
            matches!(second, Err(Error::ResponseNotSerialized { .. })),
            "{second:?}"
        );
    }

    /// Under the restart policy a panic resumes (a bug, not a failure after which the body undid its
    /// steps): its FAILED record must live as long as that of an operation that resumes, not the short
    /// `failed_ttl`, or a retry after `failed_ttl` finds a new operation and runs the finished steps
    /// again.
    #[tokio::test]
    async fn a_panic_under_the_restart_policy_resumes_after_the_failed_ttl() {
        let clock = ManualClock::new(1_000_000);
        let idem = Idempotency::builder_arc(Arc::new(MemoryStore::new()))
            .clock(clock.clone())
            .failed_ttl(std::time::Duration::from_secs(10))
            .build();
        let runs = Arc::new(AtomicUsize::new(0));
        let call = |idem: Idempotency, runs: Arc<AtomicUsize>, panics: bool| async move {
            idem.operation("tests::restart_panic", "k")
                .lease(std::time::Duration::from_secs(10))
                .restart_steps_after_failure()
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    steps
                        .run("reserve", || async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Error>(17_u32)
                        })
                        .await?;
                    assert!(!panics, "a bug after the reserve");
                    Ok::<_, Error>(18_u32)
                })
                .await
        };
        let first = tokio::spawn(call(idem.clone(), runs.clone(), true)).await;
        assert!(first.is_err(), "the first call panics");
        // Past `failed_ttl`, well within the ttl.
        clock.advance(std::time::Duration::from_mins(1));
        assert_eq!(call(idem.clone(), runs.clone(), false).await.unwrap(), 18);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the panic's record expired with `failed_ttl`: the operation started over"
        );
    }

    /// An error whose `Display` panics.
    #[derive(Debug)]
    pub(super) struct Grumpy;

    impl std::fmt::Display for Grumpy {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            panic!("display of the error panicked");
        }
    }

    impl From<Error> for Grumpy {
        fn from(_: Error) -> Self {
            Self
        }
    }

    /// A panic while describing the body's error (its `Display`) is a failure like a panicking body:
    /// FAILED with `panicked: <message>`, so the key is free at once rather than blocked for the lease,
    /// and the panic reaches the caller.
    #[tokio::test]
    async fn a_panic_while_describing_the_error_fails_the_record() {
        let idem = Idempotency::in_memory();
        let runs = Arc::new(AtomicUsize::new(0));
        let call = |idem: Idempotency, runs: Arc<AtomicUsize>| async move {
            idem.operation("tests::grumpy", "k")
                .run(|_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<u32, _>(Grumpy)
                })
                .await
        };
        let first = tokio::spawn(call(idem.clone(), runs.clone())).await;
        let panic = first.expect_err("the caller panics").into_panic();
        assert_eq!(
            panic.downcast_ref::<&str>(),
            Some(&"display of the error panicked")
        );
        // The key is free at once: the next call runs the body (and panics the same way).
        let second = tokio::spawn(call(idem.clone(), runs.clone())).await;
        assert!(second.is_err(), "the second call panics too");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the key was left blocked");
    }
}

/// How [`Held::fail`] settles a FAILED write the store rejected (with the memory store's emulated
/// business tables).
#[cfg(all(test, feature = "emulator"))]
mod failure {
    use std::fmt;
    use std::sync::Arc;
    use std::time::Duration;

    use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};

    use crate::record::Status;
    use crate::{Error, Idempotency, ManualClock, MemoryStore};

    /// A body's own error, or the library's.
    #[derive(Debug)]
    enum Failure {
        Declined,
        Idempotency(Error),
    }

    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Self::Declined => f.write_str("declined"),
                Self::Idempotency(e) => e.fmt(f),
            }
        }
    }

    impl From<Error> for Failure {
        fn from(e: Error) -> Self {
            Self::Idempotency(e)
        }
    }

    /// A zombie (its lease lapsed, another call took the key over and completed it) whose body fails:
    /// its FAILED write is rejected by the new holder's record, which it leaves alone, and it returns its
    /// body's error at once rather than trying again. Run on a thread of its own, so that a call that
    /// never returns (a retry loop that never yields) fails the test instead of hanging it; the call
    /// takes milliseconds, the test waits 10 s.
    #[test]
    fn a_zombies_failure_leaves_the_new_holders_record_alone() {
        let (done, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let clock = ManualClock::new(1_000_000);
            let store = Arc::new(MemoryStore::new());
            let idem = Idempotency::builder_arc(store.clone())
                .clock(clock.clone())
                .heartbeat(false)
                .build();
            // The taker is another process: through the zombie's handle, its call would follow the
            // zombie's (coalescing) and never reach the store.
            let other = Idempotency::builder_arc(store.clone())
                .clock(clock.clone())
                .heartbeat(false)
                .build();
            let op = || {
                idem.operation("tests::zombie", "k")
                    .lease(Duration::from_secs(10))
            };
            let zombie = runtime.block_on(op().run(|_| async {
                clock.advance(Duration::from_mins(1));
                let taken_over = other
                    .operation("tests::zombie", "k")
                    .lease(Duration::from_secs(10))
                    .run(|_| async { Ok::<u32, Failure>(2) })
                    .await;
                assert!(matches!(taken_over, Ok(2)), "{taken_over:?}");
                Err::<u32, _>(Failure::Declined)
            }));
            let replay = runtime.block_on(op().run(|_| async { Ok::<u32, Failure>(3) }));
            done.send((zombie, replay, store.records()))
                .expect("the test waits");
        });
        let (zombie, replay, records) = outcome
            .recv_timeout(Duration::from_secs(10))
            .expect("the zombie's call never returned");
        assert!(matches!(zombie, Err(Failure::Declined)), "{zombie:?}");
        assert!(matches!(replay, Ok(2)), "{replay:?}");
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].status, Status::Completed);
    }

    /// `available = available <op> 1` on the one apple of `inventory`.
    fn adjust(op: &str) -> TransactWriteItem {
        let update = Update::builder()
            .table_name("inventory")
            .key("sku", AttributeValue::S("apple".into()))
            .update_expression(format!("SET available = available {op} :one"))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .expect("an update");
        TransactWriteItem::builder().update(update).build()
    }

    /// A failure whose compensation is refused because its claim-time writes are no longer in effect
    /// (the compensation is conditioned on the mark) has nothing to undo: it is recorded without the
    /// compensation, so the key is free at once, and the writes are not undone a second time.
    #[tokio::test]
    async fn a_failure_whose_claim_writes_are_gone_is_recorded_without_its_compensation() {
        let store = Arc::new(MemoryStore::new());
        store
            .create_table("inventory", "sku", None)
            .expect("a table");
        store
            .put_item(
                "inventory",
                [
                    ("sku".to_owned(), AttributeValue::S("apple".into())),
                    ("available".to_owned(), AttributeValue::N("10".into())),
                ]
                .into(),
            )
            .expect("an apple");
        let available = || {
            store
                .get_item(
                    "inventory",
                    &[("sku".to_owned(), AttributeValue::S("apple".into()))].into(),
                )
                .expect("the apple")["available"]
                .clone()
        };
        let idem = Idempotency::builder_arc(store.clone()).build();
        let result = idem
            .operation("tests::reserve", "order-1")
            .claim_with([adjust("-")])
            .compensate_with([adjust("+")])
            .run(|_| async {
                assert_eq!(available(), AttributeValue::N("9".into()));
                // The mark goes away under the running call (as if undone elsewhere).
                let mut record = store.records().pop().expect("our claim");
                record.claim_writes_in_effect = false;
                store.insert(record);
                Err::<u32, _>(Failure::Declined)
            })
            .await;
        assert!(matches!(result, Err(Failure::Declined)), "{result:?}");
        let record = store.records().pop().expect("the record");
        assert_eq!(record.status, Status::Failed, "the key is left blocked");
        assert_eq!(available(), AttributeValue::N("9".into()), "undone again");
    }
}
