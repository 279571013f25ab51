//! Shared set-up for the examples: pick the store from the environment.
//!
//! - `IDEMPOTENT_DYNAMODB_ENDPOINT=http://127.0.0.1:8000` — DynamoDB Local (dummy credentials, region
//!   `us-east-1`); the table is created if missing.
//! - `IDEMPOTENCY_TABLE=name` — a real table, with the usual AWS configuration (environment, profile, role).
//! - neither — the in-memory store.

pub mod coldstart;
pub mod lambda;
pub mod payments;

use aws_config::BehaviorVersion;
use idempotent_runtime::aws_sdk_dynamodb::{self, Client};
use idempotent_runtime::{Builder, DynamoDbStore, Idempotency};

/// Where the example keeps its records.
#[derive(Debug, Clone)]
pub enum Backend {
    /// This process's memory.
    Memory,
    /// A DynamoDB table.
    DynamoDb {
        /// The client.
        client: Client,
        /// The table.
        table: String,
    },
}

/// The backend the environment asks for.
pub async fn backend_from_env(default_table: &str) -> Backend {
    let endpoint = std::env::var("IDEMPOTENT_DYNAMODB_ENDPOINT").ok();
    let table = std::env::var("IDEMPOTENCY_TABLE").ok();
    if endpoint.is_none() && table.is_none() {
        return Backend::Memory;
    }
    let table = table.unwrap_or_else(|| default_table.to_owned());
    let client = match endpoint {
        Some(endpoint) => {
            let config = aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
                .endpoint_url(endpoint)
                .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                    "local", "local", None, None, "example",
                ))
                .build();
            Client::from_conf(config)
        }
        None => Client::new(&aws_config::load_defaults(BehaviorVersion::latest()).await),
    };
    Backend::DynamoDb { client, table }
}

/// An [`Idempotency`] on the backend the environment asks for; on DynamoDB, creates the table if missing.
///
/// # Errors
/// The store's error when the table cannot be created.
pub async fn idempotency_from_env(
    default_table: &str,
) -> Result<Idempotency, idempotent_runtime::StoreError> {
    Ok(builder_from_env(default_table).await?.build())
}

/// [`idempotency_from_env`], as a builder to adjust first.
///
/// # Errors
/// The store's error when the table cannot be created.
pub async fn builder_from_env(
    default_table: &str,
) -> Result<Builder, idempotent_runtime::StoreError> {
    Ok(match backend_from_env(default_table).await {
        Backend::Memory => {
            println!(
                "store: in memory (set IDEMPOTENT_DYNAMODB_ENDPOINT or IDEMPOTENCY_TABLE for DynamoDB)"
            );
            Idempotency::builder_in_memory()
        }
        Backend::DynamoDb { client, table } => {
            let store = DynamoDbStore::new(client, &table);
            store.create_table().await?;
            println!("store: DynamoDB table `{table}`");
            Idempotency::builder(store)
        }
    })
}
