//! Regression tests of the correctness issue, one module per hole.

// A test target's root resolves `mod` next to itself (in `tests/`), where cargo would take each file
// for a test target of its own; the modules live in `correctness/` instead.
#[path = "correctness/missing_key.rs"]
mod missing_key;
