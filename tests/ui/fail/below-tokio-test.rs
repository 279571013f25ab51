use idempotent_runtime::idempotent;

const SEED: &str = "seed-v1";

// `#[tokio::test]` expands first and hands #[idempotent] a plain `fn`.
#[tokio::test]
#[idempotent(key = SEED)]
async fn seeds_once() -> Result<(), idempotent_runtime::Error> {
    Ok(())
}

fn main() {}
