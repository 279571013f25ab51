//! An AWS Lambda handler that charges once per order, however often the invocation is retried, with
//! its claim bounded by the invocation's deadline. Run by `examples/lambda.rs` (under the Lambda runtime,
//! or locally without AWS), and invoked directly by the integration tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::{Error, Idempotency};
use lambda_runtime::LambdaEvent;
use serde::{Deserialize, Serialize};

/// The invocation's payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeRequest {
    /// The order to charge; the idempotency key.
    pub order_id: String,
    /// The amount, in cents.
    pub amount_cents: u64,
}

/// What the function returns, the first time and on every retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The gateway's charge id.
    pub charge_id: String,
    /// The amount charged.
    pub amount_cents: u64,
}

/// A (fake) payment gateway that takes `delay` per charge and counts them.
#[derive(Debug, Default)]
pub struct Gateway {
    /// How long a charge takes.
    pub delay: Duration,
    charges: AtomicUsize,
}

impl Gateway {
    /// A gateway that answers after `delay`.
    #[must_use]
    pub fn new(delay: Duration) -> Self {
        Self {
            delay,
            charges: AtomicUsize::new(0),
        }
    }

    /// How many charges completed.
    #[must_use]
    pub fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }

    async fn charge(&self, req: &ChargeRequest) -> Receipt {
        tokio::time::sleep(self.delay).await;
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Receipt {
            charge_id: format!("ch_{}_{n}", req.order_id),
            amount_cents: req.amount_cents,
        }
    }
}

/// The handler: one charge per `order_id`, whose claim's lease ends at the invocation's deadline
/// ([`Operation::deadline`](idempotent_runtime::Operation::deadline)), so that an invocation Lambda
/// kills at its timeout leaves a key the retry can claim right after, not a default lease later. Build
/// `idem` with `heartbeat(false)`: the lease already covers all the time the invocation has.
///
/// # Errors
/// [`Error`] when the charge could not be run or replayed (another invocation holds the order, a
/// different amount was sent with it, the store failed): the Lambda runtime reports it as the
/// invocation's error, and the caller retries.
pub async fn handle(
    idem: &Idempotency,
    gateway: &Gateway,
    event: LambdaEvent<ChargeRequest>,
) -> Result<Receipt, Error> {
    let (request, context) = event.into_parts();
    idem.operation("lambda::charge", &request.order_id)
        .payload(&request.amount_cents)
        .deadline(context.deadline())
        .run(|_| async { Ok(gateway.charge(&request).await) })
        .await
}
