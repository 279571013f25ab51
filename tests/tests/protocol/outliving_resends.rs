//! A completion with business writes refused because its expiry is earlier than the end of the
//! record's released tokens is sent again with the expiry raised, each resend under a request token
//! of its own (`DynamoDbStore::transact_transition`, `outliving`). A resend's token names the expiry
//! it raises to, so that a token always stands for one request: a retry of the whole completion
//! (after a transient cancellation) that raises to the same expiry sends the same token with the
//! same parameters, and one that raises to another expiry sends another token (DynamoDB refuses a
//! token sent again with other parameters, `IdempotentParameterMismatch`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::store::conformance::Delegating;
use idempotent_runtime::{DynamoDbStore, Error, Idempotency, Status, Store};
use idempotent_tests::proxy::{Fault, Rule};
use idempotent_tests::{ClaimAppliedLate, Forward, Harness};

use super::shop::Shop;

const NAMESPACE: &str = "outliving_resends::reserve";
const KEY: &str = "order-1";
const LEASE: Duration = Duration::from_mins(1);
const TTL: Duration = Duration::from_secs(5);

/// Takes 3 units at completion, with the COMPLETED record, once `go` has a permit; counts its runs.
async fn reserve(
    idem: &Idempotency,
    shop: &Arc<Shop>,
    runs: &Arc<AtomicUsize>,
    go: &Arc<tokio::sync::Semaphore>,
) -> Result<u64, Error> {
    let (shop, runs, go) = (shop.clone(), runs.clone(), go.clone());
    idem.operation(NAMESPACE, KEY)
        .lease(LEASE)
        .ttl(TTL)
        .transact()
        .run(|cx| async move {
            let ((), tx) = cx.into_parts();
            runs.fetch_add(1, Ordering::SeqCst);
            go.acquire().await.unwrap().forget();
            tx.push(shop.take(3));
            Ok(3)
        })
        .await
}

/// A duplicate on a slow store (its claim lands 600 ms after it was sent) gives up after 50 ms; its
/// release leaves its token on the holder's record, with the released tokens' end a lease (and the
/// clock-skew margin) later.
async fn give_up(slow: &Idempotency) {
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        slow.operation(NAMESPACE, KEY)
            .lease(LEASE)
            .ttl(TTL)
            .run(|_| async { Ok::<_, Error>(0_u64) }),
    )
    .await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
}

/// The holder's completion (ttl 5 s, lease 1 min) finds one released token on its record: its
/// first transaction (request token 0) is refused by the released tokens' end, and the resend
/// (token 1, expiry raised to that end) is held on the wire while a second duplicate gives up and
/// raises the end. Token 1 is refused in turn, token 2 meets a transient cancellation, and the
/// completion is retried from token 0, and token 1 goes out again with the later expiry (five
/// transactions in all). The holder must still store its result: it ran, and its business writes
/// must apply once; a duplicate must get the 3 back without running again. Should DynamoDB keep a
/// canceled transaction's token and refuse it with other parameters (`IdempotentParameterMismatch`),
/// the completion would be refused, recorded as a failure, and the retry would run the body again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_retried_after_an_outliving_resend_stores_its_result() {
    let (h, proxy) = Harness::behind_proxy(|b| b.heartbeat(false)).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let table = h.dynamodb.as_ref().unwrap().table().to_owned();
    let direct: Arc<dyn Store> = Arc::new(DynamoDbStore::new(idempotent_tests::client().0, table));
    let slow = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(direct.clone()),
        ClaimAppliedLate(Duration::from_millis(600)),
    )))
    .clock(h.clock.clone())
    .build();

    let runs = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(tokio::sync::Semaphore::new(0));
    let holder = tokio::spawn({
        let (idem, shop, runs, go) = (h.idem.clone(), shop.clone(), runs.clone(), go.clone());
        async move { reserve(&idem, &shop, &runs, &go).await }
    });
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    give_up(&slow).await;
    let marked = h.record(NAMESPACE, KEY).await.unwrap();
    assert_eq!(
        (marked.status, marked.released.len()),
        (Status::Pending, 1),
        "the first release's token is on the holder's record: {marked:?}"
    );

    proxy.set_rules([
        Rule::new(Fault::Delay(Duration::from_secs(3)))
            .operation("TransactWriteItems")
            .nth(2),
        Rule::new(Fault::CancelTransaction(&["TransactionConflict", "None"]))
            .operation("TransactWriteItems")
            .nth(3),
    ]);
    go.add_permits(1);
    while proxy
        .stats()
        .by_operation
        .get("TransactWriteItems")
        .map_or(0, |c| c.delayed)
        == 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A second duplicate gives up two seconds later: the released tokens' end moves past the
    // expiry the held resend carries.
    h.clock.advance(Duration::from_secs(2));
    give_up(&slow).await;
    let raised = h.record(NAMESPACE, KEY).await.unwrap();
    assert_eq!(
        (raised.status, raised.released.len()),
        (Status::Pending, 2),
        "the second release's token is on the holder's record: {raised:?}"
    );

    let outcome = holder.await.unwrap();
    let stats = proxy.stats().operation("TransactWriteItems");
    assert_eq!(
        (stats.requests, stats.delayed, stats.canceled),
        (5, 1, 1),
        "the completion, its resend (held), the resend to the later end (canceled), then the \
         completion and the resend to the later end again"
    );
    let tokens = proxy.request_tokens();
    assert_eq!(
        (&tokens[0], &tokens[2]),
        (&tokens[3], &tokens[4]),
        "the same request, the same token: {tokens:?}"
    );
    assert!(
        tokens[1] != tokens[2] && tokens[1] != tokens[0],
        "each expiry its own token: {tokens:?}"
    );
    let record = h.record(NAMESPACE, KEY).await.unwrap();
    assert!(
        matches!(outcome, Ok(3)),
        "the body ran and its completion was only refused by marks and a transient \
         cancellation: its result must be stored: {outcome:?}; record: {record:?}; \
         transactions: {stats:?}"
    );
    assert_eq!(record.status, Status::Completed);
    assert_eq!(shop.available().await, 7, "the writes applied once");

    proxy.clear();
    let again = reserve(&h.idem, &shop, &runs, &go).await;
    assert!(matches!(again, Ok(3)), "a duplicate replays: {again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(shop.available().await, 7);
}
