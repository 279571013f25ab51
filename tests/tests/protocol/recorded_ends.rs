//! Where a call's end is recorded (its `idempotent` span's `outcome` and `idempotency_calls_total`):
//! `recorded` in `drive_core` and `Detaching`, the body's task of a detached call, `Joined` for a task
//! the runtime dropped, `drive_core` for a body's panic. Each call that reaches
//! the store must be recorded exactly once, with the outcome of what happened, however it ends: in
//! place and detached, with its caller gone, with its runtime shut down, under a subscriber that is not
//! the thread's default, with nested calls in a store, a `Deserialize` and a `From<Error>`; calls that
//! run alone and calls dropped mid-way record nothing. On the memory store; each test that reads
//! spans and metrics runs alone in a child process (as in `course_paths.rs`).

#![allow(
    clippy::manual_assert,
    reason = "a `panic!` behind a condition the compiler cannot see through keeps the `Ok` after it reachable"
)]

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt as _;
use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{Transition, WriteOutcome};
use idempotent_runtime::{Error, Idempotency, MemoryStore, MissingKey, Status, Store, StoreError};
use idempotent_tests::seen::{self, Install, Seen};
use idempotent_tests::{AppError, Forward, FromPanics, SharedOverride, panic_text, poll_once};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tracing::Dispatch;
use tracing::instrument::{Instrument as _, WithSubscriber as _};

// ---------------------------------------------------------------------------------------------------
// Helpers (after `course_paths.rs`).

fn memory() -> (Idempotency, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    (Idempotency::builder_arc(store.clone()).build(), store)
}

/// `future`, which must end at its first poll (a call on the memory store that does not wait), from
/// code that cannot await (a `Deserialize`, a `From`).
fn at_once<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match poll_once(future.as_mut()) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("expected to end at its first poll"),
    }
}

/// The statuses of the records in `store`.
fn statuses(store: &MemoryStore) -> Vec<Status> {
    store.records().into_iter().map(|r| r.status).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// [`seen::apart`] for a test of this module.
fn apart(test: &str, install: Install, f: impl FnOnce(&Dispatch)) -> Option<Seen> {
    seen::apart(&format!("recorded_ends::{test}"), install, f)
}

/// Panics when dropped (a guard held by a body).
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("the body's guard panics as it is dropped");
        }
    }
}

/// A value whose `Serialize` panics.
#[derive(Debug, Deserialize)]
struct SerializePanics(#[allow(dead_code, reason = "held")] u32);

impl Serialize for SerializePanics {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("SerializePanics's Serialize panics")
    }
}

/// An error whose `Display` panics for its own variant.
#[derive(Debug)]
enum DisplayPanics {
    Own,
    Lib(#[allow(dead_code, reason = "held")] Error),
}

impl std::fmt::Display for DisplayPanics {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DisplayPanics::Own => panic!("DisplayPanics's Display panics"),
            DisplayPanics::Lib(_) => Ok(()),
        }
    }
}

impl From<Error> for DisplayPanics {
    fn from(e: Error) -> Self {
        DisplayPanics::Lib(e)
    }
}

/// A body that panics (after a yield, so that it is a body that was pending once).
async fn panics() -> Result<u32, AppError> {
    tokio::task::yield_now().await;
    if std::hint::black_box(true) {
        panic!("the body panics");
    }
    Ok(0)
}

const LONG: Duration = Duration::from_hours(1);

/// Awaits `call` for a moment, then gives up on it (drops it) while its body runs.
async fn give_up<F: Future>(call: F) {
    let gave_up = tokio::time::timeout(Duration::from_millis(5), call).await;
    assert!(gave_up.is_err(), "the caller gave up while the body ran");
}

// ---------------------------------------------------------------------------------------------------
// A detached call whose body's task the runtime drops.

/// A detached call whose caller gave up (the call goes on: `detach` promises that a caller who gives up
/// stops its waiting, not the work), then whose runtime shuts down under its body, after a drain that
/// timed out (a service's graceful shutdown). The call reached the store (its key is PENDING) and
/// ended with its runtime; it must be recorded once. Only its caller's side (`Joined`) records a task
/// the runtime dropped, and the caller is gone.
#[test]
#[ignore = "limit: a detached body's task dropped by its runtime, its caller gone, ends like a crash: \
            its key is PENDING until its lease lapses, and nothing records the call"]
fn a_detached_call_whose_caller_left_is_recorded_when_its_runtime_shuts_down() {
    const NS: &str = "ends::left_then_shut_down";
    let Some(seen) = apart(
        "a_detached_call_whose_caller_left_is_recorded_when_its_runtime_shuts_down",
        Install::ThreadDefault,
        |_| {
            let rt = runtime();
            let (idem, store) = memory();
            rt.block_on(async {
                let call = idem.operation(NS, "k").detach().run(|_| async {
                    tokio::time::sleep(LONG).await;
                    Ok::<_, AppError>(1_u32)
                });
                let gave_up = tokio::time::timeout(Duration::from_millis(10), call).await;
                assert!(gave_up.is_err(), "the caller gave up while the body ran");
                let left = idem.drain(Duration::from_millis(20)).await;
                assert_eq!(left, 1, "the drain timed out with the body still running");
            });
            drop(rt);
            assert_eq!(statuses(&store), [Status::Pending]);
        },
    ) else {
        return;
    };
    seen.assert_each_closed_with_an_outcome(NS, 1);
}

/// A detached call whose body's task is on a runtime that shuts down while its caller (on another
/// runtime) waits: the caller gets `ResultNotStored`, recorded once as `error` (by `Joined`), also
/// when its error's `From<Error>` panics (recorded before the conversion).
#[test]
fn a_detached_call_whose_runtime_shuts_down_under_its_waiting_caller_is_recorded_once() {
    const NS: &str = "ends::shut_down_caller_waits";
    let Some(seen) = apart(
        "a_detached_call_whose_runtime_shuts_down_under_its_waiting_caller_is_recorded_once",
        Install::ThreadDefault,
        |_| {
            let caller = runtime();
            let bodies = runtime();
            let (idem, store) = memory();
            let mut call = Box::pin(idem.operation(NS, "k").detach().run(|_| async {
                tokio::time::sleep(LONG).await;
                Ok::<_, AppError>(1_u32)
            }));
            // A second call, whose error's `From<Error>` panics.
            let mut converted = Box::pin(idem.operation(NS, "from").detach().run(|_| async {
                tokio::time::sleep(LONG).await;
                Ok::<_, FromPanics>(1_u32)
            }));
            {
                // Claimed, and its body's task spawned on `bodies`.
                let _in = bodies.enter();
                for _ in 0..4 {
                    assert!(poll_once(call.as_mut()).is_pending());
                    assert!(poll_once(converted.as_mut()).is_pending());
                }
            }
            bodies.block_on(async {
                for _ in 0..4 {
                    tokio::task::yield_now().await;
                }
            });
            assert_eq!(statuses(&store), [Status::Pending, Status::Pending]);
            drop(bodies);
            let got = caller.block_on(call);
            assert!(
                matches!(
                    got,
                    Err(AppError::Idempotency(Error::ResultNotStored { .. }))
                ),
                "{got:?}"
            );
            let got = caller.block_on(AssertUnwindSafe(converted).catch_unwind());
            let panic = got.expect_err("From<Error> panics");
            assert!(panic_text(&*panic).starts_with("From<Error> panics on"));
        },
    ) else {
        return;
    };
    seen.assert_closed(NS, &["error", "error"]);
}

/// The same, with a body that holds a guard whose `Drop` panics: the runtime catches that panic as it
/// drops the task, and hands it to the caller as the task's panic (tokio's `JoinError::Panic`, not
/// `Cancelled`). The call ended with its runtime, as above, and must be recorded once; `Joined`
/// records only a task that was cancelled, and takes this one for a body that panicked (which
/// the core records with its storing, which never ran here).
#[test]
#[ignore = "limit: a body whose Drop panics as its runtime drops its task is taken for a body that \
            panicked, whose end is recorded once stored, which never happened"]
fn a_detached_call_whose_body_panics_as_its_runtime_drops_it_is_recorded() {
    const NS: &str = "ends::shut_down_drop_panics";
    let Some(seen) = apart(
        "a_detached_call_whose_body_panics_as_its_runtime_drops_it_is_recorded",
        Install::ThreadDefault,
        |_| {
            let caller = runtime();
            let bodies = runtime();
            let (idem, store) = memory();
            let guard = PanicsOnDrop;
            let mut call = Box::pin(idem.operation(NS, "k").detach().run(|_| async move {
                let _guard = guard;
                tokio::time::sleep(LONG).await;
                Ok::<_, AppError>(1_u32)
            }));
            {
                let _in = bodies.enter();
                for _ in 0..4 {
                    assert!(poll_once(call.as_mut()).is_pending());
                }
            }
            bodies.block_on(async {
                for _ in 0..4 {
                    tokio::task::yield_now().await;
                }
            });
            assert_eq!(statuses(&store), [Status::Pending]);
            drop(bodies);
            let got = caller.block_on(AssertUnwindSafe(call).catch_unwind());
            let panic = got.expect_err("the guard's panic goes on to the caller");
            assert_eq!(
                panic_text(&*panic),
                "the body's guard panics as it is dropped"
            );
        },
    ) else {
        return;
    };
    seen.assert_each_closed_with_an_outcome(NS, 1);
}

/// A detached call polled outside a Tokio runtime panics (documented on `detach`), before it claims its
/// key: the key is not left PENDING for a lease by a call that could never run its body, and the call,
/// which did not reach the store, is not recorded. (It used to claim first, and panic where it spawned
/// its body's task, leaving the key held and the call unrecorded.)
#[test]
fn a_detached_call_polled_outside_a_runtime_panics_before_it_claims() {
    const NS: &str = "ends::no_runtime";
    let Some(seen) = apart(
        "a_detached_call_polled_outside_a_runtime_panics_before_it_claims",
        Install::ThreadDefault,
        |_| {
            let (idem, store) = memory();
            let mut call = Box::pin(
                idem.operation(NS, "k")
                    .detach()
                    .run(|_| async { Ok::<_, AppError>(1_u32) }),
            );
            let polled = std::panic::catch_unwind(AssertUnwindSafe(|| poll_once(call.as_mut())));
            let panic = polled.expect_err("spawning outside a runtime panics");
            assert!(
                panic_text(&*panic).contains("Tokio"),
                "{}",
                panic_text(&*panic)
            );
            drop(call);
            assert_eq!(statuses(&store), [], "the call claimed its key");
        },
    ) else {
        return;
    };
    assert_eq!(
        (seen.spans_of(NS), seen.counted_of(NS)),
        (vec![String::new()], Vec::new()),
        "(the outcome of the call's span, which closed with none; idempotency_calls_total)"
    );
}

// ---------------------------------------------------------------------------------------------------
// Where a body's panic is recorded: by `drive_core`, on the call's own span.

/// Calls whose futures carry their subscriber (`WithSubscriber`, the thread has none of its own): a
/// body's panic, its error's `Display` panic and its value's `Serialize` panic, in place and detached,
/// and a detached body's `Err` beside them. Each call must close its own span with its outcome and
/// count once. A detached body's task runs outside the caller's `WithSubscriber`, so its end must be
/// recorded on the call's span (held by the task), not on `Span::current()`, which there is not the
/// call's span (a body's panic was, when its storing recorded it).
#[test]
fn a_detached_bodys_panic_is_recorded_in_its_calls_span_under_a_scoped_subscriber() {
    const IN_PLACE: &str = "ends::scoped_in_place";
    const DETACHED: &str = "ends::scoped_detached";
    const DETACHED_ERR: &str = "ends::scoped_detached_err";
    let Some(seen) = apart(
        "a_detached_bodys_panic_is_recorded_in_its_calls_span_under_a_scoped_subscriber",
        Install::Scoped,
        |dispatch| {
            let rt = runtime();
            let idem = Idempotency::in_memory();
            let calls = async {
                for detached in [false, true] {
                    let ns = if detached { DETACHED } else { IN_PLACE };
                    let op = || idem.operation(ns, "k");
                    let body = if detached {
                        AssertUnwindSafe(op().detach().run(|_| panics()))
                            .catch_unwind()
                            .await
                    } else {
                        AssertUnwindSafe(op().run(|_| panics()))
                            .catch_unwind()
                            .await
                    };
                    assert_eq!(panic_text(&*body.expect_err("panics")), "the body panics");
                    let op = || idem.operation(ns, "display");
                    let display = if detached {
                        AssertUnwindSafe(
                            op().detach()
                                .run(|_| async { Err::<u32, _>(DisplayPanics::Own) }),
                        )
                        .catch_unwind()
                        .await
                    } else {
                        AssertUnwindSafe(op().run(|_| async { Err::<u32, _>(DisplayPanics::Own) }))
                            .catch_unwind()
                            .await
                    };
                    assert_eq!(
                        panic_text(&*display.expect_err("panics")),
                        "DisplayPanics's Display panics"
                    );
                    let op = || idem.operation(ns, "serialize");
                    let serialize = if detached {
                        AssertUnwindSafe(
                            op().detach()
                                .run(|_| async { Ok::<_, AppError>(SerializePanics(1)) }),
                        )
                        .catch_unwind()
                        .await
                    } else {
                        AssertUnwindSafe(
                            op().run(|_| async { Ok::<_, AppError>(SerializePanics(1)) }),
                        )
                        .catch_unwind()
                        .await
                    };
                    assert_eq!(
                        panic_text(&*serialize.expect_err("panics")),
                        "SerializePanics's Serialize panics"
                    );
                }
                let err = idem
                    .operation(DETACHED_ERR, "k")
                    .detach()
                    .run(|_| async { Err::<u32, _>(AppError::Declined) })
                    .await;
                assert!(matches!(err, Err(AppError::Declined)), "{err:?}");
            };
            rt.block_on(calls.with_subscriber(dispatch.clone()));
            drop(rt);
        },
    ) else {
        return;
    };
    seen.assert_closed(DETACHED_ERR, &["failed"]);
    seen.assert_closed(IN_PLACE, &["failed", "failed", "error"]);
    seen.assert_closed(DETACHED, &["failed", "failed", "error"]);
}

/// A service that turns the runtime's own spans off (a global filter on `idempotent_runtime`) and
/// keeps its own request spans, which have `outcome` and `attempt` fields of their own. A call's
/// outcome and claim attempts are the call's: they are never written into the span around the call
/// (a call's end is recorded on its own span, which is off; a body's panic was recorded on
/// `Span::current()`, then the request's span, when its storing recorded it; and every claim's
/// attempt number still was).
#[test]
fn a_calls_end_and_attempts_are_not_recorded_in_the_span_around_it() {
    const NS: &str = "ends::around";
    let Some(seen) = apart(
        "a_calls_end_and_attempts_are_not_recorded_in_the_span_around_it",
        Install::ThreadDefaultWithoutTheRuntimes,
        |_| {
            let rt = runtime();
            let idem = Idempotency::in_memory();
            rt.block_on(async {
                let request = tracing::info_span!(
                    "request",
                    outcome = tracing::field::Empty,
                    attempt = tracing::field::Empty
                );
                let fine = idem
                    .operation(NS, "fine")
                    .run(|_| async { Ok::<_, AppError>(1_u32) })
                    .instrument(request)
                    .await;
                assert_eq!(fine.unwrap(), 1);
                let request = tracing::info_span!(
                    "request",
                    outcome = tracing::field::Empty,
                    attempt = tracing::field::Empty
                );
                let panicked = AssertUnwindSafe(
                    idem.operation(NS, "panics")
                        .run(|_| panics())
                        .instrument(request),
                )
                .catch_unwind()
                .await;
                assert_eq!(
                    panic_text(&*panicked.expect_err("panics")),
                    "the body panics"
                );
            });
            drop(rt);
        },
    ) else {
        return;
    };
    assert_eq!(
        seen.counted_of(NS),
        [("executed".to_owned(), 1), ("failed".to_owned(), 1)]
    );
    assert_eq!(
        (
            seen.others_named("request", "outcome"),
            seen.others_named("request", "attempt")
        ),
        (vec![String::new(); 2], vec![String::new(); 2]),
        "the outcome and attempt of each request span around a call, as it closed (\"\" for none)"
    );
}

// ---------------------------------------------------------------------------------------------------
// Calls that run alone.

/// A missing key under `MissingKey::Skip` runs the body alone, in place and detached, and each call
/// is recorded once as `skipped` (the operations guide's outcomes), by a span of its own.
#[test]
fn a_skipped_call_is_recorded_once_as_skipped() {
    const NS: &str = "ends::skipped";
    let Some(seen) = apart(
        "a_skipped_call_is_recorded_once_as_skipped",
        Install::ThreadDefault,
        |_| {
            let rt = runtime();
            let (idem, store) = memory();
            rt.block_on(async {
                let op = || {
                    idem.operation(NS, &None::<u32>)
                        .missing_key(MissingKey::Skip)
                };
                let got = op().run(|_| async { Ok::<_, AppError>(1_u32) }).await;
                assert_eq!(got.unwrap(), 1);
                let got = op()
                    .detach()
                    .run(|_| async { Ok::<_, AppError>(2_u32) })
                    .await;
                assert_eq!(got.unwrap(), 2);
            });
            drop(rt);
            assert!(store.is_empty());
        },
    ) else {
        return;
    };
    seen.assert_closed(NS, &["skipped", "skipped"]);
}

// ---------------------------------------------------------------------------------------------------
// Detached calls whose callers left, under `drain`.

/// Detached calls whose callers gave up while their bodies ran, each ending another way on its task: a
/// value, an `Err`, a panic, an error's `Display` that panics, a value's `Serialize` that panics, and a
/// value that does not serialize whose `From<Error>` panics (converted on the task). Each is recorded
/// once, by its task, with its outcome; then drained.
#[test]
fn detached_calls_whose_callers_left_record_each_end_once() {
    const NS: &str = "ends::left";
    let Some(seen) = apart(
        "detached_calls_whose_callers_left_record_each_end_once",
        Install::ThreadDefault,
        |_| {
            let rt = runtime();
            let (idem, store) = memory();
            rt.block_on(async {
                let later = || tokio::time::sleep(Duration::from_millis(30));
                let op = |key| idem.operation(NS, key).detach();
                give_up(op("value").run(move |_| async move {
                    later().await;
                    Ok::<_, AppError>(1_u32)
                }))
                .await;
                give_up(op("err").run(move |_| async move {
                    later().await;
                    Err::<u32, _>(AppError::Declined)
                }))
                .await;
                give_up(op("panic").run(move |_| async move {
                    later().await;
                    panics().await
                }))
                .await;
                give_up(op("display").run(move |_| async move {
                    later().await;
                    Err::<u32, _>(DisplayPanics::Own)
                }))
                .await;
                give_up(op("serialize").run(move |_| async move {
                    later().await;
                    Ok::<_, AppError>(SerializePanics(1))
                }))
                .await;
                give_up(op("nan").run(move |_| async move {
                    later().await;
                    Ok::<_, FromPanics>(f64::NAN)
                }))
                .await;
                assert_eq!(idem.drain(Duration::from_secs(5)).await, 0);
            });
            drop(rt);
            let statuses = statuses(&store);
            assert!(
                !statuses.contains(&Status::Pending),
                "every end was stored: {statuses:?}"
            );
        },
    ) else {
        return;
    };
    seen.assert_closed(
        NS,
        &["executed", "failed", "failed", "failed", "error", "error"],
    );
}

// ---------------------------------------------------------------------------------------------------
// `on_replay`, steps, `timeout`.

/// A replay whose `on_replay` hook panics, in place and detached: the call was recorded as `replayed`
/// before the hook ran, once; the panic goes on.
#[test]
fn a_replay_whose_on_replay_panics_is_recorded_once() {
    const IN_PLACE: &str = "ends::hook_in_place";
    const DETACHED: &str = "ends::hook_detached";
    let Some(seen) = apart(
        "a_replay_whose_on_replay_panics_is_recorded_once",
        Install::ThreadDefault,
        |_| {
            let rt = runtime();
            let idem = Idempotency::in_memory();
            rt.block_on(async {
                let hook = |_: u32| -> u32 {
                    if std::hint::black_box(true) {
                        panic!("on_replay panics");
                    }
                    0
                };
                for detached in [false, true] {
                    let ns = if detached { DETACHED } else { IN_PLACE };
                    for n in 0..2 {
                        let op = idem.operation(ns, "k").on_replay(hook);
                        let got = if detached {
                            AssertUnwindSafe(
                                op.detach().run(|_| async { Ok::<_, AppError>(7_u32) }),
                            )
                            .catch_unwind()
                            .await
                        } else {
                            AssertUnwindSafe(op.run(|_| async { Ok::<_, AppError>(7_u32) }))
                                .catch_unwind()
                                .await
                        };
                        match (n, got) {
                            (0, Ok(Ok(7))) => {}
                            (1, Err(panic)) => assert_eq!(panic_text(&*panic), "on_replay panics"),
                            (n, other) => panic!("{ns} call {n}: {other:?}"),
                        }
                    }
                }
            });
            drop(rt);
        },
    ) else {
        return;
    };
    seen.assert_closed(IN_PLACE, &["executed", "replayed"]);
    seen.assert_closed(DETACHED, &["executed", "replayed"]);
}

/// Calls with steps, in place and detached: a first call whose body fails after a step (`failed`), a
/// retry that resumes and completes (`executed`, the finished step not run again), a duplicate
/// (`replayed`): each recorded once.
#[test]
fn calls_with_steps_record_each_end_once() {
    const IN_PLACE: &str = "ends::steps_in_place";
    const DETACHED: &str = "ends::steps_detached";
    let Some(seen) = apart(
        "calls_with_steps_record_each_end_once",
        Install::ThreadDefault,
        |_| {
            let rt = runtime();
            let idem = Idempotency::in_memory();
            rt.block_on(async {
                for detached in [false, true] {
                    let ns = if detached { DETACHED } else { IN_PLACE };
                    let effects = Arc::new(AtomicUsize::new(0));
                    for (n, fail) in [(0, true), (1, false), (2, false)] {
                        let e = effects.clone();
                        let op = idem.operation(ns, "k").steps();
                        let body = move |cx: idempotent_runtime::Context<
                            idempotent_runtime::Steps,
                        >| async move {
                            let (steps, ()) = cx.into_parts();
                            let v = steps
                                .run("charge", || async {
                                    e.fetch_add(1, Ordering::SeqCst);
                                    Ok::<_, AppError>(5_u32)
                                })
                                .await?;
                            tokio::task::yield_now().await;
                            if fail {
                                Err(AppError::Declined)
                            } else {
                                Ok(v + 1)
                            }
                        };
                        let got = if detached {
                            op.detach().run(body).await
                        } else {
                            op.run(body).await
                        };
                        match (n, got) {
                            (0, Err(AppError::Declined)) | (1 | 2, Ok(6)) => {}
                            (n, other) => panic!("{ns} call {n}: {other:?}"),
                        }
                    }
                    assert_eq!(effects.load(Ordering::SeqCst), 1, "the step ran once");
                }
            });
            drop(rt);
        },
    ) else {
        return;
    };
    seen.assert_closed(IN_PLACE, &["failed", "executed", "replayed"]);
    seen.assert_closed(DETACHED, &["failed", "executed", "replayed"]);
}

/// A call in place dropped mid-body (`tokio::time::timeout`): it is not required to record an outcome,
/// and must not record two; a detached call whose caller times out while its claim is answered at once
/// records its replay once.
#[test]
fn calls_under_a_timeout_record_at_most_once() {
    const DROPPED: &str = "ends::timeout_dropped";
    const REPLAY: &str = "ends::timeout_replay";
    let Some(seen) = apart(
        "calls_under_a_timeout_record_at_most_once",
        Install::ThreadDefault,
        |_| {
            let rt = runtime();
            let idem = Idempotency::in_memory();
            rt.block_on(async {
                let dropped = tokio::time::timeout(
                    Duration::from_millis(5),
                    idem.operation(DROPPED, "k").run(|_| async {
                        tokio::time::sleep(LONG).await;
                        Ok::<_, AppError>(1_u32)
                    }),
                )
                .await;
                assert!(dropped.is_err());
                for _ in 0..2 {
                    let got = tokio::time::timeout(
                        Duration::from_secs(5),
                        idem.operation(REPLAY, "k")
                            .detach()
                            .run(|_| async { Ok::<_, AppError>(3_u32) }),
                    )
                    .await;
                    assert_eq!(got.unwrap().unwrap(), 3);
                }
                idem.drain(Duration::from_secs(5)).await;
            });
            drop(rt);
        },
    ) else {
        return;
    };
    let dropped = seen.spans_of(DROPPED);
    assert!(
        dropped.len() == 1 && seen.counted_of(DROPPED).iter().map(|(_, n)| n).sum::<u64>() <= 1,
        "a dropped call: one span, at most one count; spans {dropped:?}, counted {:?}",
        seen.counted_of(DROPPED)
    );
    seen.assert_closed(REPLAY, &["executed", "replayed"]);
}

// ---------------------------------------------------------------------------------------------------
// Nested calls: in a store, a `Deserialize`, a `From<Error>`.

/// The namespace of the calls made inside other calls' code.
const NESTED: &str = "ends::nested";

/// A store whose transitions (a body's end stored, a heartbeat) each make a call of their own (on
/// `nested`, a handle of its own), inside the outer call's core.
#[derive(Debug)]
struct CallInTransition {
    nested: Idempotency,
    made: AtomicUsize,
}

#[async_trait::async_trait]
impl Override<Forward> for CallInTransition {
    fn kind(&self) -> &'static str {
        "ends-call-in-transition"
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let n = self.made.fetch_add(1, Ordering::SeqCst);
        let got = self
            .nested
            .operation(NESTED, &format!("store-{n}"))
            .run(|_| async {
                tokio::task::yield_now().await;
                Ok::<_, Error>(1_u32)
            })
            .await;
        assert_eq!(got.unwrap(), 1);
        inner.transition(transition).await
    }
}

/// A value whose `Deserialize` makes a call of its own (on [`NESTED_IDEM`]'s handle), which ends at once.
#[derive(Debug, Serialize, PartialEq, Eq)]
struct CallsInDeserialize(u32);

thread_local! {
    static NESTED_IDEM: std::cell::RefCell<Option<Idempotency>> = const { std::cell::RefCell::new(None) };
    static NESTED_MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn nested_call() {
    let idem = NESTED_IDEM
        .with(|i| i.borrow().clone())
        .expect("set by the test");
    let n = NESTED_MADE.get();
    NESTED_MADE.set(n + 1);
    let got = at_once(
        idem.operation(NESTED, &format!("sync-{n}"))
            .run(|_| async { Ok::<_, Error>(2_u32) }),
    );
    assert_eq!(got.unwrap(), 2);
}

impl<'de> Deserialize<'de> for CallsInDeserialize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u32::deserialize(d)?;
        nested_call();
        Ok(CallsInDeserialize(v))
    }
}

/// An error whose `From<Error>` makes a call of its own.
#[derive(Debug)]
struct CallsInFrom(#[allow(dead_code, reason = "held")] Error);

impl std::fmt::Display for CallsInFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("calls in from")
    }
}

impl From<Error> for CallsInFrom {
    fn from(e: Error) -> Self {
        nested_call();
        CallsInFrom(e)
    }
}

/// Calls nested in an outer call's code, each recorded once in its own span under its own namespace,
/// and the outer calls once each: in the store's transition that stores the outer body's panic (inside
/// the outer core's poll, before `drive_core` records the panic on the outer call's span); in a replay's
/// `Deserialize` (inside `recorded`'s `catch_unwind`, in place and detached); in a `From<Error>`
/// (after `recorded`, in place and detached).
#[test]
fn calls_nested_in_a_store_a_deserialize_and_a_from_record_their_own_ends() {
    const OUTER: &str = "ends::outer";
    let Some(seen) = apart(
        "calls_nested_in_a_store_a_deserialize_and_a_from_record_their_own_ends",
        Install::ThreadDefault,
        |_| {
            let rt = runtime();
            let nested = Idempotency::in_memory();
            NESTED_IDEM.with(|i| *i.borrow_mut() = Some(nested.clone()));
            let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
            let hooks = Arc::new(CallInTransition {
                nested,
                made: AtomicUsize::new(0),
            });
            let wrapped = Arc::new(Delegating::new(
                Forward(store.clone()),
                SharedOverride(hooks.clone()),
            ));
            let idem = Idempotency::builder_arc(wrapped).build();
            let plain = Idempotency::in_memory();
            rt.block_on(async {
                // The store's transition that stores the panic makes a call.
                let panicked = AssertUnwindSafe(idem.operation(OUTER, "panics").run(|_| panics()))
                    .catch_unwind()
                    .await;
                assert_eq!(
                    panic_text(&*panicked.expect_err("panics")),
                    "the body panics"
                );
                assert_eq!(hooks.made.load(Ordering::SeqCst), 1);
                // A replay's Deserialize makes a call (the first call's read-back check too).
                for detached in [false, true] {
                    let key = if detached {
                        "deserialize-detached"
                    } else {
                        "deserialize"
                    };
                    for _ in 0..2 {
                        let op = plain.operation(OUTER, key);
                        let got = if detached {
                            op.detach()
                                .run(|_| async { Ok::<_, AppError>(CallsInDeserialize(4)) })
                                .await
                        } else {
                            op.run(|_| async { Ok::<_, AppError>(CallsInDeserialize(4)) })
                                .await
                        };
                        assert_eq!(got.unwrap(), CallsInDeserialize(4));
                    }
                }
                // A payload mismatch's From<Error> makes a call.
                for detached in [false, true] {
                    let key = if detached { "from-detached" } else { "from" };
                    for payload in [1, 2] {
                        let op = plain.operation(OUTER, key).payload(&payload);
                        let got = if detached {
                            op.detach()
                                .run(|_| async { Ok::<_, CallsInFrom>(1_u32) })
                                .await
                        } else {
                            op.run(|_| async { Ok::<_, CallsInFrom>(1_u32) }).await
                        };
                        assert_eq!(got.is_ok(), payload == 1, "{got:?}");
                    }
                }
            });
            drop(rt);
        },
    ) else {
        return;
    };
    seen.assert_closed(
        OUTER,
        &[
            "failed",
            "executed",
            "replayed",
            "executed",
            "replayed",
            "executed",
            "payload_mismatch",
            "executed",
            "payload_mismatch",
        ],
    );
    // One store call, four read-back checks and replays' Deserialize (two each, in place and
    // detached), two From<Error>: all executed, each once.
    seen.assert_closed(NESTED, &["executed"; 7]);
}
