//! `#[idempotent(.., steps = s)]`, on both stores: the body gets its `Steps` as `s`, and a call cut off,
//! failed or detached resumes where it stopped, through the attribute as through `Operation::steps`;
//! with `transact` (DynamoDB Local), the staged writes commit with the completion. Each step's effect is
//! counted.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use idempotent_runtime::{Error, Idempotency, Status, Steps, idempotent};
use idempotent_tests::{
    AppError, Backend, Effects, Email, Harness, Receipt, idem_error, unique_table,
};
use tokio::sync::{Notify, Semaphore};

const LEASE: Duration = Duration::from_secs(30);

/// reserve → charge (with its downstream key) → email, each a step of `s`; `charged` is told once the
/// charge is stored.
async fn three_steps(
    s: &Steps,
    effects: &Effects,
    email: Email,
    charged: Option<&Notify>,
) -> Result<Receipt, AppError> {
    let hold = s
        .run("reserve", || async {
            effects.happened("reserve");
            Ok::<_, AppError>(17_u32)
        })
        .await?;
    let key = s.key("charge");
    effects.keyed("charge", key.clone());
    let charge = s
        .run("charge", || async {
            effects.happened("charge");
            Ok::<_, AppError>(format!("ch_{}", &key[..8]))
        })
        .await?;
    if let Some(charged) = charged {
        charged.notify_one();
    }
    s.run("email", || async {
        match email {
            Email::Sends => {
                effects.happened("email");
                Ok(())
            }
            Email::Fails => Err(AppError::Declined),
            Email::Hangs => std::future::pending().await,
        }
    })
    .await?;
    Ok(Receipt { hold, charge })
}

#[idempotent(key = order, store = idem, name = "steps_attribute::checkout", steps = s)]
async fn checkout(
    idem: &Idempotency,
    order: &str,
    effects: &Effects,
    email: Email,
    charged: Option<&Notify>,
) -> Result<Receipt, AppError> {
    three_steps(&s, effects, email, charged).await
}

#[idempotent(
    key = order,
    store = idem,
    name = "steps_attribute::restarting",
    steps = steps,
    on_failure = "restart"
)]
async fn restarting(
    idem: &Idempotency,
    order: &str,
    effects: &Effects,
    email: Email,
) -> Result<Receipt, AppError> {
    three_steps(&steps, effects, email, None).await
}

/// Held at its charge until `gate` has a permit, after telling `reserved`.
#[idempotent(key = order, store = idem, name = "steps_attribute::detached", steps = s, detach)]
async fn detached(
    idem: Idempotency,
    order: String,
    effects: Arc<Effects>,
    reserved: Arc<Notify>,
    gate: Arc<Semaphore>,
) -> Result<Receipt, AppError> {
    let hold = s
        .run("reserve", || async {
            effects.happened("reserve");
            Ok::<_, AppError>(u32::try_from(order.len()).unwrap())
        })
        .await?;
    reserved.notify_one();
    let charge = s
        .run("charge", || async {
            gate.acquire().await.unwrap().forget();
            effects.happened("charge");
            Ok::<_, AppError>(format!("ch_{order}"))
        })
        .await?;
    Ok(Receipt { hold, charge })
}

/// Drops `call` once `charged` is told: the record is left PENDING with two finished steps, as a crash
/// after the charge leaves it.
async fn cut_off_after_charge<F: Future>(call: F, charged: &Notify) {
    tokio::select! {
        _ = call => panic!("the email never finishes"),
        () = charged.notified() => {}
    }
}

async fn harness(backend: Backend) -> Harness {
    Harness::with(backend, |b| b.default_lease(LEASE)).await
}

/// A three-step function whose caller is dropped once step two is stored is taken over
/// after the lease: the next call replays steps one and two without running them and runs
/// only step three; a duplicate then gets the receipt without running anything.
async fn a_call_cut_off_after_step_two_resumes_at_step_three(backend: Backend) {
    let h = harness(backend).await;
    let effects = Effects::default();
    let charged = Notify::new();
    let call = checkout(&h.idem, "o-1", &effects, Email::Hangs, Some(&charged));
    cut_off_after_charge(call, &charged).await;
    assert_eq!(effects.checkout(), (1, 1, 0));
    let record = h.record("steps_attribute::checkout", "o-1").await.unwrap();
    assert_eq!(record.status, Status::Pending);
    assert!(record.steps.is_some(), "the finished steps are stored");

    let early = checkout(&h.idem, "o-1", &effects, Email::Sends, None).await;
    assert!(matches!(idem_error(early), Error::InProgress { .. }));
    assert_eq!(effects.checkout(), (1, 1, 0));

    h.clock.advance(LEASE * 2);
    let receipt = checkout(&h.idem, "o-1", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(effects.checkout(), (1, 1, 1), "only step three ran again");
    let keys = effects.keys("charge");
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the charge's downstream key changed");
    assert_eq!(receipt.charge, format!("ch_{}", &keys[0][..8]));
    assert_eq!(receipt.hold, 17);

    let record = h.record("steps_attribute::checkout", "o-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.steps, None, "a completed record keeps no steps");
    let again = checkout(&h.idem, "o-1", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(again, receipt);
    assert_eq!(effects.checkout(), (1, 1, 1));
}

/// After the body returned `Err`, the retry resumes at the step that failed (the
/// default, `on_failure = "resume"`); with `on_failure = "restart"`, every step runs
/// again, with new downstream keys.
async fn a_retry_after_a_failure_resumes_unless_on_failure_restarts(backend: Backend) {
    let h = harness(backend).await;
    let resumed = Effects::default();
    let failed = checkout(&h.idem, "o-2", &resumed, Email::Fails, None).await;
    assert!(matches!(failed, Err(AppError::Declined)));
    let record = h.record("steps_attribute::checkout", "o-2").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    checkout(&h.idem, "o-2", &resumed, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(resumed.checkout(), (1, 1, 1));
    let keys = resumed.keys("charge");
    assert_eq!(keys[0], keys[1]);

    let restarted = Effects::default();
    let failed = restarting(&h.idem, "o-2", &restarted, Email::Fails).await;
    assert!(matches!(failed, Err(AppError::Declined)));
    let record = h
        .record("steps_attribute::restarting", "o-2")
        .await
        .unwrap();
    assert_eq!(record.status, Status::Failed);
    restarting(&h.idem, "o-2", &restarted, Email::Sends)
        .await
        .unwrap();
    assert_eq!(restarted.checkout(), (2, 2, 1));
    let keys = restarted.keys("charge");
    assert_ne!(
        keys[0], keys[1],
        "a restarted operation kept its downstream key"
    );
}

/// `steps` with `detach`: the caller gives up after step one, the body goes on to its end
/// on its own task, and the next call gets the stored receipt; each step ran once.
async fn a_detached_body_with_steps_finishes_without_its_caller(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    let (reserved, gate) = (Arc::new(Notify::new()), Arc::new(Semaphore::new(0)));
    let call = || {
        detached(
            h.idem.clone(),
            "o-3".to_owned(),
            effects.clone(),
            reserved.clone(),
            gate.clone(),
        )
    };
    tokio::select! {
        _ = call() => panic!("the charge is held"),
        () = reserved.notified() => {}
    }
    assert_eq!(effects.checkout(), (1, 0, 0));
    gate.add_permits(1);
    assert_eq!(h.idem.drain(Duration::from_secs(10)).await, 0);
    assert_eq!(effects.checkout(), (1, 1, 0));
    let record = h.record("steps_attribute::detached", "o-3").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    let receipt = call().await.unwrap();
    assert_eq!(
        receipt,
        Receipt {
            hold: 3,
            charge: "ch_o-3".to_owned()
        }
    );
    assert_eq!(effects.checkout(), (1, 1, 0), "the replay ran a step");
}

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test]
    a_call_cut_off_after_step_two_resumes_at_step_three,
    #[tokio::test]
    a_retry_after_a_failure_resumes_unless_on_failure_restarts,
    #[tokio::test]
    a_detached_body_with_steps_finishes_without_its_caller,
}

/// A business table, for the writes staged on `transact`.
struct Shop {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl Shop {
    async fn new(h: &Harness) -> Self {
        let (client, table) = (h.client(), unique_table("shop"));
        idempotent_tests::create_plain_table(&client, &table, "pk").await;
        Self { client, table }
    }

    /// The reservation item of `order`, written once.
    fn reservation(&self, order: &str) -> Put {
        Put::builder()
            .table_name(&self.table)
            .item("pk", AttributeValue::S(format!("reservation#{order}")))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .unwrap()
    }

    async fn has_reservation(&self, order: &str) -> bool {
        self.client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(format!("reservation#{order}")))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
            .is_some()
    }
}

#[idempotent(
    key = order,
    store = idem,
    name = "steps_attribute::reserve",
    steps = s,
    transact = tx
)]
async fn reserve(
    idem: &Idempotency,
    shop: &Shop,
    order: &str,
    effects: &Effects,
    email: Email,
    charged: Option<&Notify>,
) -> Result<Receipt, AppError> {
    tx.put(shop.reservation(order));
    three_steps(&s, effects, email, charged).await
}

/// `steps` with `transact` on DynamoDB Local: a call cut off after step two has stored its steps but
/// committed none of its staged writes; the call that resumes runs only step three and commits the
/// writes it staged with the completion, in one `TransactWriteItems`.
#[tokio::test]
async fn steps_with_transact_commit_the_staged_writes_with_the_completion() {
    let h = Harness::with(Backend::DynamoDb, |b| b.default_lease(LEASE)).await;
    let shop = Shop::new(&h).await;
    let effects = Effects::default();
    let charged = Notify::new();
    let call = reserve(
        &h.idem,
        &shop,
        "o-4",
        &effects,
        Email::Hangs,
        Some(&charged),
    );
    cut_off_after_charge(call, &charged).await;
    assert_eq!(effects.checkout(), (1, 1, 0));
    assert!(
        !shop.has_reservation("o-4").await,
        "a staged write committed before the completion"
    );
    let record = h.record("steps_attribute::reserve", "o-4").await.unwrap();
    assert_eq!(record.status, Status::Pending);

    h.clock.advance(LEASE * 2);
    h.requests.reset();
    let receipt = reserve(&h.idem, &shop, "o-4", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(effects.checkout(), (1, 1, 1), "only step three ran again");
    assert!(shop.has_reservation("o-4").await);
    assert_eq!(
        (
            h.requests.of("UpdateItem"),
            h.requests.of("TransactWriteItems")
        ),
        (3, 1),
        "fresh claim (refused) + resume claim + email; the completion with the writes"
    );
    let record = h.record("steps_attribute::reserve", "o-4").await.unwrap();
    assert_eq!(record.status, Status::Completed);

    let again = reserve(&h.idem, &shop, "o-4", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(again, receipt);
    assert_eq!(effects.checkout(), (1, 1, 1));
}

#[idempotent(
    key = order,
    store = idem,
    name = "steps_attribute::reserve_detached",
    steps = s,
    transact = tx,
    detach
)]
async fn reserve_detached(
    idem: Idempotency,
    shop: Arc<Shop>,
    order: String,
    effects: Arc<Effects>,
    reserved: Arc<Notify>,
    gate: Arc<Semaphore>,
) -> Result<u32, AppError> {
    tx.put(shop.reservation(&order));
    let hold = s
        .run("reserve", || async {
            effects.happened("reserve");
            Ok::<_, AppError>(5_u32)
        })
        .await?;
    reserved.notify_one();
    s.run("charge", || async {
        gate.acquire().await.unwrap().forget();
        effects.happened("charge");
        Ok::<_, AppError>(())
    })
    .await?;
    Ok(hold)
}

/// `steps`, `transact` and `detach` together: the caller gives up after step one, the body finishes on
/// its own task, and its staged write commits with the completion; each step ran once.
#[tokio::test]
async fn steps_with_transact_and_detach_commit_without_the_caller() {
    let h = Harness::with(Backend::DynamoDb, |b| b.default_lease(LEASE)).await;
    let shop = Arc::new(Shop::new(&h).await);
    let effects = Arc::new(Effects::default());
    let (reserved, gate) = (Arc::new(Notify::new()), Arc::new(Semaphore::new(0)));
    let call = || {
        reserve_detached(
            h.idem.clone(),
            shop.clone(),
            "o-5".to_owned(),
            effects.clone(),
            reserved.clone(),
            gate.clone(),
        )
    };
    tokio::select! {
        _ = call() => panic!("the charge is held"),
        () = reserved.notified() => {}
    }
    assert!(!shop.has_reservation("o-5").await);
    gate.add_permits(1);
    assert_eq!(h.idem.drain(Duration::from_secs(10)).await, 0);
    assert!(shop.has_reservation("o-5").await);
    assert_eq!(effects.checkout(), (1, 1, 0));
    assert_eq!(call().await.unwrap(), 5, "replayed");
    assert_eq!(effects.checkout(), (1, 1, 0));
}
