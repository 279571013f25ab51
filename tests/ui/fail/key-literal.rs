use idempotent_runtime::{Error, idempotent};

#[idempotent(key = "seed-v1")]
async fn seed(rows: u64) -> Result<u64, Error> {
    Ok(rows)
}

fn main() {}
