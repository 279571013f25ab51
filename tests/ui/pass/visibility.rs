//! `pub(crate)`, `pub(super)` and `pub` functions inside modules, called from outside them.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::Idempotency;

static RUNS: AtomicUsize = AtomicUsize::new(0);

mod billing {
    use std::sync::atomic::Ordering;

    use idempotent_runtime::{Error, idempotent};

    #[idempotent(key = order_id)]
    pub(crate) async fn charge(order_id: u64) -> Result<u64, Error> {
        super::RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(order_id)
    }

    pub mod refunds {
        use std::sync::atomic::Ordering;

        use idempotent_runtime::{Error, idempotent};

        #[idempotent(key = order_id)]
        pub(in crate::billing) async fn refund(order_id: u64) -> Result<u64, Error> {
            crate::RUNS.fetch_add(1, Ordering::SeqCst);
            Ok(order_id)
        }

        #[idempotent(key = order_id)]
        pub async fn refund_all(order_id: u64) -> Result<u64, Error> {
            refund(order_id).await
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    assert_eq!(billing::charge(1).await.unwrap(), 1);
    assert_eq!(billing::charge(1).await.unwrap(), 1);
    assert_eq!(billing::refunds::refund_all(1).await.unwrap(), 1);
    assert_eq!(billing::refunds::refund_all(1).await.unwrap(), 1);
    // One charge, one refund: the default namespaces (`module_path!()::fn_name`) keep the keys apart.
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}
