//! Compile-pass test of `#[idempotent(crate = "..")]` with the runtime renamed to `idem`, run by
//! `tests/renamed.rs` with trybuild.
//!
//! This library is empty because Cargo needs one target besides the tests; see `Cargo.toml` for why this
//! is not a case of `idempotent-ui-tests`.
