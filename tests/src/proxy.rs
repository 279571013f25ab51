//! A fault-injection proxy for DynamoDB Local.
//!
//! [`FaultProxy`] is a loopback HTTP/1.1 proxy that tests put between the AWS SDK and DynamoDB Local
//! to make the network and the service misbehave on purpose: a write that lands but whose response
//! never arrives, a throttle, a server error, a slow answer. Point a client at
//! [`FaultProxy::endpoint`] (for example with [`crate::client_at`]) and program it with [`Rule`]s:
//!
//! ```no_run
//! # async fn demo() {
//! use idempotent_tests::proxy::{Fault, FaultProxy, Rule};
//!
//! let proxy = FaultProxy::start(&idempotent_tests::endpoint()).await;
//! // The completion of a call lands, but its caller never hears back.
//! proxy.set_rules([Rule::new(Fault::DropResponse)
//!     .operation("UpdateItem")
//!     .body_contains(":completed")
//!     .nth(1)]);
//! let (client, _requests) = idempotent_tests::client_at(proxy.endpoint());
//! // ... run the code under test with `client` ...
//! assert_eq!(proxy.stats().operation("UpdateItem").dropped, 1);
//! # }
//! ```
//!
//! Requests are forwarded byte for byte (headers as the client sent them, `Host` included, minus
//! hop-by-hop headers; the body unchanged). DynamoDB Local does not check SigV4 signatures, so the
//! client's dummy credentials keep working through the proxy.
//!
//! What the Rust SDK does with each fault (standard retry mode, 3 attempts: the default of a client
//! built like [`crate::client_at`]; `tests/tests/stores/fault_proxy.rs` checks all of it):
//!
//! | fault | the SDK retries it as | when retries run out |
//! |---|---|---|
//! | [`Fault::DropResponse`] | transient | `SdkError::DispatchFailure`; its `ConnectorError` is `Other(TransientError)` (hyper's `IncompleteMessage`), not `is_io()` |
//! | [`Fault::Throttle`] | throttling | `SdkError::ServiceError`, code `ProvisionedThroughputExceededException` (a modeled variant) |
//! | [`Fault::ThrottlingException`] | throttling | `SdkError::ServiceError`, code `ThrottlingException` (a modeled variant) |
//! | [`Fault::ServerError`] | transient (HTTP 500) | `SdkError::ServiceError`, code `InternalServerError` (a modeled variant) |
//!
//! A retried write whose first response was dropped is applied twice: a conditional write then
//! fails its condition on its own earlier write, an unconditional one is simply repeated.

// "DynamoDB" and "SigV4" are product names here, not code.
#![allow(clippy::doc_markdown)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A loopback HTTP/1.1 proxy in front of DynamoDB (Local) that injects faults by [`Rule`].
///
/// It runs on the tokio runtime that started it and stops when dropped (open connections are
/// closed too). It serves any number of concurrent keep-alive connections, and keeps a pool of
/// keep-alive connections to the upstream.
#[derive(Debug)]
pub struct FaultProxy {
    endpoint: String,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

/// What the proxy does to a request that a [`Rule`] selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward the request, wait for DynamoDB's complete response (so the write is applied), then
    /// close the client's connection without answering. The SDK sees the connection close before a
    /// response, a transient dispatch failure, and retries.
    DropResponse,
    /// Answer HTTP 400 `ProvisionedThroughputExceededException` without forwarding.
    Throttle,
    /// Answer HTTP 400 `ThrottlingException` without forwarding.
    ThrottlingException,
    /// Answer HTTP 500 `InternalServerError` without forwarding.
    ServerError,
    /// Answer HTTP 400 `TransactionCanceledException` without forwarding, with one cancellation reason
    /// per code given (`"TransactionConflict"`, `"ThrottlingError"`, `"None"`, ...): what DynamoDB says
    /// when a transaction collides with another write to one of its items.
    CancelTransaction(&'static [&'static str]),
    /// Wait this long, then forward the request and return its response. A client that times out
    /// meanwhile may close the connection before the request is forwarded.
    Delay(Duration),
}

/// Selects requests and says which [`Fault`] to inject into them.
///
/// A rule's filter is the operation ([`Rule::operation`]) and a substring of the body
/// ([`Rule::body_contains`]), both optional; its trigger decides which of the requests that pass
/// the filter get the fault: all of them (the default), the n-th ([`Rule::nth`]), the first n
/// ([`Rule::first`]), or each with a probability drawn from a seeded generator
/// ([`Rule::probability`]).
///
/// Every rule counts (and, with a probability, draws a number for) every request that passes its
/// filter, whether or not an earlier rule fired on it, so each rule behaves the same whatever the
/// other rules do. When several rules fire on one request, the first in the list wins.
#[derive(Debug, Clone)]
pub struct Rule {
    fault: Fault,
    operation: Option<String>,
    body_contains: Option<String>,
    trigger: Trigger,
    matched: u64,
}

/// Counts of what the proxy did, over all requests and by operation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Client connections accepted. The SDK keeps connections alive and reuses them, so this grows
    /// with concurrency and with faults after which the SDK reconnects (dropped responses, and
    /// HTTP 500s; not throttles).
    pub connections: u64,
    /// All requests together.
    pub total: Counts,
    /// Requests by operation (`PutItem`, `UpdateItem`, ...; `unknown` without an `X-Amz-Target`).
    pub by_operation: BTreeMap<String, Counts>,
}

/// Request counts of one kind of traffic; see [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests received (every SDK attempt is one).
    pub requests: u64,
    /// Requests forwarded to the upstream, including delayed ones and ones whose response was dropped.
    pub forwarded: u64,
    /// Responses dropped by [`Fault::DropResponse`] (the request was applied).
    pub dropped: u64,
    /// Requests answered with a throttling error ([`Fault::Throttle`] or
    /// [`Fault::ThrottlingException`]) without forwarding.
    pub throttled: u64,
    /// Requests answered with HTTP 500 ([`Fault::ServerError`]) without forwarding.
    pub server_errors: u64,
    /// Transactions answered with a cancellation ([`Fault::CancelTransaction`]) without forwarding.
    pub canceled: u64,
    /// Requests delayed by [`Fault::Delay`] before forwarding.
    pub delayed: u64,
    /// Requests the proxy could not forward (upstream unreachable); answered with HTTP 502.
    pub upstream_errors: u64,
}

#[derive(Debug, Clone)]
enum Trigger {
    Always,
    Nth(u64),
    First(u64),
    Probability { threshold: f64, rng: SplitMix64 },
}

/// SplitMix64 (Steele, Lea and Flood): tiny, and unlike `rand`'s `StdRng` its output for a seed
/// never changes with a dependency upgrade, so a seeded fault schedule stays the same forever.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

struct Shared {
    upstream: Upstream,
    client: HttpClient<HttpConnector, Full<Bytes>>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct Upstream {
    scheme: hyper::http::uri::Scheme,
    authority: hyper::http::uri::Authority,
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<Rule>,
    stats: Stats,
    /// `ClientRequestToken`s of the transactions received, in order (see [`FaultProxy::request_tokens`]).
    request_tokens: Vec<String>,
}

/// The service's error that makes hyper close the connection without writing a response.
#[derive(Debug)]
struct ResponseDropped;

#[derive(Debug, Clone, Copy)]
enum Event {
    Request,
    Forwarded,
    Dropped,
    Throttled,
    ServerError,
    Canceled,
    Delayed,
    UpstreamError,
}

type ProxyResponse = Response<Full<Bytes>>;

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (an `http://host:port` endpoint such as DynamoDB
    /// Local's) on `127.0.0.1` and a free port, with no rules: everything is forwarded.
    ///
    /// # Panics
    ///
    /// When `upstream` is not an `http://` URL with an authority, when there is no tokio runtime,
    /// or when no loopback port can be bound.
    pub async fn start(upstream: &str) -> Self {
        let upstream = Upstream::parse(upstream);
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind the fault proxy to a loopback port");
        let address = listener
            .local_addr()
            .expect("the fault proxy's local address");
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let shared = Arc::new(Shared {
            upstream,
            client: HttpClient::builder(TokioExecutor::new()).build(connector),
            state: Mutex::new(State::default()),
        });
        let server = tokio::spawn(serve(listener, shared.clone()));
        Self {
            endpoint: format!("http://{address}"),
            shared,
            server,
        }
    }

    /// The proxy's endpoint, `http://127.0.0.1:<port>`, for a client's `endpoint_url`.
    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Replaces the rules; the new ones start counting from zero. Requests already being handled
    /// keep the fault they were given.
    pub fn set_rules(&self, rules: impl IntoIterator<Item = Rule>) {
        self.shared.state().rules = rules.into_iter().collect();
    }

    /// Appends one rule after the current ones.
    pub fn add_rule(&self, rule: Rule) {
        self.shared.state().rules.push(rule);
    }

    /// Removes every rule: from now on everything is forwarded. The stats are kept.
    pub fn clear(&self) {
        self.shared.state().rules.clear();
    }

    /// What the proxy has done so far.
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.shared.state().stats.clone()
    }

    /// The `ClientRequestToken` of every `TransactWriteItems` request received so far, in order, SDK
    /// retries included: tells one attempt's retries (same token) from a new attempt (a new token).
    #[must_use]
    pub fn request_tokens(&self) -> Vec<String> {
        self.shared.state().request_tokens.clone()
    }

    /// Sets every count to zero.
    pub fn reset_stats(&self) {
        self.shared.state().stats = Stats::default();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept loop owns the connection tasks, so this closes every connection as well.
        self.server.abort();
    }
}

impl Rule {
    /// A rule that injects `fault` into every request; narrow it with the other methods.
    #[must_use]
    pub fn new(fault: Fault) -> Self {
        Self {
            fault,
            operation: None,
            body_contains: None,
            trigger: Trigger::Always,
            matched: 0,
        }
    }

    /// Only requests of this operation, the part of `X-Amz-Target` after the dot: `PutItem`,
    /// `UpdateItem`, `GetItem`, `TransactWriteItems`, ...
    #[must_use]
    pub fn operation(mut self, operation: &str) -> Self {
        self.operation = Some(operation.to_owned());
        self
    }

    /// Only requests whose JSON body contains `needle`, for example `":completed"` to pick the
    /// completion among the `UpdateItem`s.
    #[must_use]
    pub fn body_contains(mut self, needle: &str) -> Self {
        self.body_contains = Some(needle.to_owned());
        self
    }

    /// Only the `n`-th request (1-based) that passes the filter.
    ///
    /// # Panics
    ///
    /// When `n` is zero.
    #[must_use]
    pub fn nth(mut self, n: u64) -> Self {
        assert!(n >= 1, "`Rule::nth` counts from 1");
        self.trigger = Trigger::Nth(n);
        self
    }

    /// Only the first `n` requests that pass the filter.
    #[must_use]
    pub fn first(mut self, n: u64) -> Self {
        self.trigger = Trigger::First(n);
        self
    }

    /// Each request that passes the filter, with probability `p`, decided by a generator seeded
    /// with `seed`: the k-th request to arrive always gets the k-th draw, so a run with the same
    /// seed and the same sequence of requests injects the same faults. With concurrent callers,
    /// which request arrives k-th varies from run to run, but how many of the first N requests get
    /// the fault does not.
    ///
    /// # Panics
    ///
    /// When `p` is not within `0.0..=1.0`.
    #[must_use]
    pub fn probability(mut self, p: f64, seed: u64) -> Self {
        assert!(
            (0.0..=1.0).contains(&p),
            "probability {p} is not within 0..=1"
        );
        self.trigger = Trigger::Probability {
            threshold: p,
            rng: SplitMix64(seed),
        };
        self
    }

    /// Counts the request if it passes the filter, and says whether the rule fires on it.
    fn fires(&mut self, operation: &str, body: &[u8]) -> bool {
        if self.operation.as_deref().is_some_and(|o| o != operation)
            || self
                .body_contains
                .as_deref()
                .is_some_and(|needle| !contains(body, needle.as_bytes()))
        {
            return false;
        }
        self.matched += 1;
        match &mut self.trigger {
            Trigger::Always => true,
            Trigger::Nth(n) => self.matched == *n,
            Trigger::First(n) => self.matched <= *n,
            Trigger::Probability { threshold, rng } => rng.next_unit() < *threshold,
        }
    }
}

impl Stats {
    /// The counts of one operation (all zero when it was never seen).
    #[must_use]
    pub fn operation(&self, operation: &str) -> Counts {
        self.by_operation
            .get(operation)
            .copied()
            .unwrap_or_default()
    }

    fn record(&mut self, operation: &str, event: Event) {
        self.total.record(event);
        if let Some(counts) = self.by_operation.get_mut(operation) {
            counts.record(event);
        } else {
            let mut counts = Counts::default();
            counts.record(event);
            self.by_operation.insert(operation.to_owned(), counts);
        }
    }
}

impl Counts {
    /// Faults injected that the caller notices: dropped responses, throttles and server errors
    /// (delays excluded).
    #[must_use]
    pub fn faults(&self) -> u64 {
        self.dropped + self.throttled + self.server_errors
    }

    fn record(&mut self, event: Event) {
        let count = match event {
            Event::Request => &mut self.requests,
            Event::Forwarded => &mut self.forwarded,
            Event::Dropped => &mut self.dropped,
            Event::Throttled => &mut self.throttled,
            Event::ServerError => &mut self.server_errors,
            Event::Canceled => &mut self.canceled,
            Event::Delayed => &mut self.delayed,
            Event::UpstreamError => &mut self.upstream_errors,
        };
        *count += 1;
    }
}

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0.0..1.0` with 32 bits of resolution, plenty for fault rates.
    fn next_unit(&mut self) -> f64 {
        let bits = (self.next_u64() >> 32) as u32;
        f64::from(bits) / 4_294_967_296.0
    }
}

impl Upstream {
    fn parse(endpoint: &str) -> Self {
        let uri: Uri = endpoint
            .parse()
            .unwrap_or_else(|e| panic!("upstream endpoint {endpoint:?} is not a URL: {e}"));
        let parts = uri.into_parts();
        let scheme = parts
            .scheme
            .filter(|s| *s == hyper::http::uri::Scheme::HTTP)
            .unwrap_or_else(|| panic!("upstream endpoint {endpoint:?} must start with http://"));
        let authority = parts
            .authority
            .unwrap_or_else(|| panic!("upstream endpoint {endpoint:?} has no host"));
        Self { scheme, authority }
    }

    fn uri(&self, original: &Uri) -> Uri {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(original.path_and_query().map_or("/", |pq| pq.as_str()))
            .build()
            .expect("an upstream URI built from valid parts")
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves only counters behind: still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn record(&self, operation: &str, event: Event) {
        self.state().stats.record(operation, event);
    }

    /// Counts the request and picks its fault: the first rule that fires, after every rule has
    /// counted it.
    fn decide(&self, operation: &str, body: &[u8]) -> Option<Fault> {
        let mut state = self.state();
        state.stats.record(operation, Event::Request);
        if operation == "TransactWriteItems"
            && let Some(token) = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["ClientRequestToken"].as_str().map(str::to_owned))
        {
            state.request_tokens.push(token);
        }
        let mut chosen = None;
        for rule in &mut state.rules {
            if rule.fires(operation, body) && chosen.is_none() {
                chosen = Some(rule.fault);
            }
        }
        chosen
    }

    async fn handle(&self, request: Request<Incoming>) -> Result<ProxyResponse, ResponseDropped> {
        let (parts, body) = request.into_parts();
        // A client that hangs up mid-request gets nothing back either.
        let body = body
            .collect()
            .await
            .map_err(|_| ResponseDropped)?
            .to_bytes();
        let operation = operation(&parts.headers);
        match self.decide(&operation, &body) {
            None => Ok(self.forward(&operation, parts, body).await),
            Some(Fault::Delay(delay)) => {
                self.record(&operation, Event::Delayed);
                tokio::time::sleep(delay).await;
                Ok(self.forward(&operation, parts, body).await)
            }
            Some(Fault::DropResponse) => {
                // The whole response has arrived, so DynamoDB has applied the request.
                let _ = self.forward(&operation, parts, body).await;
                self.record(&operation, Event::Dropped);
                Err(ResponseDropped)
            }
            Some(Fault::Throttle) => {
                self.record(&operation, Event::Throttled);
                Ok(error_response(
                    StatusCode::BAD_REQUEST,
                    "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                    "The level of configured provisioned throughput for the table was exceeded. \
                     (injected by FaultProxy)",
                ))
            }
            Some(Fault::ThrottlingException) => {
                self.record(&operation, Event::Throttled);
                Ok(error_response(
                    StatusCode::BAD_REQUEST,
                    "com.amazon.coral.availability#ThrottlingException",
                    "Rate of requests exceeds the allowed throughput. (injected by FaultProxy)",
                ))
            }
            Some(Fault::CancelTransaction(codes)) => {
                self.record(&operation, Event::Canceled);
                Ok(canceled_response(codes))
            }
            Some(Fault::ServerError) => {
                self.record(&operation, Event::ServerError);
                Ok(error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "com.amazonaws.dynamodb.v20120810#InternalServerError",
                    "Internal server error (injected by FaultProxy)",
                ))
            }
        }
    }

    /// Sends the request upstream and returns the complete response, or a 502 when the upstream
    /// cannot be reached.
    async fn forward(
        &self,
        operation: &str,
        parts: hyper::http::request::Parts,
        body: Bytes,
    ) -> ProxyResponse {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = parts.method;
        *request.uri_mut() = self.upstream.uri(&parts.uri);
        *request.headers_mut() = end_to_end(parts.headers);
        self.record(operation, Event::Forwarded);
        let response = match self.client.request(request).await {
            Ok(response) => response,
            Err(e) => return self.upstream_error(operation, &e),
        };
        let (parts, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => return self.upstream_error(operation, &e),
        };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = parts.status;
        *response.headers_mut() = end_to_end(parts.headers);
        response
    }

    fn upstream_error(&self, operation: &str, error: &dyn fmt::Display) -> ProxyResponse {
        self.record(operation, Event::UpstreamError);
        let mut response = Response::new(Full::new(Bytes::from(format!(
            "fault proxy: cannot reach the upstream {}: {error}",
            self.upstream.authority
        ))));
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("upstream", &self.upstream)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for ResponseDropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("response dropped by the fault proxy")
    }
}

impl std::error::Error for ResponseDropped {}

/// Accepts connections until aborted; the connection tasks live in a `JoinSet` owned here, so
/// aborting this task closes them all.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.state().stats.connections += 1;
                    connections.spawn(serve_connection(stream, shared.clone()));
                }
                // Out of file descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| {
        let shared = shared.clone();
        async move { shared.handle(request).await }
    });
    // Errors end the connection, which is all a dropped response needs.
    let _ = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// The operation named by `X-Amz-Target` (`DynamoDB_20120810.PutItem` → `PutItem`).
fn operation(headers: &HeaderMap) -> String {
    headers
        .get("x-amz-target")
        .and_then(|target| target.to_str().ok())
        .and_then(|target| target.rsplit('.').next())
        .unwrap_or("unknown")
        .to_owned()
}

/// The headers without the hop-by-hop ones, which describe one connection, not the message.
fn end_to_end(mut headers: HeaderMap) -> HeaderMap {
    let named_by_connection: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named_by_connection {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers
}

/// A DynamoDB JSON error, shaped as the service sends it (the SDK reads the code from `__type`).
fn error_response(status: StatusCode, error_type: &str, message: &str) -> ProxyResponse {
    let body = serde_json::json!({ "__type": error_type, "message": message }).to_string();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    headers.insert(
        "x-amzn-requestid",
        HeaderValue::from_static("FAULTPROXY0000000000000000000000000000000000000000000"),
    );
    response
}

/// A `TransactionCanceledException` with one reason per code, as DynamoDB shapes it.
fn canceled_response(codes: &[&str]) -> ProxyResponse {
    let reasons: Vec<serde_json::Value> = codes
        .iter()
        .map(|code| match *code {
            "None" => serde_json::json!({ "Code": "None" }),
            code => serde_json::json!({ "Code": code, "Message": "injected by FaultProxy" }),
        })
        .collect();
    let message = format!(
        "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
        codes.join(", ")
    );
    let mut response = error_response(
        StatusCode::BAD_REQUEST,
        "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        &message,
    );
    let body = serde_json::json!({
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "message": message,
        "CancellationReasons": reasons,
    })
    .to_string();
    *response.body_mut() = Full::new(Bytes::from(body));
    response
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}
