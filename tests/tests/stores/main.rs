//! The stores: the store contract run against every store (and broken ones it must catch), the memory
//! store's DynamoDB emulator against DynamoDB Local, table layouts and set-up, a store that is not set
//! up, and the fault proxy the other binaries put in front of DynamoDB Local.

mod broken_stores;
mod conformance;
mod differential;
mod fault_proxy;
mod layouts;
mod release_marks;
mod setup_errors;
mod table;
