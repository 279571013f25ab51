//! Spans and metrics. A binary of its own: its tests read the process's metrics recorder and drain it,
//! so no other test may count into it.

mod spans_and_metrics;
