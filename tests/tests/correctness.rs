//! Regression tests of the exactly-once promise, one module per hole a review of the protocol found:
//! each failed before its fix. They run on both stores wherever the store can show the hole, and fault
//! cases go through the fault proxy in front of DynamoDB Local.

// A test target's root resolves `mod` next to itself (in `tests/`), where cargo would take each file for
// a test target of its own; the modules live in `correctness/` instead.
#[path = "correctness/claim_writes.rs"]
mod claim_writes;
#[path = "correctness/completion.rs"]
mod completion;
#[path = "correctness/defects.rs"]
mod defects;
#[path = "correctness/flaky.rs"]
mod flaky;
#[path = "correctness/missing_key.rs"]
mod missing_key;
#[path = "correctness/shop.rs"]
mod shop;
#[path = "correctness/skew.rs"]
mod skew;
#[path = "correctness/tokens.rs"]
mod tokens;

use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) use idempotent_tests::AppError;
use tokio::sync::{Notify, Semaphore};

/// A body that can be held open: it signals `started`, then waits for a permit.
#[derive(Debug)]
pub(crate) struct Gate {
    /// How often the body ran.
    pub(crate) runs: AtomicUsize,
    started: Notify,
    release: Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            runs: AtomicUsize::new(0),
            started: Notify::new(),
            release: Semaphore::new(0),
        }
    }
}

impl Gate {
    /// How often the body ran.
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Counts a run, says it started and waits until released.
    pub(crate) async fn enter(&self) {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.started.notify_one();
        self.release.acquire().await.unwrap().forget();
    }

    /// Waits until a body has entered.
    pub(crate) async fn started(&self) {
        self.started.notified().await;
    }

    /// Lets one body through.
    pub(crate) fn release(&self) {
        self.release.add_permits(1);
    }
}

/// `#[tokio::test]`s `memory` and `dynamodb` in a module named after `$test`, each calling
/// `$test(Backend::..)`.
#[macro_export]
macro_rules! on_both_stores {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$test(idempotent_tests::Backend::Memory).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dynamodb() {
                super::$test(idempotent_tests::Backend::DynamoDb).await;
            }
        }
    )*};
}
