//! The runtime is a dependency named `idem` (`idem = { package = "idempotent-runtime", .. }`), so
//! `::idempotent_runtime` does not exist here; `crate = ".."` says where the runtime is instead, as a bare
//! crate name or as any path to it.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idem::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

mod deps {
    pub(crate) use ::idem as runtime;
}

#[idempotent(key = order_id, crate = "idem")]
async fn charge(order_id: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[idempotent(key = order_id, store = idem, crate = "::idem", name = "refund", ttl = "1h")]
async fn refund(idem: &Idempotency, order_id: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[idempotent(key = order_id, crate = "crate::deps::runtime")]
async fn capture(order_id: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let handle = Idempotency::in_memory();
    handle.install();
    for _ in 0..2 {
        assert_eq!(charge(1).await.unwrap(), 1);
        assert_eq!(refund(&handle, 1).await.unwrap(), 1);
        assert_eq!(capture(1).await.unwrap(), 1);
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
}
