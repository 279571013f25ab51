//! What an operator runs: the stream audit and the key reports (`keys list`, `keys stats`). The audit
//! installs the process's metrics recorder; the key reports emit no metric it counts.

mod key_reports;
mod stream_audit;
