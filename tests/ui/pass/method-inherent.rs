//! Methods in an inherent impl: `store = self.idem` on `&self`, `self` fields in the key, `Self` in the
//! return type, and two types with a method of the same name in one module told apart with `name`.
#![deny(warnings)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Receipt {
    cents: u64,
}

struct Payments {
    idem: Idempotency,
    tenant: u32,
    runs: AtomicUsize,
}

impl Payments {
    #[idempotent(key = (self.tenant, order_id), store = self.idem, name = "payments::charge")]
    async fn charge(&self, order_id: u64) -> Result<Receipt, Error> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(Receipt {
            cents: order_id * 100,
        })
    }
}

struct Refunds {
    idem: Arc<Idempotency>,
    runs: AtomicUsize,
}

impl Refunds {
    #[idempotent(key = order_id, store = self.idem, name = "refunds::charge")]
    async fn charge(self: Arc<Self>, order_id: u64) -> Result<Self, Error>
    where
        Self: Sized,
    {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(Refunds {
            idem: Arc::clone(&self.idem),
            runs: AtomicUsize::new(0),
        })
    }
}

impl Serialize for Refunds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit()
    }
}

impl<'de> Deserialize<'de> for Refunds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <()>::deserialize(d)?;
        Ok(Refunds {
            idem: Arc::new(Idempotency::in_memory()),
            runs: AtomicUsize::new(0),
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let shared = Idempotency::in_memory();
    let payments = Payments {
        idem: shared.clone(),
        tenant: 7,
        runs: AtomicUsize::new(0),
    };
    assert_eq!(payments.charge(3).await.unwrap(), Receipt { cents: 300 });
    assert_eq!(payments.charge(3).await.unwrap(), Receipt { cents: 300 });
    assert_eq!(payments.runs.load(Ordering::SeqCst), 1);

    // Same store, same key value, same method name: only `name` keeps the records apart.
    let refunds = Arc::new(Refunds {
        idem: Arc::new(shared),
        runs: AtomicUsize::new(0),
    });
    Arc::clone(&refunds).charge(3).await.unwrap();
    Arc::clone(&refunds).charge(3).await.unwrap();
    assert_eq!(refunds.runs.load(Ordering::SeqCst), 1);
}
