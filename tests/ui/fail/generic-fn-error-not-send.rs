use idempotent_runtime::idempotent;

// The error type names no type parameter: it is checked as in a function without them.
#[idempotent(key = key)]
async fn charge<K: serde::Serialize>(key: K) -> Result<u64, Box<dyn std::error::Error>> {
    let _ = key;
    Ok(1)
}

fn main() {}
