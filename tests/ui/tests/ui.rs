//! Compile-pass and compile-fail tests of `#[idempotent]`.
//!
//! Re-bless the `.stderr` files with `TRYBUILD=overwrite cargo test -p idempotent-ui-tests`, then read
//! every changed file: each must tell its reader exactly what to fix.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("pass/*.rs");
    t.compile_fail("fail/*.rs");
}
