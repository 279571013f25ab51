use idempotent_runtime::{Error, Idempotency, idempotent};

// A method, with a concrete `Ok` type: one error, as for a free function.
struct Receipt {
    id: u64,
}

struct Payments {
    idem: Idempotency,
}

impl Payments {
    #[idempotent(key = order_id, store = self.idem)]
    async fn charge(&self, order_id: u64) -> Result<Receipt, Error> {
        Ok(Receipt { id: order_id })
    }
}

fn main() {}
