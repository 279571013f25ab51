//! The paths through the shim's one core since it also carries the calls that run alone and the calls
//! that cannot start (`handler::run`: `InPlace`, `drive_core`, `Started`, `Ended`; `operation`: `Drive`,
//! `DriveDetached`): how each kind of call ends, what its span and `idempotency_calls_total` say of
//! it, in place and detached, with panics in `Deserialize` and `From<Error>`, with a detached call's
//! caller gone; what a call that runs alone (`MissingKey::Skip`, the kill switch) and a call that cannot
//! start do, nested in each other too; when a call's future is `Send`. On the memory store.

#![allow(
    clippy::manual_assert,
    reason = "a `panic!` behind a condition the compiler cannot see through keeps the `Ok` after it reachable"
)]

use std::cell::Cell;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt as _;
use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{Change, ClaimOutcome, ClaimRequest, Transition, WriteOutcome};
use idempotent_runtime::{
    Error, Idempotency, MemoryStore, MissingKey, Operation, Status, Store, StoreError, idempotent,
    observe,
};
use idempotent_tests::seen::{self, Install, Seen};
use idempotent_tests::{AppError, Forward, FromPanics, SharedOverride, panic_text, poll_once};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

// ---------------------------------------------------------------------------------------------------
// Helpers.

fn memory() -> (Idempotency, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    (Idempotency::builder_arc(store.clone()).build(), store)
}

async fn status(store: &dyn Store, namespace: &str, key: &str) -> Option<Status> {
    let key = idempotent_runtime::derive_key(namespace, key).unwrap();
    store.get(&key).await.unwrap().map(|r| r.status)
}

/// [`seen::apart`] for a test of this module, with a current-thread runtime for `f`, dropped (with the
/// tasks left on it) before what the calls reported is read.
fn watched_apart(test: &str, f: impl FnOnce(&tokio::runtime::Runtime)) -> Option<Seen> {
    seen::apart(
        &format!("course_paths::{test}"),
        Install::ThreadDefault,
        |_| in_runtime(f),
    )
}

/// `f` with a current-thread runtime, dropped (with the tasks left on it) after `f`.
fn in_runtime(f: impl FnOnce(&tokio::runtime::Runtime)) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    f(&rt);
    drop(rt);
}

thread_local! {
    /// `From<Error>` conversions into [`Counted`] on this thread.
    static CONVERSIONS: Cell<usize> = const { Cell::new(0) };
    /// Whether a [`Brittle`]'s `Deserialize` panics (set for replays only: the first call reads its
    /// value's JSON back too).
    static BRITTLE: Cell<bool> = const { Cell::new(false) };
    /// Runs of an `on_replay` hook on this thread.
    static HOOKED: Cell<usize> = const { Cell::new(0) };
}

/// An error that counts its conversions from the library's, and whose own variant's `Display` panics
/// (a call that runs alone must never ask for its text).
#[derive(Debug)]
enum Counted {
    Own(u32),
    Lib(Error),
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Counted::Own(_) => panic!("Counted::Own's Display panics"),
            Counted::Lib(e) => write!(f, "{e}"),
        }
    }
}

impl From<Error> for Counted {
    fn from(e: Error) -> Self {
        CONVERSIONS.set(CONVERSIONS.get() + 1);
        Counted::Lib(e)
    }
}

/// A value whose `Deserialize` panics while [`BRITTLE`] is set.
#[derive(Debug, Serialize, PartialEq, Eq)]
struct Brittle(u32);

impl<'de> Deserialize<'de> for Brittle {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u32::deserialize(d)?;
        if BRITTLE.get() {
            panic!("Brittle's Deserialize panics");
        }
        Ok(Brittle(v))
    }
}

/// A value whose serde always panics: a call that runs alone must never touch it.
#[derive(Debug, PartialEq, Eq)]
struct Untouchable(u32);

impl Serialize for Untouchable {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("Untouchable's Serialize panics")
    }
}

impl<'de> Deserialize<'de> for Untouchable {
    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        panic!("Untouchable's Deserialize panics")
    }
}

/// Sets its flag when dropped.
struct OnDrop(Arc<AtomicBool>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------------------
// Telemetry: one outcome per call that reaches the store, however it ends.

/// A call of `ns` (key `key`, payload `payload` when given), in place or detached (`detach`), whose
/// body returns `value`; boxed, so that a test makes both kinds through one path.
fn placed<'a, T, E>(
    idem: &'a Idempotency,
    ns: &'static str,
    key: &'static str,
    payload: Option<u32>,
    detach: bool,
    value: T,
) -> Pin<Box<dyn Future<Output = Result<T, E>> + 'a>>
where
    T: Serialize + serde::de::DeserializeOwned + Send + 'static,
    E: From<Error> + std::fmt::Display + Send + 'static,
{
    let mut op = idem.operation(ns, key);
    if let Some(payload) = payload {
        op = op.payload(&payload);
    }
    let body = move |_| async move { Ok::<_, E>(value) };
    if detach {
        Box::pin(op.detach().run(body))
    } else {
        Box::pin(op.run(body))
    }
}

/// A duplicate whose replayed value's `Deserialize` panics: the panic goes on, and the call (which
/// reached the store) still closes its span with an outcome and counts once. Detached, the replay is
/// decoded in the caller's future (`Detaching`).
fn a_replay_whose_deserialize_panics_is_recorded(test: &str, ns: &'static str, detach: bool) {
    let Some(seen) = watched_apart(test, |rt| {
        rt.block_on(async {
            BRITTLE.set(false);
            let idem = Idempotency::in_memory();
            let call = || placed::<_, AppError>(&idem, ns, "k", None, detach, Brittle(1));
            assert_eq!(call().await.unwrap(), Brittle(1));
            BRITTLE.set(true);
            let replay = AssertUnwindSafe(call()).catch_unwind().await;
            BRITTLE.set(false);
            let panic = replay.expect_err("the replay's Deserialize panics");
            assert_eq!(panic_text(&*panic), "Brittle's Deserialize panics");
        });
    }) else {
        return;
    };
    seen.assert_each_closed_with_an_outcome(ns, 2);
}

#[test]
fn an_in_place_replay_whose_deserialize_panics_is_recorded() {
    a_replay_whose_deserialize_panics_is_recorded(
        "an_in_place_replay_whose_deserialize_panics_is_recorded",
        "course::brittle_in_place",
        false,
    );
}

#[test]
fn a_detached_replay_whose_deserialize_panics_is_recorded() {
    a_replay_whose_deserialize_panics_is_recorded(
        "a_detached_replay_whose_deserialize_panics_is_recorded",
        "course::brittle_detached",
        true,
    );
}

/// A call that ends with the library's error and whose `From<Error>` panics: a payload mismatch from
/// the claim (detached, converted in the caller's future, `Detaching`), and a value that does not
/// serialize, after its body ran (detached, converted in the body's task, whose panic the caller
/// resumes). The panic goes on, the value is final, and each call closes its span with its outcome
/// and counts once, since its end is recorded before the conversion.
fn a_library_error_with_a_panicking_from_is_recorded(test: &str, ns: &'static str, detach: bool) {
    let Some(seen) = watched_apart(test, |rt| {
        rt.block_on(async {
            let (idem, store) = memory();
            let stored = placed::<_, FromPanics>(&idem, ns, "mismatch", Some(1), detach, 1_u32);
            assert_eq!(stored.await.unwrap(), 1);
            let mismatch = placed::<_, FromPanics>(&idem, ns, "mismatch", Some(2), detach, 2_u32);
            let panic = AssertUnwindSafe(mismatch)
                .catch_unwind()
                .await
                .expect_err("From<Error> panics");
            assert!(panic_text(&*panic).starts_with("From<Error> panics on"));
            let nan = placed::<_, FromPanics>(&idem, ns, "nan", None, detach, f64::NAN);
            let panic = AssertUnwindSafe(nan)
                .catch_unwind()
                .await
                .expect_err("From<Error> panics");
            assert!(panic_text(&*panic).starts_with("From<Error> panics on"));
            assert_eq!(
                status(&*store, ns, "nan").await,
                Some(Status::Completed),
                "the value that does not serialize is final"
            );
        });
    }) else {
        return;
    };
    seen.assert_closed(ns, &["executed", "payload_mismatch", "error"]);
}

#[test]
fn an_in_place_library_error_with_a_panicking_from_is_recorded() {
    a_library_error_with_a_panicking_from_is_recorded(
        "an_in_place_library_error_with_a_panicking_from_is_recorded",
        "course::from_panics_in_place",
        false,
    );
}

#[test]
fn a_detached_library_error_with_a_panicking_from_is_recorded() {
    a_library_error_with_a_panicking_from_is_recorded(
        "a_detached_library_error_with_a_panicking_from_is_recorded",
        "course::from_panics_detached",
        true,
    );
}

/// A detached call whose caller gave up while its body ran: the body runs to its end on its task and
/// its end is stored (COMPLETED, FAILED), so the call ended, and must close its span with its outcome
/// and count once, as it does when its body panics (`store_ending` records that itself).
#[test]
fn a_detached_call_whose_caller_left_is_recorded() {
    const NS: &str = "course::caller_left";
    let Some(seen) = watched_apart("a_detached_call_whose_caller_left_is_recorded", |rt| {
        rt.block_on(async {
            let (idem, store) = memory();
            for (key, fail) in [("value", false), ("error", true)] {
                let call = idem.operation(NS, key).detach().run(move |_| async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if fail {
                        Err(AppError::Declined)
                    } else {
                        Ok(1_u32)
                    }
                });
                let gave_up = tokio::time::timeout(Duration::from_millis(5), call).await;
                assert!(gave_up.is_err(), "the caller gave up while the body ran");
            }
            idem.drain(Duration::from_secs(5)).await;
            assert_eq!(status(&*store, NS, "value").await, Some(Status::Completed));
            assert_eq!(status(&*store, NS, "error").await, Some(Status::Failed));
        });
    }) else {
        return;
    };
    seen.assert_closed(NS, &["executed", "failed"]);
}

/// A call polled again after it ended (a value, a replay, the library's error): it panics, and is
/// neither recorded nor counted again, nor converted again.
#[test]
fn a_call_polled_after_it_ended_is_recorded_once() {
    const NS: &str = "course::polled_again";
    let Some(seen) = watched_apart("a_call_polled_after_it_ended_is_recorded_once", |rt| {
        rt.block_on(async {
            let idem = Idempotency::in_memory();
            let before = CONVERSIONS.get();
            for payload in [1, 1, 2] {
                let call = idem
                    .operation(NS, "k")
                    .payload(&payload)
                    .run(|_| async { Ok::<_, Counted>(7_u32) });
                let mut call = Box::pin(call);
                match poll_once(call.as_mut()) {
                    Poll::Ready(Ok(7)) if payload == 1 => {}
                    Poll::Ready(Err(Counted::Lib(Error::PayloadMismatch { .. })))
                        if payload == 2 => {}
                    other => panic!("payload {payload}: {other:?}"),
                }
                let again = std::panic::catch_unwind(AssertUnwindSafe(|| poll_once(call.as_mut())));
                assert!(again.is_err(), "a call polled after Ready panics");
            }
            assert_eq!(
                CONVERSIONS.get() - before,
                1,
                "the mismatch, converted once"
            );
        });
    }) else {
        return;
    };
    seen.assert_closed(NS, &["executed", "replayed", "payload_mismatch"]);
}

// ---------------------------------------------------------------------------------------------------
// Calls that run alone: the plain function.

/// What a call that runs alone must do, made with `op` (a missing key under `MissingKey::Skip`, or any
/// call under the kill switch): the body runs once per call, its value and its error come back as they
/// were (their serde and `Display` never asked for, `From<Error>` never called, `on_replay` never run,
/// nothing observed), its panic goes on, and dropping the call's future drops the body at once.
async fn runs_alone<'a>(op: impl Fn() -> Operation<'a>) {
    HOOKED.set(0);
    let conversions = CONVERSIONS.get();
    let runs = AtomicUsize::new(0);
    for n in 0..2 {
        let (value, seen) = observe(
            op().on_replay(|v: Untouchable| {
                HOOKED.set(HOOKED.get() + 1);
                v
            })
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                Ok::<_, Counted>(Untouchable(n))
            }),
        )
        .await;
        assert_eq!(value.unwrap(), Untouchable(n));
        assert_eq!(seen, None, "nothing to observe of a call that runs alone");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the body ran once per call");
    // Its error, as it was (its `Display` would panic).
    for _ in 0..2 {
        let err = op()
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<Untouchable, _>(Counted::Own(7))
            })
            .await;
        assert!(matches!(err, Err(Counted::Own(7))), "{err:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    // Its panic goes on.
    let panicked = AssertUnwindSafe(op().run(|_| async {
        if std::hint::black_box(true) {
            panic!("the body that runs alone panics");
        }
        Ok::<_, Counted>(Untouchable(0))
    }))
    .catch_unwind()
    .await;
    assert_eq!(
        panic_text(&*panicked.expect_err("the panic goes on")),
        "the body that runs alone panics"
    );
    // Dropped mid-body: the body is dropped at once.
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = OnDrop(dropped.clone());
    let call = op().run(move |_| async move {
        let _guard = guard;
        std::future::pending::<()>().await;
        Ok::<_, Counted>(Untouchable(0))
    });
    let mut call = Box::pin(call);
    assert!(poll_once(call.as_mut()).is_pending());
    assert!(!dropped.load(Ordering::SeqCst));
    drop(call);
    assert!(
        dropped.load(Ordering::SeqCst),
        "dropping the call dropped its body"
    );
    assert_eq!(
        HOOKED.get(),
        0,
        "on_replay never runs for a call that runs alone"
    );
    assert_eq!(CONVERSIONS.get(), conversions, "nothing converted");
}

/// A missing key under `MissingKey::Skip`: the plain function, in place; nothing stored; nested in a
/// call that claims its key and around one: each keeps its own end (the claiming one runs once and
/// replays, the skipped one runs whenever its caller's body runs).
#[tokio::test(flavor = "current_thread")]
async fn a_skipped_call_is_the_plain_function() {
    const NS: &str = "course::skipped";
    let (idem, store) = memory();
    runs_alone(|| {
        idem.operation(NS, &None::<u32>)
            .missing_key(MissingKey::Skip)
    })
    .await;
    assert!(store.is_empty(), "nothing was stored");
    nested_alone_and_claimed(
        || {
            idem.operation(NS, &None::<u32>)
                .missing_key(MissingKey::Skip)
        },
        || idem.operation(NS, "claimed-inner"),
        || idem.operation(NS, "claimed-outer"),
    )
    .await;
}

/// A call that runs alone (`alone`) around one that claims its key (`inner`), and one that claims its
/// key (`outer`) around one that runs alone, each called twice: the claiming calls run once and then
/// replay; the bodies that run alone run whenever their caller's body does.
async fn nested_alone_and_claimed<'a>(
    alone: impl Fn() -> Operation<'a>,
    inner: impl Fn() -> Operation<'a>,
    outer: impl Fn() -> Operation<'a>,
) {
    let (alone_runs, inner_runs, outer_runs) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    for _ in 0..2 {
        let got = alone()
            .run(|_| async {
                alone_runs.fetch_add(1, Ordering::SeqCst);
                let inner = inner()
                    .run(|_| async {
                        inner_runs.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, AppError>(10_u32)
                    })
                    .await?;
                Ok::<_, AppError>(inner + 1)
            })
            .await;
        assert_eq!(got.unwrap(), 11);
    }
    assert_eq!(
        (
            alone_runs.load(Ordering::SeqCst),
            inner_runs.load(Ordering::SeqCst)
        ),
        (2, 1),
        "the body that runs alone ran twice, the claiming call nested in it once"
    );
    alone_runs.store(0, Ordering::SeqCst);
    for _ in 0..2 {
        let got = outer()
            .run(|_| async {
                outer_runs.fetch_add(1, Ordering::SeqCst);
                let alone = alone()
                    .run(|_| async {
                        alone_runs.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, AppError>(20_u32)
                    })
                    .await?;
                Ok::<_, AppError>(alone + 2)
            })
            .await;
        assert_eq!(got.unwrap(), 22);
    }
    assert_eq!(
        (
            outer_runs.load(Ordering::SeqCst),
            alone_runs.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the claiming call ran once and replayed; the call nested in it ran with its body"
    );
}

/// A store whose claims and heartbeats each make a skipped call (`MissingKey::Skip`, on `nested`), whose
/// body makes a call of its own that claims its key: bodies that run alone and calls that claim, nested
/// inside a core's poll (where the core's exchange with its shim is in use).
#[derive(Debug)]
struct SkipInStore {
    nested: Idempotency,
    skipped_runs: Arc<AtomicUsize>,
    inner_runs: Arc<AtomicUsize>,
    beats: AtomicUsize,
}

impl SkipInStore {
    async fn nest(&self) {
        let (skipped, inner, idem) = (
            self.skipped_runs.clone(),
            self.inner_runs.clone(),
            self.nested.clone(),
        );
        let v = self
            .nested
            .operation("course::in_store_skipped", &None::<u32>)
            .missing_key(MissingKey::Skip)
            .run(|_| async move {
                skipped.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                let got = idem
                    .operation("course::in_store_inner", "k")
                    .run(|_| async move {
                        inner.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, Error>(3_u32)
                    })
                    .await?;
                tokio::task::yield_now().await;
                Ok::<_, Error>(got + 1)
            })
            .await
            .expect("the skipped call nested in the store succeeds");
        assert_eq!(v, 4);
    }
}

#[async_trait::async_trait]
impl Override<Forward> for SkipInStore {
    fn kind(&self) -> &'static str {
        "course-skip-in-store"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.nest().await;
        inner.claim(request).await
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if matches!(transition.change, Change::ExtendLease { .. }) {
            self.beats.fetch_add(1, Ordering::SeqCst);
            self.nest().await;
        }
        inner.transition(transition).await
    }
}

/// Skipped calls (whose bodies run alone and make calls that claim their keys) nested in the store's
/// claim and heartbeats of a call whose body is pending for a while: every call keeps its own end; the
/// outer body runs once and its duplicate replays; the skipped body runs at each claim and heartbeat;
/// the call nested in it runs once and then replays.
#[tokio::test(flavor = "current_thread")]
async fn skipped_calls_nested_in_a_stores_claim_and_heartbeats() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let hooks = Arc::new(SkipInStore {
        nested: Idempotency::in_memory(),
        skipped_runs: Arc::default(),
        inner_runs: Arc::default(),
        beats: AtomicUsize::new(0),
    });
    let wrapped = Arc::new(Delegating::new(
        Forward(store.clone()),
        SharedOverride(hooks.clone()),
    ));
    let idem = Idempotency::builder_arc(wrapped)
        .default_lease(Duration::from_secs(1))
        .build();
    let runs = AtomicUsize::new(0);
    let call = || {
        idem.operation("course::in_store_outer", "k")
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_millis(350)).await;
                    tokio::task::yield_now().await;
                }
                Ok::<_, AppError>("outer".to_owned())
            })
    };
    assert_eq!(call().await.unwrap(), "outer");
    assert_eq!(call().await.unwrap(), "outer");
    let beats = hooks.beats.load(Ordering::SeqCst);
    assert!(beats >= 2, "{beats} heartbeats");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        hooks.skipped_runs.load(Ordering::SeqCst),
        2 + beats,
        "a skipped body per claim and heartbeat"
    );
    assert_eq!(hooks.inner_runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        status(&*store, "course::in_store_outer", "k").await,
        Some(Status::Completed)
    );
}

/// A detached call that runs alone (`MissingKey::Skip`): its value and error as they were, its panic
/// goes on, and a caller that gives up does not cut its body off (its task is drained).
#[tokio::test(flavor = "current_thread")]
async fn a_detached_skipped_call_runs_on_its_own_task() {
    const NS: &str = "course::skipped_detached";
    let (idem, store) = memory();
    detached_alone(&idem, || {
        idem.operation(NS, &None::<u32>)
            .missing_key(MissingKey::Skip)
    })
    .await;
    assert!(store.is_empty());
}

async fn detached_alone<'a>(idem: &Idempotency, op: impl Fn() -> Operation<'a>) {
    let conversions = CONVERSIONS.get();
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let r = runs.clone();
        let got = op()
            .detach()
            .run(move |_| async move {
                r.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Counted>(3_u32)
            })
            .await;
        assert_eq!(got.unwrap(), 3);
    }
    let err = op()
        .detach()
        .run(|_| async { Err::<u32, _>(Counted::Own(4)) })
        .await;
    assert!(matches!(err, Err(Counted::Own(4))), "{err:?}");
    let panicked = AssertUnwindSafe(op().detach().run(|_| async {
        if std::hint::black_box(true) {
            panic!("the detached body that runs alone panics");
        }
        Ok::<_, Counted>(0_u32)
    }))
    .catch_unwind()
    .await;
    assert_eq!(
        panic_text(&*panicked.expect_err("the panic goes on")),
        "the detached body that runs alone panics"
    );
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let call = op().detach().run(move |_| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        d.store(true, Ordering::SeqCst);
        Ok::<_, Counted>(5_u32)
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(5), call)
            .await
            .is_err()
    );
    idem.drain(Duration::from_secs(5)).await;
    for _ in 0..100 {
        if done.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        done.load(Ordering::SeqCst),
        "the detached body was cut off with its caller"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(CONVERSIONS.get(), conversions, "nothing converted");
}

#[idempotent(key = order, store = idem, name = "course::killed_fn")]
async fn killed_fn(idem: &Idempotency, runs: &AtomicUsize, order: &str) -> Result<usize, AppError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[idempotent(key = order, name = "course::uninstalled_fn")]
async fn uninstalled_fn(runs: &AtomicUsize, order: f64) -> Result<u32, Counted> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

/// Under the kill switch, calls that run alone (of `ns`) nested in a call with business writes (which
/// still claims its key, on `store`'s table `orders`) and around one, each made twice: the call with
/// writes runs once and replays; the bodies that run alone run whenever their caller's body does.
async fn nested_in_and_around_writes(idem: &Idempotency, store: &MemoryStore, ns: &'static str) {
    store.create_table("orders", "pk", None).unwrap();
    let put = || {
        aws_sdk_dynamodb::types::Put::builder()
            .table_name("orders")
            .item(
                "pk",
                aws_sdk_dynamodb::types::AttributeValue::S("o-1".into()),
            )
            .build()
            .unwrap()
    };
    let (alone_runs, tx_runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    for _ in 0..2 {
        let got = idem
            .operation("course::killed_tx", "outer")
            .transact()
            .run(|cx| async {
                tx_runs.fetch_add(1, Ordering::SeqCst);
                let ((), tx) = cx.into_parts();
                tx.put(put());
                let inner = idem
                    .operation(ns, "inner")
                    .run(|_| async {
                        alone_runs.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, AppError>(1_u32)
                    })
                    .await?;
                Ok::<_, AppError>(inner + 1)
            })
            .await;
        assert_eq!(got.unwrap(), 2);
    }
    assert_eq!(
        (
            tx_runs.load(Ordering::SeqCst),
            alone_runs.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the call with writes ran once and replayed"
    );
    for _ in 0..2 {
        let got = idem
            .operation(ns, "around")
            .run(|_| async {
                alone_runs.fetch_add(1, Ordering::SeqCst);
                idem.operation("course::killed_tx", "inner")
                    .transact()
                    .run(|cx| async {
                        tx_runs.fetch_add(1, Ordering::SeqCst);
                        let ((), tx) = cx.into_parts();
                        tx.put(put());
                        tokio::task::yield_now().await;
                        Ok::<_, AppError>(5_u32)
                    })
                    .await
            })
            .await;
        assert_eq!(got.unwrap(), 5);
    }
    assert_eq!(
        (
            tx_runs.load(Ordering::SeqCst),
            alone_runs.load(Ordering::SeqCst)
        ),
        (2, 3),
        "the body that runs alone ran twice, the call with writes nested in it once"
    );
}

/// The kill switch (`IDEMPOTENT_DISABLED=1`, read once per process: checked in a child process): every
/// call without business writes is the plain function, in place and detached, through `Operation`
/// and the attribute, with no handle installed and with a key that does not serialize; nested in a
/// call with business writes (which still claims its key) and around one; no call that runs alone
/// opens a span or counts; the call with writes closes its span once.
#[test]
fn calls_under_the_kill_switch_run_alone() {
    const CHILD: &str = "COURSE_PATHS_KILL_CHILD";
    const NS: &str = "course::killed";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "course_paths::calls_under_the_kill_switch_run_alone",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env(idempotent_runtime::DISABLED_VAR, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the child run failed: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let seen = seen::watching(Install::ThreadDefault, |_| {
        in_runtime(|rt| {
            rt.block_on(async {
                let (idem, store) = memory();
                runs_alone(|| idem.operation(NS, "k")).await;
                detached_alone(&idem, || idem.operation(NS, "d")).await;
                // A key that does not serialize, no handle installed: alone all the same.
                runs_alone(|| idem.operation(NS, &f64::NAN)).await;
                let runs = AtomicUsize::new(0);
                assert_eq!(killed_fn(&idem, &runs, "o").await.unwrap(), 1);
                assert_eq!(killed_fn(&idem, &runs, "o").await.unwrap(), 2);
                assert_eq!(uninstalled_fn(&runs, f64::NAN).await.unwrap(), 1);
                assert!(store.is_empty(), "nothing was stored");
                nested_in_and_around_writes(&idem, &store, NS).await;
            });
        });
    });
    assert_eq!(
        seen.spans_of(NS),
        Vec::<String>::new(),
        "no span for a call that runs alone"
    );
    assert_eq!(
        seen.counted_of(NS),
        Vec::new(),
        "no count for a call that runs alone"
    );
    seen.assert_closed(
        "course::killed_tx",
        &["executed", "replayed", "executed", "replayed"],
    );
}

// ---------------------------------------------------------------------------------------------------
// Calls that cannot start.

/// An operation for each way a call cannot start (a key or a payload that does not serialize, a lease
/// too short, a missing key under `MissingKey::Reject`).
#[allow(clippy::type_complexity, reason = "a list of operation makers")]
fn cannot_start<'a>(
    idem: &'a Idempotency,
    ns: &'static str,
) -> Vec<(&'static str, Box<dyn Fn() -> Operation<'a> + 'a>)> {
    vec![
        ("key", Box::new(move || idem.operation(ns, &f64::NAN))),
        (
            "payload",
            Box::new(move || idem.operation(ns, "p").payload(&f64::NAN)),
        ),
        (
            "lease",
            Box::new(move || idem.operation(ns, "l").lease(Duration::from_millis(1))),
        ),
        (
            "missing key",
            Box::new(move || idem.operation(ns, &None::<u32>)),
        ),
    ]
}

/// Each way a call cannot start (a key or a payload that does not serialize, a lease too short, a
/// missing key under `MissingKey::Reject`, no handle installed), in place, detached and through the
/// attribute: the library's error, converted once; the body never runs; a call polled again after it
/// ended panics without converting again.
#[tokio::test(flavor = "current_thread")]
async fn calls_that_cannot_start_convert_once_and_never_run() {
    const NS: &str = "course::cannot_start";
    let idem = Idempotency::in_memory();
    let runs = Arc::new(AtomicUsize::new(0));
    for (what, op) in cannot_start(&idem, NS) {
        let before = CONVERSIONS.get();
        let r = runs.clone();
        let call = op().run(move |_| async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Counted>(1_u32)
        });
        let mut call = Box::pin(call);
        match poll_once(call.as_mut()) {
            Poll::Ready(Err(Counted::Lib(_))) => {}
            other => panic!("{what}: {other:?}"),
        }
        let again = std::panic::catch_unwind(AssertUnwindSafe(|| poll_once(call.as_mut())));
        assert!(
            again.is_err(),
            "{what}: polled again after Ready, it panics"
        );
        drop(call);
        assert_eq!(CONVERSIONS.get() - before, 1, "{what}: converted once");

        let before = CONVERSIONS.get();
        let r = runs.clone();
        let detached = op()
            .detach()
            .run(move |_| async move {
                r.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Counted>(1_u32)
            })
            .await;
        assert!(
            matches!(detached, Err(Counted::Lib(_))),
            "{what}: {detached:?}"
        );
        assert_eq!(
            CONVERSIONS.get() - before,
            1,
            "{what}, detached: converted once"
        );
    }
    let before = CONVERSIONS.get();
    let r = uninstalled_fn(&runs, 1.0).await;
    assert!(
        matches!(r, Err(Counted::Lib(Error::NotInstalled { .. }))),
        "{r:?}"
    );
    assert_eq!(CONVERSIONS.get() - before, 1, "no handle: converted once");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no body ran");
}

// ---------------------------------------------------------------------------------------------------
// `Send`.

/// Whether a value's type is `Send`, told at compile time where its type is known (an inherent method
/// whose impl needs `Send`, before a trait's method for every type).
struct Probe<T>(PhantomData<T>);

trait NotSendFallback {
    fn is_send(&self) -> bool {
        false
    }
}

impl<T> NotSendFallback for Probe<T> {}

impl<T: Send> Probe<T> {
    #[allow(
        clippy::unused_self,
        reason = "called as a method, to come before the trait's"
    )]
    fn is_send(&self) -> bool {
        true
    }
}

fn probe<T>(_: &T) -> Probe<T> {
    Probe(PhantomData)
}

/// A `Send` value that is not `Sync`, with serde.
#[derive(Debug, Serialize, Deserialize)]
struct SendOnly(Cell<u32>);

/// A value that is not `Send`, with serde.
#[derive(Debug)]
struct NotSend(PhantomData<*const ()>);

impl Serialize for NotSend {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit()
    }
}

impl<'de> Deserialize<'de> for NotSend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <()>::deserialize(d).map(|()| NotSend(PhantomData))
    }
}

/// A call's future is `Send` when its body's future, value and error are (also when they are not
/// `Sync`), on every path it may take (a claim, a missing key skipped, a call that cannot start); and
/// not when its value or its error is not. (A body's future that is not `Send` cannot be probed this
/// way: rustc reports the opaque type's missing `Send` as an error rather than pass over the probe.)
#[tokio::test(flavor = "current_thread")]
async fn a_calls_future_is_send_exactly_when_its_body_value_and_error_are() {
    #[derive(Debug)]
    struct SendError(#[allow(dead_code, reason = "held")] Cell<u8>);
    impl std::fmt::Display for SendError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("send error")
        }
    }
    impl From<Error> for SendError {
        fn from(_: Error) -> Self {
            SendError(Cell::new(0))
        }
    }
    #[derive(Debug)]
    struct NotSendError(#[allow(dead_code, reason = "held")] PhantomData<*const ()>);
    impl std::fmt::Display for NotSendError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("not send error")
        }
    }
    impl From<Error> for NotSendError {
        fn from(_: Error) -> Self {
            NotSendError(PhantomData)
        }
    }
    let idem = Idempotency::in_memory();
    let body = || async {
        let held = Cell::new(5_u32);
        tokio::task::yield_now().await;
        Ok::<_, SendError>(SendOnly(held))
    };
    let claimed = idem.operation("course::send", "k").run(|_| body());
    let skipped = idem
        .operation("course::send", &None::<u32>)
        .missing_key(MissingKey::Skip)
        .run(|_| body());
    let failed = idem.operation("course::send", &f64::NAN).run(|_| body());
    assert!(probe(&claimed).is_send(), "a call that claims its key");
    assert!(probe(&skipped).is_send(), "a call that runs alone");
    assert!(probe(&failed).is_send(), "a call that cannot start");
    let (claimed, skipped, failed) = tokio::join!(claimed, skipped, failed);
    assert_eq!(claimed.unwrap().0.get(), 5);
    assert_eq!(skipped.unwrap().0.get(), 5);
    assert!(failed.is_err());

    let not_send_value = idem
        .operation("course::send", "v")
        .run(|_| async { Ok::<_, SendError>(NotSend(PhantomData)) });
    let not_send_error = idem
        .operation("course::send", "e")
        .run(|_| async { Ok::<_, NotSendError>(1_u32) });
    assert!(
        !probe(&not_send_value).is_send(),
        "a value that is not Send"
    );
    assert!(
        !probe(&not_send_error).is_send(),
        "an error that is not Send"
    );
    drop((not_send_value, not_send_error));
}
