//! The generated code names everything by absolute path: shadowing the prelude and `core`/`std` changes
//! nothing.
#![deny(warnings)]
#![allow(dead_code, unused_macros)]

use ::std::sync::atomic::{AtomicUsize, Ordering};

use ::idempotent_runtime::{Error, Idempotency, idempotent};

type Result = ();
struct Option;
struct Some;
struct None;
struct Ok;
struct Err;
struct Box;
struct String;
struct Vec;
struct Clone;
struct Default;
struct From;
struct Into;
mod core {}
mod std {}
mod serde {}
// Even a local module of the runtime's name: the macro says `::idempotent_runtime`.
mod idempotent_runtime {}
fn drop() {}
fn stringify() {}
fn concat() {}
fn module_path() {}
macro_rules! concat {
    ($($t:tt)*) => {
        "shadowed"
    };
}
macro_rules! stringify {
    ($($t:tt)*) => {
        "shadowed"
    };
}
macro_rules! module_path {
    () => {
        "shadowed"
    };
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = (order_id, "fixed"), payload = [order_id, 1], ttl = "1h", store = idem)]
async fn charge(idem: &Idempotency, order_id: u64) -> ::core::result::Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    ::core::result::Result::Ok(order_id)
}

#[idempotent(key = order_id)]
async fn refund(order_id: u64) -> ::core::result::Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    ::core::result::Result::Ok(order_id)
}

#[idempotent(key = order_id, store = idem, steps = s, on_failure = "restart")]
async fn checkout(idem: &Idempotency, order_id: u64) -> ::core::result::Result<u64, Error> {
    s.run("reserve", || async move {
        RUNS.fetch_add(1, Ordering::SeqCst);
        ::core::result::Result::Ok::<u64, Error>(order_id)
    })
    .await
}

fn main() {
    ::tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(calls());
}

async fn calls() {
    let idem = Idempotency::in_memory();
    idem.install();
    assert_eq!(charge(&idem, 1).await.unwrap(), 1);
    assert_eq!(charge(&idem, 1).await.unwrap(), 1);
    assert_eq!(refund(1).await.unwrap(), 1);
    assert_eq!(refund(1).await.unwrap(), 1);
    assert_eq!(checkout(&idem, 1).await.unwrap(), 1);
    assert_eq!(checkout(&idem, 1).await.unwrap(), 1);
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
}
