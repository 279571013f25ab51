//! Hole 7: smaller defects, each of which cost a stuck key, a panic or a misleading error.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::Status;
use idempotent_tests::{Backend, Harness};

use super::AppError;
use crate::on_both_stores;

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
        .run(|| async { Err::<u64, _>(Verbose) })
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
            .run(|| async {
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
