use idempotent_runtime::{Error, idempotent};

struct Transfer {
    id: u64,
    cents: u64,
}

#[idempotent(key = req.id, payload = &req)]
async fn transfer(req: Transfer) -> Result<u64, Error> {
    Ok(req.cents)
}

fn main() {}
