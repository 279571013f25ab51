//! The key and payload borrow their places: non-`Copy` fields named in a tuple or array stay usable in
//! the body, and a `Err` lets the next call run the body again.
#![deny(warnings)]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Idempotency, idempotent};

static RUNS: AtomicUsize = AtomicUsize::new(0);

struct Request {
    tenant: String,
    order_id: String,
    tags: Vec<String>,
}

#[derive(Debug)]
enum PaymentError {
    Declined,
    Idempotency(idempotent_runtime::Error),
}

impl fmt::Display for PaymentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PaymentError::Declined => f.write_str("declined"),
            PaymentError::Idempotency(e) => write!(f, "idempotency: {e}"),
        }
    }
}

impl From<idempotent_runtime::Error> for PaymentError {
    fn from(e: idempotent_runtime::Error) -> Self {
        PaymentError::Idempotency(e)
    }
}

#[idempotent(key = (req.tenant, req.order_id), payload = [req.tenant, req.order_id])]
async fn charge(req: Request, decline: bool) -> Result<String, PaymentError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    if decline {
        return Err(PaymentError::Declined);
    }
    // Moves out of `req`: the attribute only borrowed these fields.
    let Request {
        tenant,
        order_id,
        tags,
    } = req;
    Ok(format!("{tenant}/{order_id} {}", tags.join(",")))
}

fn request() -> Request {
    Request {
        tenant: "acme".to_owned(),
        order_id: "order-1".to_owned(),
        tags: vec!["a".to_owned(), "b".to_owned()],
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idempotency::in_memory().install();
    assert!(matches!(
        charge(request(), true).await,
        Err(PaymentError::Declined)
    ));
    // A failure is not stored: the retry runs the body, then later calls replay its result.
    assert_eq!(charge(request(), false).await.unwrap(), "acme/order-1 a,b");
    assert_eq!(charge(request(), false).await.unwrap(), "acme/order-1 a,b");
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}
