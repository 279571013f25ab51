//! What `coldstart-ours` and `coldstart-baseline` share: the client, built the same way on both sides,
//! and a request id of the process's own.

use std::time::{SystemTime, UNIX_EPOCH};

use idempotent_runtime::aws_sdk_dynamodb::{self, Client};

/// The client for `IDEMPOTENT_DYNAMODB_ENDPOINT` (dummy credentials, region `us-east-1`), and the table
/// `IDEMPOTENCY_TABLE` names (default `coldstart`).
///
/// # Errors
/// When `IDEMPOTENT_DYNAMODB_ENDPOINT` is not set.
pub fn client_from_env() -> Result<(Client, String), String> {
    let endpoint = std::env::var("IDEMPOTENT_DYNAMODB_ENDPOINT").map_err(|_| {
        "IDEMPOTENT_DYNAMODB_ENDPOINT is not set (scripts/dynamodb-local start prints one)"
            .to_owned()
    })?;
    let table = std::env::var("IDEMPOTENCY_TABLE").unwrap_or_else(|_| "coldstart".to_owned());
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "local",
            "local",
            None,
            None,
            "coldstart",
        ))
        .build();
    Ok((Client::from_conf(config), table))
}

/// A request id no other process uses: the process id and the time.
#[must_use]
pub fn request_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("req-{}-{nanos:x}", std::process::id())
}
