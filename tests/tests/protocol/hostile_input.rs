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

async fn a_flattened_parameter_cannot_reach_another_tenants_record(backend: Backend) {
    let h = Harness::new(backend).await;
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

async fn a_payload_that_repeats_a_field_does_not_pass_for_another(backend: Backend) {
    let h = Harness::new(backend).await;
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

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test]
    a_flattened_parameter_cannot_reach_another_tenants_record,
    #[tokio::test]
    a_payload_that_repeats_a_field_does_not_pass_for_another,
}

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

// Records written by someone else.

/// gzip of `prefix`, then `fill` bytes of `a`, then `suffix`: a few kilobytes per ten megabytes.
fn gzip_bomb(prefix: &str, fill: usize, suffix: &str) -> Vec<u8> {
    use std::io::Write as _;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gzip.write_all(prefix.as_bytes()).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut left = fill;
    while left > 0 {
        let n = left.min(chunk.len());
        gzip.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    gzip.write_all(suffix.as_bytes()).unwrap();
    gzip.finish().unwrap()
}

/// Writes a COMPLETED record of `key` holding `response` through the store's own requests, as another
/// writer of the table could: no fingerprint, so that any call on the key reads it.
async fn plant(h: &Harness, key: &str, response: &[u8]) {
    use idempotent_runtime::store::conformance::request;
    let now_ms = h.clock.now_ms();
    let mut claim = request::claim(key, "someone-else", now_ms);
    claim.fingerprint = None;
    h.store.claim(&claim).await.unwrap();
    let complete = request::complete(key, "someone-else", response, now_ms / 1000 + 3600);
    h.store.transition(&complete).await.unwrap();
}

#[idempotent(key = id, store = idem, name = "hostile::report")]
async fn report(idem: &Idempotency, runs: &AtomicUsize, id: &str) -> Result<String, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok("x".repeat(2_000))
}

use idempotent_runtime::Clock as _;

/// 20 MiB of JSON in about 20 KB of gzip: past the default bound (16 MiB).
async fn a_stored_response_that_inflates_past_the_bound_is_corrupt_and_not_inflated(
    backend: Backend,
) {
    let bomb = gzip_bomb("\"", 20 << 20, "\"");
    assert!(bomb.len() < 100_000, "{}", bomb.len());
    for cache in [false, true] {
        let h = Harness::with(backend, |b| if cache { b.local_cache(16) } else { b }).await;
        let key = derive_key("hostile::report", "r-1").unwrap();
        plant(&h, &key, &bomb).await;
        let runs = AtomicUsize::new(0);
        // Twice: the local cache, if any, keeps nothing that did not decode.
        for _ in 0..2 {
            let err = idem_error(report(&h.idem, &runs, "r-1").await);
            assert!(
                matches!(&err, Error::CorruptRecord { detail, .. } if detail.contains(&format!("inflates to more than {} bytes", idempotent_runtime::DEFAULT_MAX_RESPONSE_BYTES))),
                "{err:?}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the body never runs on it");
        let record = h.store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Completed);
        assert_eq!(
            record.response.as_deref(),
            Some(&bomb[..]),
            "left as it was"
        );
    }
}

/// A handle reads back whatever it stored: a value over its bound is recorded without it.
async fn a_response_over_the_bound_is_not_stored_and_replays_as_too_large(backend: Backend) {
    let h = Harness::with(backend, |b| b.max_response_bytes(1_000)).await;
    assert_eq!(h.idem.max_response_bytes(), 1_000);
    let runs = AtomicUsize::new(0);
    assert_eq!(report(&h.idem, &runs, "r-2").await.unwrap().len(), 2_000);
    let record = h.record("hostile::report", "r-2").await.unwrap();
    assert_eq!((record.status, record.response), (Status::Completed, None));
    let err = idem_error(report(&h.idem, &runs, "r-2").await);
    assert!(matches!(&err, Error::ResponseTooLarge { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Under the bound, stored and replayed as ever.
    let h = Harness::with(backend, |b| b.max_response_bytes(2_002)).await;
    assert_eq!(report(&h.idem, &runs, "r-3").await.unwrap().len(), 2_000);
    assert_eq!(report(&h.idem, &runs, "r-3").await.unwrap().len(), 2_000);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

idempotent_tests::on_both_stores! {
    mod memory_records, mod dynamodb_records;
    #[tokio::test]
    a_stored_response_that_inflates_past_the_bound_is_corrupt_and_not_inflated,
    #[tokio::test]
    a_response_over_the_bound_is_not_stored_and_replays_as_too_large,
}

#[test]
fn a_bound_of_zero_is_refused() {
    let e = Idempotency::builder_in_memory()
        .max_response_bytes(0)
        .try_build()
        .unwrap_err();
    assert!(e.to_string().contains("`max_response_bytes`"), "{e}");
}

mod http {
    use super::*;
    use axum::body::Bytes;
    use axum::http::{Request, StatusCode};
    use axum::routing::post;
    use http_body_util::{BodyExt, Full};
    use idempotent_runtime::http::IdempotencyLayer;

    /// A server whose one route answers with `body` and counts its runs, behind a layer that stores
    /// bodies of at most 1 KiB.
    async fn serve(
        h: &Harness,
        runs: Arc<AtomicUsize>,
        body: &'static str,
    ) -> std::net::SocketAddr {
        let layer = IdempotencyLayer::new(h.idem.clone(), |_| Some("tenant-a".into()))
            .max_stored_response_bytes(1024);
        let router = axum::Router::new()
            .route(
                "/orders",
                post(move || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    body
                }),
            )
            .layer(layer);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        addr
    }

    async fn send(addr: std::net::SocketAddr, key: &str) -> (StatusCode, Bytes) {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        let request = Request::post(format!("http://{addr}/orders"))
            .header("idempotency-key", key)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let status = response.status();
        (
            status,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    }

    use std::sync::Arc;

    /// A record at the layer's key whose body inflates to 1 MiB, though the layer stores
    /// at most 1 KiB: refused, not sent.
    async fn a_replay_inflates_no_more_than_the_layer_could_have_stored(backend: Backend) {
        let h = Harness::new(backend).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let addr = serve(&h, runs.clone(), "ok").await;
        let key = idempotent_runtime::derive_http_key("http", "tenant-a", "k-1").unwrap();
        let bomb = gzip_bomb(
            r#"{"status":200,"headers":[],"body":{"text":""#,
            1 << 20,
            "\"}}",
        );
        plant(&h, &key, &bomb).await;
        let (status, body) = send(addr, "k-1").await;
        assert!(status.is_server_error(), "{status}");
        assert!(body.len() < 4096, "{} bytes sent", body.len());
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    /// The bound leaves room for the worst a stored body can take in JSON: every byte
    /// a control character (six bytes each).
    async fn a_stored_body_of_the_largest_size_still_replays(backend: Backend) {
        let h = Harness::new(backend).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let body: &'static str = "\u{1}".repeat(1024).leak();
        let addr = serve(&h, runs.clone(), body).await;
        let first = send(addr, "k-2").await;
        let again = send(addr, "k-2").await;
        assert_eq!(first, (StatusCode::OK, Bytes::from(body)));
        assert_eq!(again, first);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    idempotent_tests::on_both_stores! {
        mod memory, mod dynamodb;
        #[tokio::test]
        a_replay_inflates_no_more_than_the_layer_could_have_stored,
        #[tokio::test]
        a_stored_body_of_the_largest_size_still_replays,
    }
}
