use idempotent_runtime::{Error, idempotent};

trait Job {
    #[idempotent(key = self)]
    async fn run(&self) -> Result<u64, Error> {
        Ok(1)
    }
}

fn main() {}
