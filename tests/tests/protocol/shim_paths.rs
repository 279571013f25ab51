//! The typed shim's paths the other shim tests leave out (`handler::run`: `drive_core`, `discard`,
//! `Over::end`; `operation`: `start`, `Drive`): what `discard` runs (a `Drop` making a call of its own
//! key, a panic payload whose own `Drop` panics), the spans of every kind of call, `From<Error>` called
//! once on every error path, a waiter behind a panicking body, a call polled after it ended or
//! panicked, a detached body panicking after its caller left. On the memory store.

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
use idempotent_runtime::{Error, Idempotency, MemoryStore, Status, Store};
use idempotent_tests::{AppError, panic_text, poll_once};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NS: &str = "shim_paths::call";

fn memory() -> (Idempotency, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    (Idempotency::builder_arc(store.clone()).build(), store)
}

async fn status(store: &dyn Store, key: &str) -> Option<Status> {
    let key = idempotent_runtime::derive_key(NS, key).unwrap();
    store.get(&key).await.unwrap().map(|r| r.status)
}

/// Runs the test `test` in a child process ([`idempotent_tests::spans::in_child`]) and checks that it
/// passed there.
fn in_child(test: &str, child: &str) {
    let out = idempotent_tests::spans::in_child(test, child);
    assert!(
        out.status.success(),
        "{:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A value whose `Serialize` panics, and whose `Drop` runs its function.
#[derive(Debug)]
struct Doomed(fn());

impl Serialize for Doomed {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("Serialize panics")
    }
}

impl<'de> Deserialize<'de> for Doomed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <()>::deserialize(d).map(|()| Doomed(|| ()))
    }
}

impl Drop for Doomed {
    fn drop(&mut self) {
        (self.0)();
    }
}

// ---------------------------------------------------------------------------------------------------
// What `discard` runs.

/// A value whose `Serialize` panics and whose `Drop` panics with a payload whose own `Drop` panics
/// (checked in a child process): nothing aborts, the record is COMPLETED (not serialized), and the
/// panic the caller gets is the call's own (its `Serialize`'s), not the one thrown while the kept value
/// was discarded.
#[test]
#[allow(
    clippy::items_after_statements,
    reason = "the child's types, after the parent's early return"
)]
fn a_discarded_values_panic_payload_panicking_in_its_drop() {
    const CHILD: &str = "SHIM_PATHS_PAYLOAD_BOMB_CHILD";
    if std::env::var_os(CHILD).is_none() {
        return in_child(
            "shim_paths::a_discarded_values_panic_payload_panicking_in_its_drop",
            CHILD,
        );
    }
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's Drop panics")
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (idem, store) = memory();
    let caught = rt.block_on(
        AssertUnwindSafe(
            idem.operation(NS, "bomb")
                .run(|_| async { Ok::<_, AppError>(Doomed(|| std::panic::panic_any(Bomb))) }),
        )
        .catch_unwind(),
    );
    let panic = match caught {
        Ok(r) => {
            std::mem::forget(r);
            panic!("the call did not panic")
        }
        Err(panic) => panic,
    };
    assert_eq!(
        rt.block_on(status(&*store, "bomb")),
        Some(Status::Completed)
    );
    assert_eq!(panic_text(&*panic), "Serialize panics");
}

thread_local! {
    static SAME_KEY: std::cell::RefCell<Option<(Idempotency, String)>> =
        const { std::cell::RefCell::new(None) };
    static SAME_KEY_GOT: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
    static SAME_KEY_RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Makes a call of the outer call's own handle and key (it ends at once on the memory store) and keeps
/// what it got.
fn call_same_key() {
    let Some((idem, key)) = SAME_KEY.with_borrow(Clone::clone) else {
        return;
    };
    let mut call = Box::pin(idem.operation(NS, &key).run(|_| async {
        SAME_KEY_RUNS.set(SAME_KEY_RUNS.get() + 1);
        Ok::<_, AppError>(7_u32)
    }));
    let got = match poll_once(call.as_mut()) {
        Poll::Ready(Ok(v)) => format!("ok {v}"),
        Poll::Ready(Err(AppError::Idempotency(e))) => format!("err {e:?}"),
        Poll::Ready(Err(e)) => format!("err {e}"),
        Poll::Pending => "pending".to_owned(),
    };
    SAME_KEY_GOT.with_borrow_mut(|g| g.push(got));
}

/// An error whose `Display` panics, and whose `Drop` (run by `discard`, after the failure is recorded)
/// calls its own key: the key is free by then, so the nested call runs its body and stores its value;
/// the caller gets the `Display`'s panic.
#[tokio::test(flavor = "current_thread")]
async fn a_discarded_errors_drop_calls_its_own_key() {
    #[derive(Debug)]
    struct Loud;
    impl std::fmt::Display for Loud {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            panic!("Display panics")
        }
    }
    impl From<Error> for Loud {
        fn from(_: Error) -> Self {
            Loud
        }
    }
    impl Drop for Loud {
        fn drop(&mut self) {
            call_same_key();
        }
    }
    let (idem, store) = memory();
    SAME_KEY.set(Some((idem.clone(), "loud".to_owned())));
    let caught = AssertUnwindSafe(
        idem.operation(NS, "loud")
            .run(|_| async { Err::<u32, _>(Loud) }),
    )
    .catch_unwind()
    .await;
    SAME_KEY.set(None);
    let panic = caught.expect_err("the call panics");
    assert_eq!(panic_text(&*panic), "Display panics");
    assert_eq!(SAME_KEY_GOT.take(), ["ok 7"]);
    assert_eq!(SAME_KEY_RUNS.get(), 1);
    assert_eq!(status(&*store, "loud").await, Some(Status::Completed));
}

/// A value whose `Serialize` panics, whose `Drop` (run by `discard`) calls its own key: the success is
/// final by then, so the nested call gets `ResponseNotSerialized` without running its body.
#[tokio::test(flavor = "current_thread")]
async fn a_discarded_values_drop_calls_its_own_key() {
    let (idem, store) = memory();
    SAME_KEY_RUNS.set(0);
    SAME_KEY.set(Some((idem.clone(), "doomed".to_owned())));
    let caught = AssertUnwindSafe(
        idem.operation(NS, "doomed")
            .run(|_| async { Ok::<_, AppError>(Doomed(call_same_key)) }),
    )
    .catch_unwind()
    .await;
    SAME_KEY.set(None);
    let panic = match caught {
        Ok(r) => {
            std::mem::forget(r);
            panic!("the call did not panic")
        }
        Err(panic) => panic,
    };
    assert_eq!(panic_text(&*panic), "Serialize panics");
    let got = SAME_KEY_GOT.take();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].contains("ResponseNotSerialized"), "{got:?}");
    assert_eq!(SAME_KEY_RUNS.get(), 0);
    assert_eq!(status(&*store, "doomed").await, Some(Status::Completed));
}

// ---------------------------------------------------------------------------------------------------
// `From<Error>` once on every error path.

static CONVERSIONS: AtomicUsize = AtomicUsize::new(0);

/// An error that counts its conversions from the library's.
#[derive(Debug)]
enum Counted {
    Own,
    Lib(Error),
}
impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
impl From<Error> for Counted {
    fn from(e: Error) -> Self {
        CONVERSIONS.fetch_add(1, Ordering::SeqCst);
        Counted::Lib(e)
    }
}

/// A value whose stored JSON does not read back as a `Strict` once the test says so.
static STRICT_REFUSES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
#[derive(Debug, Serialize)]
struct Strict(u32);
impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u32::deserialize(d)?;
        if STRICT_REFUSES.load(Ordering::SeqCst) {
            return Err(serde::de::Error::custom("refused"));
        }
        Ok(Strict(v))
    }
}

/// Each error the library gives a call (a replay that does not decode, a key in progress, a payload
/// that does not match, a lease too short, no store) is converted into the function's error exactly
/// once, and the body does not run.
#[tokio::test(flavor = "current_thread")]
async fn from_error_is_called_once_on_every_error_path() {
    let (idem, _store) = memory();
    let runs = AtomicUsize::new(0);
    let run = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Counted>(Strict(1))
    };
    let convert = |before: usize| CONVERSIONS.load(Ordering::SeqCst) - before;
    // The first call stores its value.
    let first = idem
        .operation(NS, "conv")
        .payload(&"a")
        .run(|_| run())
        .await;
    assert!(matches!(first, Ok(Strict(1))), "{first:?}");
    // A replay that does not decode.
    STRICT_REFUSES.store(true, Ordering::SeqCst);
    let before = CONVERSIONS.load(Ordering::SeqCst);
    let r = idem
        .operation(NS, "conv")
        .payload(&"a")
        .run(|_| run())
        .await;
    STRICT_REFUSES.store(false, Ordering::SeqCst);
    assert!(
        matches!(r, Err(Counted::Lib(Error::Deserialize { .. }))),
        "{r:?}"
    );
    assert_eq!(convert(before), 1, "replay that does not decode");
    // A payload that does not match.
    let before = CONVERSIONS.load(Ordering::SeqCst);
    let r = idem
        .operation(NS, "conv")
        .payload(&"b")
        .run(|_| run())
        .await;
    assert!(
        matches!(r, Err(Counted::Lib(Error::PayloadMismatch { .. }))),
        "{r:?}"
    );
    assert_eq!(convert(before), 1, "payload mismatch");
    // A lease too short.
    let before = CONVERSIONS.load(Ordering::SeqCst);
    let r = idem
        .operation(NS, "conv-lease")
        .lease(Duration::from_millis(1))
        .run(|_| run())
        .await;
    assert!(
        matches!(r, Err(Counted::Lib(Error::LeaseTooShort { .. }))),
        "{r:?}"
    );
    assert_eq!(convert(before), 1, "lease too short");
    // In progress: a running call holds the key.
    let gate = tokio::sync::Notify::new();
    let holder = idem.operation(NS, "conv-held").run(|_| async {
        gate.notified().await;
        Ok::<_, Counted>(Strict(2))
    });
    let mut holder = std::pin::pin!(holder);
    assert!(poll_once(holder.as_mut()).is_pending());
    let before = CONVERSIONS.load(Ordering::SeqCst);
    let r = idem.operation(NS, "conv-held").run(|_| run()).await;
    assert!(
        matches!(r, Err(Counted::Lib(Error::InProgress { .. }))),
        "{r:?}"
    );
    assert_eq!(convert(before), 1, "in progress");
    gate.notify_one();
    assert!(matches!(holder.await, Ok(Strict(2))));
    // The body's own error is not converted.
    let before = CONVERSIONS.load(Ordering::SeqCst);
    let r = idem
        .operation(NS, "conv-own")
        .run(|_| async { Err::<Strict, _>(Counted::Own) })
        .await;
    assert!(matches!(r, Err(Counted::Own)), "{r:?}");
    assert_eq!(convert(before), 0, "the body's own error");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only the first call ran its body"
    );
}

// ---------------------------------------------------------------------------------------------------
// A waiter behind a panicking body.

/// A call that waits (`wait`) for a key held by a body that then panics: the panic frees the key, and
/// the waiter runs its own body and gets its own value (not the panicking call's, not an error).
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_behind_a_panicking_body_runs_its_own() {
    let (idem, store) = memory();
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let idem2 = idem.clone();
    let first = tokio::spawn(async move {
        AssertUnwindSafe(idem2.operation(NS, "waited").run(|_| async move {
            g.notified().await;
            if std::hint::black_box(true) {
                panic!("the first body panics");
            }
            Ok::<u32, AppError>(1)
        }))
        .catch_unwind()
        .await
        .is_err()
    });
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    let runs = AtomicUsize::new(0);
    let waiter = idem
        .operation(NS, "waited")
        .wait(Duration::from_secs(5))
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, AppError>(2)
        });
    let mut waiter = std::pin::pin!(waiter);
    assert!(poll_once(waiter.as_mut()).is_pending(), "the waiter waits");
    gate.notify_one();
    assert!(first.await.unwrap(), "the first call panicked");
    assert_eq!(status(&*store, "waited").await, Some(Status::Failed));
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
    assert!(matches!(got, Ok(Ok(2))), "{got:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(status(&*store, "waited").await, Some(Status::Completed));
}

// ---------------------------------------------------------------------------------------------------
// A call polled again after it ended.

/// A call polled again after it panicked, or after it returned `Ready`: it panics (it never runs its
/// body again, hangs, or changes the record).
#[test]
fn a_call_polled_after_it_panicked_or_ended() {
    let (idem, store) = memory();
    let runs = AtomicUsize::new(0);
    let call = idem.operation(NS, "again").run(|_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        if runs.load(Ordering::SeqCst) > 0 {
            panic!("the body panics");
        }
        Ok::<u32, AppError>(1)
    });
    let mut call = std::pin::pin!(call);
    let first = std::panic::catch_unwind(AssertUnwindSafe(|| poll_once(call.as_mut())));
    assert!(first.is_err());
    let again = std::panic::catch_unwind(AssertUnwindSafe(|| poll_once(call.as_mut())));
    assert!(again.is_err(), "a call polled after its panic panics");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let st = futures_util::FutureExt::now_or_never(status(&*store, "again")).unwrap();
    assert_eq!(st, Some(Status::Failed));

    let call = idem
        .operation(NS, "again-ok")
        .run(|_| async { Ok::<u32, AppError>(3) });
    let mut call = std::pin::pin!(call);
    assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(3))));
    let again = std::panic::catch_unwind(AssertUnwindSafe(|| poll_once(call.as_mut())));
    assert!(again.is_err(), "a call polled after Ready panics");
    let st = futures_util::FutureExt::now_or_never(status(&*store, "again-ok")).unwrap();
    assert_eq!(st, Some(Status::Completed));
}

// ---------------------------------------------------------------------------------------------------
// Detached calls.

/// A detached body that panics after its caller was dropped: the failure is recorded (the key free at
/// once) and a retry runs its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_body_panicking_after_its_caller_left() {
    let (idem, store) = memory();
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let (s, g) = (started.clone(), gate.clone());
    let idem2 = idem.clone();
    let call = tokio::spawn(async move {
        idem2
            .operation(NS, "detached-panic")
            .detach()
            .run(move |_| async move {
                s.notify_one();
                g.notified().await;
                if std::hint::black_box(true) {
                    panic!("the detached body panics");
                }
                Ok::<u32, AppError>(1)
            })
            .await
    });
    started.notified().await;
    call.abort();
    let _ = call.await;
    gate.notify_one();
    let mut st = None;
    for _ in 0..200 {
        st = status(&*store, "detached-panic").await;
        if st == Some(Status::Failed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(st, Some(Status::Failed));
    let r = idem
        .operation(NS, "detached-panic")
        .run(|_| async { Ok::<u32, AppError>(2) })
        .await;
    assert!(matches!(r, Ok(2)), "{r:?}");
}

// ---------------------------------------------------------------------------------------------------
// Spans.

/// Every kind of call closes at most one `idempotent` span, with its outcome: a run, a replay, a replay
/// that does not decode, a key in progress, a payload mismatch, a detached call and its replay, a body
/// that fails, a body that panics (`failed`: its record is FAILED, and the span is closed before the
/// panic leaves), in place or detached, a value whose `Serialize` panics (`error`: its record is
/// COMPLETED without its value). Errors before the body (a lease too short) open none.
#[test]
fn every_path_closes_one_span_with_its_outcome() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let spans = idempotent_tests::spans::ClosedSpans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (idem, _store) = memory();
        let ok = |v: u32| async move { Ok::<_, Counted>(Strict(v)) };
        // executed, replayed
        let _ = idem
            .operation("sp::run", "k")
            .payload(&1)
            .run(|_| ok(1))
            .await;
        let _ = idem.operation("sp::replay", "k").run(|_| ok(1)).await;
        let _ = idem.operation("sp::replay", "k").run(|_| ok(1)).await;
        // a replay that does not decode
        let _ = idem.operation("sp::undecodable", "k").run(|_| ok(1)).await;
        STRICT_REFUSES.store(true, Ordering::SeqCst);
        let _ = idem.operation("sp::undecodable", "k").run(|_| ok(1)).await;
        STRICT_REFUSES.store(false, Ordering::SeqCst);
        // a payload mismatch
        let _ = idem
            .operation("sp::run", "k")
            .payload(&2)
            .run(|_| ok(1))
            .await;
        // a lease too short: no span
        let _ = idem
            .operation("sp::lease", "k")
            .lease(Duration::from_millis(1))
            .run(|_| ok(1))
            .await;
        // a body that fails
        let _ = idem
            .operation("sp::failed", "k")
            .run(|_| async { Err::<Strict, _>(Counted::Own) })
            .await;
        // a body that panics
        let panicked = AssertUnwindSafe(idem.operation("sp::panic", "k").run(|_| async {
            if std::hint::black_box(true) {
                panic!("the body panics");
            }
            Ok::<_, Counted>(Strict(1))
        }))
        .catch_unwind()
        .await;
        assert!(panicked.is_err());
        // a value whose `Serialize` panics: COMPLETED without its value
        let panicked = AssertUnwindSafe(
            idem.operation("sp::serialize_panic", "k")
                .run(|_| async { Ok::<_, Counted>(Doomed(|| ())) }),
        )
        .catch_unwind()
        .await;
        assert!(panicked.is_err());
        // a detached body that panics
        let panicked = AssertUnwindSafe(idem.operation("sp::detached_panic", "k").detach().run(
            |_| async {
                if std::hint::black_box(true) {
                    panic!("the detached body panics");
                }
                Ok::<_, Counted>(Strict(1))
            },
        ))
        .catch_unwind()
        .await;
        assert!(panicked.is_err());
        // a detached call and its replay
        let _ = idem
            .operation("sp::detached", "k")
            .detach()
            .run(|_| ok(1))
            .await;
        let _ = idem
            .operation("sp::detached", "k")
            .detach()
            .run(|_| ok(1))
            .await;
    });
    drop(rt);
    let closed = spans.namespaces_and_outcomes();
    let closed: Vec<(&str, &str)> = closed
        .iter()
        .map(|(n, o)| (n.as_str(), o.as_str()))
        .collect();
    assert_eq!(
        closed,
        [
            ("sp::run", "executed"),
            ("sp::replay", "executed"),
            ("sp::replay", "replayed"),
            ("sp::undecodable", "executed"),
            ("sp::undecodable", "error"),
            ("sp::run", "payload_mismatch"),
            ("sp::failed", "failed"),
            ("sp::panic", "failed"),
            ("sp::serialize_panic", "error"),
            ("sp::detached_panic", "failed"),
            ("sp::detached", "executed"),
            ("sp::detached", "replayed"),
        ],
        "{closed:#?}"
    );
}

// ---------------------------------------------------------------------------------------------------
// The builder's options around the shim's ends.

/// An error whose `Display` panics (the caller gets its panic), after the finished step of a body with
/// steps: the failure is recorded, the key is free, and a retry resumes after that step and gets its
/// own value; with `transact` too (memory store), whose staged writes do not commit with a failure.
#[tokio::test(flavor = "current_thread")]
async fn a_panicking_display_after_a_step_and_with_a_transaction() {
    #[derive(Debug)]
    enum Loud {
        Loud,
        Lib(Error),
    }
    impl std::fmt::Display for Loud {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Loud::Loud => panic!("Display panics"),
                Loud::Lib(e) => write!(f, "{e}"),
            }
        }
    }
    impl From<Error> for Loud {
        fn from(e: Error) -> Self {
            Loud::Lib(e)
        }
    }
    let (idem, store) = memory();
    let steps_run = AtomicUsize::new(0);
    let call = |fail: bool| {
        let steps_run = &steps_run;
        AssertUnwindSafe(
            idem.operation(NS, "steps-loud")
                .steps()
                .run(move |cx| async move {
                    let (steps, ()) = cx.into_parts();
                    let a = steps
                        .run("a", || async {
                            steps_run.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Loud>(10_u32)
                        })
                        .await?;
                    if fail {
                        return Err(Loud::Loud);
                    }
                    Ok::<_, Loud>(a + 1)
                }),
        )
        .catch_unwind()
    };
    let panic = call(true).await.expect_err("the Display's panic goes on");
    assert_eq!(panic_text(&*panic), "Display panics");
    assert_eq!(status(&*store, "steps-loud").await, Some(Status::Failed));
    let r = call(false).await.expect("no panic");
    assert!(matches!(r, Ok(11)), "{r:?}");
    assert_eq!(
        steps_run.load(Ordering::SeqCst),
        1,
        "the finished step did not run again"
    );
    let again = call(true).await.expect("a replay does not run the body");
    assert!(matches!(again, Ok(11)), "{again:?}");

    // With a transaction (memory store).
    let runs = AtomicUsize::new(0);
    let tx_call = |fail: bool| {
        let runs = &runs;
        AssertUnwindSafe(
            idem.operation(NS, "tx-loud")
                .transact()
                .run(move |_cx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if fail {
                        return Err(Loud::Loud);
                    }
                    Ok::<_, Loud>(5_u32)
                }),
        )
        .catch_unwind()
    };
    match tx_call(true).await {
        Err(panic) => {
            assert_eq!(panic_text(&*panic), "Display panics");
            assert_eq!(status(&*store, "tx-loud").await, Some(Status::Failed));
            let r = tx_call(false).await.expect("no panic");
            assert!(matches!(r, Ok(5)), "{r:?}");
            assert_eq!(runs.load(Ordering::SeqCst), 2);
        }
        // The memory store refuses transactions before the body runs.
        Ok(r) => {
            assert!(matches!(r, Err(Loud::Lib(_))), "{r:?}");
            assert_eq!(runs.load(Ordering::SeqCst), 0, "{r:?}");
        }
    }
}

/// A deadline already passed, and a key that does not serialize: the library's error, converted once,
/// and the body does not run.
#[tokio::test(flavor = "current_thread")]
async fn errors_before_the_body_convert_once() {
    struct BadKey;
    impl Serialize for BadKey {
        fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no key"))
        }
    }
    let (idem, store) = memory();
    let runs = AtomicUsize::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Counted>(Strict(1))
    };
    let before = CONVERSIONS.load(Ordering::SeqCst);
    let r = idem
        .operation(NS, "deadline")
        .deadline(std::time::SystemTime::now() - Duration::from_secs(5))
        .run(|_| body())
        .await;
    assert!(matches!(r, Err(Counted::Lib(_))), "{r:?}");
    assert_eq!(CONVERSIONS.load(Ordering::SeqCst) - before, 1);
    let before = CONVERSIONS.load(Ordering::SeqCst);
    let r = idem.operation(NS, &BadKey).run(|_| body()).await;
    assert!(matches!(r, Err(Counted::Lib(_))), "{r:?}");
    assert_eq!(CONVERSIONS.load(Ordering::SeqCst) - before, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(status(&*store, "deadline").await, None);
}
