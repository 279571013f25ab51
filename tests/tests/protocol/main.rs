//! The exactly-once protocol, through `#[idempotent]` and `Operation`: what a call runs, stores and
//! returns, on both stores wherever a store can show it, with faults injected by wrapped stores or by
//! the fault proxy in front of DynamoDB Local.
//!
//! One test binary with a module per behaviour: each binary links the AWS SDK, so few binaries build
//! and link faster than one per file.

mod attribute;
mod bad_input;
mod behaviour;
mod claim_tokens;
mod claim_writes;
mod clock_skew;
mod coalescing;
mod core_and_shim;
mod course_paths;
mod deadline_bound;
mod faults;
mod flaky;
mod given_up_claims;
mod hostile_input;
mod interruptions;
mod late_requests;
mod limits;
mod missing_key;
mod outliving_resends;
mod recorded_ends;
mod release_faults;
mod released_claims;
mod replay;
mod resilience;
mod retry_hints;
mod round_trips;
mod shim_paths;
mod shop;
mod stale_decisions;
mod storing_the_result;
mod takeover_expiry;
mod time_in_flight;
mod transact;
mod typed_shim;
mod unstorable_values;
mod unsupported;

pub(crate) use idempotent_tests::{AppError, Gate};
