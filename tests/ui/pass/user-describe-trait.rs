//! A trait of the caller's with methods for every type, in scope where the attribute expands, whose names
//! the generated code could otherwise resolve to: the expansion calls nothing by method syntax.
#![deny(warnings)]

use idempotent_runtime::{Error, Idempotency, idempotent};

#[allow(dead_code)]
trait Everything {
    fn describe(&self) -> String {
        String::new()
    }
    fn checked(&self) -> bool {
        true
    }
    fn idempotency(&self) {}
    fn into_result(self) -> u8
    where
        Self: Sized,
    {
        0
    }
}

impl<T: ?Sized> Everything for T {}

#[derive(Debug)]
struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("declined")
    }
}

#[derive(Debug)]
enum AppError {
    Declined(Declined),
    Idempotency(Error),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Declined(why) => write!(f, "{why}"),
            Self::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        Self::Idempotency(e)
    }
}

#[idempotent(key = order_id, store = idem)]
async fn charge(idem: &Idempotency, order_id: u64) -> Result<u64, AppError> {
    if order_id == 0 {
        return Err(AppError::Declined(Declined));
    }
    Ok(order_id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::in_memory();
    assert_eq!(charge(&idem, 1).await.unwrap(), 1);
    assert!(matches!(
        charge(&idem, 0).await,
        Err(AppError::Declined(Declined))
    ));
}
