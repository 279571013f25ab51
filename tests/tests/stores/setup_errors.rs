//! A store that is not set up — the table missing, the credentials refused, a table of another key
//! schema — fails every call the same way until an operator acts: not retryable, an HTTP 500 that does
//! not invite a retry, and an `error` event that says which namespace, which table and what to do
//! (`ensure_table`). On DynamoDB Local, through `Operation`, the attribute and the HTTP layer; on the
//! memory store through a store that reports a missing table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use idempotent_runtime::aws_sdk_dynamodb::Client;
use idempotent_runtime::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idempotent_runtime::http::IdempotencyLayer;
use idempotent_runtime::{DynamoDbStore, Error, Idempotency, Layout, idempotent};
use idempotent_tests::{create_plain_table, unique_table};
use tracing_subscriber::layer::SubscriberExt as _;

const NS: &str = "setup::charge";

/// The `error` events logged while it lives, each as its fields (the message under `message`).
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<HashMap<String, String>>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Errors {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::ERROR {
            let mut fields = HashMap::new();
            event.record(&mut Fields(&mut fields));
            self.0.lock().unwrap().push(fields);
        }
    }
}

impl Errors {
    /// Captures this thread's events until the guard is dropped (the tests run on one thread).
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let errors = Self::default();
        let guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(errors.clone()));
        (errors, guard)
    }

    fn take(&self) -> Vec<HashMap<String, String>> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// One call through `Operation`; its body counts its runs.
async fn call(idem: &Idempotency, runs: &AtomicUsize) -> Error {
    idem.operation(NS, &("acme", "order-1"))
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, Error>(1)
        })
        .await
        .unwrap_err()
}

#[idempotent(key = order, store = idem, name = "setup::attribute")]
async fn charge(idem: &Idempotency, order: &str, runs: &AtomicUsize) -> Result<u32, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(u32::try_from(order.len()).unwrap())
}

/// What every setup error must be: not retryable, and saying what to do; the body never runs, and one
/// `error` event names the namespace and what to do.
fn assert_setup_error(err: &Error, namespace: &str, says: &[&str], errors: &Errors) {
    assert!(!err.is_retryable(), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("`{namespace}`: ")), "{text}");
    for needle in says {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    assert!(!text.contains("retry"), "{text}");
    let events = errors.take();
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event["namespace"], namespace, "{event:?}");
    assert_eq!(event["error"], text, "{event:?}");
    assert!(event["message"].contains("not set up"), "{event:?}");
}

/// A client for DynamoDB Local with these credentials.
fn client_with(access_key: &str) -> Client {
    Client::from_conf(
        idempotent_runtime::aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(idempotent_tests::endpoint())
            .credentials_provider(Credentials::new(access_key, "dummy", None, None, "tests"))
            .build(),
    )
}

#[tokio::test(flavor = "current_thread")]
async fn a_missing_table_names_ensure_table_and_is_not_retryable() {
    let (errors, _guard) = Errors::capture();
    let table = unique_table("missing");
    let (client, requests) = idempotent_tests::client();
    let idem = Idempotency::dynamodb(client, &table);
    let runs = AtomicUsize::new(0);
    let err = call(&idem, &runs).await;
    assert!(
        matches!(&err, Error::TableNotFound { table: t, .. } if *t == table),
        "{err:?}"
    );
    assert_setup_error(
        &err,
        NS,
        &[
            &format!("`{table}` does not exist"),
            "`DynamoDbStore::ensure_table`",
        ],
        &errors,
    );
    assert_eq!(requests.total(), 1, "one claim, not retried");

    // Through the attribute: the same error, the same event.
    let err = charge(&idem, "order-1", &runs).await.unwrap_err();
    assert_setup_error(&err, "setup::attribute", &["ensure_table"], &errors);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Once the table is created as the message says, the same call runs.
    DynamoDbStore::new(idempotent_tests::client().0, &table)
        .ensure_table()
        .await
        .unwrap();
    assert_eq!(charge(&idem, "order-1", &runs).await.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_table_with_another_key_schema_says_so_and_is_not_retryable() {
    let (errors, _guard) = Errors::capture();
    let (client, _) = idempotent_tests::client();
    let runs = AtomicUsize::new(0);
    // Another partition key name.
    let by_id = unique_table("by-id");
    create_plain_table(&client, &by_id, "id").await;
    // The right partition key, and a sort key the default layout does not send.
    let with_sort_key = unique_table("with-sk");
    DynamoDbStore::new(client.clone(), &with_sort_key)
        .with_layout(Layout::Tenant)
        .ensure_table()
        .await
        .unwrap();
    for table in [&by_id, &with_sort_key] {
        let idem = Idempotency::dynamodb(client.clone(), table);
        let err = call(&idem, &runs).await;
        assert!(matches!(&err, Error::TableMismatch { .. }), "{err:?}");
        assert_setup_error(
            &err,
            NS,
            &[
                &format!("table `{table}` does not have the store's key schema"),
                "`DynamoDbStore::check`",
                "`DynamoDbStore::ensure_table`",
            ],
            &errors,
        );
        let err = charge(&idem, "order-1", &runs).await.unwrap_err();
        assert!(matches!(&err, Error::TableMismatch { .. }), "{err:?}");
        errors.take();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// DynamoDB Local refuses an access key that is not alphanumeric, as the service refuses unknown
/// ones: `UnrecognizedClientException`.
#[tokio::test(flavor = "current_thread")]
async fn refused_credentials_name_the_table_and_are_not_retryable() {
    let (errors, _guard) = Errors::capture();
    let table = unique_table("denied");
    DynamoDbStore::new(idempotent_tests::client().0, &table)
        .ensure_table()
        .await
        .unwrap();
    let idem = Idempotency::dynamodb(client_with("not_a_key"), &table);
    let runs = AtomicUsize::new(0);
    let err = call(&idem, &runs).await;
    assert!(
        matches!(&err, Error::AccessDenied { table: t, .. } if *t == table),
        "{err:?}"
    );
    assert_setup_error(
        &err,
        NS,
        &[
            &format!("access to the idempotency table `{table}` was refused"),
            "UnrecognizedClientException",
            "`dynamodb:UpdateItem`",
        ],
        &errors,
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// POSTs `/pay` with a key to a router with `layer` in front of a handler that counts its runs;
/// returns the status, the body and how many times the handler ran.
async fn post_through(layer: IdempotencyLayer) -> (StatusCode, serde_json::Value, usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED
        }
    };
    let app = axum::Router::new().route("/pay", axum::routing::post(handler).layer(layer));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{addr}/pay"))
        .header("idempotency-key", "k-1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert!(response.headers().get("retry-after").is_none());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let runs = runs.load(Ordering::SeqCst);
    (status, serde_json::from_slice(&body).unwrap(), runs)
}

/// The HTTP layer's 500 for a store that is not set up: no invitation to retry, nothing about the
/// table for the client; the operator's `error` event, once, says it all.
async fn assert_http_setup_error(idem: Idempotency, says: &str, errors: &Errors) {
    let layer = IdempotencyLayer::new(idem, |_| Some("acme".to_owned())).namespace("setup-http");
    let (status, body, runs) = post_through(layer).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs, 0);
    let detail = body["detail"].as_str().unwrap();
    assert!(!detail.to_lowercase().contains("retry"), "{detail}");
    assert!(detail.contains("not set up"), "{detail}");
    assert!(detail.contains("error log"), "{detail}");
    let events = errors.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["namespace"], "setup-http", "{events:?}");
    assert!(events[0]["error"].contains(says), "{events:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_http_layer_answers_500_without_retry_for_a_store_that_is_not_set_up() {
    let (errors, _guard) = Errors::capture();
    let (client, _) = idempotent_tests::client();
    let missing = unique_table("http-missing");
    assert_http_setup_error(
        Idempotency::dynamodb(client.clone(), &missing),
        "DynamoDbStore::ensure_table",
        &errors,
    )
    .await;
    let other = unique_table("http-other");
    create_plain_table(&client, &other, "id").await;
    assert_http_setup_error(
        Idempotency::dynamodb(client.clone(), &other),
        "does not have the store's key schema",
        &errors,
    )
    .await;
    assert_http_setup_error(
        Idempotency::dynamodb(client_with("not_a_key"), &missing),
        "was refused",
        &errors,
    )
    .await;
}

/// On any store: one that reports its table missing (a memory store behind a wrapper) gets the same
/// answer and the same event.
#[tokio::test(flavor = "current_thread")]
async fn the_http_layer_answers_500_without_retry_on_any_store_that_is_not_set_up() {
    use idempotent_runtime::MemoryStore;
    use idempotent_runtime::store::conformance::{Delegating, Override};

    #[derive(Debug)]
    struct NoTable;

    #[async_trait::async_trait]
    impl Override<MemoryStore> for NoTable {
        fn kind(&self) -> &'static str {
            "no-table"
        }
        async fn claim(
            &self,
            _: &MemoryStore,
            _: &idempotent_runtime::store::ClaimRequest<'_>,
        ) -> Result<idempotent_runtime::store::ClaimOutcome, idempotent_runtime::StoreError>
        {
            Err(idempotent_runtime::StoreError::TableNotFound(
                "records".to_owned(),
            ))
        }
    }

    let (errors, _guard) = Errors::capture();
    assert_http_setup_error(
        Idempotency::builder(Delegating::new(MemoryStore::new(), NoTable)).build(),
        "`records` does not exist",
        &errors,
    )
    .await;
}

/// Through a `RoutedStore`: a region whose table is missing or which refuses the credentials is not
/// set up, not down — the same errors, never `RegionUnavailable`, and no failover (which would give up
/// exactly-once for a problem no other region fixes).
#[tokio::test(flavor = "current_thread")]
async fn a_routed_store_reports_setup_errors_as_they_are_and_does_not_fail_over() {
    let (errors, _guard) = Errors::capture();
    let (client, requests) = idempotent_tests::client();
    let missing = unique_table("routed-missing");
    let runs = AtomicUsize::new(0);
    for failover in [false, true] {
        let routed = idempotent_runtime::RoutedStore::dynamodb(
            &missing,
            [("region-a", client.clone()), ("region-b", client.clone())],
        )
        .unwrap()
        .failover(failover);
        let idem = Idempotency::builder(routed).build();
        requests.reset();
        let err = call(&idem, &runs).await;
        assert!(matches!(&err, Error::TableNotFound { .. }), "{err:?}");
        assert_setup_error(&err, NS, &["ensure_table"], &errors);
        assert_eq!(requests.total(), 1, "one region asked, failover {failover}");
    }
    let table = unique_table("routed-denied");
    DynamoDbStore::new(client.clone(), &table)
        .ensure_table()
        .await
        .unwrap();
    let denied = client_with("not_a_key");
    let routed = idempotent_runtime::RoutedStore::dynamodb(
        &table,
        [("region-a", denied.clone()), ("region-b", denied)],
    )
    .unwrap()
    .failover(true);
    let err = call(&Idempotency::builder(routed).build(), &runs).await;
    assert!(matches!(&err, Error::AccessDenied { .. }), "{err:?}");
    assert_setup_error(&err, NS, &["was refused"], &errors);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Credentials refused when the result is stored (they expired during the body, or the role lacks a
/// permission only the completion needs): the same setup error, logged at `error` level as at claim
/// time — an operator must act, and the caller may well turn the error into a generic one. The body
/// ran once.
#[tokio::test(flavor = "current_thread")]
async fn credentials_refused_at_completion_are_logged_as_a_setup_error() {
    use idempotent_runtime::MemoryStore;
    use idempotent_runtime::store::conformance::{Delegating, Override};
    use idempotent_runtime::store::{Transition, WriteOutcome};

    /// Claims pass; every completion is refused, as DynamoDB refuses expired credentials.
    #[derive(Debug)]
    struct DeniedAtCompletion;

    #[async_trait::async_trait]
    impl Override<MemoryStore> for DeniedAtCompletion {
        fn kind(&self) -> &'static str {
            "denied-at-completion"
        }

        async fn transition(
            &self,
            _: &MemoryStore,
            _: &Transition<'_>,
        ) -> Result<WriteOutcome, idempotent_runtime::StoreError> {
            Err(idempotent_runtime::StoreError::AccessDenied {
                table: "records".to_owned(),
                source:
                    "ExpiredTokenException: the security token included in the request is expired"
                        .into(),
            })
        }
    }

    let (errors, _guard) = Errors::capture();
    let store = Delegating::new(MemoryStore::new(), DeniedAtCompletion);
    let idem = Idempotency::builder(store).build();
    let runs = AtomicUsize::new(0);
    let err = call(&idem, &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        matches!(&err, Error::AccessDenied { table, .. } if table == "records"),
        "{err:?}"
    );
    assert_setup_error(&err, NS, &["was refused", "records"], &errors);
}

/// No credentials at all (no environment variables, no profile, no role: a service deployed without
/// its role, a local run without a profile): the SDK fails before sending anything, and that is a
/// setup error like a refused key — not retryable, not a 503 inviting a retry, and logged with what to
/// do — never "the store is unavailable". A credentials provider that timed out may pass, and stays
/// retryable.
#[tokio::test(flavor = "current_thread")]
async fn missing_credentials_are_a_setup_error_not_an_outage() {
    use aws_credential_types::provider::{
        ProvideCredentials, error::CredentialsError, future::ProvideCredentials as Provided,
    };
    use idempotent_runtime::aws_sdk_dynamodb::config::SharedCredentialsProvider;

    #[derive(Debug)]
    struct Failing(fn() -> CredentialsError);

    impl ProvideCredentials for Failing {
        fn provide_credentials<'a>(&'a self) -> Provided<'a>
        where
            Self: 'a,
        {
            Provided::ready(Err((self.0)()))
        }
    }

    let client_failing = |error: fn() -> CredentialsError| {
        Client::from_conf(
            idempotent_runtime::aws_sdk_dynamodb::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .region(Region::new("us-east-1"))
                .endpoint_url(idempotent_tests::endpoint())
                .credentials_provider(SharedCredentialsProvider::new(Failing(error)))
                .build(),
        )
    };
    let (errors, _guard) = Errors::capture();
    let table = unique_table("no-credentials");
    let runs = AtomicUsize::new(0);
    let none = client_failing(|| {
        CredentialsError::not_loaded("no providers in chain provided credentials")
    });
    let err = call(
        &Idempotency::builder(DynamoDbStore::new(none, &table)).build(),
        &runs,
    )
    .await;
    assert!(matches!(&err, Error::AccessDenied { .. }), "{err:?}");
    assert_setup_error(&err, NS, &["was refused", "credentials"], &errors);

    let slow =
        client_failing(|| CredentialsError::provider_timed_out(std::time::Duration::from_secs(1)));
    let err = call(
        &Idempotency::builder(DynamoDbStore::new(slow, &table)).build(),
        &runs,
    )
    .await;
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The first call of a service may well stage business writes (`claim_with`): on an idempotency table
/// of another key schema it is the same setup error as without them (`TableMismatch`, logged with
/// what to do), not "the staged business writes were refused", which sends the reader to the wrong
/// table. A business write that does not fit its own table's key schema is still refused as the
/// business write's fault. The body never runs.
#[tokio::test(flavor = "current_thread")]
async fn claim_with_on_a_table_of_another_key_schema_is_a_table_mismatch() {
    use idempotent_runtime::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

    let (errors, _guard) = Errors::capture();
    let (client, _) = idempotent_tests::client();
    let runs = AtomicUsize::new(0);
    let business = unique_table("business");
    create_plain_table(&client, &business, "id").await;
    let put = |key: &str| {
        TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name(&business)
                    .item(key, AttributeValue::S("order-1".to_owned()))
                    .build()
                    .unwrap(),
            )
            .build()
    };
    let claim_with = |idem: Idempotency, write: TransactWriteItem| {
        let runs = &runs;
        async move {
            idem.operation(NS, &("acme", "order-1"))
                .claim_with([write])
                .run(|_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<u32, Error>(1)
                })
                .await
                .unwrap_err()
        }
    };

    let by_id = unique_table("claim-with-by-id");
    create_plain_table(&client, &by_id, "id").await;
    let err = claim_with(Idempotency::dynamodb(client.clone(), &by_id), put("id")).await;
    assert!(matches!(&err, Error::TableMismatch { .. }), "{err:?}");
    assert_setup_error(
        &err,
        NS,
        &[&format!(
            "table `{by_id}` does not have the store's key schema"
        )],
        &errors,
    );

    // The idempotency table is right; the business item lacks its table's key.
    let right = unique_table("claim-with-right");
    DynamoDbStore::new(client.clone(), &right)
        .ensure_table()
        .await
        .unwrap();
    let err = claim_with(Idempotency::dynamodb(client.clone(), &right), put("sku")).await;
    assert!(matches!(&err, Error::WriteRejected { .. }), "{err:?}");
    assert!(errors.take().is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
