//! The payments API (`idempotent_examples::payments`) behind `IdempotencyLayer`, served on loopback and
//! driven over HTTP, with its records on DynamoDB Local: every status the layer answers, the replay
//! header, tenant scoping, and 50 concurrent retries of one request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use idempotent_examples::payments::{Ledger, app};
use idempotent_runtime::Status;
use idempotent_tests::{Backend, Harness};
use serde_json::{Value, json};

/// The API on a fresh DynamoDB Local table, on a free loopback port.
struct Api {
    addr: SocketAddr,
    ledger: Arc<Ledger>,
    harness: Harness,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// What came back.
#[derive(Debug)]
struct Reply {
    version: axum::http::Version,
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

impl Api {
    async fn start(gateway_delay: Duration) -> Self {
        Self::start_with(gateway_delay, |b| b).await
    }

    async fn start_with(
        gateway_delay: Duration,
        configure: impl FnOnce(idempotent_runtime::Builder) -> idempotent_runtime::Builder,
    ) -> Self {
        Self::start_on(false, gateway_delay, configure).await
    }

    /// The API, its client speaking HTTP/2 (with prior knowledge) when `http2`, else HTTP/1.1.
    async fn start_on(
        http2: bool,
        gateway_delay: Duration,
        configure: impl FnOnce(idempotent_runtime::Builder) -> idempotent_runtime::Builder,
    ) -> Self {
        let harness = Harness::with(Backend::DynamoDb, configure).await;
        let ledger = Arc::new(Ledger::default());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app(harness.idem.clone(), ledger.clone(), gateway_delay);
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        let client = Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(http2)
            .build_http();
        Self {
            addr,
            ledger,
            harness,
            client,
        }
    }

    async fn post(&self, tenant: Option<&str>, key: Option<&str>, body: &Value) -> Reply {
        let mut request = Request::post(format!("http://{}/payments", self.addr))
            .header("content-type", "application/json");
        if let Some(tenant) = tenant {
            request = request.header("authorization", format!("Bearer sk_{tenant}"));
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = self.client.request(request).await.unwrap();
        let version = response.version();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply {
            version,
            status,
            headers,
            body,
        }
    }
}

fn payment(amount: u64) -> Value {
    json!({ "amount": amount, "currency": "eur" })
}

fn assert_problem(reply: &Reply, status: StatusCode) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.body["status"], status.as_u16());
    assert!(reply.body["detail"].as_str().is_some_and(|d| !d.is_empty()));
}

#[tokio::test]
async fn first_call_is_201_and_a_retry_replays_it_with_the_header() {
    let api = Api::start(Duration::ZERO).await;
    let first = api
        .post(Some("acme"), Some("order-1"), &payment(4200))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.header("location"), Some("/payments/pay_1"));
    assert_eq!(first.header("idempotent-replayed"), None);
    assert_eq!(first.body["tenant"], "acme");

    let again = api
        .post(Some("acme"), Some("order-1"), &payment(4200))
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("location"), Some("/payments/pay_1"));
    assert_eq!(again.header("content-type"), Some("application/json"));
    assert_eq!(again.body, first.body);
    assert_eq!(api.ledger.charges().len(), 1, "charged once");

    let record = api
        .harness
        .record("payments", &("acme", "order-1"))
        .await
        .expect("the response is stored");
    assert_eq!(record.status, Status::Completed);
}

#[tokio::test]
async fn the_key_may_be_a_structured_field_string() {
    let api = Api::start(Duration::ZERO).await;
    let bare = api.post(Some("acme"), Some("k-7"), &payment(1)).await;
    let quoted = api.post(Some("acme"), Some("\"k-7\""), &payment(1)).await;
    assert_eq!(quoted.header("idempotent-replayed"), Some("true"));
    assert_eq!(quoted.body, bare.body);
    assert_eq!(api.ledger.charges().len(), 1);
}

#[tokio::test]
async fn missing_or_empty_key_is_400_and_nothing_runs() {
    let api = Api::start(Duration::ZERO).await;
    assert_problem(
        &api.post(Some("acme"), None, &payment(4200)).await,
        StatusCode::BAD_REQUEST,
    );
    assert_problem(
        &api.post(Some("acme"), Some("\"\""), &payment(4200)).await,
        StatusCode::BAD_REQUEST,
    );
    assert!(api.ledger.charges().is_empty());
    assert_eq!(api.harness.requests.total(), 0, "no store call");
}

#[tokio::test]
async fn no_caller_identity_is_401() {
    let api = Api::start(Duration::ZERO).await;
    assert_problem(
        &api.post(None, Some("order-1"), &payment(4200)).await,
        StatusCode::UNAUTHORIZED,
    );
    assert!(api.ledger.charges().is_empty());
}

#[tokio::test]
async fn same_key_with_another_body_is_422_and_the_record_stands() {
    let api = Api::start(Duration::ZERO).await;
    let first = api
        .post(Some("acme"), Some("order-1"), &payment(4200))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = api
        .post(Some("acme"), Some("order-1"), &payment(9900))
        .await;
    assert_problem(&other, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(api.ledger.charges().len(), 1);
    // The original request still replays.
    let again = api
        .post(Some("acme"), Some("order-1"), &payment(4200))
        .await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
}

#[tokio::test]
async fn in_flight_duplicate_is_409_with_retry_after_from_the_hint() {
    // A 60 s lease and a 3 s hint: Retry-After is the hint, not what is left of the lease.
    let api = Api::start_with(Duration::from_millis(1500), |b| {
        b.default_lease(Duration::from_mins(1))
            .retry_hint(Duration::from_secs(3))
    })
    .await;
    let api = Arc::new(api);
    let first = tokio::spawn({
        let api = api.clone();
        async move { api.post(Some("acme"), Some("slow"), &payment(100)).await }
    });
    // Wait until the first request holds the claim.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while api
        .harness
        .record("payments", &("acme", "slow"))
        .await
        .is_none()
    {
        assert!(tokio::time::Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let duplicate = api.post(Some("acme"), Some("slow"), &payment(100)).await;
    assert_problem(&duplicate, StatusCode::CONFLICT);
    assert_eq!(duplicate.header("retry-after"), Some("3"));

    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(api.ledger.charges().len(), 1);
}

#[tokio::test]
async fn two_tenants_with_the_same_key_get_their_own_results() {
    let api = Api::start(Duration::ZERO).await;
    let acme = api
        .post(Some("acme"), Some("order-1"), &payment(4200))
        .await;
    let globex = api
        .post(Some("globex"), Some("order-1"), &payment(4200))
        .await;
    assert_eq!(globex.status, StatusCode::CREATED);
    assert_eq!(
        globex.header("idempotent-replayed"),
        None,
        "not acme's replay"
    );
    assert_eq!(globex.body["tenant"], "globex");
    assert_ne!(globex.body["id"], acme.body["id"]);
    // Each replays its own.
    let acme_again = api
        .post(Some("acme"), Some("order-1"), &payment(4200))
        .await;
    let globex_again = api
        .post(Some("globex"), Some("order-1"), &payment(4200))
        .await;
    assert_eq!(acme_again.body, acme.body);
    assert_eq!(globex_again.body, globex.body);
    assert_eq!(api.ledger.charges().len(), 2);
}

#[tokio::test]
async fn fifty_concurrent_posts_with_one_key_charge_once() {
    let api = Arc::new(Api::start(Duration::from_millis(300)).await);
    let posts: Vec<_> = (0..50)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { api.post(Some("acme"), Some("burst"), &payment(777)).await })
        })
        .collect();
    let mut created = Vec::new();
    let mut conflicts = 0;
    for post in posts {
        let reply = post.await.unwrap();
        match reply.status {
            StatusCode::CREATED => created.push(reply.body),
            StatusCode::CONFLICT => {
                assert!(reply.header("retry-after").is_some());
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(api.ledger.charges().len(), 1, "one charge for 50 requests");
    assert!(!created.is_empty());
    assert!(created.iter().all(|body| *body == created[0]));
    assert_eq!(created.len() + conflicts, 50);
    // Once done, every retry is a replay of that one charge.
    let after = api.post(Some("acme"), Some("burst"), &payment(777)).await;
    assert_eq!(after.header("idempotent-replayed"), Some("true"));
    assert_eq!(after.body, created[0]);
}

#[tokio::test]
async fn a_declined_payment_is_a_final_answer_and_replays() {
    let api = Api::start(Duration::ZERO).await;
    let over = payment(idempotent_examples::payments::MAX_AMOUNT + 1);
    let first = api.post(Some("acme"), Some("big"), &over).await;
    assert_eq!(first.status, StatusCode::PAYMENT_REQUIRED);
    let again = api.post(Some("acme"), Some("big"), &over).await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert!(api.ledger.charges().is_empty());
}

#[tokio::test]
async fn over_http2_a_retry_is_replayed_and_a_reused_key_is_422() {
    let api = Api::start_on(true, Duration::ZERO, |b| b).await;
    let first = api
        .post(Some("acme"), Some("order-h2"), &payment(4200))
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.version, axum::http::Version::HTTP_2);
    let again = api
        .post(Some("acme"), Some("order-h2"), &payment(4200))
        .await;
    assert_eq!(again.version, axum::http::Version::HTTP_2);
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("location"), first.header("location"));
    assert_eq!(again.body, first.body);
    let other = api
        .post(Some("acme"), Some("order-h2"), &payment(9900))
        .await;
    assert_problem(&other, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(api.ledger.charges().len(), 1, "charged once");
}
