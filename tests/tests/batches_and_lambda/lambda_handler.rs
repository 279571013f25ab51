//! The Lambda handler (`idempotent_examples::lambda`), invoked directly as the Lambda runtime would, on
//! DynamoDB Local: retries replay, and the claim of an invocation killed at its deadline is free right
//! after that deadline.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_examples::lambda::{ChargeRequest, Gateway, handle};
use idempotent_runtime::{Error, Status};
use idempotent_tests::{Backend, Harness};
use lambda_runtime::{Context, LambdaEvent};

/// The skew margin the harness runs with: small, so the claim frees up soon after the deadline.
const MARGIN: Duration = Duration::from_millis(50);

async fn harness() -> Harness {
    // A real clock: the deadline is wall-clock time, as in Lambda.
    Harness::with(Backend::DynamoDb, |b| {
        b.heartbeat(false)
            .clock_skew_margin(MARGIN)
            .clock(idempotent_runtime::SystemClock)
    })
    .await
}

fn event(order: &str, amount_cents: u64, deadline: SystemTime) -> LambdaEvent<ChargeRequest> {
    let mut context = Context::default();
    context.deadline =
        u64::try_from(deadline.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
    let request = ChargeRequest {
        order_id: order.to_owned(),
        amount_cents,
    };
    LambdaEvent::new(request, context)
}

#[tokio::test]
async fn a_retried_invocation_replays_the_charge() {
    let h = harness().await;
    let gateway = Gateway::new(Duration::ZERO);
    let deadline = SystemTime::now() + Duration::from_secs(30);
    let first = handle(&h.idem, &gateway, event("order-1", 4200, deadline))
        .await
        .unwrap();
    let retry = handle(&h.idem, &gateway, event("order-1", 4200, deadline))
        .await
        .unwrap();
    assert_eq!(retry, first);
    assert_eq!(gateway.charges(), 1);
    let other = handle(&h.idem, &gateway, event("order-1", 9900, deadline)).await;
    assert!(matches!(other, Err(Error::PayloadMismatch { .. })));
}

#[tokio::test]
async fn the_claim_of_an_invocation_killed_at_its_deadline_is_free_right_after_it() {
    let h = harness().await;
    // The gateway hangs for longer than the invocation may run.
    let stuck = Gateway::new(Duration::from_secs(30));
    // At least the shortest lease away: with less left, the invocation would not claim at all.
    let deadline = SystemTime::now() + Duration::from_millis(1_500);
    let invocation = handle(&h.idem, &stuck, event("order-2", 100, deadline));
    let timeout = deadline.duration_since(SystemTime::now()).unwrap();
    // Lambda ends the invocation at its deadline: its future is dropped mid-charge.
    let killed = tokio::time::timeout(timeout, invocation).await;
    assert!(killed.is_err(), "the invocation ran into its deadline");
    assert_eq!(stuck.charges(), 0);

    let record = h.record("lambda::charge", "order-2").await.unwrap();
    assert_eq!(record.status, Status::Pending);
    let lease_until = record.lease_until_ms.unwrap();
    let deadline_ms =
        u64::try_from(deadline.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
    assert!(
        lease_until <= deadline_ms,
        "the lease ends by the deadline ({lease_until} > {deadline_ms})"
    );

    // A retry just after the deadline (and the skew margin) takes the key over and charges once.
    tokio::time::sleep(MARGIN + Duration::from_millis(50)).await;
    let gateway = Gateway::new(Duration::ZERO);
    let later = SystemTime::now() + Duration::from_secs(30);
    let receipt = handle(&h.idem, &gateway, event("order-2", 100, later))
        .await
        .unwrap();
    assert_eq!(receipt.amount_cents, 100);
    assert_eq!(gateway.charges(), 1);
    let record = h.record("lambda::charge", "order-2").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.attempt, 2, "taken over, not claimed anew");
}

/// An invocation with less than the shortest lease left before its deadline does not claim the key
/// and does not charge: the next invocation, with time, does.
#[tokio::test]
async fn an_invocation_too_close_to_its_deadline_does_not_charge() {
    let h = harness().await;
    let gateway = Gateway::new(Duration::ZERO);
    let close = SystemTime::now() + Duration::from_millis(400);
    let refused = handle(&h.idem, &gateway, event("order-4", 100, close)).await;
    assert!(
        matches!(refused, Err(Error::DeadlinePassed { .. })),
        "{refused:?}"
    );
    assert_eq!(gateway.charges(), 0);
    assert!(
        h.record("lambda::charge", "order-4").await.is_none(),
        "no claim"
    );
    let later = SystemTime::now() + Duration::from_secs(30);
    handle(&h.idem, &gateway, event("order-4", 100, later))
        .await
        .unwrap();
    assert_eq!(gateway.charges(), 1);
}

#[tokio::test]
async fn before_the_deadline_a_retry_finds_the_invocation_in_progress() {
    let h = harness().await;
    let stuck = Gateway::new(Duration::from_secs(30));
    let deadline = SystemTime::now() + Duration::from_secs(5);
    let invocation = handle(&h.idem, &stuck, event("order-3", 100, deadline));
    let retry = async {
        while h.record("lambda::charge", "order-3").await.is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handle(
            &h.idem,
            &Gateway::new(Duration::ZERO),
            event("order-3", 100, deadline),
        )
        .await
    };
    tokio::select! {
        _ = invocation => panic!("the stuck invocation finished"),
        retry = retry => assert!(matches!(retry, Err(Error::InProgress { .. })), "{retry:?}"),
    }
}
