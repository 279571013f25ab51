//! Arguments passed through `macro_rules!`: rustc wraps each `$x:expr` (and `$x:literal`) in an invisible
//! group, which the attribute looks through, so they mean what they would mean written in place.
#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

struct Request {
    tenant: String,
    order_id: String,
}

macro_rules! charge_fn {
    (
        $name:ident($idem:ident, $req:ident),
        $key:expr,
        $ttl:expr,
        $lease:literal,
        $wait:expr,
        $ns:literal,
        $missing:expr,
        $store:expr
    ) => {
        #[idempotent(
            key = $key,
            ttl = $ttl,
            lease = $lease,
            wait = $wait,
            name = $ns,
            missing_key = $missing,
            store = $store,
            payload = $key
        )]
        async fn $name($idem: &Idempotency, $req: Request) -> Result<String, Error> {
            RUNS.fetch_add(1, Ordering::SeqCst);
            // The tuple key borrowed the fields: the body can still move them.
            let Request { tenant, order_id } = $req;
            Ok(format!("{tenant}/{order_id}"))
        }
    };
}

charge_fn!(
    charge(idem, req),
    (req.tenant, req.order_id),
    "1h",
    "30s",
    "0s",
    "macro-rules-charge",
    "reject",
    idem
);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::in_memory();
    let request = || Request {
        tenant: "t".to_owned(),
        order_id: "o-1".to_owned(),
    };
    assert_eq!(charge(&idem, request()).await.unwrap(), "t/o-1");
    assert_eq!(charge(&idem, request()).await.unwrap(), "t/o-1");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
