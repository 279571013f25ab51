//! Records crafted by someone else, and key shapes that could collide: a replay that would overflow a
//! header map, integers beyond 64 bits in raw JSON, map keys whose type JSON cannot keep. And records
//! in every shape the HTTP layer has stored so far, as an older build wrote them (docs/rolling-deploys.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use idempotent_runtime::http::IdempotencyLayer;
use idempotent_tests::{Backend, Harness};

const NAMESPACE: &str = "crafted-records";
const TENANT: &str = "acme";

/// The SHA-256 of an empty body, as the layer fingerprints one.
const EMPTY_BODY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// A record the layer did not write (a tampered item, another service on the table) holds 40 000
// distinct trailers: about 600 KB of JSON, well inside the replay bound (`stored_json_bound`: six
// times `max_stored_response_bytes` plus 64 KiB, > 6 MB by default), and a few KB gzipped. The
// replay appends each to one `HeaderMap`, whose `append` panics past 2^15 names ("size overflows
// MAX_SIZE"). The replay must call the stored response unreadable instead, and never panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crafted_record_with_many_trailers_does_not_panic_the_replay() {
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    let harness = Harness::new(Backend::Memory).await;
    let trailers: Vec<serde_json::Value> = (0..40_000)
        .map(|i| serde_json::json!([format!("x-{i}"), ""]))
        .collect();
    let crafted = serde_json::json!({
        "status": 201,
        "headers": [["content-type", "text/plain"]],
        "body": { "text": "charge 0" },
        "trailers": trailers,
    });
    let fingerprint = vec![
        "POST".to_owned(),
        "/payments".to_owned(),
        EMPTY_BODY_SHA256.to_owned(),
    ];
    harness
        .idem
        .operation(NAMESPACE, &(TENANT.to_owned(), "c-1".to_owned()))
        .payload(&fingerprint)
        .run(|_| async { Ok::<_, idempotent_runtime::Error>(crafted) })
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = post(move || {
        let runs = counted.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, "charge 1")
        }
    });
    let layer = IdempotencyLayer::new(harness.idem.clone(), |_: &axum::http::request::Parts| {
        Some(TENANT.to_owned())
    })
    .namespace(NAMESPACE);
    let router = Router::new().route("/payments", handler.layer(layer));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    // The layer turns a panic into a 500, so the reply alone does not tell a panic from the 500 of an
    // unreadable record: the panics are counted.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.to_string().contains("MAX_SIZE") {
            PANICS.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    for _ in 0..2 {
        let request = Request::post(format!("http://{addr}/payments"))
            .header("idempotency-key", "c-1")
            .body(Body::empty())
            .unwrap();
        let reply = client.request(request).await.expect("a response");
        let status = reply.status();
        let body = reply.into_body().collect().await.unwrap().to_bytes();
        eprintln!("{status}: {}", String::from_utf8_lossy(&body));
    }
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "replaying a crafted record panicked in HeaderMap::append (caught, and answered 500)"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A map key that is an id or a name: `#[serde(untagged)]`, as scopes often are.
#[derive(serde::Serialize, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[serde(untagged)]
enum Scope {
    Id(u64),
    Name(String),
}

// Map keys become JSON object keys, which are strings: the id 7 and the name "7" have one canonical
// form, so two different keys derive one record key, and the second caller is answered with the
// first's response (same payload). In a value position they stay apart (`7` vs `"7"`), and within one
// map the pair is refused as a repeated key; across two keys nothing tells them apart.
#[tokio::test]
#[ignore = "reproduces: a map key's type is not in canonical JSON (an untagged enum's 7 and \"7\" share one record key)"]
async fn keys_differing_only_in_a_map_keys_type_derive_different_record_keys() {
    let by_id = BTreeMap::from([(Scope::Id(7), "read")]);
    let by_name = BTreeMap::from([(Scope::Name("7".into()), "read")]);
    assert_ne!(by_id, by_name);
    let a = idempotent_runtime::derive_key("grants::apply", &by_id).unwrap();
    let b = idempotent_runtime::derive_key("grants::apply", &by_name).unwrap();
    assert_ne!(a, b, "two different keys share one record");
}

// A `RawValue` key or payload (a webhook's or a proxied request's JSON, kept as received) goes down the
// `to_value` path, which parses its numbers into `f64` past `u64`: the distinct integers
// 100000000000000000001 and 100000000000000000000 become one number, so two different keys share one
// record, and a payload passes for another's fingerprint (an amount off by one passes as the same
// request and gets the first one's answer).
#[test]
fn raw_json_integers_beyond_u64_keep_their_value_in_keys_and_fingerprints() {
    use serde_json::value::RawValue;
    let raw = |text: &str| RawValue::from_string(text.to_owned()).unwrap();
    let first = raw(r#"{"account":100000000000000000001}"#);
    let other = raw(r#"{"account":100000000000000000000}"#);
    assert_ne!(first.get(), other.get());
    // Refused (canonical JSON would round them to one float), never one record key for both.
    for value in [&first, &other] {
        let refused = idempotent_runtime::derive_key("webhooks::apply", value).unwrap_err();
        assert!(refused.to_string().contains("beyond 64 bits"), "{refused}");
    }
    let paid = raw(r#"{"amount":18446744073709551617}"#);
    let forged = raw(r#"{"amount":18446744073709551616}"#);
    for value in [&paid, &forged] {
        assert!(idempotent_runtime::fingerprint(value).is_err());
    }
    // Within 64 bits, raw integers keep their value.
    let small = raw(r#"{"account":18446744073709551615}"#);
    let smaller = raw(r#"{"account":18446744073709551614}"#);
    assert_ne!(
        idempotent_runtime::derive_key("webhooks::apply", &small).unwrap(),
        idempotent_runtime::derive_key("webhooks::apply", &smaller).unwrap()
    );
}

/// Serves `stored` as the response the HTTP layer stored for key `key` (stored here as an earlier
/// build of the layer would have), and returns a retry's status, body and replay header, with how
/// many times the handler ran.
async fn replay_of(
    backend: Backend,
    key: &str,
    stored: serde_json::Value,
) -> (StatusCode, Vec<u8>, Option<String>, usize) {
    let harness = Harness::new(backend).await;
    let fingerprint = vec![
        "POST".to_owned(),
        "/payments".to_owned(),
        EMPTY_BODY_SHA256.to_owned(),
    ];
    harness
        .idem
        .operation(NAMESPACE, &(TENANT.to_owned(), key.to_owned()))
        .payload(&fingerprint)
        .run(|_| async { Ok::<_, idempotent_runtime::Error>(stored) })
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = post(move || {
        let runs = counted.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, "charge again")
        }
    });
    let layer = IdempotencyLayer::new(harness.idem.clone(), |_: &axum::http::request::Parts| {
        Some(TENANT.to_owned())
    })
    .namespace(NAMESPACE);
    let router = Router::new().route("/payments", handler.layer(layer));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = Request::post(format!("http://{addr}/payments"))
        .header("idempotency-key", key)
        .body(Body::empty())
        .unwrap();
    let reply = client.request(request).await.expect("a response");
    let status = reply.status();
    let replayed = reply
        .headers()
        .get(idempotent_runtime::http::IDEMPOTENT_REPLAYED)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = reply
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, body, replayed, runs.load(Ordering::SeqCst))
}

// Every shape of stored response the layer has written so far is still replayed by today's layer, on
// both stores: the first one (text body, header values as strings, no `trailers`), a body in hex, and
// the mark of a body that was not stored (`"unstored"`, answered 410). An older layer cannot read the
// last two (docs/rolling-deploys.md); this pins that today's reads every one, so that a change of the
// stored form that drops one fails here. No release is published yet, so no released layer's
// decoding is tested against today's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_stored_in_every_earlier_shape_are_replayed() {
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let first_shape = serde_json::json!({
            "status": 201,
            "headers": [["content-type", "text/plain"]],
            "body": { "text": "charge 0" },
        });
        let (status, body, replayed, runs) = replay_of(backend, "shape-text", first_shape).await;
        assert_eq!(
            (status, body.as_slice(), replayed.as_deref(), runs),
            (StatusCode::CREATED, &b"charge 0"[..], Some("true"), 0),
            "{backend:?}: a text body stored by the first layer"
        );

        let hex = serde_json::json!({
            "status": 201,
            "headers": [["content-type", "application/octet-stream"]],
            "body": { "hex": "ff00fe" },
        });
        let (status, body, replayed, runs) = replay_of(backend, "shape-hex", hex).await;
        assert_eq!(
            (status, body.as_slice(), replayed.as_deref(), runs),
            (
                StatusCode::CREATED,
                &[0xff_u8, 0x00, 0xfe][..],
                Some("true"),
                0
            ),
            "{backend:?}: a body stored in hex"
        );

        let unstored = serde_json::json!({
            "status": 201,
            "headers": [],
            "body": "unstored",
        });
        let (status, _, replayed, runs) = replay_of(backend, "shape-unstored", unstored).await;
        assert_eq!(
            (status, replayed.as_deref(), runs),
            (StatusCode::GONE, Some("true"), 0),
            "{backend:?}: a response whose body was not stored"
        );
    }
}
