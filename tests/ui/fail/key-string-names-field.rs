use idempotent_runtime::{Error, idempotent};

struct Request {
    order_id: u64,
}

#[idempotent(key = (7, "req.order_id"))]
async fn charge(req: Request) -> Result<u64, Error> {
    Ok(req.order_id)
}

fn main() {}
