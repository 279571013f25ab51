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
#[path = "correctness/stale_decision.rs"]
mod stale_decision;
#[path = "correctness/tokens.rs"]
mod tokens;
#[path = "correctness/unstorable.rs"]
mod unstorable;

pub(crate) use idempotent_tests::{AppError, Gate};

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
