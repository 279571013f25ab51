use idempotent_runtime::{Error, Idempotency, idempotent};

struct Payments {
    idem: Idempotency,
    fee: u64,
}

impl Payments {
    #[idempotent(key = order_id, store = self.idem, detach)]
    async fn charge(&self, order_id: u64) -> Result<u64, Error> {
        Ok(order_id + self.fee)
    }
}

fn main() {}
