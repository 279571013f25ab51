//! Compile-pass and compile-fail tests of `#[idempotent]`, run by `tests/ui.rs` with trybuild.
//!
//! The cases live in `pass/` and `fail/`; this library is empty because Cargo needs one target besides the
//! tests. It is a package of its own so that the project trybuild builds for the cases does not compile the
//! AWS SDK: its dependencies are the runtime without the `dynamodb` feature, serde and tokio.
