//! The runtime's features are additive: this crate builds [`idempotent_additive_store`], a store
//! written without the runtime's `dynamodb` feature, in one program with a runtime that has
//! `dynamodb` and `emulator` on (cargo unifies a crate's features across the program). It compiles
//! only while no feature changes a signature or a public struct's fields.
//!
//! Its test runs the store contract's suite on that store, wrapped around a [`MemoryStore`].

use idempotent_additive_store::Recoded;
use idempotent_runtime::MemoryStore;
use idempotent_runtime::store::conformance::{BusinessTable, Subject};

/// The name of the business table of [`subject`]'s transaction cases.
pub const BUSINESS_TABLE: &str = "business";

/// A fresh [`Recoded`] store over a [`MemoryStore`] with the business table the transaction cases of
/// the suite write to (the runtime's `emulator` feature, on in this program, runs them in memory).
///
/// # Panics
///
/// If the memory store refuses the table (it never does for a new store).
#[must_use]
pub fn subject() -> Subject<Recoded<MemoryStore>> {
    let memory = MemoryStore::new();
    memory
        .create_table(BUSINESS_TABLE, "id", None)
        .expect("a new memory store takes a table");
    Subject::new(Recoded::new(memory)).with_business_table(BusinessTable::new(BUSINESS_TABLE, "id"))
}
