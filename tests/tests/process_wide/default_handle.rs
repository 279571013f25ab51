//! The process-wide default handle. In its own test binary: `install` is global.

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = id, name = "install::work")]
async fn work(id: u32) -> Result<u32, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(id * 2)
}

#[tokio::test]
async fn without_an_installed_handle_the_call_fails_clearly_then_works_once_installed() {
    Idempotency::uninstall();
    let err = work(1).await.unwrap_err();
    assert!(
        matches!(&err, Error::NotInstalled { namespace, .. } if namespace == "install::work"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("call `Idempotency::install()`"),
        "{err}"
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 0);

    Idempotency::in_memory().install();
    assert_eq!(work(1).await.unwrap(), 2);
    assert_eq!(work(1).await.unwrap(), 2);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);

    // Installing another handle replaces the default: its store is empty, so the body runs again.
    Idempotency::in_memory().install();
    assert_eq!(work(1).await.unwrap(), 2);
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}
