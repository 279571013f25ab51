//! Steps (`Operation::steps`, `#[idempotent(.., steps = s)]`): a body of several effects resumes
//! where it stopped, and a finished step never runs again while its record lives.

mod attribute;
mod crash;
mod in_doubt;
mod promise;
mod restart_policy;
mod resume;
mod sequences;
mod values_and_races;
