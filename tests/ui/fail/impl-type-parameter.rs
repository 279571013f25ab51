use idempotent_runtime::{Error, idempotent};

struct Repository<T> {
    default: T,
}

impl<T: Clone> Repository<T> {
    #[idempotent(key = id)]
    async fn load(&self, id: u64) -> Result<T, Error> {
        let _ = id;
        Ok(self.default.clone())
    }
}

fn main() {}
