//! Cold start, the bare SDK: `coldstart-ours`'s two requests, hand-written with `aws-sdk-dynamodb`.
//!
//! ```text
//! IDEMPOTENT_DYNAMODB_ENDPOINT=http://127.0.0.1:PORT IDEMPOTENCY_TABLE=NAME \
//!     target/release/coldstart-baseline
//! ```
//!
//! A conditional `PutItem` that claims the request's key (PENDING, a token, a lease, an expiry), then an
//! `UpdateItem` fenced by the token that stores the answer (COMPLETED), then the answer printed: the
//! least any handler making the same requests does. No key derivation, no payload hash, no record
//! parsing, no retry of a lapsed claim: the floor `coldstart-ours` is compared with.

use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use idempotent_examples::coldstart;

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: u128) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (client, table) = coldstart::client_from_env()?;
    let request_id = coldstart::request_id();
    let pk = format!("coldstart::greet#{request_id}");
    let token = format!(
        "{:032x}",
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos()
    );
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    client
        .put_item()
        .table_name(&table)
        .item("pk", s(&pk))
        .item("status", s("PENDING"))
        .item("token", s(&token))
        .item("attempt", n(1))
        .item("lease_until", n(now_ms + 60_000))
        .item("expires_at", n(now_ms / 1_000 + 60 + 86_400))
        .condition_expression("attribute_not_exists(pk)")
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await?;
    let answer = format!("hello {request_id}");
    client
        .update_item()
        .table_name(&table)
        .key("pk", s(&pk))
        .update_expression("SET #st = :done, #r = :r, #ex = :ex REMOVE #lu")
        .condition_expression("#st = :pending AND #tk = :tk")
        .expression_attribute_names("#st", "status")
        .expression_attribute_names("#r", "response")
        .expression_attribute_names("#ex", "expires_at")
        .expression_attribute_names("#lu", "lease_until")
        .expression_attribute_names("#tk", "token")
        .expression_attribute_values(":done", s("COMPLETED"))
        .expression_attribute_values(":pending", s("PENDING"))
        .expression_attribute_values(":tk", s(&token))
        .expression_attribute_values(":r", AttributeValue::B(serde_json::to_vec(&answer)?.into()))
        .expression_attribute_values(":ex", n(now_ms / 1_000 + 86_400))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await?;
    println!("{answer}");
    Ok(())
}
