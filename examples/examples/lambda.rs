//! An AWS Lambda function that charges once per order, with its claim bounded by the invocation's
//! deadline. Under Lambda (`AWS_LAMBDA_RUNTIME_API` set) it serves invocations; anywhere else it invokes
//! its handler directly, as Lambda would, with a 3 s deadline: a first call, a retry that replays, and
//! a retry with another amount.
//!
//! ```text
//! cargo run -p idempotent-examples --example lambda
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_examples::lambda::{ChargeRequest, Gateway, handle};
use lambda_runtime::{Context, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // No heartbeats: each claim's lease already runs to the invocation's deadline.
    let idem = idempotent_examples::builder_from_env("idempotency-examples")
        .await?
        .heartbeat(false)
        .build();
    let gateway = Gateway::new(Duration::from_millis(200));
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        let shared = Arc::new((idem, gateway));
        return lambda_runtime::run(service_fn(move |event| {
            let shared = shared.clone();
            async move {
                let (idem, gateway) = &*shared;
                handle(idem, gateway, event)
                    .await
                    .map_err(lambda_runtime::Error::from)
            }
        }))
        .await;
    }

    let invoke = |order: &str, amount_cents| {
        let mut context = Context::default();
        let deadline = SystemTime::now() + Duration::from_secs(3);
        context.deadline = u64::try_from(
            deadline
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        let request = ChargeRequest {
            order_id: order.to_owned(),
            amount_cents,
        };
        handle(&idem, &gateway, LambdaEvent::new(request, context))
    };
    println!("invocation 1: {:?}", invoke("order-1", 4200).await);
    println!(
        "invocation 2 (Lambda retried it): {:?}",
        invoke("order-1", 4200).await
    );
    println!(
        "invocation 3 (same order, another amount): {:?}",
        invoke("order-1", 9900).await.map_err(|e| e.to_string())
    );
    println!("charges made: {}", gateway.charges());
    Ok(())
}
