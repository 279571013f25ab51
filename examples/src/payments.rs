//! A small payments API on axum: `POST /payments` charges once per `Idempotency-Key` and tenant,
//! however often a client retries. Served by `examples/axum_payments.rs`, and driven over HTTP by the
//! integration tests.
//!
//! The handler is plain axum; [`IdempotencyLayer`] does the protocol: the key header, the tenant scope,
//! 409 while in flight, 422 for a reused key, replays with `Idempotent-Replayed: true`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotent_runtime::Idempotency;
use idempotent_runtime::http::IdempotencyLayer;
use serde::{Deserialize, Serialize};

/// What a client posts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewPayment {
    /// The amount, in the currency's minor unit.
    pub amount: u64,
    /// ISO 4217 code, lowercase.
    pub currency: String,
}

/// A charge made by the (fake) gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// `pay_<n>`, unique in the ledger.
    pub id: String,
    /// Whose payment it is.
    pub tenant: String,
    /// The amount charged.
    pub amount: u64,
    /// Its currency.
    pub currency: String,
}

/// Every charge the gateway made: what the tests count.
#[derive(Debug, Default)]
pub struct Ledger {
    charges: Mutex<Vec<Payment>>,
}

impl Ledger {
    /// Every charge so far, in order.
    #[must_use]
    pub fn charges(&self) -> Vec<Payment> {
        self.charges
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn charge(&self, tenant: &str, new: NewPayment) -> Payment {
        let mut charges = self.charges.lock().unwrap_or_else(PoisonError::into_inner);
        let payment = Payment {
            id: format!("pay_{}", charges.len() + 1),
            tenant: tenant.to_owned(),
            amount: new.amount,
            currency: new.currency,
        };
        charges.push(payment.clone());
        payment
    }
}

/// The largest amount the gateway accepts; above it, 402 (a final answer, stored and replayed).
pub const MAX_AMOUNT: u64 = 1_000_000;

#[derive(Clone)]
struct AppState {
    ledger: Arc<Ledger>,
    gateway_delay: Duration,
}

/// The caller's tenant: a stand-in for real authentication, `Authorization: Bearer sk_<tenant>`.
#[must_use]
pub fn tenant(headers: &HeaderMap) -> Option<String> {
    let token = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer sk_")?;
    (!token.is_empty()).then(|| token.to_owned())
}

/// The API: `POST /payments` behind the idempotency layer, on `idem`, recording charges in `ledger`;
/// the gateway takes `gateway_delay` per charge (long enough, in the example, to see a 409).
pub fn app(idem: Idempotency, ledger: Arc<Ledger>, gateway_delay: Duration) -> Router {
    let idempotency = IdempotencyLayer::new(idem, |parts: &Parts| tenant(&parts.headers))
        .namespace("payments")
        .ttl(Duration::from_hours(24));
    Router::new()
        .route("/payments", post(create_payment).layer(idempotency))
        .with_state(AppState {
            ledger,
            gateway_delay,
        })
}

async fn create_payment(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(new): Json<NewPayment>,
) -> Response {
    // The layer has already refused callers without a tenant; this is the handler's own check.
    let Some(tenant) = tenant(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if new.amount > MAX_AMOUNT {
        return (
            StatusCode::PAYMENT_REQUIRED,
            Json(serde_json::json!({ "error": "amount over the limit", "limit": MAX_AMOUNT })),
        )
            .into_response();
    }
    tokio::time::sleep(state.gateway_delay).await;
    let payment = state.ledger.charge(&tenant, new);
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/payments/{}", payment.id))],
        Json(payment),
    )
        .into_response()
}
