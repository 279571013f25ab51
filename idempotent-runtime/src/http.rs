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
//! | first with its key | the handler's own response, whole (headers, and a body of any size: what is kept for storage, up to `max_stored_response_bytes`, is read before the caller gets the head, the rest streams through); it is stored unless [it is not final](#which-responses-are-stored) |
//! | same key, same request, done | the stored status, [headers that matter](IdempotencyLayer::replay_header) and body, plus `Idempotent-Replayed: true` |
//! | same key, done, but its response could not be stored (too large, or its body failed while it was sent) | 410, saying the request was processed and its response cannot be sent again, plus `Idempotent-Replayed: true` ([below](#responses-that-cannot-be-stored)) |
//! | same key, still in flight | 409, `Retry-After` from the handle's retry hint; once the request's worker has stopped sending heartbeats, the seconds left on its lease ([`Error::InProgress`]'s `retry_hint`) |
//! | same key, another request (method, path and query, or body) | 422 |
//! | no `Idempotency-Key` | 400; with [`optional`](IdempotencyLayer::optional), passed to the handler without idempotency |
//! | an empty or malformed `Idempotency-Key` (several, not visible ASCII, bad quoting, over 255 bytes) | 400, `optional` or not: a key the client meant to send is never ignored |
//! | no caller identity | 401 |
//! | a request body over [the limit](IdempotencyLayer::max_request_bytes) | 413 |
//! | a request body whose stream failed (malformed framing, a body timeout in front) | 400 |
//! | the handler, or the identity or fingerprint function, panicked | 500; nothing is stored and the key is free at once |
//! | the store throttled or is unavailable | 503, `Retry-After` |
//! | the store is not set up: the table is missing, refused the credentials, or has another key schema | 500, without an invitation to retry (the runtime logs an `error` event saying what to do, e.g. create the table with `DynamoDbStore::ensure_table`) |
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
//! # Scoping
//!
//! The record key is `(identity, Idempotency-Key)`, so two callers that happen to send the same key
//! value never see each other's responses: the identity function is a required argument for that
//! reason. The request fingerprint is the method, the path and query *as the client sent them* (axum's
//! [`OriginalUri`], so a layer inside [`Router::nest`](axum::Router::nest)
//! sees the prefix that `nest` strips: `/accounts/A/payments` and `/accounts/B/payments`, or one API
//! mounted at `/test` and `/live`, are different requests) and a digest of the body
//! ([the fingerprint](#the-fingerprint)); with the path
//! and query the request was routed by when a middleware rewrote them after the outer router recorded
//! the client's (a version picked from a header behind [`Router::nest_service`](axum::Router::nest_service)),
//! and the body's `Content-Encoding` when it has one (the same bytes gzip-encoded or as they are are two
//! bodies). A key reused on another endpoint or with another body is a 422, never a replay of something
//! else.
//!
//! Anything else that selects the resource or the account a request acts on must be in the identity
//! the function returns: the `Host` when one service answers for several sites, an account or
//! environment header (`Stripe-Account`-style), a tenant taken from the TLS client certificate. What is
//! in neither the identity nor the fingerprint cannot tell two requests apart, and the second would get
//! the first one's response.
//!
//! # The fingerprint
//!
//! A retry of the same request is replayed however the client framed it again (the IETF draft leaves
//! the fingerprint to the server; Stripe replays a retry whatever its encoding). Common clients encode
//! a retry anew: Python's `gzip.compress` stamps the current second into a gzip header, and requests
//! and urllib3 draw a fresh random boundary for each multipart form. So the body's part of the default
//! fingerprint ([`request_fingerprint`]) is a digest of what the body says:
//!
//! - a body whose only `Content-Encoding` is `gzip` (or `x-gzip`): the SHA-256 of the content it
//!   inflates to, so the header's timestamp, file name and operating system, and the compression
//!   level, do not count. Inflating stops at 16 MiB; a body that inflates to more, or does not inflate,
//!   counts as its compressed stream without its header;
//! - a `multipart/*` body: the SHA-256 of its parts between the boundary delimiters, so the boundary
//!   does not count (a gzip-encoded multipart body counts by its inflated bytes, boundary included);
//! - any other body: the SHA-256 of its bytes.
//!
//! The `Content-Encoding` still counts (a `.gz` file uploaded as it is and the same bytes sent
//! gzip-encoded are two requests). Anything else that tells two requests apart for a service (a JSON
//! body by its meaning, a version header) goes into a fingerprint of its own:
//! [`IdempotencyLayer::fingerprint`].
//!
//! A replay is the first response as its request's negotiation made it. A compression layer between
//! this layer and the handler stores the coding the first client accepted (`Content-Encoding: gzip`),
//! and a retry whose `Accept-Encoding` does not take it gets it all the same: put compression *in
//! front of* this layer, where it encodes each answer, a replay too, for its own request.
//!
//! # Which responses are stored
//!
//! A response is the operation's final outcome, stored and replayed, when the handler began to act on
//! the request: 2xx, 3xx, and 4xx that are business outcomes (402 Payment Required, 410 Gone, ...).
//! Not stored, so a corrected or later retry with the same key runs again:
//!
//! - server errors (5xx) and the statuses that say "try again" (408, 409, 425, 429);
//! - rejections of the request's form, mostly answered before the handler ran (axum's extractors
//!   answer 400, 413, 415 and 422): 400, 401, 403, 404, 405, 406, 407, 411, 412, 413, 414, 415, 416,
//!   417, 421, 422, 426, 428 and 431. As Stripe puts it, a result is saved once the endpoint started
//!   executing.
//!
//! A handler whose rejection is final after all (it had effects, or the answer must not change) marks
//! its response with [`Final`]; [`IdempotencyLayer::store_status`] changes the rule for a status.
//!
//! # Trailers
//!
//! A request's trailers reach the handler after its body, as they came (they are not part of the
//! fingerprint, as headers are not). A response's trailers (gRPC's `grpc-status`, a checksum) reach
//! the first caller after the body, and are stored and replayed with it: every trailer but the fields
//! that cannot be trailers (framing, routing, authentication, the representation's headers) and
//! those about the connection or the moment (`Set-Cookie`, `Date`, `Server-Timing`); the same rule
//! decides what a replay sends, whoever wrote the record. Over HTTP/1.1, trailers travel only in a
//! chunked body, to a client that sent `TE: trailers`, and only those the response names in its
//! `Trailer` header: a response with trailers is sent chunked (never with a `Content-Length`), and a
//! replay names its stored trailers in a `Trailer` header. HTTP/2 sends them as they are.
//!
//! # Responses that cannot be stored
//!
//! Once the handler has answered with a status that is stored, its outcome is final, whatever happens to
//! its body: the handler never runs again for the key while the record lives. Its body is read into
//! memory for the record up to [`max_stored_response_bytes`](IdempotencyLayer::max_stored_response_bytes);
//! a larger body, one whose stream fails while it is read, or one over DynamoDB's item limit even
//! compressed ([`MAX_ITEM_BYTES`](crate::MAX_ITEM_BYTES)) is recorded as COMPLETED without it. The first
//! caller still gets the handler's own response, its body streamed through beyond what was buffered (a
//! failing body fails for it as it did for the handler). A retry gets **410 Gone**, an
//! `application/problem+json` body saying that the request was processed and its response cannot be
//! sent again, its `original_status` (and `location`, when the handler sent one) when they were stored,
//! and `Idempotent-Replayed: true`. 410 because it is final (a retry with the same key gets the same
//! answer; the 5xx "try again" would be a lie) and unlike every other answer of the layer; a client
//! that needs the resource reads it where it lives (`location`). The alternative, running the handler
//! again, is what the key exists to prevent.
//!
//! # A client that hangs up
//!
//! Hyper drops a handler's future when its client disconnects (an HTTP/1 connection's EOF, an HTTP/2
//! `RST_STREAM`), and so do timeouts in front of the service. Dropped mid-handler, the work would stop
//! at an arbitrary await, nothing would be stored, and the retry the client sends next would run the
//! handler again after the lease. So once a request has been read and checked, the layer runs the claim,
//! the handler and the storing of its response on a task of their own, tracked by the handle (a
//! graceful shutdown waits for it with [`Idempotency::drain`]); the service's future only awaits that
//! task. A client that leaves drops the waiter, not the work: the response is
//! stored as usual, and the retry gets it with `Idempotent-Replayed: true`. This needs a Tokio runtime
//! (axum's), and costs a task per request with a key. Put timeouts *in front of* the layer, where they
//! drop only the waiter: one between the layer and the handler cancels the handler itself, and its 408
//! or 503 is not stored, so the retry runs the handler again whatever the cancelled run had done.
//! Likewise a concurrency limit in front of the layer counts waiters, not running handlers (a client
//! that hangs up frees its slot while its handler runs on): to bound the handlers, put the limit
//! between the layer and the handler. On its own task, the handler sees the request's extensions and
//! the current `tracing` span, but not the task-locals (`tokio::task_local!`) that a layer in front
//! set; pass such context in the request's extensions.
//!
//! Handlers that must stop when their client is gone opt out with
//! [`cancel_with_client`](IdempotencyLayer::cancel_with_client): the handler then runs in the service's
//! future, as without the layer. A handler dropped mid-run that way leaves its key PENDING until the
//! lease runs out (it may have had effects; running it again early would be worse).
//!
//! # Panics
//!
//! A handler that panics is a failure: the record becomes FAILED with the text `panicked: <message>`,
//! so the key is free at once, and the client gets a 500 `application/problem+json`. The panic does not
//! reach hyper, which would close the connection without an answer. An identity or fingerprint
//! function that panics gets the same 500 before anything is claimed, so the key stays free. A response *body* that panics after
//! the handler answered with a stored status is a body that failed mid-stream: the outcome is final, as
//! [above](#responses-that-cannot-be-stored).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::OriginalUri;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::request::Parts;
use axum::http::{Request, Response, StatusCode};
use axum::response::{IntoResponseParts, ResponseParts};
use futures_util::FutureExt as _;
use http_body::{Frame, SizeHint};
use serde::{Deserialize, Serialize};
use tracing::Instrument as _;

use crate::{Error, Idempotency};

mod fingerprint;

/// The request header carrying the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The response header that marks a replayed response (`true`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The longest key accepted, in bytes (longer ones are a 400).
pub const MAX_KEY_BYTES: usize = crate::key::http::MAX_KEY_BYTES;
/// The default limit on request bodies (1 MiB); see [`IdempotencyLayer::max_request_bytes`].
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;
/// The default limit on the response bodies that are stored (1 MiB); see
/// [`IdempotencyLayer::max_stored_response_bytes`].
pub const DEFAULT_MAX_STORED_RESPONSE_BYTES: usize = 1 << 20;

/// Who is asking: returns the caller's identity (a tenant, an account, an API key's owner) from the
/// request, or `None` when there is none (the request is refused with 401).
type Identity = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// What tells two requests with the same key apart: see [`IdempotencyLayer::fingerprint`].
type Fingerprint = dyn Fn(&Parts, &[u8]) -> Vec<String> + Send + Sync;

/// Marks a handler's response as final: stored and replayed whatever its status, also one that the
/// layer would not store by default (a rejection such as 403, or a 5xx). See
/// [which responses are stored](self#which-responses-are-stored).
///
/// ```
/// use axum::http::StatusCode;
/// use idempotent_runtime::http::Final;
///
/// // The refusal is the operation's outcome (the account was frozen by this very request's checks):
/// // a retry with the same key gets the same 403.
/// async fn transfer() -> (StatusCode, Final, &'static str) {
///     (StatusCode::FORBIDDEN, Final, "account frozen")
/// }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Final;

impl IntoResponseParts for Final {
    type Error = Infallible;

    fn into_response_parts(self, mut parts: ResponseParts) -> Result<ResponseParts, Infallible> {
        parts.extensions_mut().insert(self);
        Ok(parts)
    }
}

/// A tower layer that makes the services it wraps idempotent per `Idempotency-Key` header and caller.
/// See the [module docs](self).
#[derive(Clone)]
pub struct IdempotencyLayer {
    settings: Arc<Settings>,
}

struct Settings {
    idem: Idempotency,
    identity: Box<Identity>,
    fingerprint: Box<Fingerprint>,
    namespace: &'static str,
    required: bool,
    max_request_bytes: usize,
    max_stored_response_bytes: usize,
    replay_headers: Vec<HeaderName>,
    /// Statuses whose storing [`IdempotencyLayer::store_status`] decided, the last word first.
    statuses: Vec<(StatusCode, bool)>,
    /// Whether the work runs on a task of its own (not cancelled with its client).
    detached: bool,
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
            .field("max_request_bytes", &s.max_request_bytes)
            .field("max_stored_response_bytes", &s.max_stored_response_bytes)
            .field("replay_headers", &s.replay_headers)
            .field("statuses", &s.statuses)
            .field("detached", &s.detached)
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
    /// for all of them. Whatever else selects the resource a request acts on and is not in its method,
    /// path, query or body (the `Host`, an account header) belongs in it too: see
    /// [scoping](self#scoping).
    pub fn new(
        idem: Idempotency,
        identity: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            settings: Arc::new(Settings {
                idem,
                identity: Box::new(identity),
                fingerprint: Box::new(request_fingerprint),
                namespace: crate::key::http::DEFAULT_HTTP_NAMESPACE,
                required: true,
                max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
                max_stored_response_bytes: DEFAULT_MAX_STORED_RESPONSE_BYTES,
                // The representation's own headers (RFC 9110 §8: what the body is and how it is
                // encoded, without which the replayed bytes are read wrong), its validators, and where
                // the created resource lives.
                replay_headers: vec![
                    header::CONTENT_TYPE,
                    header::CONTENT_ENCODING,
                    header::CONTENT_LANGUAGE,
                    header::CONTENT_LOCATION,
                    header::CONTENT_DISPOSITION,
                    HeaderName::from_static("content-digest"),
                    HeaderName::from_static("repr-digest"),
                    header::LOCATION,
                    header::ETAG,
                    header::LAST_MODIFIED,
                ],
                statuses: Vec::new(),
                detached: true,
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

    /// The key namespace of the records (default [`DEFAULT_HTTP_NAMESPACE`](crate::DEFAULT_HTTP_NAMESPACE),
    /// `"http"`): give each API its own, so that keys and stored responses of two APIs on one table
    /// never meet. A request's record key is [`derive_http_key`](crate::derive_http_key)`(namespace,
    /// identity, key)`; `idempotent key show --http IDENTITY KEY --namespace NS` shows it.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn namespace(mut self, namespace: &'static str) -> Self {
        self.settings().namespace = namespace;
        self
    }

    /// Requests without an `Idempotency-Key` header pass through without idempotency, instead of a 400.
    /// A request whose key is present but empty or malformed is still a 400: the client meant to send
    /// one, and running its request without would lose the guarantee it asked for.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn optional(mut self) -> Self {
        self.settings().required = false;
        self
    }

    /// The largest request body (default [`DEFAULT_MAX_REQUEST_BYTES`]): the layer reads it whole to
    /// fingerprint it; a larger one is a 413, and nothing runs.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn max_request_bytes(mut self, limit: usize) -> Self {
        self.settings().max_request_bytes = limit;
        self
    }

    /// The largest response body that is stored for replay (default
    /// [`DEFAULT_MAX_STORED_RESPONSE_BYTES`]): the most a request holds in memory for its record. A
    /// larger response still goes to the first caller whole, and is recorded as processed without its
    /// body: a retry gets the 410 described under
    /// [responses that cannot be stored](self#responses-that-cannot-be-stored), and the handler does
    /// not run again. Above about 400 KB a response is stored only if it compresses into DynamoDB's
    /// item limit ([`MAX_ITEM_BYTES`](crate::MAX_ITEM_BYTES)); JSON usually does, several times over.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn max_stored_response_bytes(mut self, limit: usize) -> Self {
        self.settings().max_stored_response_bytes = limit;
        self
    }

    /// Whether responses with `status` are stored and replayed (`true`) or not, so that a retry with
    /// the same key runs again (`false`), instead of the default rule (see
    /// [which responses are stored](self#which-responses-are-stored)); the last call for a status
    /// wins. A response marked [`Final`] is stored whatever its status.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use idempotent_runtime::{Idempotency, http::IdempotencyLayer};
    ///
    /// // This API's 404 means "that order was cancelled", an outcome to replay.
    /// let layer = IdempotencyLayer::new(Idempotency::in_memory(), |_| Some("all".into()))
    ///     .store_status(StatusCode::NOT_FOUND, true);
    /// ```
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn store_status(mut self, status: StatusCode, store: bool) -> Self {
        self.settings().statuses.insert(0, (status, store));
        self
    }

    /// One more response header to store and replay, besides the representation's (`Content-Type`,
    /// `Content-Encoding`, `Content-Language`, `Content-Location`, `Content-Disposition`,
    /// `Content-Digest`, `Repr-Digest`), `Location`, `ETag` and `Last-Modified`. Headers about the
    /// connection or the moment (`Date`, `Set-Cookie`, rate limits) are not replayed. Values are kept
    /// byte for byte, UTF-8 or not.
    ///
    /// The list applies to replays as well as to storing: a record holding other headers (written by
    /// another service on the table, or tampered with) is replayed without them.
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.settings().replay_headers.push(name);
        self
    }

    /// How the layer tells two requests with the same key apart, instead of
    /// [`request_fingerprint`]: `fingerprint` gets the request's head and its whole body, and returns
    /// the values whose hash is stored with the record; a later request with the key and other values
    /// is a 422, never a replay. The same request must give the same values however the client framed
    /// it (the IETF draft leaves the fingerprint to the server), and two requests that must not share a
    /// response must give different ones: start from [`request_fingerprint`], which covers the method,
    /// the path and query, and the body, and add to it or replace its body digest. A `fingerprint`
    /// that panics gets a 500, and nothing is claimed.
    ///
    /// ```
    /// use axum::http::request::Parts;
    /// use idempotent_runtime::Idempotency;
    /// use idempotent_runtime::http::{IdempotencyLayer, request_fingerprint};
    ///
    /// let layer = IdempotencyLayer::new(Idempotency::in_memory(), |_: &Parts| Some("all".into()))
    ///     .fingerprint(|parts, body| {
    ///         // A JSON body by its meaning: member order and white space do not count. (A member
    ///         // that appears twice counts as its last value, as serde_json reads it.)
    ///         let canonical = serde_json::from_slice::<serde_json::Value>(body)
    ///             .map(|json| json.to_string().into_bytes());
    ///         let mut fingerprint = request_fingerprint(parts, canonical.as_deref().unwrap_or(body));
    ///         // The API version selects the behaviour: the same body under another is another request.
    ///         let version = parts.headers.get("api-version").map(|v| v.as_bytes().to_vec());
    ///         fingerprint.push(format!("api-version {version:?}"));
    ///         fingerprint
    ///     });
    /// ```
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn fingerprint(
        mut self,
        fingerprint: impl Fn(&Parts, &[u8]) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.settings().fingerprint = Box::new(fingerprint);
        self
    }

    /// The handler is cancelled when its client hangs up (its future is dropped with the service's),
    /// instead of running to completion on a task of its own: for handlers that must stop when nobody
    /// waits. A handler dropped mid-run leaves its key PENDING until the lease runs out; see
    /// [a client that hangs up](self#a-client-that-hangs-up).
    ///
    /// # Panics
    /// When the layer was cloned already (configure it first).
    #[must_use]
    pub fn cancel_with_client(mut self) -> Self {
        self.settings().detached = false;
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
        Box::pin(async move { Ok(Settings::handle(settings, inner, request).await) })
    }
}

/// What is stored for a response: enough to send it again.
#[derive(Serialize, Deserialize)]
struct StoredResponse {
    status: u16,
    headers: Vec<(String, StoredValue)>,
    body: StoredBody,
    /// The body's trailers ([`replays_trailer`]); absent from records of responses without any, which
    /// are stored as they always were.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    trailers: Vec<(String, StoredValue)>,
}

/// A header value as stored: text when it is UTF-8 (readable in the table, and what records held before
/// values of other bytes were kept), else its bytes in hex (`{"hex": ".."}`), so that a Latin-1
/// `Content-Disposition` file name is replayed byte for byte.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredValue {
    Text(String),
    Bytes { hex: String },
}

impl StoredValue {
    fn new(value: &HeaderValue) -> Self {
        match std::str::from_utf8(value.as_bytes()) {
            Ok(text) => StoredValue::Text(text.to_owned()),
            Err(_) => StoredValue::Bytes {
                hex: hex::encode(value.as_bytes()),
            },
        }
    }

    /// The value, when it is one a header can carry (a record is untrusted input).
    fn to_header(&self) -> Option<HeaderValue> {
        match self {
            StoredValue::Text(text) => HeaderValue::from_str(text).ok(),
            StoredValue::Bytes { hex } => HeaderValue::from_bytes(&hex::decode(hex).ok()?).ok(),
        }
    }
}

/// The most bytes of JSON a [`StoredResponse`] with a body of at most `max_body` bytes can take, so
/// that a replay inflates no more than the layer could have stored: the body written as a JSON string
/// (a control character takes six bytes, `\u0000`; hex two per byte), and the status and headers in
/// [`STORED_HEADERS_JSON_BYTES`] (a response whose headers need more is recorded without its body).
fn stored_json_bound(max_body: usize) -> usize {
    max_body
        .saturating_mul(6)
        .saturating_add(STORED_HEADERS_JSON_BYTES)
}

/// The room for a stored response's status and headers in [`stored_json_bound`] (64 KiB of JSON).
const STORED_HEADERS_JSON_BYTES: usize = 64 * 1024;

/// A body as text when it is UTF-8 (JSON APIs: stored as is, readable in the table), hex otherwise;
/// or the mark of a body that was not stored (too large, or failed while it was read).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoredBody {
    Text(String),
    Hex(String),
    Unstored,
}

impl StoredBody {
    fn new(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) => StoredBody::Text(text),
            Err(e) => StoredBody::Hex(hex::encode(e.into_bytes())),
        }
    }

    fn into_bytes(self) -> Option<Vec<u8>> {
        match self {
            StoredBody::Text(text) => Some(text.into_bytes()),
            StoredBody::Hex(hex) => hex::decode(hex).ok(),
            StoredBody::Unstored => None,
        }
    }
}

/// Why the operation's body did not produce a response to store.
enum Failure {
    /// The handler's response is not one to replay (a 5xx, say): the client gets it, and may retry.
    NotStored(Response<Body>),
    /// The handler panicked, with this message.
    Panicked(String),
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
            Failure::Panicked(message) => write!(f, "panicked: {message}"),
            Failure::Idempotency(e) => e.fmt(f),
        }
    }
}

/// Whether a response with `status` is the operation's final outcome by default (see
/// [which responses are stored](self#which-responses-are-stored)): not a server error, not a status
/// that says "try again" (408, 409, 425, 429), and not a rejection of the request's form.
fn storable(status: StatusCode) -> bool {
    !status.is_server_error()
        && !matches!(
            status.as_u16(),
            // Try again.
            408 | 409 | 425 | 429
            // The request's form: syntax, credentials, permissions, target, method, negotiation,
            // framing, preconditions, size, media type, validation, protocol.
            | 400 | 401 | 403 | 404 | 405 | 406 | 407 | 411 | 412 | 413 | 414 | 415 | 416 | 417
            | 421 | 422 | 426 | 428 | 431
        )
}

/// What the first caller gets when its handler ran: its own status and headers, and its body (what was
/// read for the record, then the rest of the stream or the error that ended it).
struct Original {
    parts: axum::http::response::Parts,
    body: Passthrough,
}

impl Settings {
    /// The request's checks (key, identity, body, fingerprint), then the operation: on a task of its
    /// own unless the layer cancels with the client.
    async fn handle<S>(this: Arc<Self>, mut inner: S, request: Request<Body>) -> Response<Body>
    where
        S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
            + Send
            + 'static,
        S::Future: Send,
    {
        if request.method().is_safe() {
            return pass(&mut inner, request).await;
        }
        let key = match idempotency_key(request.headers()) {
            Ok(Some(key)) => key,
            Ok(None) if !this.required => return pass(&mut inner, request).await,
            Ok(None) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "this operation requires an `Idempotency-Key` header: a unique value per request, such as a UUID, sent again unchanged with each retry",
                );
            }
            Err(why) => return problem(StatusCode::BAD_REQUEST, why),
        };
        let (parts, body) = request.into_parts();
        // The service's own code, run in the service's future: its panic must not reach hyper, which
        // would close the connection without an answer. Nothing is claimed yet, so the key stays free.
        let identity = match std::panic::catch_unwind(AssertUnwindSafe(|| (this.identity)(&parts)))
        {
            Ok(Some(identity)) => identity,
            Ok(None) => {
                return problem(
                    StatusCode::UNAUTHORIZED,
                    "an `Idempotency-Key` is scoped by the caller, and this request does not say who the caller is",
                );
            }
            Err(panic) => {
                tracing::error!(namespace = this.namespace, panic = %panic_message(&*panic), "the identity function panicked; nothing was processed");
                return panicked();
            }
        };
        let (bytes, trailers) = match read_request(body, this.max_request_bytes).await {
            Ok(read) => read,
            Err(RequestBody::TooLarge) => {
                return problem(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("the request body is over {} bytes", this.max_request_bytes),
                );
            }
            Err(RequestBody::Failed(e)) => {
                tracing::info!(namespace = this.namespace, error = %e, "the request body could not be read");
                return problem(
                    StatusCode::BAD_REQUEST,
                    "the request body could not be read to its end; nothing was processed, and it may be sent again with the same key",
                );
            }
        };
        let fingerprint = match std::panic::catch_unwind(AssertUnwindSafe(|| {
            (this.fingerprint)(&parts, &bytes)
        })) {
            Ok(fingerprint) => fingerprint,
            Err(panic) => {
                tracing::error!(namespace = this.namespace, panic = %panic_message(&*panic), "the fingerprint function panicked; nothing was processed");
                return panicked();
            }
        };
        let request = Request::from_parts(parts, Buffered::body(bytes, trailers));
        let scope = crate::key::http::scope(identity, key);
        if !this.detached {
            return this.execute(inner, request, &scope, &fingerprint).await;
        }
        let settings = this.clone();
        let work = async move { settings.execute(inner, request, &scope, &fingerprint).await };
        // Dropping the handle (the client hung up) detaches the task; it runs on and stores its result.
        // Tracked by the handle, so that `Idempotency::drain` waits for it at shutdown.
        match this.idem.tasks().spawn(work.in_current_span()).await {
            Ok(response) => response,
            Err(e) if e.is_panic() => {
                tracing::error!(namespace = this.namespace, error = %e, "idempotent request panicked");
                panicked()
            }
            Err(e) => {
                tracing::warn!(namespace = this.namespace, error = %e, "idempotent request cancelled");
                with_retry_after(
                    problem(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the service is shutting down; retry with the same key",
                    ),
                    Duration::from_secs(1),
                )
            }
        }
    }

    /// The operation: claim, the handler, its response stored (or the stored one replayed).
    async fn execute<S>(
        &self,
        mut inner: S,
        request: Request<Body>,
        scope: &crate::key::http::Scope,
        fingerprint: &[String],
    ) -> Response<Body>
    where
        S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    {
        let mut operation = self
            .idem
            .operation(self.namespace, scope)
            .payload(fingerprint)
            .max_response_bytes(stored_json_bound(self.max_stored_response_bytes));
        if let Some(ttl) = self.ttl {
            operation = operation.ttl(ttl);
        }
        if let Some(lease) = self.lease {
            operation = operation.lease(lease);
        }
        if let Some(wait) = self.wait {
            operation = operation.wait(wait);
        }
        // The first caller gets the handler's response as it was, not the stored copy: all its headers,
        // and a body that may not have been stored at all.
        let original: Mutex<Option<Original>> = Mutex::new(None);
        let run = operation.run(|_| async {
            let response = match AssertUnwindSafe(pass(&mut inner, request))
                .catch_unwind()
                .await
            {
                Ok(response) => response,
                Err(panic) => return Err(Failure::Panicked(panic_message(&*panic))),
            };
            if !self.stores(&response) {
                return Err(Failure::NotStored(response));
            }
            let (parts, body) = response.into_parts();
            let (body, whole) = Passthrough::read(body, self.max_stored_response_bytes).await;
            let (body_bytes, trailers) = match whole {
                Some((bytes, trailers)) => (StoredBody::new(bytes), stored_trailers(&trailers)),
                None => (StoredBody::Unstored, Vec::new()),
            };
            let stored = StoredResponse {
                status: parts.status.as_u16(),
                headers: self.stored_headers(&parts.headers),
                body: body_bytes,
                trailers,
            };
            *original.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(Original { parts, body });
            Ok(stored)
        });
        let result = run.await;
        let original = original
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        match (result, original) {
            // The handler ran in this call: its own response.
            (Ok(_), Some(original)) => {
                Response::from_parts(original.parts, Body::new(original.body))
            }
            (Ok(stored), None) => self.replay(stored),
            (Err(Failure::NotStored(response)), _) => response,
            (Err(Failure::Panicked(message)), _) => {
                tracing::error!(namespace = self.namespace, panic = %message, "the handler panicked; recorded as failed");
                panicked()
            }
            // The handler ran, but its response was not stored (the claim was taken over, or the store
            // stayed down for the whole lease): the client still gets what the handler answered, which
            // tells it what happened better than a 5xx inviting it to run the request again.
            (Err(Failure::Idempotency(e)), Some(original)) => {
                tracing::warn!(namespace = self.namespace, error = %e, "the handler's response could not be stored; sent to its caller only");
                Response::from_parts(original.parts, Body::new(original.body))
            }
            (Err(Failure::Idempotency(e)), None) => error_response(&e),
        }
    }

    /// Whether `response` is stored: marked [`Final`], or its status is stored by the layer's rule.
    fn stores(&self, response: &Response<Body>) -> bool {
        if response.extensions().get::<Final>().is_some() {
            return true;
        }
        let status = response.status();
        self.statuses
            .iter()
            .find(|(s, _)| *s == status)
            .map_or_else(|| storable(status), |(_, store)| *store)
    }

    /// The headers of `headers` that are stored for replay (see [`IdempotencyLayer::replay_header`]),
    /// their values byte for byte.
    fn stored_headers(&self, headers: &HeaderMap) -> Vec<(String, StoredValue)> {
        headers
            .iter()
            .filter(|(name, _)| self.replay_headers.contains(name))
            .map(|(name, value)| (name.as_str().to_owned(), StoredValue::new(value)))
            .collect()
    }

    /// The stored headers that a replay sends: only those the layer stores, whoever wrote the record (a
    /// record is untrusted input: one written by another service on the table, or tampered with, could
    /// otherwise set a cookie), and only names and values a header can carry. An error for more than a
    /// header map holds (a crafted record): the stored response is unreadable.
    fn replayed_headers(
        &self,
        stored: &[(String, StoredValue)],
    ) -> Result<HeaderMap, axum::http::header::MaxSizeReached> {
        let mut headers = HeaderMap::new();
        for (name, value) in stored {
            let Ok(name) = HeaderName::try_from(name.as_str()) else {
                continue;
            };
            if !self.replay_headers.contains(&name) {
                continue;
            }
            if let Some(value) = value.to_header() {
                headers.try_append(name, value)?;
            }
        }
        Ok(headers)
    }

    /// A stored response, sent again with `Idempotent-Replayed: true`, its trailers after its body (and
    /// named in a `Trailer` header, which HTTP/1.1 needs to send them); one stored without its body is
    /// the 410 of [`not_replayable`].
    fn replay(&self, stored: StoredResponse) -> Response<Body> {
        let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
        let (Ok(mut headers), Ok(trailers)) = (
            self.replayed_headers(&stored.headers),
            replayed_trailers(&stored.trailers),
        ) else {
            return problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the stored response is unreadable",
            );
        };
        let mut response = match stored.body {
            StoredBody::Unstored => {
                let location = headers
                    .get(header::LOCATION)
                    .and_then(|value| value.to_str().ok());
                return not_replayable(Some(status), location);
            }
            body => match body.into_bytes() {
                Some(body) => {
                    if let Some(trailers) = &trailers {
                        let names: Vec<&str> = trailers.keys().map(HeaderName::as_str).collect();
                        if let Ok(value) = HeaderValue::from_str(&names.join(", ")) {
                            headers.insert(header::TRAILER, value);
                        }
                    }
                    Response::new(Buffered::body(body.into(), trailers))
                }
                None => {
                    return problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the stored response is unreadable",
                    );
                }
            },
        };
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        response
    }
}

/// The trailers of `trailers` that are stored ([`replays_trailer`]), values byte for byte.
fn stored_trailers(trailers: &HeaderMap) -> Vec<(String, StoredValue)> {
    trailers
        .iter()
        .filter(|(name, _)| replays_trailer(name))
        .map(|(name, value)| (name.as_str().to_owned(), StoredValue::new(value)))
        .collect()
}

/// The stored trailers a replay sends (by the rule they were stored by, whoever wrote the record), or
/// `None` when there are none; an error for more than a header map holds (a crafted record): the stored
/// response is unreadable.
fn replayed_trailers(
    stored: &[(String, StoredValue)],
) -> Result<Option<HeaderMap>, axum::http::header::MaxSizeReached> {
    let mut trailers = HeaderMap::new();
    for (name, value) in stored {
        let Ok(name) = HeaderName::try_from(name.as_str()) else {
            continue;
        };
        if let (true, Some(value)) = (replays_trailer(&name), value.to_header()) {
            trailers.try_append(name, value)?;
        }
    }
    Ok((!trailers.is_empty()).then_some(trailers))
}

/// Why a request body was not read.
enum RequestBody {
    /// Over the limit: said by its `Content-Length`, or found while it was read.
    TooLarge,
    /// Its stream failed (malformed framing, a client gone, a body timeout in front).
    Failed(axum::Error),
}

/// The request body, whole, if it is at most `limit` bytes; one whose declared length is over the
/// limit is refused before a byte of it is read (and before a `100 Continue`).
/// With its trailers, when it has some: they are passed on to the handler (a checksum, gRPC's
/// metadata), not fingerprinted.
async fn read_request(
    mut body: Body,
    limit: usize,
) -> Result<(Bytes, Option<HeaderMap>), RequestBody> {
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    if body.size_hint().lower() > limit {
        return Err(RequestBody::TooLarge);
    }
    let mut chunks = Vec::new();
    let mut trailers: Option<HeaderMap> = None;
    let mut len = 0_u64;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let data = match frame.map_err(RequestBody::Failed)?.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    trailers.get_or_insert_default().extend(more);
                }
                continue;
            }
        };
        len = len.saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
        if len > limit {
            return Err(RequestBody::TooLarge);
        }
        chunks.push(data);
    }
    // One chunk (a body with a `Content-Length`, mostly) as it came; several joined.
    let bytes = match chunks.len() {
        1 => chunks.pop().unwrap_or_default(),
        _ => chunks.concat().into(),
    };
    Ok((bytes, trailers))
}

/// A body read whole, sent again: its bytes, then its trailers when it has some. With trailers its
/// size is not given as exact, so that HTTP/1.1 sends it chunked, the only framing with trailers.
struct Buffered {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Buffered {
    /// `data` and `trailers` as a body: a plain one without trailers.
    fn body(data: Bytes, trailers: Option<HeaderMap>) -> Body {
        match trailers {
            None => Body::from(data),
            Some(trailers) => Body::new(Buffered {
                data: (!data.is_empty()).then_some(data),
                trailers: Some(trailers),
            }),
        }
    }
}

impl HttpBody for Buffered {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let frame = match this.data.take() {
            Some(data) => Frame::data(data),
            None => match this.trailers.take() {
                Some(trailers) => Frame::trailers(trailers),
                None => return Poll::Ready(None),
            },
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        hint.set_lower(self.data.as_ref().map_or(0, |d| d.len() as u64));
        hint
    }
}

/// Whether a response trailer is stored and replayed: every field but those that cannot be trailers
/// (RFC 9110 §6.5.1: framing, routing, authentication, response control, the representation's
/// headers, as hyper refuses them) and those about the connection or the moment (`Set-Cookie`,
/// `Date`, `Server-Timing`). Trailers carry values whose names the application chooses (gRPC's
/// `grpc-status`, checksums), so this is a list of what never is, not of what is. The same rule
/// decides what a replay sends, whoever wrote the record.
fn replays_trailer(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "authorization"
            | "cache-control"
            | "connection"
            | "content-encoding"
            | "content-length"
            | "content-range"
            | "content-type"
            | "date"
            | "expires"
            | "host"
            | "keep-alive"
            | "location"
            | "max-forwards"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "retry-after"
            | "server-timing"
            | "set-cookie"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "www-authenticate"
    )
}

/// The layer's default request fingerprint: what tells a request apart from another with the same key
/// (a key reused with another fingerprint is a 422). In order:
///
/// 1. the method;
/// 2. the path and query as the client sent them (axum's [`OriginalUri`]: a router that `nest`s this
///    one stripped its prefix, the account or the mode, from `parts.uri`);
/// 3. the digest of the body: the SHA-256 of its bytes, except that a gzip body (`Content-Encoding:
///    gzip`) is hashed by the content it inflates to, and a `multipart/*` body without its boundary, so
///    that a retry the client encoded again is the same request (see
///    [the fingerprint](self#the-fingerprint));
/// 4. only when they differ from the second (so that a plain request's fingerprint is the same three
///    values it always was), `routed <path and query>`: the URI the request was routed by (`nest`'s
///    stripped path, or a middleware's rewrite after the outer router recorded the client's URI, such
///    as a version picked from a header behind `nest_service`);
/// 5. `content-encoding <coding>` for each `Content-Encoding` of the body (the same bytes gzip-encoded
///    or as they are are two bodies).
///
/// A service that defines its own with [`IdempotencyLayer::fingerprint`] can start from this one.
#[must_use]
pub fn request_fingerprint(parts: &Parts, body: &[u8]) -> Vec<String> {
    fn target(uri: &axum::http::Uri) -> String {
        uri.path_and_query()
            .map_or_else(|| uri.path().to_owned(), ToString::to_string)
    }
    let sent = parts
        .extensions
        .get::<OriginalUri>()
        .map_or_else(|| target(&parts.uri), |original| target(&original.0));
    let routed = target(&parts.uri);
    let mut fingerprint = vec![
        parts.method.as_str().to_owned(),
        sent,
        fingerprint::body_digest(&parts.headers, body),
    ];
    if fingerprint[1] != routed {
        fingerprint.push(format!("routed {routed}"));
    }
    for encoding in parts.headers.get_all(header::CONTENT_ENCODING) {
        fingerprint.push(format!(
            "content-encoding {}",
            String::from_utf8_lossy(encoding.as_bytes())
        ));
    }
    fingerprint
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

/// A panic's message, when it has one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The answer to a request whose handler panicked: it was recorded as failed, so the key is free, and
/// a retry runs the handler again, effects and all: the body says so rather than promise nothing happened.
fn panicked() -> Response<Body> {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the request failed unexpectedly; no response was stored for its key, so the same request sent again runs the handler again, and what the handler did before it failed (a charge, an email) may happen a second time",
    )
}

/// A response body as the first caller gets it: the frames read for the record, then the rest of the
/// handler's body (streamed, never buffered), or the error that ended it.
struct Passthrough {
    read: VecDeque<Frame<Bytes>>,
    rest: Rest,
}

/// What follows the frames a [`Passthrough`] read.
enum Rest {
    /// The handler's body, not read to its end.
    Body(Body),
    /// The body failed while it was read: its error comes next, as it came to the layer.
    Failed(Option<axum::Error>),
    Done,
}

impl Passthrough {
    /// Reads `body` until its end, its error, or `limit` bytes and more; with the bytes to store when
    /// the body was read whole within `limit`. A body that panics ends as a failed one.
    async fn read(mut body: Body, limit: usize) -> (Passthrough, Option<(Vec<u8>, HeaderMap)>) {
        let mut read = VecDeque::new();
        let mut len = 0_usize;
        let rest = AssertUnwindSafe(async {
            loop {
                if len > limit {
                    return None;
                }
                match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                    None => return Some(Rest::Done),
                    Some(Ok(frame)) => {
                        len += frame.data_ref().map_or(0, Bytes::len);
                        read.push_back(frame);
                    }
                    Some(Err(e)) => return Some(Rest::Failed(Some(e))),
                }
            }
        })
        .catch_unwind()
        .await;
        let rest = match rest {
            Ok(Some(rest)) => rest,
            Ok(None) => {
                tracing::info!(
                    bytes_over = limit,
                    "response over `max_stored_response_bytes`: recorded as processed without its body"
                );
                Rest::Body(body)
            }
            Err(panic) => Rest::Failed(Some(axum::Error::new(std::io::Error::other(format!(
                "the response body panicked: {}",
                panic_message(&*panic)
            ))))),
        };
        let whole = matches!(rest, Rest::Done).then(|| {
            let mut bytes = Vec::with_capacity(len);
            let mut trailers = HeaderMap::new();
            for frame in &read {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                } else if let Some(more) = frame.trailers_ref() {
                    trailers.extend(more.clone());
                }
            }
            (bytes, trailers)
        });
        if let Rest::Failed(Some(e)) = &rest {
            tracing::warn!(error = %e, "the response body failed after the handler answered; recorded as processed without its body");
        }
        (Passthrough { read, rest }, whole)
    }
}

impl HttpBody for Passthrough {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match &mut this.rest {
            Rest::Body(body) => Pin::new(body).poll_frame(cx),
            Rest::Failed(error) => Poll::Ready(error.take().map(Err)),
            Rest::Done => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && match &self.rest {
                Rest::Body(body) => body.is_end_stream(),
                Rest::Failed(error) => error.is_none(),
                Rest::Done => true,
            }
    }

    fn size_hint(&self) -> SizeHint {
        let read: usize = self
            .read
            .iter()
            .filter_map(Frame::data_ref)
            .map(Bytes::len)
            .sum();
        let read = u64::try_from(read).unwrap_or(u64::MAX);
        match &self.rest {
            // Trailers follow: not an exact size, which would make HTTP/1.1 send a `Content-Length`
            // and drop them.
            Rest::Done if self.read.iter().any(Frame::is_trailers) => {
                let mut hint = SizeHint::new();
                hint.set_lower(read);
                hint
            }
            Rest::Done => SizeHint::with_exact(read),
            Rest::Body(body) => {
                let rest = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
            Rest::Failed(_) => {
                let mut hint = SizeHint::new();
                hint.set_lower(read);
                hint
            }
        }
    }
}

/// The answer to a retry of a request that was processed but whose response was not stored: 410, with
/// the original status and location when they are known, and `Idempotent-Replayed: true`. See
/// [responses that cannot be stored](self#responses-that-cannot-be-stored).
fn not_replayable(original: Option<StatusCode>, location: Option<&str>) -> Response<Body> {
    let status = StatusCode::GONE;
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Gone"),
        "status": status.as_u16(),
        "detail": "the request with this `Idempotency-Key` was processed, but its response could not be stored (too large, or its body failed while it was sent), so it cannot be sent again; the request will not be processed again with this key",
    });
    if let Some(original) = original {
        body["original_status"] = original.as_u16().into();
    }
    if let Some(location) = location {
        body["location"] = location.into();
    }
    let mut response = problem_response(status, &body);
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// The request's key: `None` when absent; an error text when it is not one usable key (see
/// [`key_of_header`](crate::key::http::key_of_header), which `derive_http_key` shares).
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
        .map_err(|_| "the `Idempotency-Key` header must be visible ASCII")?;
    crate::key::http::key_of_header(text).map(Some)
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
        // Stored as COMPLETED without its response (over DynamoDB's item limit even compressed): the
        // request was processed, and is not run again.
        Error::ResponseTooLarge { .. } => not_replayable(None, None),
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
        // The runtime logged it at `error` level, with what to do. Nothing a client does helps, so
        // the answer does not invite a retry; the table's name stays out of it.
        error if error.is_setup() => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the service's idempotency store is not set up, so the request was not processed; the service's error log says what to do",
        ),
        _ => {
            tracing::error!(namespace = error.namespace(), error = %error, "idempotency failed");
            problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                if error.is_retryable() {
                    "the request could not be processed idempotently; retry with the same key"
                } else {
                    "the request could not be processed idempotently because of a problem in the service; the service's error log says more"
                },
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
    problem_response(status, &body)
}

/// A response with `status` and the problem document `body`.
fn problem_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
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
    fn try_again_statuses_and_rejections_of_the_form_are_not_stored() {
        assert!(storable(StatusCode::CREATED));
        assert!(storable(StatusCode::SEE_OTHER));
        assert!(storable(StatusCode::PAYMENT_REQUIRED));
        assert!(storable(StatusCode::GONE));
        assert!(!storable(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!storable(StatusCode::TOO_MANY_REQUESTS));
        for status in [400, 401, 403, 404, 405, 406, 411, 413, 414, 415, 422, 431] {
            assert!(!storable(StatusCode::from_u16(status).unwrap()), "{status}");
        }
    }

    #[test]
    fn a_final_mark_or_a_status_setting_overrides_the_rule() {
        let layer = IdempotencyLayer::new(Idempotency::in_memory(), |_| Some("all".into()))
            .store_status(StatusCode::NOT_FOUND, true)
            .store_status(StatusCode::ACCEPTED, false)
            .store_status(StatusCode::ACCEPTED, true)
            .store_status(StatusCode::CREATED, false);
        let with = |status: u16, mark: bool| {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::from_u16(status).unwrap();
            if mark {
                response.extensions_mut().insert(Final);
            }
            layer.settings.stores(&response)
        };
        assert!(with(404, false));
        assert!(with(202, false), "the last setting for a status wins");
        assert!(!with(201, false));
        assert!(with(201, true));
        assert!(with(403, true));
        assert!(with(500, true));
        assert!(!with(403, false));
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
