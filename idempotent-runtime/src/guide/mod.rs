//! Guides: how to use the crate for each kind of service, with complete examples.
//!
//! Every example here compiles and runs as a test of this crate (`scripts/test`), so none of them can
//! fall behind the API. Start with the README's quickstart (an axum service on the in-memory store, then
//! on DynamoDB), then read the guide for what you are building:
//!
//! | guide | read it for |
//! |---|---|
//! | [`attribute`] | every argument of `#[idempotent]` and [`Operation`](crate::Operation): keys, payloads, waiting, ttl and retention, large responses, what is never run twice |
//! | [`http`] | the axum layer: scoping by caller, which responses are stored, 409/410/422, clients that hang up |
//! | [`lambda`] | a Lambda handler bounded by its invocation's deadline |
//! | [`queues`] | SQS batches: each message once, partial-batch responses |
//! | [`transactions`] | business writes in the record's transaction (`transact`), `claim_with`, `compensate_with` |
//! | [`steps`] | a body that resumes after a crash at its first unfinished step |
//! | [`interruptions`] | dropped futures, panics, crashes, `detach` and graceful shutdown |
//! | [`regions`] | global tables, home regions and failover; table layouts |
//! | [`operations`] | the table, IAM, the command line, traces and metrics, the kill switch |
//! | [`runbook`] | a stuck key, late retries after TTL, choosing `ttl` and `retain` |
//! | [`correctness`] | how we know it is correct: model checking, fuzzing, differential and fault tests |
//!
//! The guides are documentation only: this module exists in `cargo doc` and in doctests, never in a
//! build.

#[doc = include_str!("attribute.md")]
pub mod attribute {}

#[doc = include_str!("http.md")]
pub mod http {}

#[doc = include_str!("lambda.md")]
pub mod lambda {}

#[doc = include_str!("queues.md")]
pub mod queues {}

#[doc = include_str!("transactions.md")]
pub mod transactions {}

#[doc = include_str!("steps.md")]
pub mod steps {}

#[doc = include_str!("interruptions.md")]
pub mod interruptions {}

#[doc = include_str!("regions.md")]
pub mod regions {}

#[doc = include_str!("operations.md")]
pub mod operations {}

#[doc = include_str!("runbook.md")]
pub mod runbook {}

#[doc = include_str!("correctness.md")]
pub mod correctness {}
