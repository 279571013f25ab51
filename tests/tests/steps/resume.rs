//! Steps, on both stores: a body of several effects resumes where it stopped (after a crash, a lapsed
//! lease or a failure) instead of running them all again; each finished step's value is stored in the
//! record by a fenced write; `Steps::key` is the same in every run of an operation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::{Error, Idempotency, Status};
use idempotent_tests::{
    AppError, Backend, Effects, Email, Harness, Receipt, SlowResume, idem_error,
};
use tokio::sync::Notify;

const NAMESPACE: &str = "steps::checkout";
const LEASE: Duration = Duration::from_secs(30);

/// The three-step checkout: reserve → charge (with its downstream key) → email.
async fn checkout(
    idem: &Idempotency,
    order: &str,
    effects: &Arc<Effects>,
    email: Email,
    charged: Option<&Notify>,
) -> Result<Receipt, AppError> {
    idem.operation(NAMESPACE, order)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let hold = steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(17_u32)
                })
                .await?;
            let key = steps.key("charge");
            effects.keyed("charge", key.clone());
            let charge = steps
                .run("charge", || async {
                    effects.happened("charge");
                    Ok::<_, AppError>(format!("ch_{}", &key[..8]))
                })
                .await?;
            if let Some(charged) = charged {
                charged.notify_one();
            }
            steps
                .run("email", || async {
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
        })
        .await
}

/// Starts a checkout whose email never finishes, and drops it once the charge is stored: the record is
/// left PENDING with two finished steps, as a crash after the charge leaves it.
async fn crash_after_charge(h: &Harness, order: &str, effects: &Arc<Effects>) {
    let charged = Notify::new();
    tokio::select! {
        _ = checkout(&h.idem, order, effects, Email::Hangs, Some(&charged)) => panic!("the email never finishes"),
        () = charged.notified() => {}
    }
    let record = h.record(NAMESPACE, order).await.unwrap();
    assert_eq!(record.status, Status::Pending);
    assert!(record.steps.is_some(), "the finished steps are stored");
}

async fn harness(backend: Backend) -> Harness {
    Harness::with(backend, |b| b.default_lease(LEASE)).await
}

/// A call cut off after its second step (the caller dropped it, as a crash would) is taken
/// over once its lease lapsed: the new call replays the first two steps' values without
/// running them, runs the third, and completes; a duplicate then gets the receipt.
async fn a_call_cut_off_after_two_steps_resumes_at_the_third(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    crash_after_charge(&h, "o-1", &effects).await;
    assert_eq!((effects.runs("reserve"), effects.runs("charge")), (1, 1));

    // Within the lease the key is still held.
    let early = checkout(&h.idem, "o-1", &effects, Email::Sends, None).await;
    assert!(matches!(idem_error(early), Error::InProgress { .. }));

    h.clock.advance(LEASE * 2);
    let receipt = checkout(&h.idem, "o-1", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(effects.runs("reserve"), 1, "reserve ran again");
    assert_eq!(effects.runs("charge"), 1, "charged twice");
    assert_eq!(effects.runs("email"), 1);
    let keys = effects.keys("charge");
    assert_eq!(receipt.charge, format!("ch_{}", &keys[0][..8]));
    assert_eq!(keys[0], keys[1], "the charge's downstream key changed");

    let record = h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.steps, None, "a completed record keeps no steps");
    let again = checkout(&h.idem, "o-1", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(again, receipt);
    assert_eq!(
        (
            effects.runs("reserve"),
            effects.runs("charge"),
            effects.runs("email")
        ),
        (1, 1, 1)
    );
}

/// A body that failed at its third step is resumed by the retry: the finished steps are
/// not run again, only the one that failed.
async fn a_retry_after_a_failure_runs_only_the_step_that_failed(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    let failed = checkout(&h.idem, "o-2", &effects, Email::Fails, None).await;
    assert!(matches!(failed, Err(AppError::Declined)));
    let record = h.record(NAMESPACE, "o-2").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert!(record.steps.is_some());
    // A failure of a body with steps keeps its record (and its steps) for the ttl, not
    // just `failed_ttl` (the lease by default): the retry may come later.
    h.clock.advance(LEASE * 10);
    let receipt = checkout(&h.idem, "o-2", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(receipt.hold, 17);
    assert_eq!(
        (
            effects.runs("reserve"),
            effects.runs("charge"),
            effects.runs("email")
        ),
        (1, 1, 1)
    );
    let keys = effects.keys("charge");
    assert_eq!(keys[0], keys[1]);
}

/// `restart_steps_after_failure`: after a failure every step runs again, with new
/// downstream keys.
async fn an_operation_that_restarts_after_a_failure_runs_every_step_again(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    let run = |email| {
        let (idem, effects) = (h.idem.clone(), effects.clone());
        async move {
            idem.operation(NAMESPACE, "o-3")
                .restart_steps_after_failure()
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    steps
                        .run("reserve", || async {
                            effects.happened("reserve");
                            Ok::<_, AppError>(1_u32)
                        })
                        .await?;
                    effects.keyed("charge", steps.key("charge"));
                    steps
                        .run("email", || async {
                            match email {
                                Email::Fails => Err(AppError::Declined),
                                _ => Ok(()),
                            }
                        })
                        .await
                })
                .await
        }
    };
    assert!(matches!(run(Email::Fails).await, Err(AppError::Declined)));
    run(Email::Sends).await.unwrap();
    assert_eq!(effects.runs("reserve"), 2);
    let keys = effects.keys("charge");
    assert_ne!(
        keys[0], keys[1],
        "a restarted operation keeps its downstream keys"
    );
}

/// A step name asked for twice in one run is an error, and the second step does not run.
async fn a_step_name_used_twice_is_an_error(backend: Backend) {
    let h = harness(backend).await;
    let runs = &AtomicUsize::new(0);
    let result = h
        .idem
        .operation(NAMESPACE, "o-4")
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            for _ in 0..2 {
                steps
                    .run("charge", || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, AppError>(1_u32)
                    })
                    .await?;
            }
            Ok::<_, AppError>(())
        })
        .await;
    match idem_error(result) {
        Error::StepRepeated { step, .. } => assert_eq!(step, "charge"),
        other => panic!("expected StepRepeated, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        h.record(NAMESPACE, "o-4").await.unwrap().status,
        Status::Failed
    );
}

/// A call that lost its claim (its lease lapsed, and another call took the key over and
/// completed) stores nothing more: its next step's write is fenced, and it stops there
/// with `LeaseLost`; the other call's result stands.
async fn a_zombies_step_is_fenced_and_its_body_stops(backend: Backend) {
    let h = Harness::with(backend, |b| b.default_lease(LEASE).heartbeat(false)).await;
    let effects = Arc::new(Effects::default());
    let (reserved, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let zombie = {
        let (idem, effects) = (h.idem.clone(), effects.clone());
        let (reserved, resume) = (reserved.clone(), resume.clone());
        tokio::spawn(async move {
            idem.operation(NAMESPACE, "o-5")
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    steps
                        .run("reserve", || async {
                            effects.happened("reserve");
                            Ok::<_, AppError>(1_u32)
                        })
                        .await?;
                    reserved.notify_one();
                    resume.notified().await;
                    let charged = steps
                        .run("charge", || async {
                            effects.happened("charge");
                            Ok::<_, AppError>(String::from("zombie"))
                        })
                        .await?;
                    steps
                        .run("email", || async {
                            effects.happened("email");
                            Ok::<_, AppError>(())
                        })
                        .await?;
                    Ok(charged)
                })
                .await
        })
    };
    reserved.notified().await;
    h.clock.advance(LEASE * 2);
    // Another process takes over: in the zombie's, a duplicate would wait on it.
    let taken = h
        .another_process(|b| b.default_lease(LEASE).heartbeat(false))
        .operation(NAMESPACE, "o-5")
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("reserve", || async { Ok::<_, AppError>(2_u32) })
                .await?;
            steps
                .run("charge", || async {
                    Ok::<_, AppError>(String::from("taker"))
                })
                .await
        })
        .await
        .unwrap();
    assert_eq!(taken, "taker");
    resume.notify_one();
    let lost = zombie.await.unwrap();
    assert!(
        matches!(idem_error(lost), Error::LeaseLost { .. }),
        "the zombie's step was stored"
    );
    assert_eq!(effects.runs("reserve"), 1);
    assert_eq!(
        effects.runs("email"),
        0,
        "the zombie's body went on past its fenced step"
    );
    let replayed = h
        .idem
        .operation(NAMESPACE, "o-5")
        .steps()
        .run(|_| async { Ok::<_, AppError>(String::from("ran again")) })
        .await
        .unwrap();
    assert_eq!(replayed, "taker");
}

/// A step whose value would not fit in the record is an error before anything is
/// written: the record holds the steps before it, and the body stops.
async fn a_step_too_large_for_the_record_is_an_error_before_it_is_written(backend: Backend) {
    let h = harness(backend).await;
    // Beyond the record even compressed: 1.2 MB of pseudo-random hex digits (xorshift).
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let big: String = (0..1_200_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from_digit((state % 16) as u32, 16).unwrap()
        })
        .collect();
    let result = h
        .idem
        .operation(NAMESPACE, "o-6")
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("small", || async { Ok::<_, AppError>(1_u8) })
                .await?;
            steps.run("big", || async { Ok::<_, AppError>(big) }).await
        })
        .await;
    match result.map(|big| big.len()) {
        Err(AppError::Idempotency(Error::StepTooLarge {
            step,
            bytes,
            budget,
            ..
        })) => {
            assert_eq!(step, "big");
            assert!(bytes > budget, "{bytes} <= {budget}");
        }
        other => panic!("expected StepTooLarge, got {other:?}"),
    }
    let record = h.record(NAMESPACE, "o-6").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    let stored: serde_json::Value =
        serde_json::from_slice(record.steps.as_deref().unwrap()).unwrap();
    assert_eq!(stored["steps"], serde_json::json!({ "small": 1 }));
}

/// Once the record has expired the key is a new operation: its steps run again, with new
/// downstream keys.
async fn after_the_record_expires_the_steps_start_afresh(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    crash_after_charge(&h, "o-7", &effects).await;
    h.clock.advance(Duration::from_hours(72));
    checkout(&h.idem, "o-7", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(
        (
            effects.runs("reserve"),
            effects.runs("charge"),
            effects.runs("email")
        ),
        (2, 2, 1)
    );
    let keys = effects.keys("charge");
    assert_ne!(keys[0], keys[1]);
}

/// Downstream keys differ by step and by operation key.
async fn downstream_keys_differ_by_step_and_by_operation(backend: Backend) {
    let h = harness(backend).await;
    let keys = |order: &'static str| {
        let idem = h.idem.clone();
        async move {
            idem.operation(NAMESPACE, order)
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    Ok::<_, AppError>((steps.key("a"), steps.key("b"), steps.key("a")))
                })
                .await
                .unwrap()
        }
    };
    let (a1, b1, a1_again) = keys("k-1").await;
    let (a2, _, _) = keys("k-2").await;
    assert_eq!(a1, a1_again);
    assert_ne!(a1, b1);
    assert_ne!(a1, a2);
    assert_eq!(a1.len(), 64);
}

/// A detached body with steps: the caller gives up, the body finishes, and the result is
/// stored.
async fn a_detached_body_with_steps_finishes_without_its_caller(backend: Backend) {
    let h = harness(backend).await;
    let effects = Arc::new(Effects::default());
    let call = || {
        let effects = effects.clone();
        h.idem
            .operation(NAMESPACE, "o-8")
            .detach()
            .steps()
            .run(move |cx| async move {
                let (steps, ()) = cx.into_parts();
                steps
                    .run("slow", || async {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        effects.happened("slow");
                        Ok::<_, AppError>(5_u32)
                    })
                    .await
            })
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(10), call())
            .await
            .is_err()
    );
    h.idem.drain(Duration::from_secs(5)).await;
    assert_eq!(call().await.unwrap(), 5);
    assert_eq!(effects.runs("slow"), 1);
}

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test]
    a_call_cut_off_after_two_steps_resumes_at_the_third,
    #[tokio::test]
    a_retry_after_a_failure_runs_only_the_step_that_failed,
    #[tokio::test]
    an_operation_that_restarts_after_a_failure_runs_every_step_again,
    #[tokio::test]
    a_step_name_used_twice_is_an_error,
    #[tokio::test]
    a_zombies_step_is_fenced_and_its_body_stops,
    #[tokio::test]
    a_step_too_large_for_the_record_is_an_error_before_it_is_written,
    #[tokio::test]
    after_the_record_expires_the_steps_start_afresh,
    #[tokio::test]
    downstream_keys_differ_by_step_and_by_operation,
    #[tokio::test]
    a_detached_body_with_steps_finishes_without_its_caller,
}

/// Round trips on DynamoDB: a three-step call is its claim, one `UpdateItem` per step and its
/// completion; a duplicate is one claim; a resume after a crash is the refused fresh claim, the resume
/// claim, the remaining step and the completion.
#[tokio::test]
async fn each_step_costs_one_update_and_a_resume_two_claims() {
    let h = Harness::with(Backend::DynamoDb, |b| b.default_lease(LEASE)).await;
    let effects = Arc::new(Effects::default());
    checkout(&h.idem, "rt-1", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(h.requests.of("UpdateItem"), 5, "claim + 3 steps + complete");
    assert_eq!(h.requests.total(), 5);
    h.requests.reset();
    checkout(&h.idem, "rt-1", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(h.requests.total(), 1, "a duplicate is its claim");

    crash_after_charge(&h, "rt-2", &effects).await;
    h.clock.advance(LEASE * 2);
    h.requests.reset();
    checkout(&h.idem, "rt-2", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(
        h.requests.of("UpdateItem"),
        4,
        "fresh claim (refused) + resume claim + email + complete"
    );
    assert_eq!(h.requests.total(), 4);
}

/// A step write whose response is lost (the write landed; the SDK sends it again) is harmless: the
/// resent write is refused (the steps it extends are no longer there), and the record it gets back
/// holds exactly its steps under the call's own token, so the call counts it as stored and the body
/// goes on; every step's effect happens once.
#[tokio::test]
async fn a_step_write_whose_response_was_lost_is_sent_again_harmlessly() {
    use idempotent_tests::proxy::{Fault, Rule};
    let (h, proxy) = Harness::behind_proxy(|b| b.default_lease(LEASE)).await;
    proxy.set_rules([Rule::new(Fault::DropResponse)
        .operation("UpdateItem")
        .body_contains("SET #sp = :sp")
        .first(1)]);
    let effects = Arc::new(Effects::default());
    let receipt = checkout(&h.idem, "lost-1", &effects, Email::Sends, None)
        .await
        .unwrap();
    assert_eq!(receipt.hold, 17);
    assert_eq!(proxy.stats().operation("UpdateItem").dropped, 1);
    assert_eq!(
        (
            effects.runs("reserve"),
            effects.runs("charge"),
            effects.runs("email")
        ),
        (1, 1, 1)
    );
    let record = h.record(NAMESPACE, "lost-1").await.unwrap();
    assert_eq!((record.status, record.steps), (Status::Completed, None));
}

/// An operation that restarts after a failure, whose resuming call is dropped while its claim is on
/// its way: the claim is not released as a failure (a release is no failure of the finished steps,
/// and a FAILED record would make the next call start over and run them again); it lapses with its
/// lease, and the next call resumes.
#[tokio::test]
async fn a_dropped_resume_of_an_operation_that_restarts_after_failure_is_not_a_failure() {
    let slow = Arc::new(SlowResume::new(Arc::new(
        idempotent_runtime::MemoryStore::new(),
    )));
    let h = Harness::over(
        slow.clone(),
        idempotent_tests::RequestCounter::default(),
        |b| b.default_lease(LEASE),
    );
    let effects = Arc::new(Effects::default());
    let reserved = Notify::new();
    let call = |hang: bool| {
        let (idem, effects, reserved) = (h.idem.clone(), effects.clone(), &reserved);
        async move {
            idem.operation(NAMESPACE, "r-1")
                .restart_steps_after_failure()
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    steps
                        .run("reserve", || async {
                            effects.happened("reserve");
                            Ok::<_, AppError>(1_u32)
                        })
                        .await?;
                    if hang {
                        reserved.notify_one();
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, AppError>(2_u32)
                })
                .await
        }
    };
    // A first call stores its step and is cut off mid-body (as a crash would).
    tokio::select! {
        _ = call(true) => panic!("it hangs"),
        () = reserved.notified() => {}
    }
    h.clock.advance(LEASE * 2);
    // The next call's resume claim lands, but its caller gives up before hearing of it.
    slow.hold(true);
    tokio::select! {
        _ = call(false) => panic!("its claim is slow"),
        () = slow.landed() => {}
    }
    slow.hold(false);
    h.idem.drain(Duration::from_secs(5)).await;
    let record = h.record(NAMESPACE, "r-1").await.unwrap();
    assert_eq!(
        record.status,
        Status::Pending,
        "the dropped resume was released as a failure"
    );
    h.clock.advance(LEASE * 2);
    assert_eq!(call(false).await.unwrap(), 2);
    assert_eq!(effects.runs("reserve"), 1, "the finished step ran again");
}
