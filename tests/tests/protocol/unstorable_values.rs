//! A body that succeeded never runs again, whatever happens to its value. A value that does not
//! serialize (a map with non-string keys), or that JSON cannot hold (a NaN or an infinity, which
//! `serde_json` writes as `null`), is recorded as COMPLETED without a response: the first caller gets
//! `Error::Serialize`, a duplicate gets `Error::ResponseNotSerialized`, and the body runs once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, Status, idempotent};
use idempotent_tests::{Backend, Harness, idem_error};
use serde::{Deserialize, Serialize};

use super::AppError;
use idempotent_tests::on_both_stores;

/// A map with tuple keys: `serde_json` refuses it ("key must be a string").
type Unserializable = HashMap<(u8, u8), u8>;

#[idempotent(key = order, store = idem, name = "unstorable::attribute")]
async fn unserializable_through_the_attribute(
    idem: &Idempotency,
    runs: &AtomicUsize,
    order: &str,
) -> Result<Unserializable, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(HashMap::from([((1, 2), 3)]))
}

async fn an_unserializable_value_through_the_attribute_is_final(backend: Backend) {
    let h = Harness::new(backend).await;
    let order = format!("order-{}", uuid::Uuid::new_v4());
    let runs = AtomicUsize::new(0);
    let first = idem_error(unserializable_through_the_attribute(&h.idem, &runs, &order).await);
    assert!(
        matches!(
            first,
            Error::Serialize {
                what: "response",
                ..
            }
        ),
        "{first:?}"
    );
    let record = h.record("unstorable::attribute", &order).await.unwrap();
    assert_eq!(record.status, Status::Completed, "the success is final");
    for _ in 0..2 {
        let again = idem_error(unserializable_through_the_attribute(&h.idem, &runs, &order).await);
        assert!(
            matches!(again, Error::ResponseNotSerialized { .. }),
            "{again:?}"
        );
        assert!(!again.is_retryable());
        let text = again.to_string();
        assert!(
            text.contains("completed") && text.contains("not stored"),
            "{text}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

async fn an_unserializable_value_through_run_is_final(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let call = || {
        h.idem
            .operation("unstorable::run", "order-1")
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<Unserializable, AppError>(HashMap::from([((1, 2), 3)]))
            })
    };
    let first = idem_error(call().await);
    assert!(matches!(first, Error::Serialize { .. }), "{first:?}");
    let record = h.record("unstorable::run", "order-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    let again = idem_error(call().await);
    assert!(
        matches!(again, Error::ResponseNotSerialized { .. }),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Stats {
    orders: u64,
    refund_rate: f64,
}

/// A NaN is stored as `null`, which never decodes back; the first caller is told when the
/// value is stored, never a duplicate a day later.
async fn a_non_finite_float_is_refused_when_stored(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    for (key, rate) in [
        ("nan", f64::NAN),
        ("inf", f64::INFINITY),
        ("-inf", f64::NEG_INFINITY),
    ] {
        let call = || {
            h.idem.operation("unstorable::nan", key).run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(Stats {
                    orders: 0,
                    refund_rate: rate,
                })
            })
        };
        let first = idem_error(call().await);
        assert!(matches!(first, Error::Serialize { .. }), "{first:?}");
        assert!(first.to_string().contains("non-finite"), "{first}");
        let again = idem_error(call().await);
        assert!(
            matches!(again, Error::ResponseNotSerialized { .. }),
            "{again:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "each body ran once");
    // Finite values, and `None`, still replay.
    let value = h
        .idem
        .operation("unstorable::nan", "finite")
        .run(|_| async {
            Ok::<_, AppError>((
                Stats {
                    orders: 1,
                    refund_rate: 0.5,
                },
                None::<f64>,
            ))
        })
        .await
        .unwrap();
    let replayed = h
        .idem
        .operation("unstorable::nan", "finite")
        .run(|_| async { Err::<(Stats, Option<f64>), AppError>(AppError::Declined) })
        .await
        .unwrap();
    assert_eq!(value, replayed);
}

on_both_stores!(
    an_unserializable_value_through_the_attribute_is_final,
    an_unserializable_value_through_run_is_final,
    a_non_finite_float_is_refused_when_stored,
);

#[idempotent(key = (tenant, rate), store = idem, name = "unstorable::keyed-on-a-float")]
async fn keyed_on_a_float(
    idem: &Idempotency,
    runs: &AtomicUsize,
    tenant: &str,
    rate: Option<f64>,
) -> Result<String, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{tenant} at {rate:?}"))
}

/// NaN, +∞, −∞ and `None` inside a key all serialized to the same `null`, so calls keyed on
/// them shared one record and got each other's responses. A non-finite float in a key is an error before
/// any I/O; `None` stays the missing key it always was.
async fn a_non_finite_float_in_a_key_is_an_error_before_any_io(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    for rate in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = idem_error(keyed_on_a_float(&h.idem, &runs, "acme", Some(rate)).await);
        assert!(
            matches!(&err, Error::Serialize { what: "key", .. }),
            "{rate}: {err:?}"
        );
        assert!(err.to_string().contains("non-finite"), "{err}");
        // Through the programmatic API too, also for a payload.
        let err = idem_error(
            h.idem
                .operation("unstorable::keyed", &("acme", rate))
                .run(|_| async { Ok::<u8, AppError>(1) })
                .await,
        );
        assert!(matches!(&err, Error::Serialize { .. }), "{err:?}");
        assert!(idempotent_runtime::derive_key("ns", &[rate]).is_err());
        assert!(idempotent_runtime::fingerprint(&(1, rate)).is_err());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(h.requests.total(), 0, "nothing is sent for such a key");
    // Finite floats key as before.
    let first = keyed_on_a_float(&h.idem, &runs, "acme", Some(0.5))
        .await
        .unwrap();
    let again = keyed_on_a_float(&h.idem, &runs, "acme", Some(0.5))
        .await
        .unwrap();
    assert_eq!((first, runs.load(Ordering::SeqCst)), (again, 1));
}

on_both_stores!(a_non_finite_float_in_a_key_is_an_error_before_any_io);
