use idempotent_runtime::{Error, idempotent};

struct OrderId(u64);

struct Request {
    order_id: OrderId,
}

// A key of several tokens: one error, on all of them.
#[idempotent(key = req.order_id)]
async fn charge(req: Request) -> Result<u64, Error> {
    Ok(req.order_id.0)
}

fn main() {}
