//! Queues and Lambda: the batch consumer, and the example Lambda handler invoked as the Lambda runtime
//! would invoke it.

mod lambda_handler;
mod queue_batches;
