//! The lease heartbeat beside a running body: every third of the lease, counted from when the previous
//! request that set the lease was sent ([`decide::next_heartbeat_ms`]).

#[allow(
    clippy::wildcard_imports,
    reason = "the state machine's parts share its vocabulary"
)]
use super::*;

/// What the heartbeat needs: the claim on `key` held by `token`, whose lease (until `lease_until_ms`,
/// asked for by a request sent one `lease` before) it extends.
#[derive(Clone, Copy)]
pub(super) struct Heartbeat<'a> {
    pub(super) idem: &'a Idempotency,
    pub(super) key: &'a str,
    pub(super) token: &'a str,
    pub(super) lease: Duration,
    pub(super) ttl: Duration,
    pub(super) lease_until_ms: u64,
}

impl<'a> Heartbeat<'a> {
    /// The heartbeat of `plan`'s claim under `token`, granted until `lease_until_ms`.
    pub(super) fn of(
        idem: &'a Idempotency,
        plan: &Plan<'a>,
        token: &'a str,
        lease: Duration,
        ttl: Duration,
        lease_until_ms: u64,
    ) -> Self {
        Self {
            idem,
            key: plan.key,
            token,
            lease,
            ttl: writes_lifetime(idem, plan, ttl),
            lease_until_ms,
        }
    }

    /// The heartbeat's requests, started; boxed, so that the box a call that runs its body takes
    /// does not carry its timer and request.
    #[inline(never)]
    fn start(self) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(heartbeats(self))
    }
}

/// The heartbeat beside a body that holds its claim and the storing of its end (`run.rs`: `ended`), while
/// they are pending: started when first needed (so that a body that ends at its first poll never
/// allocates it), then polled.
pub(super) fn beat<'a>(
    beat: &mut Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
    heartbeat: Heartbeat<'a>,
    cx: &mut std::task::Context<'_>,
) {
    if !heartbeat.idem.heartbeat() {
        return;
    }
    let beat = beat.get_or_insert_with(|| heartbeat.start());
    // The heartbeat never finishes; polled here to arm its timer and send its requests.
    let _ = beat.as_mut().poll(cx);
}

/// Extends the lease every third of it, counted from when the previous request that set it was sent
/// (the claim, then each heartbeat), so that a slow answer never delays the next renewal; until the
/// claim is found lost or completed. Never returns. A lease too short to renew is not renewed
/// ([`decide::heartbeat_interval`]).
pub(super) async fn heartbeats(heartbeat: Heartbeat<'_>) {
    let Heartbeat {
        idem,
        key,
        token,
        lease,
        ttl,
        mut lease_until_ms,
    } = heartbeat;
    let Some(every) = decide::heartbeat_interval(lease) else {
        return std::future::pending().await;
    };
    let clock = idem.clock();
    let mut sent_ms = lease_until_ms.saturating_sub(millis(lease));
    loop {
        let due_ms = decide::next_heartbeat_ms(sent_ms, every);
        let wait = due_ms.saturating_sub(clock.now_ms());
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        sent_ms = clock.now_ms();
        let asked_ms = decide::heartbeat_lease_ms(sent_ms, lease);
        let transition = Transition {
            key,
            token,
            change: Change::ExtendLease {
                lease_until_ms: asked_ms,
                expires_at_s: expiry_s(sent_ms, lease.saturating_add(ttl)),
            },
        };
        let applied =
            match telemetry::observe("heartbeat", idem.store().transition(&transition)).await {
                Ok(WriteOutcome::Applied) => Some(true),
                Ok(WriteOutcome::Rejected(_)) => Some(false),
                Err(e) => {
                    tracing::warn!(error = %e, "lease heartbeat failed; will retry");
                    None
                }
            };
        match decide::after_heartbeat(applied, clock.now_ms(), lease_until_ms) {
            decide::AfterHeartbeat::Extended => lease_until_ms = asked_ms,
            decide::AfterHeartbeat::ExtendedLate => {
                tracing::warn!(
                    lease_ms = millis(lease),
                    "a lease heartbeat was answered after the lease it renewed had run out; the store is nearly too slow for this lease: a longer lease keeps a live worker from being taken over"
                );
                lease_until_ms = asked_ms;
            }
            // Lost, or already completed: the completion reports which. Stop beating.
            decide::AfterHeartbeat::Stop => std::future::pending::<()>().await,
            decide::AfterHeartbeat::Retry => {}
        }
    }
}
