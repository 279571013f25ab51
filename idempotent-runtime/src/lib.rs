//! Exactly-once async functions backed by DynamoDB.
//!
//! Put `#[idempotent]` on an `async fn` returning `Result<T, E>`: the first call with a key runs the body
//! and stores its `Ok` value; later calls with the same key get the stored value back without running the
//! body; a call while the first is still running gets [`Error::InProgress`] (or waits, with `wait = ..`);
//! an `Err` lets the next call run again.
//!
//! ```
//! use idempotent_runtime::{idempotent, Error, Idempotency};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Receipt { id: u64 }
//!
//! #[derive(Debug)]
//! enum PaymentError { Declined, Idempotency(Error) }
//! impl From<Error> for PaymentError {
//!     fn from(e: Error) -> Self { PaymentError::Idempotency(e) }
//! }
//!
//! #[idempotent(key = (tenant, order_id), ttl = "24h")]
//! async fn charge(tenant: u32, order_id: &str, cents: u64) -> Result<Receipt, PaymentError> {
//!     if cents == 0 { return Err(PaymentError::Declined); }
//!     Ok(Receipt { id: 7 })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), PaymentError> {
//! Idempotency::in_memory().install(); // or Idempotency::dynamodb(client, "idempotency")
//! let first = charge(1, "order-1", 500).await?;
//! let again = charge(1, "order-1", 500).await?; // replayed, the body did not run
//! assert_eq!(first.id, again.id);
//! # Ok(()) }
//! ```
//!
//! The protocol, per call (every request, with its exact condition, is listed in the docs of the
//! [`store::dynamodb`] module):
//!
//! | path | DynamoDB round trips |
//! |---|---|
//! | first call, success or failure | 2 (claim, complete/fail) |
//! | duplicate of a COMPLETED key | 1 (the claim's failed condition returns the record) |
//! | duplicate while PENDING | 1 (with `wait`, plus one `GetItem` per poll) |
//! | a body that runs longer than a third of its lease | + 1 `UpdateItem` (heartbeat) per third of the lease |
//! | missing key, rejected or skipped | 0 |
//!
//! Every transition out of PENDING is fenced by the claim's token, so a caller whose lease ran out and was
//! taken over can never overwrite the new owner's result ([`Error::LeaseLost`]).
//!
//! Features (on docs.rs, each item names the feature it needs); each only adds items, so crates that
//! turn on different features of this crate build together:
//!
//! - `macros` (default): the `#[idempotent]` attribute.
//! - `dynamodb` (default): `DynamoDbStore`, `RoutedStore::dynamodb`, `Transaction` and the business
//!   writes of `transact`/`claim_with`/`compensate_with` (the AWS SDK's `TransactWriteItem`).
//! - `emulator` (default, implies `dynamodb`): the DynamoDB transaction emulator behind
//!   [`MemoryStore`]'s business tables, so that `transact` and `claim_with` can be tested in memory.
//! - `metrics`: counters and a latency histogram through the `metrics` facade (see [`telemetry`]).
//! - `audit` (implies `dynamodb`): the `audit` module: TTL deletions and late retries read from the
//!   table's DynamoDB stream, by a polling reader or a Lambda stream consumer.
//! - `cli` (implies `audit`): the `idempotent` command line and the `admin` module.
//! - `axum`: the `Idempotency-Key` HTTP layer (the `http` module).
//! - `batch`: queue batches, each message processed once (the `batch` module).
//! - `conformance`: `store::conformance`, the store contract as a suite for a store of your own.
//!
//! `IDEMPOTENT_DISABLED=1` switches idempotency off in a process ([`DISABLED_VAR`]).
//!
//! Across regions (DynamoDB global tables, where a conditional write is linearizable only in the region
//! that received it), a [`RoutedStore`] sends each key to one home region chosen by a hash of the key, so
//! callers in different regions never both claim it; an unreachable home region is
//! [`Error::RegionUnavailable`], and failover to another region is an explicit opt-in (see the
//! [`store::routed`] module). `DynamoDbStore::check` warns about a replicated table used without such
//! routing (or refuses it, with `DynamoDbStore::strict_replicas`), and a routed store counts duplicates
//! found completed by another region than the key's home.
//!
//! Table layouts (`DynamoDbStore::with_layout`): by default the record key is the partition key; a
//! static partition key with the record key as sort key, or the namespace as partition key with the key's
//! hash as sort key, serve queries over keys at the price of hot partitions (the `guide::regions`
//! module, in the documentation built with all features).
//!
//! What is never run twice: once a body has returned `Ok`, its outcome is final while the record lives.
//! A value over DynamoDB's 400 KB item limit even compressed is recorded without it (duplicates get
//! [`Error::ResponseTooLarge`]); a value that does not serialize, or holds a NaN or ±infinity (which JSON
//! cannot hold), is recorded without it too: the first caller gets [`Error::Serialize`], duplicates
//! [`Error::ResponseNotSerialized`]. Only a result the store could not take at all for a whole lease
//! ([`Error::ResultNotStored`]) leaves the key claimable again (the `guide::attribute`
//! module has the table).
//!
//! How we know: the protocol is model-checked exhaustively (three workers, crashes, lost responses, lapsing
//! leases, expiry and skewed clocks) against the runtime's own decision functions, every decoder is fuzzed,
//! and the memory store's transaction emulator is differential-tested against DynamoDB Local; the
//! `guide::correctness` module has the details and figures.
//!
//! The `guide` module (in the documentation built with all features, as on docs.rs) has a guide per
//! kind of service: HTTP, Lambda, queues, transactions, steps, interruptions, regions, operations.

// docs.rs (nightly, `--cfg docsrs`, `[package.metadata.docs.rs]`) shows the feature each item needs.
// `doc_cfg` took `doc_auto_cfg` in (the latter no longer exists on nightly): the badge comes from an
// item's own `#[cfg]`; the explicit `doc(cfg(..))` attributes say the same where a re-export or an
// `impl` block would not show it. Stable rustdoc ignores both (`docsrs` is unset there).
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod admin;
#[cfg(feature = "audit")]
#[cfg_attr(docsrs, doc(cfg(feature = "audit")))]
pub mod audit;
#[cfg(feature = "batch")]
#[cfg_attr(docsrs, doc(cfg(feature = "batch")))]
pub mod batch;
mod cache;
mod call;
mod clock;
mod codec;
mod config;
#[cfg(feature = "emulator")]
mod emulator;
mod error;
mod execution;
#[cfg(all(test, feature = "dynamodb"))]
mod fuzz;
// The guides compile their examples against every integration, so they need its features (the
// workspace's tests enable them all, and docs.rs builds with all features).
#[cfg(all(
    any(doc, doctest),
    feature = "macros",
    feature = "emulator",
    feature = "axum",
    feature = "batch"
))]
pub mod guide;
mod handler;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod http;
mod key;
#[cfg(test)]
mod model;
// The model names the steps by the path they had before they joined the state machine.
#[cfg(test)]
use handler::steps;
mod operation;
mod record;
mod size;
pub mod store;
pub mod telemetry;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
// The checks behind the attribute's compile errors, at the root so that rustc names them by their bare
// names in its notes (it spells out the path of an item found only in a hidden module).
#[doc(hidden)]
pub use __private::{
    Concrete, Generic, IdempotencyHandle, IdempotencyKey, IdempotencyPayload, IdempotentError,
    IdempotentErrorSend, IdempotentOutput, IdempotentValue,
};

pub use call::MissingKey;
pub use clock::{Clock, ManualClock, SystemClock};
pub use codec::{COMPRESS_ABOVE, DEFAULT_MAX_RESPONSE_BYTES};
pub use config::{
    Builder, ConfigError, DEFAULT_CLOCK_SKEW_MARGIN, DEFAULT_LEASE, DEFAULT_RETRY_HINT,
    DEFAULT_TTL, DISABLED_VAR, Idempotency, MAX_DURATION,
};
pub use error::{BoxError, CancellationReason, Error};
pub use execution::{Execution, observe};
pub use handler::MIN_LEASE;
pub use handler::steps::{Steps, StepsReport};
pub use key::http::{DEFAULT_HTTP_NAMESPACE, derive_http_key};
pub use key::{derive_key, fingerprint};
pub use operation::{Context, Detached, Given, InPlace, OnReplay, Operation, Placement, Unchanged};
pub use record::{AttributeNames, MAX_RELEASED, Record, Status};
pub use size::MAX_ITEM_BYTES;
pub use store::memory::MemoryStore;
pub use store::routed::{RegionConfigError, RoutedStore};
pub use store::{Store, StoreError};

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use store::dynamodb::{
    DynamoDbStore, Layout, Replication, TableReport,
    transaction::{MAX_STAGED_WRITES, MAX_TRANSACTION_BYTES, Transaction},
};

/// The AWS SDK for DynamoDB, re-exported so that users get the version this crate was built with.
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use aws_sdk_dynamodb;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use idempotent_macros::idempotent;

/// The README's code blocks, compiled and run as doctests so that the front page cannot rot.
#[cfg(all(doctest, feature = "macros", feature = "axum"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
