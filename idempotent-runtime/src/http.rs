//! The `Idempotency-Key` HTTP header (IETF draft "The Idempotency-Key HTTP Header Field") as a tower
//! layer for axum: feature `axum`.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use idempotent_runtime::Idempotency;
//! use idempotent_runtime::http::IdempotencyLayer;
//!
//! async fn create_payment(body: String) -> (axum::http::StatusCode, String) {
//!     (axum::http::StatusCode::CREATED, body)
//! }
//!
//! let idem = Idempotency::in_memory();
//! // Whose request this is: in a real service, the principal your authentication put in the extensions.
//! let layer = IdempotencyLayer::new(idem, |parts: &axum::http::request::Parts| {
//!     parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
//! })
//! .namespace("payments");
//! let app: Router = Router::new().route("/payments", post(create_payment).layer(layer));
//! ```
//!
//! What a request through the layer gets:
//!
//! | request | response |
//! |---|---|
//! | first with its key | the handler's response; it is stored unless it is a 5xx, 408, 409, 425 or 429 |
//! | same key, same request, done | the stored status, [headers that matter](IdempotencyLayer::replay_header) and body, plus `Idempotent-Replayed: true` |
//! | same key, still in flight | 409, `Retry-After` from the handle's retry hint |
//! | same key, another request (method, path or body) | 422 |
//! | no `Idempotency-Key` (or an empty or malformed one) | 400, unless [`optional`](IdempotencyLayer::optional) |
//! | no caller identity | 401 |
//! | a body over the limit | 413 |
//! | the store throttled or is unavailable | 503, `Retry-After` |
//!
//! Errors are `application/problem+json` (RFC 9457). `GET`, `HEAD`, `OPTIONS` and `TRACE` pass through:
//! they are idempotent already.
//!
//! **Why a layer, not an extractor.** What must be replayed is the *HTTP response* — status, headers and
//! body — and only a layer sees it whole. An extractor sees the request; it would make every handler
//! return a storable type and rebuild the response itself. The layer keeps handlers as they are (any
//! `IntoResponse`), covers a route, a group of routes or a whole router with one line, and works for any
//! tower service whose body is axum's.
//!
//! **Scoping.** The record key is `(identity, Idempotency-Key)`, so two callers that happen to send the
//! same key value never see each other's responses: the identity function is a required argument for
//! that reason. The request fingerprint is `(method, path and query, SHA-256 of the body)`, so a key
//! reused on another endpoint or with another body is a 422, never a replay of something else.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::request::Parts;
use axum::http::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Execution, Idempotency};

/// The request header carrying the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The response header that marks a replayed response (`true`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The longest key accepted, in bytes (longer ones are a 400).
pub const MAX_KEY_BYTES: usize = 255;
/// The default limit on request and response bodies (1 MiB); see [`IdempotencyLayer::max_body_bytes`].
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// Who is asking: returns the caller's identity (a tenant, an account, an API key's owner) from the
/// request, or `None` when there is none (the request is refused with 401).
type Identity = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// A tower layer that makes the services it wraps idempotent per `Idempotency-Key` header and caller.
/// See the [module docs](self).
#[derive(Clone)]
pub struct IdempotencyLayer {
    settings: Arc<Settings>,
}

struct Settings {
    idem: Idempotency,
    identity: Box<Identity>,
    namespace: &'static str,
    required: bool,
    max_body_bytes: usize,
    replay_headers: Vec<HeaderName>,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    wait: Option<Duration>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("IdempotencyLayer")
            .field("namespace", &s.namespace)
            .field("required", &s.required)
            .field("max_body_bytes", &s.max_body_bytes)
            .field("replay_headers", &s.replay_headers)
            .field("ttl", &s.ttl)
            .field("lease", &s.lease)
            .field("wait", &s.wait)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer on `idem` whose keys are scoped by `identity`: the caller's identity from the request
    /// (typically what an authentication layer in front of this one put in the extensions), or `None` to
    /// refuse the request with 401. To share keys between all callers on purpose, return the same string
    /// for all of them.
    pub fn new(
        idem: Idempotency,
        identity: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            settings: Arc::new(Settings {
                idem,
                identity: Box::new(identity),
                namespace: "http",
                required: true,
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
                replay_headers: vec![
                    header::CONTENT_TYPE,
                    header::CONTENT_LANGUAGE,
                    header::LOCATION,
                    header::ETAG,
                    header::LAST_MODIFIED,
                ],
                ttl: None,
                lease: None,
                wait: None,
            }),
        }
    }

    fn settings(&mut self) -> &mut Settings {
        // Configuration happens before the layer is cloned into a router, so this does not copy.
        Arc::get_mut(&mut self.settings).expect("configure an IdempotencyLayer before cloning it")
    }

    /// The key namespace of the records (default `"http"`): give each API its own, so that keys and
    /// stored responses of two APIs on one table never meet.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn namespace(mut self, namespace: &'static str) -> Self {
        self.settings().namespace = namespace;
        self
    }

    /// Requests without `Idempotency-Key` pass through without idempotency, instead of a 400.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn optional(mut self) -> Self {
        self.settings().required = false;
        self
    }

    /// The largest request body, and the largest response body that is stored (default
    /// [`DEFAULT_MAX_BODY_BYTES`]). A larger request is a 413; a larger response is returned as a 500
    /// and not stored, so the request can be retried.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.settings().max_body_bytes = limit;
        self
    }

    /// One more response header to store and replay, besides `Content-Type`, `Content-Language`,
    /// `Location`, `ETag` and `Last-Modified`. Headers about the connection or the moment (`Date`,
    /// `Set-Cookie`, rate limits) are not replayed.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.settings().replay_headers.push(name);
        self
    }

    /// How long a response is replayed (default: the handle's `ttl`).
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings().ttl = Some(ttl);
        self
    }

    /// How long an in-flight request blocks its duplicates if its worker dies (default: the handle's).
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings().lease = Some(lease);
        self
    }

    /// How long a duplicate waits for an in-flight request to finish before its 409 (default: none).
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.settings().wait = Some(wait);
        self
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            settings: self.settings.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around `S`.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("namespace", &self.settings.namespace)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower_service::Service<Request<Body>> for IdempotencyService<S>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The clone that was polled ready is the one to call (tower's rule); keep a fresh one for next time.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        let settings = self.settings.clone();
        Box::pin(async move { Ok(settings.handle(inner, request).await) })
    }
}

/// What is stored for a response: enough to send it again.
#[derive(Serialize, Deserialize)]
struct StoredResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: StoredBody,
}

/// A body as text when it is UTF-8 (JSON APIs: stored as is, readable in the table), hex otherwise.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoredBody {
    Text(String),
    Hex(String),
}

impl StoredBody {
    fn new(bytes: Bytes) -> Self {
        match String::from_utf8(bytes.into()) {
            Ok(text) => StoredBody::Text(text),
            Err(e) => StoredBody::Hex(hex::encode(e.into_bytes())),
        }
    }

    fn into_bytes(self) -> Option<Vec<u8>> {
        match self {
            StoredBody::Text(text) => Some(text.into_bytes()),
            StoredBody::Hex(hex) => hex::decode(hex).ok(),
        }
    }
}

/// Why the operation's body did not produce a response to store.
enum Failure {
    /// The handler's response is not one to replay (a 5xx, say): the client gets it, and may retry.
    NotStored(Response<Body>),
    Idempotency(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Idempotency(e)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NotStored(response) => {
                write!(f, "the handler answered {}; not stored", response.status())
            }
            Failure::Idempotency(e) => e.fmt(f),
        }
    }
}

/// Responses stored for replay: everything but server errors and the statuses that say "try again"
/// (408 Request Timeout, 409 Conflict, 425 Too Early, 429 Too Many Requests), which a retry with the same
/// key must be able to get past.
fn storable(status: StatusCode) -> bool {
    !status.is_server_error()
        && !matches!(
            status,
            StatusCode::REQUEST_TIMEOUT
                | StatusCode::CONFLICT
                | StatusCode::TOO_EARLY
                | StatusCode::TOO_MANY_REQUESTS
        )
}

impl Settings {
    async fn handle<S>(&self, mut inner: S, request: Request<Body>) -> Response<Body>
    where
        S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    {
        if request.method().is_safe() {
            return pass(&mut inner, request).await;
        }
        let key = match idempotency_key(request.headers()) {
            Ok(Some(key)) => key,
            Ok(None) if !self.required => return pass(&mut inner, request).await,
            Ok(None) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "this operation requires an `Idempotency-Key` header: a unique value per request, such as a UUID, sent again unchanged with each retry",
                );
            }
            Err(why) => return problem(StatusCode::BAD_REQUEST, why),
        };
        let (parts, body) = request.into_parts();
        let Some(identity) = (self.identity)(&parts) else {
            return problem(
                StatusCode::UNAUTHORIZED,
                "an `Idempotency-Key` is scoped by the caller, and this request does not say who the caller is",
            );
        };
        let Ok(bytes) = axum::body::to_bytes(body, self.max_body_bytes).await else {
            return problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the request body is over {} bytes, or could not be read",
                    self.max_body_bytes
                ),
            );
        };
        let target = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), ToString::to_string);
        let fingerprint = (
            parts.method.as_str().to_owned(),
            target,
            hex::encode(Sha256::digest(&bytes)),
        );
        let request = Request::from_parts(parts, Body::from(bytes));

        let mut operation = self
            .idem
            .operation(self.namespace, &(identity, key))
            .payload(&fingerprint);
        if let Some(ttl) = self.ttl {
            operation = operation.ttl(ttl);
        }
        if let Some(lease) = self.lease {
            operation = operation.lease(lease);
        }
        if let Some(wait) = self.wait {
            operation = operation.wait(wait);
        }
        // The first caller gets the handler's response with all its headers, not only the stored ones.
        let original: Mutex<Option<(StatusCode, HeaderMap)>> = Mutex::new(None);
        let run = operation.run(|| async {
            let response = pass(&mut inner, request).await;
            if !storable(response.status()) {
                return Err(Failure::NotStored(response));
            }
            let (parts, body) = response.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, self.max_body_bytes).await else {
                return Err(Failure::NotStored(problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the response could not be read in full, or is too large to store; it was not stored, so the request may be retried",
                )));
            };
            let stored = StoredResponse {
                status: parts.status.as_u16(),
                headers: self.stored_headers(&parts.headers),
                body: StoredBody::new(bytes),
            };
            *original.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((parts.status, parts.headers));
            Ok(stored)
        });
        let (result, execution) = crate::observe(run).await;
        match result {
            Ok(stored) => {
                let first = original
                    .into_inner()
                    .unwrap_or_else(PoisonError::into_inner);
                respond(stored, first, execution)
            }
            Err(Failure::NotStored(response)) => response,
            Err(Failure::Idempotency(e)) => error_response(&e),
        }
    }

    fn stored_headers(&self, headers: &HeaderMap) -> Vec<(String, String)> {
        headers
            .iter()
            .filter(|(name, _)| self.replay_headers.contains(name))
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect()
    }
}

async fn pass<S>(inner: &mut S, request: Request<Body>) -> Response<Body>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    match inner.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The response for a stored value: the handler's own headers when it just ran, the stored ones and
/// `Idempotent-Replayed: true` when replayed.
fn respond(
    stored: StoredResponse,
    first: Option<(StatusCode, HeaderMap)>,
    execution: Option<Execution>,
) -> Response<Body> {
    let Some(body) = stored.body.into_bytes() else {
        return problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the stored response is unreadable",
        );
    };
    let mut response = Response::new(Body::from(body));
    if let Some((status, headers)) = first.filter(|_| execution != Some(Execution::Replayed)) {
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        // The body was buffered: its length is known again, whatever the handler streamed.
        response.headers_mut().remove(header::CONTENT_LENGTH);
        response.headers_mut().remove(header::TRANSFER_ENCODING);
        return response;
    }
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// The request's key: `None` when absent; an error text when it is not one usable key. The draft
/// makes it a Structured Field string (`"8e03978e-..."`); a bare token (`8e03978e-...`) is accepted
/// too, as most clients send one.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("send one `Idempotency-Key` header, not several");
    }
    let text = value
        .to_str()
        .map_err(|_| "the `Idempotency-Key` header must be visible ASCII")?
        .trim();
    let key = match text.strip_prefix('"') {
        Some(quoted) => unquote(quoted).ok_or("the quoted `Idempotency-Key` is malformed")?,
        None => text.to_owned(),
    };
    if key.is_empty() {
        return Err("the `Idempotency-Key` header is empty");
    }
    if key.len() > MAX_KEY_BYTES {
        return Err("the `Idempotency-Key` header is longer than 255 bytes");
    }
    Ok(Some(key))
}

/// The content of a Structured Field string after its opening quote (RFC 8941 §3.3.3): `\"` and `\\`
/// escapes, ending at the closing quote, with nothing after it.
fn unquote(quoted: &str) -> Option<String> {
    let mut out = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                escaped @ ('"' | '\\') => out.push(escaped),
                _ => return None,
            },
            '"' => return chars.as_str().is_empty().then_some(out),
            c => out.push(c),
        }
    }
    None
}

/// The response for an error of the protocol: 409 and 422 for the client's own doing, 503 for what
/// passes with time, 500 for the rest (logged; its detail stays out of the response).
fn error_response(error: &Error) -> Response<Body> {
    match error {
        Error::InProgress { retry_hint, .. } => with_retry_after(
            problem(
                StatusCode::CONFLICT,
                "a request with this `Idempotency-Key` is still being processed; retry after the `Retry-After` delay",
            ),
            *retry_hint,
        ),
        Error::Contended { .. } => with_retry_after(
            problem(
                StatusCode::CONFLICT,
                "requests with this `Idempotency-Key` are racing; retry after the `Retry-After` delay",
            ),
            Duration::from_secs(1),
        ),
        Error::PayloadMismatch { .. } => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this `Idempotency-Key` was already used with a different request (method, path or body); use a new key for a new request",
        ),
        Error::Expired { .. } => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this `Idempotency-Key` was used long ago and its response has expired; use a new key",
        ),
        Error::Throttled { .. } | Error::Unavailable { .. } | Error::RegionUnavailable { .. } => {
            tracing::warn!(error = %error, "idempotency store unavailable");
            with_retry_after(
                problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the service cannot check this `Idempotency-Key` right now; retry with the same key",
                ),
                Duration::from_secs(1),
            )
        }
        _ => {
            tracing::error!(error = %error, "idempotency failed");
            problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request could not be processed idempotently; retry with the same key",
            )
        }
    }
}

/// `Retry-After` in whole seconds (HTTP has no finer unit), rounded up and at least 1.
fn with_retry_after(mut response: Response<Body>, after: Duration) -> Response<Body> {
    let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}

/// An `application/problem+json` response (RFC 9457) of type `about:blank`: the title is the status's
/// reason phrase, the detail says what to do.
fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(value: &str) -> Result<Option<String>, &'static str> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_str(value).unwrap());
        idempotency_key(&headers)
    }

    #[test]
    fn keys_as_structured_strings_or_bare_tokens() {
        assert_eq!(key_of("\"abc-1\"").unwrap().as_deref(), Some("abc-1"));
        assert_eq!(key_of("abc-1").unwrap().as_deref(), Some("abc-1"));
        assert_eq!(key_of(r#""a\"b\\c""#).unwrap().as_deref(), Some(r#"a"b\c"#));
        assert!(key_of("\"\"").is_err());
        assert!(key_of("\"open").is_err());
        assert!(key_of("\"x\"y").is_err());
        assert!(key_of(&"k".repeat(256)).is_err());
        assert_eq!(idempotency_key(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn try_again_statuses_are_not_stored() {
        assert!(storable(StatusCode::CREATED));
        assert!(storable(StatusCode::PAYMENT_REQUIRED));
        assert!(!storable(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!storable(StatusCode::TOO_MANY_REQUESTS));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let at = |d| {
            with_retry_after(problem(StatusCode::CONFLICT, ""), d).headers()[header::RETRY_AFTER]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(at(Duration::from_millis(1)), "1");
        assert_eq!(at(Duration::from_millis(1500)), "2");
        assert_eq!(at(Duration::ZERO), "1");
    }
}
