//! Limits and odd inputs that must not cost a stuck key, a panic or a misleading error: a huge error
//! text, absurd durations, a key that keeps changing hands, a transaction's size estimate, a missing
//! business table.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::Status;
use idempotent_tests::{Backend, Harness};

use super::AppError;
use idempotent_tests::on_both_stores;

const NAMESPACE: &str = "correctness::defects";

/// An error whose text is a megabyte long.
#[derive(Debug)]
struct Verbose;

impl std::fmt::Display for Verbose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Multi-byte characters, so a cut in the middle of one would show.
        f.write_str(&"é".repeat(512 * 1024))
    }
}

impl From<idempotent_runtime::Error> for Verbose {
    fn from(e: idempotent_runtime::Error) -> Self {
        panic!("unexpected {e:?}")
    }
}

async fn a_huge_error_text_is_truncated_and_the_key_released(backend: Backend) {
    let h = Harness::new(backend).await;
    let err = h
        .idem
        .operation(NAMESPACE, "verbose")
        .run(|_| async { Err::<u64, _>(Verbose) })
        .await;
    assert!(err.is_err());
    let record = h.record(NAMESPACE, "verbose").await.unwrap();
    assert_eq!(
        record.status,
        Status::Failed,
        "the FAILED write must fit in an item"
    );
    let text = record.error.unwrap();
    assert!(text.len() <= 4096, "{} bytes stored", text.len());
    assert!(text.starts_with("éé"), "cut on a character boundary");
}

async fn absurd_durations_do_not_panic(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    for _ in 0..2 {
        let value = h
            .idem
            .operation(NAMESPACE, "forever")
            .ttl(Duration::MAX)
            .lease(Duration::MAX)
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(7)
            })
            .await
            .unwrap();
        assert_eq!(value, 7);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

on_both_stores!(
    a_huge_error_text_is_truncated_and_the_key_released,
    absurd_durations_do_not_panic,
);

#[test]
fn absurd_builder_durations_are_refused_when_the_handle_is_built() {
    use idempotent_runtime::{Idempotency, MAX_DURATION};
    let err = Idempotency::builder_in_memory()
        .default_ttl(Duration::MAX)
        .try_build()
        .unwrap_err();
    assert!(err.to_string().contains("`default_ttl`"), "{err}");
    let err = Idempotency::builder_in_memory()
        .default_lease(Duration::ZERO)
        .try_build()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("`default_lease` must be longer than zero"),
        "{err}"
    );
    let err = Idempotency::builder_in_memory()
        .retain(MAX_DURATION + Duration::from_secs(1))
        .try_build()
        .unwrap_err();
    assert!(err.to_string().contains("`retain`"), "{err}");
    assert!(
        Idempotency::builder_in_memory()
            .default_ttl(MAX_DURATION)
            .default_lease(MAX_DURATION)
            .retain(MAX_DURATION)
            .try_build()
            .is_ok()
    );
    let panic = std::panic::catch_unwind(|| {
        Idempotency::builder_in_memory()
            .clock_skew_margin(Duration::MAX)
            .build()
    })
    .unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(message.contains("`clock_skew_margin`"), "{message}");
}

/// A key that keeps changing hands is reported as such, not as an unreadable record.
#[tokio::test]
async fn a_key_that_keeps_changing_hands_is_contended() {
    use idempotent_runtime::Error;
    use idempotent_tests::RequestCounter;
    use std::sync::Arc;

    use super::flaky::Flaky;

    let flaky = Arc::new(Flaky::default());
    flaky.script.lock().unwrap().always_taken = true;
    let h = Harness::over(flaky, RequestCounter::default(), |b| b);
    let runs = AtomicUsize::new(0);
    let err = h
        .idem
        .operation(NAMESPACE, "busy")
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AppError>(1)
        })
        .await
        .unwrap_err()
        .idempotency();
    assert!(
        matches!(err, Error::Contended { attempts: 4, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The 4 MB transaction limit counts the record's own response: staged writes that fit alone, plus a
/// large response, are refused before anything is sent.
async fn the_transaction_estimate_counts_the_response(backend: Backend) {
    use idempotent_runtime::Error;
    use std::sync::Arc;

    use super::shop::Shop;

    let h = Harness::new(backend).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    h.requests.reset();
    // Ten items of 395 KB: 3.9 MB, under the 4 MiB limit by themselves.
    let err = h
        .idem
        .operation(NAMESPACE, "big")
        .transact()
        .run(|cx| {
            let ((), tx) = cx.into_parts();
            let shop = shop.clone();
            async move {
                for i in 0..10 {
                    tx.push(shop.put_blob(&format!("blob-{i}"), 395 * 1024));
                }
                // A response of 350 KB of pseudo-random printable characters: gzip leaves about 290 KB.
                let mut state = 0x9E37_79B9_7F4A_7C15_u64;
                let noise: String = (0..350 * 1024)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        char::from(b'#' + u8::try_from(state % 90).unwrap())
                    })
                    .collect();
                Ok::<_, AppError>(noise)
            }
        })
        .await
        .unwrap_err()
        .idempotency();
    assert!(
        matches!(&err, Error::TooManyWrites { detail, .. } if detail.contains("the idempotency record")),
        "{err:?}"
    );
    assert_eq!(h.requests.of("TransactWriteItems"), 0, "nothing was sent");
    assert!(shop.item("blob-0").await.is_none());
    assert_eq!(
        h.record(NAMESPACE, "big").await.unwrap().status,
        Status::Failed
    );
}

/// A staged write to a business table that does not exist is the business write's error, not the
/// idempotency store's; nothing was written and the key is free for a retry.
async fn a_write_to_a_missing_business_table_is_the_writes_own_error(backend: Backend) {
    use idempotent_runtime::Error;
    use std::sync::Arc;

    use super::shop::Shop;

    let h = Harness::new(backend).await;
    let shop = Arc::new(Shop::new(&h, 10).await);
    let err = h
        .idem
        .operation(NAMESPACE, "nowhere")
        .transact()
        .run(|cx| {
            let ((), tx) = cx.into_parts();
            let shop = shop.clone();
            async move {
                let mut write = shop.take(1);
                if let Some(update) = write.update.as_mut() {
                    "no-such-business-table".clone_into(&mut update.table_name);
                }
                tx.push(write);
                Ok::<_, AppError>(1)
            }
        })
        .await
        .unwrap_err()
        .idempotency();
    assert!(matches!(&err, Error::WriteRejected { .. }), "{err:?}");
    assert!(!err.is_retryable(), "it needs fixing first");
    assert!(err.to_string().contains("no-such-business-table"), "{err}");
    assert_eq!(
        h.record(NAMESPACE, "nowhere").await.unwrap().status,
        Status::Failed
    );
    assert_eq!(shop.available().await, 10);
}

on_both_stores!(
    the_transaction_estimate_counts_the_response,
    a_write_to_a_missing_business_table_is_the_writes_own_error,
);
