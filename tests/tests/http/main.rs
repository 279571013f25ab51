//! The HTTP layer (`IdempotencyLayer`) served on loopback: the payments example API, what the layer
//! promises when routing, responses or connections are not the plain case, request fingerprints, and
//! records crafted by someone else.

mod crafted_records;
mod guarantees;
mod keys_and_fingerprints;
mod payments_api;
