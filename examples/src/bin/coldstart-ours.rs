//! Cold start, ours: a minimal handler, one `#[idempotent]` call, from process start to its answer.
//!
//! ```text
//! IDEMPOTENT_DYNAMODB_ENDPOINT=http://127.0.0.1:PORT IDEMPOTENCY_TABLE=NAME \
//!     target/release/coldstart-ours [--create-table]
//! ```
//!
//! Builds the client (dummy credentials, as on DynamoDB Local), installs the handle, makes one first
//! call on a key of its own (a claim and a completion: two requests) and prints its answer.
//! `coldstart-baseline` does the same two requests with the bare SDK; `scripts/bench-coldstart` starts
//! each many times and times process start to the answer. `--create-table` creates the table (once,
//! untimed) and exits.

use idempotent_examples::coldstart;
use idempotent_runtime::{DynamoDbStore, Error, Idempotency, idempotent};

/// The handler's work: the response is stored, so a retry of this request gets it back.
#[idempotent(key = request_id, name = "coldstart::greet")]
async fn greet(request_id: &str) -> Result<String, Error> {
    Ok(format!("hello {request_id}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (client, table) = coldstart::client_from_env()?;
    let store = DynamoDbStore::new(client, table);
    if std::env::args().any(|a| a == "--create-table") {
        store.create_table().await?;
        return Ok(());
    }
    Idempotency::builder(store).build().install();
    println!("{}", greet(&coldstart::request_id()).await?);
    Ok(())
}
