//! Every claim attempt gets its own `ClientRequestToken`. A claim that loops (waiting for a held
//! key, with `claim_with`) used to send the same token with a new time, lease and expiry, which
//! DynamoDB refuses for ten minutes (`IdempotentParameterMismatch`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::Status;
use idempotent_tests::proxy::{Fault, Rule};
use idempotent_tests::{Backend, Harness};

use super::shop::Shop;
use super::{AppError, Gate};
use idempotent_tests::on_both_stores;

const NAMESPACE: &str = "correctness::tokens";

async fn a_waiting_claim_with_writes_claims_after_the_holder_fails(backend: Backend) {
    let h = Harness::new(backend).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let gate = Arc::new(Gate::default());
    let holder = tokio::spawn({
        let (idem, gate) = (h.idem.clone(), gate.clone());
        async move {
            idem.operation(NAMESPACE, "order-1")
                .run(|_| async {
                    gate.enter().await?;
                    Err::<u64, _>(AppError::Declined)
                })
                .await
        }
    });
    gate.started().await;

    let runs = Arc::new(AtomicUsize::new(0));
    let waiter = tokio::spawn({
        let (idem, shop, runs) = (h.idem.clone(), shop.clone(), runs.clone());
        async move {
            idem.operation(NAMESPACE, "order-1")
                .wait(Duration::from_secs(20))
                .claim_with([shop.take(3)])
                .run(|_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, AppError>(3)
                })
                .await
        }
    });
    // Let the waiter's first claim be refused and its polling start.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the key is held");
    gate.release();
    assert!(matches!(holder.await.unwrap(), Err(AppError::Declined)));

    let result = waiter.await.unwrap();
    assert_eq!(
        result.map_err(AppError::idempotency).unwrap(),
        3,
        "the second claim attempt must not reuse the first one's request token"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(shop.available().await, 7);
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));
}

on_both_stores!(a_waiting_claim_with_writes_claims_after_the_holder_fails);

/// On the wire: the waiting claim's first attempt is refused (its response lost once, so the SDK
/// retries it), and its second attempt, after the holder failed, commits. The SDK's retry must keep its
/// attempt's token; the second attempt, which carries a new time, lease and expiry, must not reuse it.
#[tokio::test]
async fn each_claim_attempt_has_its_own_request_token_and_an_sdk_retry_keeps_it() {
    let (h, proxy) = Harness::behind_proxy(|b| b).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let gate = Arc::new(Gate::default());
    let holder = tokio::spawn({
        let (idem, gate) = (h.idem.clone(), gate.clone());
        async move {
            idem.operation(NAMESPACE, "order-2")
                .run(|_| async {
                    gate.enter().await?;
                    Err::<u64, _>(AppError::Declined)
                })
                .await
        }
    });
    gate.started().await;
    proxy.set_rules([Rule::new(Fault::DropResponse)
        .operation("TransactWriteItems")
        .nth(1)]);
    let reads_before = proxy.stats().operation("GetItem").requests;
    // From another process, so that its claims go to the store (one in the holder's process would
    // follow the holder's call and send nothing until it failed).
    let waiter = tokio::spawn({
        let (idem, shop) = (h.another_process(|b| b), shop.clone());
        async move {
            idem.operation(NAMESPACE, "order-2")
                .wait(Duration::from_secs(20))
                .claim_with([shop.take(3)])
                .run(|_| async { Ok::<_, AppError>(3) })
                .await
        }
    });
    // Release the holder only once the waiter's first attempt was refused (after its SDK retry), however
    // slow the machine: once the waiter polls the record, which it does only after the refusal came
    // back. (Both attempts reaching the proxy is not enough: released then, the holder's failure can
    // land before DynamoDB evaluates the retry, which then commits as attempt 1.)
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while (proxy.request_tokens().len() < 2
        || proxy.stats().operation("GetItem").requests == reads_before)
        && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gate.release();
    assert!(matches!(holder.await.unwrap(), Err(AppError::Declined)));
    assert_eq!(waiter.await.unwrap().unwrap(), 3);

    let tokens = proxy.request_tokens();
    assert_eq!(
        tokens.len(),
        3,
        "attempt 1, its SDK retry, attempt 2: {tokens:?}"
    );
    assert_eq!(
        tokens[0], tokens[1],
        "an SDK retry keeps its attempt's token"
    );
    assert_ne!(
        tokens[1], tokens[2],
        "a new claim attempt (new time, lease and expiry) needs a new token"
    );
    assert_eq!(shop.available().await, 7);
}
