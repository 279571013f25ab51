// Keys that name no parameter, however they are computed: nothing in them need differ between calls, so
// every call could share one record. Only a name alone (`key = SEED`, a named constant) says that
// deliberately.
#![allow(
    clippy::redundant_closure_call,
    clippy::deref_addrof,
    clippy::never_loop,
    clippy::let_and_return
)]

use idempotent_runtime::{Error, idempotent};

const SEED: &str = "seed-v1";

fn request_id() -> u64 {
    7
}

#[idempotent(key = (|| "seed")())]
async fn closure(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent(key = *&"order_id")]
async fn deref(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent(key = const { "seed" })]
async fn const_block(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent(key = loop { break "seed" })]
async fn loop_break(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent(key = cfg!(unix))]
async fn cfg(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent(key = { let k = "seed"; k })]
async fn binding(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent(key = format!("request-{}", request_id()))]
async fn call_without_arguments(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent(key = (SEED, 1))]
async fn constant_in_a_tuple(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
