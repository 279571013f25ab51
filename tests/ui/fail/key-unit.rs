use idempotent_runtime::{Error, idempotent};

#[idempotent(key = ())]
async fn seed(rows: u64) -> Result<u64, Error> {
    Ok(rows)
}

fn main() {}
