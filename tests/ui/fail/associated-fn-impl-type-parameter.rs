use idempotent_runtime::{Error, idempotent};

struct Repository<T> {
    default: T,
}

// An associated function without `self`: the impl's `T` is as unseen as a method's.
impl<T: Clone> Repository<T> {
    #[idempotent(key = id)]
    async fn load(id: u64, default: T) -> Result<T, Error> {
        let _ = id;
        Ok(default)
    }
}

fn main() {}
