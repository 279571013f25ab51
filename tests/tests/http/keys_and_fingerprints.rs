//! Keys of the attribute computed through closures, dereferences, loops and blocks, which must still
//! give one record per value of the parameter they name; and request fingerprints of the HTTP layer,
//! which two requests a handler reads differently must not share.

// The keys below are the forms the lints point at, on purpose.
#![allow(
    clippy::redundant_closure_call,
    clippy::deref_addrof,
    clippy::never_loop,
    clippy::let_and_return
)]

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use idempotent_runtime::http::IdempotencyLayer;
use idempotent_runtime::{Error, Idempotency, idempotent};
use idempotent_tests::{Backend, Harness};

// ---------------------------------------------------------------------------------------------------
// The attribute: a key naming its parameter through a closure, a dereference, a loop or a block.
// (The same forms over literals alone are refused at compile time: `tests/ui/fail/key-names-no-parameter.rs`.)
// ---------------------------------------------------------------------------------------------------

static RUNS_CLOSURE: AtomicUsize = AtomicUsize::new(0);
static RUNS_DEREF: AtomicUsize = AtomicUsize::new(0);
static RUNS_LOOP: AtomicUsize = AtomicUsize::new(0);
static RUNS_LET: AtomicUsize = AtomicUsize::new(0);

/// The parameter returned by a closure called in place.
#[idempotent(key = (|| order_id)(), store = idem)]
async fn charge_closure(idem: &Idempotency, order_id: u64) -> Result<String, Error> {
    RUNS_CLOSURE.fetch_add(1, Ordering::SeqCst);
    Ok(format!("charged {order_id}"))
}

/// The parameter behind `*&`.
#[idempotent(key = *&order_id, store = idem)]
async fn charge_deref(idem: &Idempotency, order_id: u64) -> Result<String, Error> {
    RUNS_DEREF.fetch_add(1, Ordering::SeqCst);
    Ok(format!("charged {order_id}"))
}

/// A loop that breaks with the parameter.
#[idempotent(key = loop { break order_id }, store = idem)]
async fn charge_loop(idem: &Idempotency, order_id: u64) -> Result<String, Error> {
    RUNS_LOOP.fetch_add(1, Ordering::SeqCst);
    Ok(format!("charged {order_id}"))
}

/// A block that binds the parameter and returns the binding.
#[idempotent(key = { let k = order_id; k }, store = idem)]
async fn charge_let(idem: &Idempotency, order_id: u64) -> Result<String, Error> {
    RUNS_LET.fetch_add(1, Ordering::SeqCst);
    Ok(format!("charged {order_id}"))
}

/// Two calls with different orders: each must run its own body and get its own answer.
async fn two_orders<F, Fut>(call: F, runs: &AtomicUsize, what: &str)
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<String, Error>>,
{
    assert_eq!(call(1).await.unwrap(), "charged 1", "{what}");
    let second = call(2).await.unwrap();
    assert_eq!(
        (second.as_str(), runs.load(Ordering::SeqCst)),
        ("charged 2", 2),
        "{what}: order 2 got order 1's answer; the key is the same for every call"
    );
    assert_eq!(
        (call(1).await.unwrap().as_str(), runs.load(Ordering::SeqCst)),
        ("charged 1", 2),
        "{what}: order 1 again ran its body again"
    );
}

/// Each form gives one record per order: two orders run the body twice, the first order again is a
/// replay.
#[tokio::test]
async fn a_key_naming_its_parameter_through_any_form_gives_one_record_per_value() {
    let h = Harness::new(Backend::Memory).await;
    two_orders(
        |o| charge_closure(&h.idem, o),
        &RUNS_CLOSURE,
        "(|| order_id)()",
    )
    .await;
    two_orders(|o| charge_deref(&h.idem, o), &RUNS_DEREF, "*&order_id").await;
    two_orders(
        |o| charge_loop(&h.idem, o),
        &RUNS_LOOP,
        "loop { break order_id }",
    )
    .await;
    two_orders(
        |o| charge_let(&h.idem, o),
        &RUNS_LET,
        "{ let k = order_id; k }",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------------
// The HTTP layer: two different requests with one fingerprint.
// ---------------------------------------------------------------------------------------------------

const NAMESPACE: &str = "fingerprints";

struct Server {
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Server {
    async fn start(router: Router) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        Self { addr, client }
    }

    async fn send(&self, key: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
        let mut request =
            Request::post(format!("http://{}/r", self.addr)).header("idempotency-key", key);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self
            .client
            .request(request.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            body,
        }
    }
}

fn layer(harness: &Harness) -> IdempotencyLayer {
    IdempotencyLayer::new(harness.idem.clone(), |_: &axum::http::request::Parts| {
        Some("acme".to_owned())
    })
    .namespace(NAMESPACE)
}

fn gzip(content: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(content).unwrap();
    encoder.finish().unwrap()
}

/// A body of two gzip members (`gzip(a) + gzip(b)`, what `cat a.gz b.gz` or a streaming writer that
/// closes a member per flush sends) inflates to `a + b` for a multi-member decoder, while the
/// single-member decoders servers commonly use (flate2's `GzDecoder`, async-compression's default,
/// behind tower-http's request decompression) read only `a`. The request whose handler reads
/// `amount=10` must not get the stored answer of the one that read `amount=100`: the key reused with
/// another body is a 422, and the body runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_member_gzip_body_is_not_taken_for_its_inflated_concatenation() {
    let harness = Harness::new(Backend::Memory).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = post(move |body: Bytes| {
        let runs = counted.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut content = String::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_string(&mut content)
                .unwrap();
            (StatusCode::CREATED, format!("charged {content}"))
        }
    });
    let router = Router::new().route("/r", handler.layer(layer(&harness)));
    let server = Server::start(router).await;
    let gz = [("content-encoding", "gzip")];
    let first = server.send("k-1", &gz, gzip(b"amount=100")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.body, "charged amount=100");
    let mut other = gzip(b"amount=10");
    other.extend(gzip(b"0"));
    let second = server.send("k-1", &gz, other).await;
    assert_eq!(
        (second.status, runs.load(Ordering::SeqCst)),
        (StatusCode::UNPROCESSABLE_ENTITY, 1),
        "a request the handler reads as amount=10 was given amount=100's answer: {second:?} {:?}",
        second.headers.get("idempotent-replayed")
    );
}

/// The `boundary` of a `Content-Type` as RFC 9110 §5.6.6 reads parameters (a quoted string may hold
/// `;`), which is how multer (axum's `Multipart`) and the `mime` crate read it.
fn boundary(content_type: &str) -> Option<String> {
    let mut params = Vec::new();
    let (mut current, mut quoted) = (String::new(), false);
    for c in content_type.chars() {
        match c {
            '"' => quoted = !quoted,
            ';' if !quoted => params.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    params.push(current);
    params.into_iter().skip(1).find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().to_owned())
    })
}

/// A `Content-Type` whose first parameter quotes `;boundary=F;`: split on every `;`, the header would
/// give `F` as the boundary, while a multipart parser takes the real `boundary=R`. Two requests that
/// differ only in that `F` (and in the matching text inside a part, which under `R` is content) have
/// different field values for the handler, so the second must not get the first's stored answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boundary_quoted_inside_another_parameter_is_not_the_boundary() {
    let harness = Harness::new(Backend::Memory).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = post(move |headers: HeaderMap, body: Bytes| {
        let runs = counted.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let content_type = headers[header::CONTENT_TYPE].to_str().unwrap();
            let boundary = boundary(content_type).unwrap();
            // The first part's content, between its blank line and the next delimiter.
            let body = std::str::from_utf8(&body).unwrap();
            let after = body.split_once("\r\n\r\n").unwrap().1;
            let value = after.split(&format!("\r\n--{boundary}")).next().unwrap();
            (StatusCode::CREATED, format!("note={value:?}"))
        }
    });
    let router = Router::new().route("/r", handler.layer(layer(&harness)));
    let server = Server::start(router).await;
    let send = async |amount: &str| {
        let content_type =
            format!("multipart/form-data; x=\"a;boundary={amount};b\"; boundary=REAL");
        let body = format!(
            "--REAL\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\npay\r\n--{amount}\r\n--REAL--\r\n"
        );
        server
            .send(
                "m-1",
                &[("content-type", content_type.as_str())],
                body.into_bytes(),
            )
            .await
    };
    let first = send("100").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.body, r#"note="pay\r\n--100""#);
    let second = send("999").await;
    assert_eq!(
        (second.status, runs.load(Ordering::SeqCst)),
        (StatusCode::UNPROCESSABLE_ENTITY, 1),
        "a form whose note is \"pay\\r\\n--999\" was given the answer of \"pay\\r\\n--100\": {second:?}"
    );
}
