//! The fault-injection proxy against DynamoDB Local, and what the AWS SDK does with each fault it
//! injects: how many attempts it makes, and which error surfaces when its retries run out.
//!
//! Run with `scripts/test -p idempotent-tests --test stores fault_proxy::` (it starts DynamoDB Local).

// "DynamoDB" is a product name here, not code.
#![allow(clippy::doc_markdown)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::{PutItemError, PutItemOutput};
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_smithy_types::retry::ErrorKind;
use idempotent_tests::proxy::{Counts, Fault, FaultProxy, Rule};
use idempotent_tests::{RequestCounter, client_at, endpoint, unique_table};

type Item = HashMap<String, AttributeValue>;

/// A fresh table, a proxy in front of DynamoDB Local, and a client that bypasses the proxy.
struct Fixture {
    proxy: FaultProxy,
    direct: Client,
    table: String,
}

impl Fixture {
    async fn new() -> Self {
        let (direct, _) = client_at(&endpoint());
        let table = unique_table("proxy");
        idempotent_tests::create_plain_table(&direct, &table, "pk").await;
        let proxy = FaultProxy::start(&endpoint()).await;
        Self {
            proxy,
            direct,
            table,
        }
    }

    /// A client through the proxy with the SDK's default retry configuration.
    fn client(&self) -> (Client, RequestCounter) {
        client_at(self.proxy.endpoint())
    }

    /// A client through the proxy with `retry`.
    fn client_with(&self, retry: RetryConfig) -> (Client, RequestCounter) {
        let (client, counter) = self.client();
        let config = client.config().to_builder().retry_config(retry).build();
        (Client::from_conf(config), counter)
    }

    /// The item stored under `pk`, read past the proxy with a consistent read.
    async fn stored(&self, pk: &str) -> Option<Item> {
        self.direct
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .consistent_read(true)
            .send()
            .await
            .expect("read past the proxy")
            .item
    }

    async fn put(
        &self,
        client: &Client,
        pk: &str,
    ) -> Result<PutItemOutput, SdkError<PutItemError>> {
        client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(pk))
            .send()
            .await
    }
}

/// How the SDK reports a connection closed before the response: a dispatch failure (not a
/// `ResponseError`, not `is_io()`) whose connector error is "other", classified transient, from
/// hyper's `IncompleteMessage`.
fn is_lost_response<E>(error: &SdkError<E>) -> bool {
    matches!(error, SdkError::DispatchFailure(failure)
        if failure.as_other() == Some(ErrorKind::TransientError) && !failure.is_io())
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

/// The default standard mode (three attempts), with millisecond backoffs to keep the tests quick.
fn quick_retries() -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(3)
        .with_initial_backoff(Duration::from_millis(1))
        .with_max_backoff(Duration::from_millis(5))
}

#[tokio::test]
async fn the_default_retry_config_makes_three_attempts() {
    let f = Fixture::new().await;
    let (client, _) = f.client();
    f.proxy
        .set_rules([Rule::new(Fault::ServerError).operation("PutItem")]);

    let error = f.put(&client, "k").await.expect_err("every attempt fails");

    assert_eq!(error.code(), Some("InternalServerError"));
    assert_eq!(f.proxy.stats().operation("PutItem").requests, 3);
}

#[tokio::test]
async fn a_dropped_put_lands_once_and_the_sdk_retry_then_fails_its_condition() {
    let f = Fixture::new().await;
    let (client, attempts) = f.client();
    f.proxy
        .set_rules([Rule::new(Fault::DropResponse).operation("PutItem").first(1)]);

    let result = client
        .put_item()
        .table_name(&f.table)
        .item("pk", s("k"))
        .item("token", s("ours"))
        .condition_expression("attribute_not_exists(pk)")
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await;

    // The first attempt was applied and its response lost; the SDK retried on its own, and the
    // retry found the first attempt's item. Only the fencing token tells the caller it was its own.
    let error = result
        .expect_err("the retry fails its condition")
        .into_service_error();
    let PutItemError::ConditionalCheckFailedException(failed) = error else {
        panic!("expected ConditionalCheckFailedException, got {error:?}");
    };
    assert_eq!(failed.item().unwrap()["token"], s("ours"));
    assert_eq!(f.stored("k").await.unwrap()["token"], s("ours"));
    let put = f.proxy.stats().operation("PutItem");
    assert_eq!(
        put,
        Counts {
            requests: 2,
            forwarded: 2,
            dropped: 1,
            ..Counts::default()
        }
    );
    assert_eq!(attempts.of("PutItem"), 2, "the SDK's own count of attempts");
    assert_eq!(
        f.proxy.stats().connections,
        2,
        "the SDK reconnected after the drop"
    );
}

#[tokio::test]
async fn a_dropped_unconditional_update_is_applied_twice_by_the_sdk_retry() {
    let f = Fixture::new().await;
    let (client, _) = f.client_with(quick_retries());
    f.proxy.set_rules([Rule::new(Fault::DropResponse)
        .operation("UpdateItem")
        .first(1)]);

    client
        .update_item()
        .table_name(&f.table)
        .key("pk", s("k"))
        .update_expression("ADD n :one")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .send()
        .await
        .expect("the retry succeeds");

    assert_eq!(
        f.stored("k").await.unwrap()["n"],
        AttributeValue::N("2".into())
    );
    assert_eq!(f.proxy.stats().operation("UpdateItem").requests, 2);
}

#[tokio::test]
async fn without_retries_a_dropped_response_is_a_transient_dispatch_failure() {
    let f = Fixture::new().await;
    let (client, _) = f.client_with(RetryConfig::disabled());
    f.proxy
        .set_rules([Rule::new(Fault::DropResponse).operation("PutItem")]);

    let error = f.put(&client, "k").await.expect_err("no response");

    assert!(is_lost_response(&error), "{error:?}");
    assert!(f.stored("k").await.is_some(), "the write was applied");
    assert_eq!(f.proxy.stats().operation("PutItem").requests, 1);
}

#[tokio::test]
async fn dropped_responses_exhaust_the_retries_as_a_dispatch_failure() {
    let f = Fixture::new().await;
    let (client, _) = f.client_with(quick_retries());
    f.proxy
        .set_rules([Rule::new(Fault::DropResponse).operation("PutItem")]);

    let error = f.put(&client, "k").await.expect_err("every response lost");

    assert!(is_lost_response(&error), "{error:?}");
    assert!(f.stored("k").await.is_some());
    let put = f.proxy.stats().operation("PutItem");
    assert_eq!((put.requests, put.forwarded, put.dropped), (3, 3, 3));
}

#[tokio::test]
async fn a_throttled_request_is_retried_by_the_sdk_and_then_succeeds() {
    let f = Fixture::new().await;
    let (client, attempts) = f.client(); // the default retry configuration
    f.proxy
        .set_rules([Rule::new(Fault::Throttle).operation("PutItem").first(1)]);

    f.put(&client, "k").await.expect("the retry succeeds");

    assert!(f.stored("k").await.is_some());
    let put = f.proxy.stats().operation("PutItem");
    assert_eq!(
        put,
        Counts {
            requests: 2,
            forwarded: 1,
            throttled: 1,
            ..Counts::default()
        }
    );
    assert_eq!(attempts.of("PutItem"), 2);
    assert_eq!(
        f.proxy.stats().connections,
        1,
        "the retry reused the kept-alive connection"
    );
}

#[tokio::test]
async fn one_throttling_exception_or_server_error_is_retried_and_then_succeeds() {
    for fault in [Fault::ThrottlingException, Fault::ServerError] {
        let f = Fixture::new().await;
        let (client, _) = f.client_with(quick_retries());
        f.proxy
            .set_rules([Rule::new(fault).operation("PutItem").first(1)]);

        f.put(&client, "k").await.expect("the retry succeeds");

        let put = f.proxy.stats().operation("PutItem");
        assert_eq!(
            (put.requests, put.forwarded, put.faults()),
            (2, 1, 1),
            "{fault:?}"
        );
    }
}

#[tokio::test]
async fn exhausted_retries_on_injected_errors_surface_as_service_errors() {
    for (fault, code) in [
        (Fault::Throttle, "ProvisionedThroughputExceededException"),
        (Fault::ThrottlingException, "ThrottlingException"),
        (Fault::ServerError, "InternalServerError"),
    ] {
        let f = Fixture::new().await;
        let (client, _) = f.client_with(quick_retries());
        f.proxy.set_rules([Rule::new(fault).operation("PutItem")]);

        let error = f.put(&client, "k").await.expect_err("every attempt fails");

        assert!(matches!(error, SdkError::ServiceError(_)), "{error:?}");
        assert_eq!(error.code(), Some(code));
        let error = error.into_service_error();
        let modeled = match fault {
            Fault::Throttle => {
                matches!(
                    error,
                    PutItemError::ProvisionedThroughputExceededException(_)
                )
            }
            Fault::ThrottlingException => matches!(error, PutItemError::ThrottlingException(_)),
            _ => matches!(error, PutItemError::InternalServerError(_)),
        };
        assert!(modeled, "{fault:?} gave {error:?}");
        assert!(f.stored("k").await.is_none(), "nothing was forwarded");
        let put = f.proxy.stats().operation("PutItem");
        assert_eq!(
            (put.requests, put.forwarded, put.faults()),
            (3, 0, 3),
            "{fault:?}"
        );
    }
}

#[tokio::test]
async fn rules_select_by_operation_body_and_count_and_can_change_while_running() {
    let f = Fixture::new().await;
    let (client, _) = f.client_with(RetryConfig::disabled());
    f.proxy.set_rules([
        Rule::new(Fault::ServerError)
            .operation("UpdateItem")
            .body_contains(":completed")
            .nth(2),
        Rule::new(Fault::Throttle).operation("GetItem").first(2),
    ]);
    let update = |value: &'static str| {
        client
            .update_item()
            .table_name(&f.table)
            .key("pk", s("k"))
            .update_expression(format!("SET #s = {value}"))
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(value, s("x"))
            .send()
    };
    let get = || {
        client
            .get_item()
            .table_name(&f.table)
            .key("pk", s("k"))
            .send()
    };

    assert!(update(":completed").await.is_ok());
    assert!(update(":pending").await.is_ok(), "outside the body filter");
    assert!(update(":completed").await.is_err(), "the second match");
    assert!(update(":completed").await.is_ok());
    assert!(get().await.is_err());
    assert!(get().await.is_err());
    assert!(get().await.is_ok());

    let stats = f.proxy.stats();
    assert_eq!(
        stats.operation("UpdateItem"),
        Counts {
            requests: 4,
            forwarded: 3,
            server_errors: 1,
            ..Counts::default()
        }
    );
    assert_eq!(
        stats.operation("GetItem"),
        Counts {
            requests: 3,
            forwarded: 1,
            throttled: 2,
            ..Counts::default()
        }
    );
    assert_eq!(stats.total.requests, 7);
    assert_eq!(stats.total.faults(), 3);

    f.proxy.clear();
    assert!(get().await.is_ok());
    f.proxy.set_rules([Rule::new(Fault::ServerError)]);
    assert!(get().await.is_err());
    assert!(
        update(":x").await.is_err(),
        "a rule without filters takes everything"
    );
    f.proxy.reset_stats();
    assert_eq!(f.proxy.stats(), idempotent_tests::proxy::Stats::default());
}

#[tokio::test]
async fn a_probability_rule_with_one_seed_injects_the_same_faults_every_run() {
    async fn run(f: &Fixture, seed: u64) -> Vec<bool> {
        let proxy = FaultProxy::start(&endpoint()).await;
        proxy.set_rules([Rule::new(Fault::Throttle)
            .operation("GetItem")
            .probability(0.3, seed)]);
        let (client, _) = client_at(proxy.endpoint());
        let client = Client::from_conf(
            client
                .config()
                .to_builder()
                .retry_config(RetryConfig::disabled())
                .build(),
        );
        let mut throttled = Vec::new();
        for _ in 0..50 {
            let result = client
                .get_item()
                .table_name(&f.table)
                .key("pk", s("k"))
                .send()
                .await;
            throttled.push(result.is_err());
        }
        let faults = throttled.iter().filter(|&&t| t).count() as u64;
        assert_eq!(proxy.stats().operation("GetItem").throttled, faults);
        throttled
    }
    let f = Fixture::new().await;

    let first = run(&f, 42).await;
    let again = run(&f, 42).await;
    let other = run(&f, 43).await;

    assert_eq!(first, again);
    assert_ne!(first, other);
    // SplitMix64 never changes, so neither does the schedule a seed gives.
    assert_eq!(first.iter().filter(|&&t| t).count(), SEED_42_FAULTS);
}

/// How many of 50 requests `probability(0.3, 42)` throttles.
const SEED_42_FAULTS: usize = 18;

#[tokio::test]
async fn a_delay_holds_the_request_and_then_forwards_it() {
    let f = Fixture::new().await;
    let (client, _) = f.client();
    f.proxy
        .set_rules([Rule::new(Fault::Delay(Duration::from_millis(100)))
            .operation("PutItem")
            .first(1)]);

    let started = Instant::now();
    f.put(&client, "k").await.expect("delayed, not failed");

    assert!(started.elapsed() >= Duration::from_millis(100));
    assert!(f.stored("k").await.is_some());
    let put = f.proxy.stats().operation("PutItem");
    assert_eq!((put.requests, put.forwarded, put.delayed), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_callers_get_through_drops_and_throttles() {
    const CALLERS: usize = 64;
    let f = Fixture::new().await;
    let (client, attempts) = f.client_with(quick_retries().with_max_attempts(20));
    f.proxy.set_rules([
        Rule::new(Fault::DropResponse).probability(0.2, 1),
        Rule::new(Fault::Throttle).probability(0.2, 2),
    ]);

    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let client = client.clone();
            let table = f.table.clone();
            tokio::spawn(async move {
                client
                    .put_item()
                    .table_name(table)
                    .item("pk", s(&format!("k{i}")))
                    .send()
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().expect("retried until it got through");
    }

    for i in 0..CALLERS {
        assert!(f.stored(&format!("k{i}")).await.is_some());
    }
    let put = f.proxy.stats().operation("PutItem");
    assert_eq!(
        usize::try_from(put.requests).unwrap(),
        attempts.of("PutItem")
    );
    assert_eq!(put.forwarded, put.requests - put.throttled);
    assert_eq!(
        put.forwarded - put.dropped,
        CALLERS as u64,
        "one answered write per caller"
    );
    assert!(put.dropped > 0 && put.throttled > 0, "{put:?}");
}
