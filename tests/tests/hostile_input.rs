//! Hostile input: keys and payloads a caller shapes to collide with another's, and records written by
//! someone else (another service sharing the table, a tampered item). A caller never reaches another
//! key's record, and a record is read as untrusted data: bounded, never more than its writer could have
//! stored.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, Status, derive_key, fingerprint, idempotent};
use idempotent_tests::{AppError, Backend, Harness, idem_error};
use proptest::prelude::*;
use serde::Serialize;

/// A key whose extra parameters are flattened next to its tenant: a parameter named `tenant` would
/// write that field twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct LookupKey {
    tenant: String,
    #[serde(flatten)]
    params: BTreeMap<String, String>,
}

fn lookup_key(tenant: &str, params: &[(&str, &str)]) -> LookupKey {
    LookupKey {
        tenant: tenant.to_owned(),
        params: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

#[idempotent(key = key, store = idem, name = "hostile::lookup")]
async fn lookup(
    idem: &Idempotency,
    runs: &AtomicUsize,
    key: &LookupKey,
) -> Result<String, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("the stored answer for {}", key.tenant))
}

/// A payload with a field and a flattened map beside it.
#[derive(Debug, Serialize)]
struct Charge {
    amount: u64,
    #[serde(flatten)]
    extra: BTreeMap<String, u64>,
}

#[idempotent(key = order, store = idem, name = "hostile::charge", payload = charge)]
async fn charge(
    idem: &Idempotency,
    runs: &AtomicUsize,
    order: &str,
    charge: &Charge,
) -> Result<u64, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(charge.amount)
}

macro_rules! hostile_input {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn a_flattened_parameter_cannot_reach_another_tenants_record() {
                let h = Harness::new($backend).await;
                let runs = AtomicUsize::new(0);
                let bob = lookup_key("bob", &[("order", "1")]);
                let answer = lookup(&h.idem, &runs, &bob).await.unwrap();
                assert_eq!(answer, "the stored answer for bob");
                h.requests.reset();
                // Alice's key, with a parameter that shadows the tenant field.
                let forged = lookup_key("alice", &[("order", "1"), ("tenant", "bob")]);
                let err = idem_error(lookup(&h.idem, &runs, &forged).await);
                assert!(
                    matches!(&err, Error::Serialize { what: "key", .. }),
                    "{err:?}"
                );
                assert_eq!(err.namespace(), "hostile::lookup");
                assert!(
                    err.to_string()
                        .contains("repeats the object key \"tenant\""),
                    "{err}"
                );
                assert_eq!(runs.load(Ordering::SeqCst), 1, "only bob's own call ran");
                assert_eq!(h.requests.total(), 0, "refused before any request");
                // Bob's record is as his call left it, and alice's key has none.
                let record = h.record("hostile::lookup", &bob).await.unwrap();
                assert_eq!(record.status, Status::Completed);
                assert_eq!(record.attempt, 1);
                assert_eq!(
                    record.response.as_deref(),
                    Some(&br#""the stored answer for bob""#[..])
                );
                let alice = lookup_key("alice", &[("order", "1")]);
                assert!(h.record("hostile::lookup", &alice).await.is_none());
                // Alice's own key still works, and runs her own body.
                let answer = lookup(&h.idem, &runs, &alice).await.unwrap();
                assert_eq!(answer, "the stored answer for alice");
                assert_eq!(runs.load(Ordering::SeqCst), 2);
            }

            #[tokio::test]
            async fn a_payload_that_repeats_a_field_does_not_pass_for_another() {
                let h = Harness::new($backend).await;
                let runs = AtomicUsize::new(0);
                let five = Charge {
                    amount: 5,
                    extra: BTreeMap::new(),
                };
                assert_eq!(charge(&h.idem, &runs, "order-1", &five).await.unwrap(), 5);
                // 5000, with an extra entry that would have overwritten the amount in the fingerprint.
                let forged = Charge {
                    amount: 5000,
                    extra: BTreeMap::from([("amount".to_owned(), 5)]),
                };
                let err = idem_error(charge(&h.idem, &runs, "order-1", &forged).await);
                assert!(
                    matches!(
                        &err,
                        Error::Serialize {
                            what: "payload",
                            ..
                        }
                    ),
                    "{err:?}"
                );
                assert!(err.to_string().contains("\"amount\""), "{err}");
                assert_eq!(runs.load(Ordering::SeqCst), 1);
                // On a new key too: nothing is claimed with it.
                let err = idem_error(charge(&h.idem, &runs, "order-2", &forged).await);
                assert!(
                    matches!(
                        &err,
                        Error::Serialize {
                            what: "payload",
                            ..
                        }
                    ),
                    "{err:?}"
                );
                assert_eq!(runs.load(Ordering::SeqCst), 1);
                assert!(h.record("hostile::charge", "order-2").await.is_none());
                // A real change of amount is a payload mismatch, as ever.
                let other = Charge {
                    amount: 5000,
                    extra: BTreeMap::new(),
                };
                let err = idem_error(charge(&h.idem, &runs, "order-1", &other).await);
                assert!(matches!(&err, Error::PayloadMismatch { .. }), "{err:?}");
            }
        }
    };
}

hostile_input!(memory, Backend::Memory);
hostile_input!(dynamodb, Backend::DynamoDb);

/// Keys over a few tenants and parameter names, `tenant` among them: pairs often share a tenant or a
/// parameter, which is where a merge would make two of them one.
fn lookup_keys() -> impl Strategy<Value = LookupKey> {
    let name = prop::sample::select(vec!["bob", "alice", "tenant", "order", ""]);
    (
        name.clone(),
        prop::collection::btree_map(name.clone(), name, 0..3),
    )
        .prop_map(|(tenant, params)| LookupKey {
            tenant: tenant.to_owned(),
            params: params
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Two distinct values of a key type with a flattened map never derive one record key (nor one
    /// fingerprint): a value whose JSON would repeat a field is refused instead.
    #[test]
    fn distinct_keys_with_a_flattened_map_never_share_a_record(a in lookup_keys(), b in lookup_keys()) {
        let (ka, kb) = (derive_key("hostile::lookup", &a), derive_key("hostile::lookup", &b));
        prop_assert_eq!(ka.is_ok(), !a.params.contains_key("tenant"));
        prop_assert_eq!(kb.is_ok(), !b.params.contains_key("tenant"));
        if let (Ok(ka), Ok(kb)) = (&ka, &kb) {
            prop_assert_eq!(ka == kb, a == b, "{:?} and {:?}", a, b);
            prop_assert_eq!(fingerprint(&a).unwrap() == fingerprint(&b).unwrap(), a == b);
        }
    }
}
