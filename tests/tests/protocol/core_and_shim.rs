//! The call's state machine as one core beside a typed shim (`handler::run`: `core`, `InPlace`, `Detaching`, the
//! thread-local `EXCHANGE`): calls nested in bodies and in stores (claim, completion, heartbeat), bodies
//! pending many times or waking themselves, panics everywhere, drops at every stage, detached calls,
//! heartbeats, calls polled alternately on one thread or moved between threads, `Send`, `observe`, spans,
//! `on_replay`, steps. On the memory store.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt as _;
use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{Change, ClaimOutcome, ClaimRequest, Transition, WriteOutcome};
use idempotent_runtime::{
    Error, Execution, Idempotency, MemoryStore, Record, Status, Store, StoreError, observe,
};
use idempotent_tests::{AppError, Forward};
use serde::{Deserialize, Serialize};

const NS: &str = "core::call";

// ---------------------------------------------------------------------------------------------------
// Helpers.

/// A body that is pending `n` times (waking itself each time), then gives `value`.
async fn yielding<T>(n: usize, value: T) -> T {
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
    value
}

/// A future that wakes itself and is pending `n` times without going through the runtime's budget.
fn spurious(n: usize) -> impl Future<Output = ()> + Send {
    let mut left = n;
    std::future::poll_fn(move |cx| {
        if left == 0 {
            return Poll::Ready(());
        }
        left -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
}

async fn record(store: &dyn Store, namespace: &str, key: &str) -> Option<Record> {
    let key = idempotent_runtime::derive_key(namespace, key).unwrap();
    store.get(&key).await.unwrap()
}

/// A plain call of `NS` with `key` counting its runs, pending `pending` times, giving `value`.
async fn counted(
    idem: &Idempotency,
    key: &str,
    runs: &AtomicUsize,
    pending: usize,
    value: u32,
) -> Result<u32, AppError> {
    idem.operation(NS, key)
        .run(|_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AppError>(yielding(pending, value).await)
        })
        .await
}

/// What the store under test does besides forwarding.
#[derive(Default)]
struct Hooks {
    /// Heartbeats (`ExtendLease`) seen.
    beats: AtomicUsize,
    /// Completions seen.
    completes: AtomicUsize,
    /// Make an idempotent call (on `nested`) inside each claim / completion / heartbeat.
    nest_in_claim: AtomicBool,
    nest_in_complete: AtomicBool,
    nest_in_beat: AtomicBool,
    /// Panic inside the next heartbeat.
    panic_in_beat: AtomicBool,
    /// Answer claims this late (after they landed), once.
    claim_delay_once: Mutex<Option<Duration>>,
    /// Answer completions this late (after they landed), once.
    complete_delay_once: Mutex<Option<Duration>>,
    /// Yield this many times before every request.
    yields: AtomicUsize,
    nested: Mutex<Option<Idempotency>>,
    nested_calls: AtomicUsize,
    nested_runs: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooks")
    }
}

impl Hooks {
    async fn nest(&self, at: &str) {
        let idem = self.nested.lock().unwrap().clone();
        let Some(idem) = idem else { return };
        let n = self.nested_calls.fetch_add(1, Ordering::SeqCst);
        // Each nested call is made twice: the second is a replay inside a store's future.
        let key = format!("{at}-{n}");
        for _ in 0..2 {
            let (runs, key) = (self.nested_runs.clone(), key.clone());
            let value = idem
                .operation("core::nested", &key)
                .run(|_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Pending a few times, then ends: its own core asks for its body inside the
                    // outer core's poll.
                    Ok::<_, Error>(yielding(3, key.len()).await)
                })
                .await
                .expect("a nested call inside a store succeeds");
            assert_eq!(value, format!("{at}-{n}").len());
        }
    }

    async fn before(&self) {
        for _ in 0..self.yields.load(Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
    }
}

/// The hooks, as the store's override.
#[derive(Debug)]
struct Hooked(Arc<Hooks>);

impl std::ops::Deref for Hooked {
    type Target = Hooks;
    fn deref(&self) -> &Hooks {
        &self.0
    }
}

#[async_trait::async_trait]
impl Override<Forward> for Hooked {
    fn kind(&self) -> &'static str {
        "core-hooks"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.before().await;
        if self.nest_in_claim.load(Ordering::SeqCst) {
            self.nest("claim").await;
        }
        let outcome = inner.claim(request).await;
        let delay = self.claim_delay_once.lock().unwrap().take();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        outcome
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        self.before().await;
        match transition.change {
            Change::ExtendLease { .. } => {
                self.beats.fetch_add(1, Ordering::SeqCst);
                assert!(
                    !self.panic_in_beat.swap(false, Ordering::SeqCst),
                    "the store panics in a heartbeat"
                );
                if self.nest_in_beat.load(Ordering::SeqCst) {
                    self.nest("beat").await;
                }
            }
            Change::Complete { .. } => {
                self.completes.fetch_add(1, Ordering::SeqCst);
                if self.nest_in_complete.load(Ordering::SeqCst) {
                    self.nest("complete").await;
                }
            }
            _ => {}
        }
        let outcome = inner.transition(transition).await;
        if matches!(transition.change, Change::Complete { .. }) {
            let delay = self.complete_delay_once.lock().unwrap().take();
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
        }
        outcome
    }
}

struct Setup {
    idem: Idempotency,
    store: Arc<dyn Store>,
    hooks: Arc<Hooks>,
}

fn setup(
    configure: impl FnOnce(idempotent_runtime::Builder) -> idempotent_runtime::Builder,
) -> Setup {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let hooks = Arc::new(Hooks::default());
    let wrapped = Arc::new(Delegating::new(
        Forward(store.clone()),
        Hooked(hooks.clone()),
    ));
    let idem = configure(Idempotency::builder_arc(wrapped)).build();
    Setup { idem, store, hooks }
}

fn assert_send<T: Send>(_: &T) {}

// ---------------------------------------------------------------------------------------------------
// Heartbeats.

/// A body that ends at its first poll never starts the heartbeat (no request while it runs), even on
/// a store whose requests are pending several times.
#[tokio::test(flavor = "current_thread")]
async fn a_body_that_ends_at_once_sends_no_heartbeat() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    s.hooks.yields.store(3, Ordering::SeqCst);
    let runs = AtomicUsize::new(0);
    for i in 0..5 {
        assert_eq!(
            counted(&s.idem, &format!("at-once-{i}"), &runs, 0, 7)
                .await
                .unwrap(),
            7
        );
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(s.hooks.beats.load(Ordering::SeqCst), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

/// A body pending for longer than its lease (1 s, a beat every third) keeps it by heartbeats: a
/// duplicate after the lease gets `InProgress`, and the body runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_pending_body_keeps_its_lease() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let runs = Arc::new(AtomicUsize::new(0));
    let first = tokio::spawn({
        let (idem, runs) = (s.idem.clone(), runs.clone());
        async move {
            idem.operation(NS, "long")
                .run(|_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1800)).await;
                    Ok::<_, AppError>(11_u32)
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(1400)).await;
    let other = AtomicUsize::new(0);
    let err = counted(&s.idem, "long", &other, 0, 12).await.unwrap_err();
    assert!(matches!(err.idempotency(), Error::InProgress { .. }));
    assert_eq!(first.await.unwrap().unwrap(), 11);
    assert!(
        s.hooks.beats.load(Ordering::SeqCst) >= 3,
        "{:?}",
        s.hooks.beats
    );
    assert_eq!(counted(&s.idem, "long", &other, 0, 12).await.unwrap(), 11);
    assert_eq!(
        runs.load(Ordering::SeqCst) + other.load(Ordering::SeqCst),
        1
    );
}

/// A body that wakes itself and is pending a great many times: the heartbeat is polled beside each
/// poll and neither starves nor runs away; the body runs once and its value is stored.
#[tokio::test(flavor = "current_thread")]
async fn a_body_that_wakes_itself_spuriously_ends_and_is_stored() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let runs = AtomicUsize::new(0);
    let value = s
        .idem
        .operation(NS, "spurious")
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            spurious(20_000).await;
            Ok::<_, AppError>(5_u32)
        })
        .await
        .unwrap();
    assert_eq!(value, 5);
    let r = record(&*s.store, NS, "spurious").await.unwrap();
    assert_eq!(r.status, Status::Completed);
    assert!(s.hooks.beats.load(Ordering::SeqCst) <= 2);
    assert_eq!(counted(&s.idem, "spurious", &runs, 0, 6).await.unwrap(), 5);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A body woken only by something outside (a channel) after longer than its lease: the lease is
/// renewed while it is pending though nothing else polls the call.
#[tokio::test(flavor = "current_thread")]
async fn a_body_parked_on_a_channel_keeps_its_lease() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
    let idem = s.idem.clone();
    let call = tokio::spawn(async move {
        idem.operation(NS, "parked")
            .run(|_| async move { Ok::<_, AppError>(rx.await.unwrap()) })
            .await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let runs = AtomicUsize::new(0);
    let err = counted(&s.idem, "parked", &runs, 0, 1).await.unwrap_err();
    assert!(matches!(err.idempotency(), Error::InProgress { .. }));
    tx.send(9).unwrap();
    assert_eq!(call.await.unwrap().unwrap(), 9);
    assert!(s.hooks.beats.load(Ordering::SeqCst) >= 3);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------------------------------
// Nesting.

/// A call nested in a body (pending several times, on another key) inside a body pending several
/// times: both stored, both replayed, `observe` reports the outer call.
#[tokio::test(flavor = "current_thread")]
async fn a_call_nested_in_the_body() {
    let s = setup(|b| b);
    let (outer_runs, inner_runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let outer = || {
        s.idem.operation(NS, "outer").run(|_| async {
            outer_runs.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            let inner = counted(&s.idem, "inner", &inner_runs, 4, 21).await?;
            tokio::task::yield_now().await;
            Ok::<_, AppError>(format!("outer of {inner}"))
        })
    };
    let (first, executed) = observe(outer()).await;
    assert_eq!(first.unwrap(), "outer of 21");
    assert_eq!(executed, Some(Execution::Executed));
    let (again, replayed) = observe(outer()).await;
    assert_eq!(again.unwrap(), "outer of 21");
    assert_eq!(replayed, Some(Execution::Replayed));
    assert_eq!(
        counted(&s.idem, "inner", &inner_runs, 0, 0).await.unwrap(),
        21
    );
    assert_eq!(outer_runs.load(Ordering::SeqCst), 1);
    assert_eq!(inner_runs.load(Ordering::SeqCst), 1);
}

/// A call nested in a body three deep, each level pending before and after: each level's value is
/// its own (no level takes another's body end).
#[tokio::test(flavor = "current_thread")]
async fn calls_nested_three_deep_keep_their_own_ends() {
    let s = setup(|b| b);
    let idem = &s.idem;
    let result = idem
        .operation(NS, "l1")
        .run(|_| async {
            tokio::task::yield_now().await;
            let l2 = idem
                .operation(NS, "l2")
                .run(|_| async {
                    let l3 = idem
                        .operation(NS, "l3")
                        .run(|_| async { Ok::<_, AppError>(3_u64) })
                        .await?;
                    tokio::task::yield_now().await;
                    Ok::<_, AppError>(vec![l3, 2])
                })
                .await?;
            Ok::<_, AppError>(format!("{l2:?}+1"))
        })
        .await
        .unwrap();
    assert_eq!(result, "[3, 2]+1");
    for (key, status) in [
        ("l1", Status::Completed),
        ("l2", Status::Completed),
        ("l3", Status::Completed),
    ] {
        assert_eq!(
            record(&*s.store, NS, key).await.unwrap().status,
            status,
            "{key}"
        );
    }
}

/// A panic in a nested call's body goes through the outer body: both records are FAILED (both keys
/// free), the panic reaches the caller, and both run again on a retry.
#[tokio::test(flavor = "current_thread")]
async fn a_panic_in_a_nested_call_frees_both_keys() {
    let s = setup(|b| b);
    let runs = AtomicUsize::new(0);
    let call = |panic: bool| {
        let (idem, runs) = (&s.idem, &runs);
        idem.operation(NS, "p-outer").run(move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let inner = idem
                .operation(NS, "p-inner")
                .run(|_| async move {
                    tokio::task::yield_now().await;
                    assert!(!panic, "nested body panics");
                    Ok::<_, AppError>(1_u32)
                })
                .await?;
            Ok::<_, AppError>(inner + 1)
        })
    };
    let panicked = AssertUnwindSafe(call(true)).catch_unwind().await;
    assert!(panicked.is_err());
    for key in ["p-outer", "p-inner"] {
        let r = record(&*s.store, NS, key).await.unwrap();
        assert_eq!(r.status, Status::Failed, "{key}");
        assert!(
            r.error.as_deref().unwrap().starts_with("panicked:"),
            "{r:?}"
        );
    }
    assert_eq!(call(false).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Calls made inside the store's futures (the claim, the completion and the heartbeats), each with a
/// body pending several times, some of them replays: the outer call and every nested one end with
/// their own values; the outer body runs once.
#[tokio::test(flavor = "current_thread")]
async fn calls_nested_in_the_stores_claim_completion_and_heartbeat() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    *s.hooks.nested.lock().unwrap() = Some(Idempotency::in_memory());
    s.hooks.nest_in_claim.store(true, Ordering::SeqCst);
    s.hooks.nest_in_complete.store(true, Ordering::SeqCst);
    s.hooks.nest_in_beat.store(true, Ordering::SeqCst);
    let runs = AtomicUsize::new(0);
    let call = || {
        s.idem.operation(NS, "nested-store").run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            // Long enough for heartbeats (each makes a nested call) while pending.
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_millis(350)).await;
                tokio::task::yield_now().await;
            }
            Ok::<_, AppError>("outer".to_owned())
        })
    };
    assert_eq!(call().await.unwrap(), "outer");
    assert!(s.hooks.beats.load(Ordering::SeqCst) >= 2);
    assert_eq!(call().await.unwrap(), "outer");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let nested = s.hooks.nested_calls.load(Ordering::SeqCst);
    assert!(nested >= 5, "{nested}");
    assert_eq!(s.hooks.nested_runs.load(Ordering::SeqCst), nested);
    assert_eq!(
        record(&*s.store, NS, "nested-store").await.unwrap().status,
        Status::Completed
    );
}

/// The same nested in a body that is itself nested in a store's heartbeat: a call inside a body inside
/// a store inside a body.
#[tokio::test(flavor = "current_thread")]
async fn a_call_nested_in_a_store_nested_in_a_body() {
    let inner = setup(|b| b.default_lease(Duration::from_secs(1)));
    *inner.hooks.nested.lock().unwrap() = Some(Idempotency::in_memory());
    inner.hooks.nest_in_beat.store(true, Ordering::SeqCst);
    inner.hooks.nest_in_complete.store(true, Ordering::SeqCst);
    let outer = setup(|b| b.default_lease(Duration::from_secs(1)));
    *outer.hooks.nested.lock().unwrap() = Some(inner.idem.clone());
    outer.hooks.nest_in_complete.store(true, Ordering::SeqCst);
    outer.hooks.nest_in_claim.store(true, Ordering::SeqCst);
    let v = outer
        .idem
        .operation(NS, "deep")
        .run(|_| async {
            let v = inner
                .idem
                .operation(NS, "deep-inner")
                .run(|_| async {
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    Ok::<_, AppError>(4_u8)
                })
                .await?;
            Ok::<_, AppError>(u32::from(v) * 10)
        })
        .await
        .unwrap();
    assert_eq!(v, 40);
    assert_eq!(
        record(&*outer.store, NS, "deep").await.unwrap().status,
        Status::Completed
    );
    assert_eq!(
        record(&*inner.store, NS, "deep-inner")
            .await
            .unwrap()
            .status,
        Status::Completed
    );
}

// ---------------------------------------------------------------------------------------------------
// Panics.

#[derive(Debug, Deserialize)]
struct Boom(#[allow(dead_code, reason = "only deserialized")] u32);

impl Serialize for Boom {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("Serialize panics")
    }
}

#[derive(Debug)]
struct LoudError;

impl std::fmt::Display for LoudError {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("Display panics")
    }
}

impl From<Error> for LoudError {
    fn from(_: Error) -> Self {
        LoudError
    }
}

/// A body panicking at its first poll, or after being pending: the panic reaches the caller, the
/// record is FAILED, a retry runs; and the next calls on the thread are unaffected.
#[tokio::test(flavor = "current_thread")]
async fn a_body_panicking_at_any_poll_frees_its_key() {
    let s = setup(|b| b);
    for pending in [0_usize, 1, 5] {
        let key = format!("panic-{pending}");
        let runs = AtomicUsize::new(0);
        let panicked = AssertUnwindSafe(s.idem.operation(NS, &key).run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            yielding(pending, ()).await;
            panic!("body panics");
            #[allow(unreachable_code)]
            Ok::<u32, AppError>(0)
        }))
        .catch_unwind()
        .await;
        let payload = panicked.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"body panics"));
        let r = record(&*s.store, NS, &key).await.unwrap();
        assert_eq!(r.status, Status::Failed);
        assert_eq!(r.error.as_deref(), Some("panicked: body panics"));
        assert_eq!(counted(&s.idem, &key, &runs, 2, 3).await.unwrap(), 3);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

/// A value whose `Serialize` panics (at once, or after the body was pending): COMPLETED as not
/// serialized, the panic reaches the caller, duplicates get `ResponseNotSerialized`, the body never
/// runs again.
#[tokio::test(flavor = "current_thread")]
async fn a_panicking_serialize_completes_and_never_runs_again() {
    let s = setup(|b| b);
    for pending in [0_usize, 3] {
        let key = format!("boom-{pending}");
        let runs = AtomicUsize::new(0);
        let call = || {
            AssertUnwindSafe(s.idem.operation(NS, &key).run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(yielding(pending, Boom(1)).await)
            }))
            .catch_unwind()
        };
        assert!(call().await.is_err());
        let r = record(&*s.store, NS, &key).await.unwrap();
        assert_eq!(r.status, Status::Completed, "{r:?}");
        let again = call().await.expect("a duplicate does not panic");
        assert!(matches!(
            again.unwrap_err().idempotency(),
            Error::ResponseNotSerialized { .. }
        ),);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

/// An error whose `Display` panics: FAILED, the panic reaches the caller, a retry runs.
#[tokio::test(flavor = "current_thread")]
async fn a_panicking_display_fails_and_frees_the_key() {
    let s = setup(|b| b);
    let runs = AtomicUsize::new(0);
    let runs = &runs;
    let call = |fail: bool| {
        AssertUnwindSafe(s.idem.operation(NS, "loud").run(move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            if fail { Err(LoudError) } else { Ok(8_u32) }
        }))
        .catch_unwind()
    };
    assert!(call(true).await.is_err());
    let r = record(&*s.store, NS, "loud").await.unwrap();
    assert_eq!(r.status, Status::Failed);
    assert_eq!(call(false).await.unwrap().unwrap(), 8);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A store that panics inside a heartbeat (in the core's poll, where the exchange holds the core's
/// question): the panic reaches the caller; afterwards, calls on the same thread (plain, nested, with
/// pending bodies, alternating) work as before.
#[tokio::test(flavor = "current_thread")]
async fn a_store_panicking_in_a_heartbeat_leaves_the_thread_usable() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    s.hooks.panic_in_beat.store(true, Ordering::SeqCst);
    let panicked = AssertUnwindSafe(s.idem.operation(NS, "beat-panic").run(|_| async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        Ok::<_, AppError>(1_u32)
    }))
    .catch_unwind()
    .await;
    assert!(
        panicked.is_err(),
        "the heartbeat's panic reaches the caller"
    );
    // The same nested in an outer body, which catches it as its own panic.
    s.hooks.panic_in_beat.store(true, Ordering::SeqCst);
    let outer = setup(|b| b);
    let panicked = AssertUnwindSafe(outer.idem.operation(NS, "beat-panic-outer").run(|_| async {
        let v = s
            .idem
            .operation(NS, "beat-panic-inner")
            .run(|_| async {
                tokio::time::sleep(Duration::from_millis(800)).await;
                Ok::<_, AppError>(1_u32)
            })
            .await?;
        Ok::<_, AppError>(v)
    }))
    .catch_unwind()
    .await;
    assert!(panicked.is_err());
    assert_eq!(
        record(&*outer.store, NS, "beat-panic-outer")
            .await
            .unwrap()
            .status,
        Status::Failed
    );
    // The thread's calls afterwards.
    let runs = AtomicUsize::new(0);
    let (a, b) = tokio::join!(
        counted(&s.idem, "after-a", &runs, 3, 1),
        counted(&outer.idem, "after-b", &runs, 0, 2),
    );
    assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
    let v = outer
        .idem
        .operation(NS, "after-nested")
        .run(|_| async {
            let v = counted(&s.idem, "after-inner", &runs, 2, 5).await?;
            tokio::task::yield_now().await;
            Ok::<_, AppError>(v + 1)
        })
        .await
        .unwrap();
    assert_eq!(v, 6);
}

// ---------------------------------------------------------------------------------------------------
// Calls polled alternately, moved, spawned.

/// Calls of different value types joined on one task (polled alternately on one thread), some ending
/// at their first poll, some pending many times, one failing, one nested: each gets its own value.
#[tokio::test(flavor = "current_thread")]
async fn calls_polled_alternately_on_one_thread_keep_their_own_ends() {
    let setup = setup(|builder| builder.default_lease(Duration::from_secs(1)));
    let idem = &setup.idem;
    let runs = AtomicUsize::new(0);
    let one = idem
        .operation(NS, "alt-a")
        .run(|_| async { Ok::<_, AppError>(yielding(7, 1_u8).await) });
    let two = idem
        .operation(NS, "alt-b")
        .run(|_| async { Ok::<_, AppError>("b".to_owned()) });
    let three = idem
        .operation(NS, "alt-c")
        .run(|_| async { Ok::<_, AppError>(yielding(2, vec![3_u64; 3]).await) });
    let four = idem.operation(NS, "alt-d").run(|_| async {
        yielding(4, ()).await;
        Err::<u16, _>(AppError::Declined)
    });
    let five = idem.operation(NS, "alt-e").run(|_| async {
        spurious(50).await;
        let v = counted(idem, "alt-e-inner", &runs, 3, 9).await?;
        Ok::<_, AppError>(f64::from(v) / 2.0)
    });
    let six = idem.operation(NS, "alt-f").run(|_| async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok::<_, AppError>((6_i32, true))
    });
    let (one, two, three, four, five, six) = tokio::join!(one, two, three, four, five, six);
    assert_eq!(one.unwrap(), 1);
    assert_eq!(two.unwrap(), "b");
    assert_eq!(three.unwrap(), vec![3; 3]);
    assert!(matches!(four.unwrap_err(), AppError::Declined));
    assert!((five.unwrap() - 4.5).abs() < f64::EPSILON);
    assert_eq!(six.unwrap(), (6, true));
    assert_eq!(
        record(&*setup.store, NS, "alt-d").await.unwrap().status,
        Status::Failed
    );
}

/// A `select!` that polls two calls alternately and drops the loser mid-body: the winner's value is
/// its own, the loser's key stays PENDING (its body was cut, it keeps its claim until its lease).
#[tokio::test(flavor = "current_thread")]
async fn a_select_between_two_calls() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let fast = s
        .idem
        .operation(NS, "sel-fast")
        .run(|_| async { Ok::<_, AppError>(yielding(10, 1_u32).await) });
    let slow = s.idem.operation(NS, "sel-slow").run(|_| async {
        spurious(5).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok::<_, AppError>(2_u32)
    });
    let won = tokio::select! {
        v = fast => v.unwrap(),
        v = slow => v.unwrap() + 100,
    };
    assert_eq!(won, 1);
    assert_eq!(
        record(&*s.store, NS, "sel-slow").await.unwrap().status,
        Status::Pending
    );
    // Its heartbeat stopped with it: the lease lapses (with the clock-skew margin) and a retry runs.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let runs = AtomicUsize::new(0);
    assert_eq!(counted(&s.idem, "sel-slow", &runs, 0, 3).await.unwrap(), 3);
    assert_eq!(s.hooks.beats.load(Ordering::SeqCst), 0);
}

/// Many spawned calls on a multi-thread runtime, with bodies that yield (so their futures move
/// between workers between polls) and nest; every call gets its own value, each body runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_calls_moving_between_workers() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..64_u32 {
        let (idem, runs) = (s.idem.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("spawned-{}", i % 32);
            idem.operation(NS, &key)
                .run(|_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    for _ in 0..(i % 7) {
                        tokio::task::yield_now().await;
                        std::thread::yield_now();
                    }
                    let inner = idem
                        .operation(NS, &format!("spawned-inner-{}", i % 32))
                        .run(|_| async { Ok::<_, AppError>(yielding(3, i % 32).await) })
                        .await?;
                    Ok::<_, AppError>(inner * 1000 + i % 32)
                })
                .await
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.unwrap() {
            Ok(v) => assert_eq!(v, (u32::try_from(i).unwrap() % 32) * 1001),
            Err(e) => assert!(matches!(e.idempotency(), Error::InProgress { .. })),
        }
    }
    assert!(runs.load(Ordering::SeqCst) <= 32);
    for i in 0..32_u32 {
        let r = record(&*s.store, NS, &format!("spawned-{i}"))
            .await
            .unwrap();
        assert_eq!(r.status, Status::Completed);
    }
}

/// A call polled once on the test's thread (its body pending, its core waiting for it), then moved to
/// a worker thread by `tokio::spawn`: it ends there with its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_moved_to_another_thread_mid_body() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
    let idem = s.idem.clone();
    let mut call = Box::pin(async move {
        idem.operation(NS, "moved")
            .run(|_| async move { Ok::<_, AppError>(rx.await.unwrap() + 1) })
            .await
    });
    assert!(futures_util::poll!(call.as_mut()).is_pending());
    let here = std::thread::current().id();
    let task = tokio::spawn(async move {
        let v = call.await;
        (v, std::thread::current().id())
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tx.send(1).unwrap();
    let (v, there) = task.await.unwrap();
    assert_eq!(v.unwrap(), 2);
    assert_ne!(here, there);
    assert!(
        s.hooks.beats.load(Ordering::SeqCst) >= 2,
        "beats {:?}",
        s.hooks.beats
    );
}

// ---------------------------------------------------------------------------------------------------
// Send.

/// The caller's future is `Send` when the body is, in place and detached.
#[tokio::test(flavor = "current_thread")]
async fn a_calls_future_is_send_when_its_body_is() {
    let idem = Idempotency::in_memory();
    let in_place = idem
        .operation(NS, "send-1")
        .run(|_| async { Ok::<_, AppError>(yielding(1, 1_u32).await) });
    assert_send(&in_place);
    let detached = idem
        .operation(NS, "send-2")
        .detach()
        .run(|_| async { Ok::<_, AppError>(1_u32) });
    assert_send(&detached);
    drop((in_place, detached));
}

// ---------------------------------------------------------------------------------------------------
// Drops.

/// A caller dropped while its claim is on its way (answered late): the claim is released, and a retry
/// runs the body at once.
#[tokio::test(flavor = "current_thread")]
async fn a_caller_dropped_while_claiming_releases_its_claim() {
    let s = setup(|b| b);
    *s.hooks.claim_delay_once.lock().unwrap() = Some(Duration::from_secs(5));
    let runs = AtomicUsize::new(0);
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        counted(&s.idem, "drop-claim", &runs, 0, 1),
    )
    .await;
    assert!(cut.is_err());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        counted(&s.idem, "drop-claim", &runs, 0, 2).await.unwrap(),
        2
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A caller dropped while its body's end is being stored (the completion landed, its answer late):
/// the value is stored, duplicates replay it, the body never runs again.
#[tokio::test(flavor = "current_thread")]
async fn a_caller_dropped_while_storing_keeps_the_stored_value() {
    let s = setup(|b| b);
    *s.hooks.complete_delay_once.lock().unwrap() = Some(Duration::from_secs(5));
    let runs = AtomicUsize::new(0);
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        counted(&s.idem, "drop-store", &runs, 2, 1),
    )
    .await;
    assert!(cut.is_err());
    assert_eq!(
        counted(&s.idem, "drop-store", &runs, 0, 2).await.unwrap(),
        1
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A caller dropped mid-body: the key stays PENDING (`InProgress` to a duplicate), its heartbeat stops,
/// and once its lease lapses a retry runs.
#[tokio::test(flavor = "current_thread")]
async fn a_caller_dropped_mid_body_keeps_the_key_until_its_lease() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let runs = AtomicUsize::new(0);
    let cut = tokio::time::timeout(
        Duration::from_millis(500),
        s.idem.operation(NS, "drop-body").run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok::<_, AppError>(1_u32)
        }),
    )
    .await;
    assert!(cut.is_err());
    let err = counted(&s.idem, "drop-body", &runs, 0, 2)
        .await
        .unwrap_err();
    assert!(matches!(err.idempotency(), Error::InProgress { .. }));
    let beats = s.hooks.beats.load(Ordering::SeqCst);
    // The lease, with the clock-skew margin (1 s).
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert_eq!(
        s.hooks.beats.load(Ordering::SeqCst),
        beats,
        "a dropped call beats on"
    );
    assert_eq!(counted(&s.idem, "drop-body", &runs, 0, 2).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A call's future dropped inside another call's body, at each stage of its own (never polled, after
/// its first poll, mid-body): the outer call goes on and stores its value.
#[tokio::test(flavor = "current_thread")]
async fn inner_calls_dropped_inside_a_body() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let v = s
        .idem
        .operation(NS, "drop-outer")
        .run(|_| async {
            let none = AtomicUsize::new(0);
            let never = counted(&s.idem, "drop-never", &none, 0, 1);
            drop(never);
            let runs = AtomicUsize::new(0);
            let mut once = Box::pin(counted(&s.idem, "drop-once", &runs, 100, 1));
            assert!(futures_util::poll!(once.as_mut()).is_pending());
            drop(once);
            let _ = tokio::time::timeout(
                Duration::from_millis(50),
                s.idem.operation(NS, "drop-mid").run(|_| async {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok::<_, AppError>(0_u32)
                }),
            )
            .await;
            tokio::task::yield_now().await;
            Ok::<_, AppError>(17_u32)
        })
        .await
        .unwrap();
    assert_eq!(v, 17);
    assert_eq!(
        record(&*s.store, NS, "drop-outer").await.unwrap().status,
        Status::Completed
    );
    assert!(record(&*s.store, NS, "drop-never").await.is_none());
}

/// A body whose `Drop` makes an idempotent call (and blocks on nothing): dropping the caller mid-body
/// runs that call from inside the dropped call's destructor.
#[tokio::test(flavor = "current_thread")]
async fn a_call_made_in_a_bodys_drop() {
    struct CallOnDrop(Idempotency, Arc<AtomicUsize>);
    impl Drop for CallOnDrop {
        fn drop(&mut self) {
            let (idem, ran) = (self.0.clone(), self.1.clone());
            let mut call = Box::pin(async move {
                idem.operation(NS, "from-drop")
                    .run(|_| async move {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, AppError>(1_u32)
                    })
                    .await
            });
            // Polled in the destructor (it ends at once on the memory store).
            let waker = futures_util::task::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(matches!(call.as_mut().poll(&mut cx), Poll::Ready(Ok(1))));
        }
    }
    let s = setup(|b| b);
    let ran = Arc::new(AtomicUsize::new(0));
    let guard = CallOnDrop(s.idem.clone(), ran.clone());
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        s.idem.operation(NS, "dropping").run(|_| async move {
            let _guard = guard;
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, AppError>(0_u32)
        }),
    )
    .await;
    assert!(cut.is_err());
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(
        record(&*s.store, NS, "from-drop").await.unwrap().status,
        Status::Completed
    );
}

// ---------------------------------------------------------------------------------------------------
// Detached calls.

/// A detached call whose caller is dropped once its body is running: the body runs to its end on its
/// own task, its value is stored and replayed, the heartbeat keeps its lease meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_body_outlives_its_caller_and_keeps_its_lease() {
    let s = setup(|b| b.default_lease(Duration::from_secs(1)));
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |runs: Arc<AtomicUsize>| {
        s.idem
            .operation(NS, "detached")
            .detach()
            .run(move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1600)).await;
                Ok::<_, AppError>("done".to_owned())
            })
    };
    let cut = tokio::time::timeout(Duration::from_millis(100), call(runs.clone())).await;
    assert!(cut.is_err());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let err = call(runs.clone()).await.unwrap_err();
    assert!(matches!(err.idempotency(), Error::InProgress { .. }));
    assert_eq!(s.idem.drain(Duration::from_secs(5)).await, 0);
    let (v, execution) = observe(call(runs.clone())).await;
    assert_eq!(v.unwrap(), "done");
    assert_eq!(execution, Some(Execution::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(s.hooks.beats.load(Ordering::SeqCst) >= 3);
}

/// A detached body that ends at once, and one pending many times: the caller gets the value, `observe`
/// says it executed, the record is COMPLETED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_call_ends_with_its_value() {
    let s = setup(|b| b);
    for pending in [0_usize, 50] {
        let key = format!("detached-{pending}");
        let (v, execution) = observe(
            s.idem
                .operation(NS, &key)
                .detach()
                .run(move |_| async move { Ok::<_, AppError>(yielding(pending, pending).await) }),
        )
        .await;
        assert_eq!(v.unwrap(), pending);
        assert_eq!(execution, Some(Execution::Executed));
        assert_eq!(
            record(&*s.store, NS, &key).await.unwrap().status,
            Status::Completed
        );
    }
}

/// A detached body that panics: the panic reaches its caller, the record is FAILED, a retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_body_panicking() {
    let s = setup(|b| b);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |panic: bool| {
        let runs = runs.clone();
        s.idem
            .operation(NS, "detached-panic")
            .detach()
            .run(move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                assert!(!panic, "detached body panics");
                Ok::<_, AppError>(3_u32)
            })
    };
    assert!(AssertUnwindSafe(call(true)).catch_unwind().await.is_err());
    assert_eq!(
        record(&*s.store, NS, "detached-panic")
            .await
            .unwrap()
            .status,
        Status::Failed
    );
    assert_eq!(call(false).await.unwrap(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A detached call dropped while its claim is on its way: released, a retry runs at once, and `drain`
/// does not hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_call_dropped_while_claiming() {
    let s = setup(|b| b);
    *s.hooks.claim_delay_once.lock().unwrap() = Some(Duration::from_secs(5));
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |v: u32| {
        let runs = runs.clone();
        s.idem
            .operation(NS, "detached-claim")
            .detach()
            .run(move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(v)
            })
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(100), call(1))
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(call(2).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(s.idem.drain(Duration::from_secs(2)).await, 0);
}

/// A detached call nested in an in-place body, and an in-place call nested in a detached body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_and_in_place_calls_nested_in_each_other() {
    let s = setup(|b| b);
    let idem = s.idem.clone();
    let v = s
        .idem
        .operation(NS, "mix-outer")
        .run(|_| async {
            let inner = idem
                .operation(NS, "mix-detached")
                .detach()
                .run({
                    let idem = idem.clone();
                    move |_| async move {
                        let runs = AtomicUsize::new(0);
                        let v = counted(&idem, "mix-innermost", &runs, 3, 5).await?;
                        Ok::<_, AppError>(v * 2)
                    }
                })
                .await?;
            Ok::<_, AppError>(inner + 1)
        })
        .await
        .unwrap();
    assert_eq!(v, 11);
    for key in ["mix-outer", "mix-detached", "mix-innermost"] {
        assert_eq!(
            record(&*s.store, NS, key).await.unwrap().status,
            Status::Completed,
            "{key}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------
// observe, spans, on_replay.

/// `on_replay` runs on replays only (from the store and from the local cache), in place and detached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_replay_runs_on_replays_only() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let idem = Idempotency::builder_arc(store).local_cache(16).build();
    let hooked = Arc::new(AtomicUsize::new(0));
    let call = |detach: bool| {
        let hooked = hooked.clone();
        let op = idem.operation(NS, "hooked").on_replay(move |v: u32| {
            hooked.fetch_add(1, Ordering::SeqCst);
            v + 1000
        });
        async move {
            if detach {
                op.detach()
                    .run(|_| async { Ok::<_, AppError>(yielding(2, 7_u32).await) })
                    .await
            } else {
                op.run(|_| async { Ok::<_, AppError>(yielding(2, 7_u32).await) })
                    .await
            }
        }
    };
    assert_eq!(call(false).await.unwrap(), 7);
    assert_eq!(hooked.load(Ordering::SeqCst), 0);
    assert_eq!(call(false).await.unwrap(), 1007);
    assert_eq!(call(true).await.unwrap(), 1007);
    assert_eq!(hooked.load(Ordering::SeqCst), 2);
}

/// Each call's span closes with its outcome (executed, replayed, failed; a detached one; a nested
/// one, whose span is the outer call's child).
#[test]
fn spans_close_with_their_outcomes() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let spans = idempotent_tests::spans::ClosedSpans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let idem = Idempotency::in_memory();
        let runs = AtomicUsize::new(0);
        counted(&idem, "span-1", &runs, 2, 1).await.unwrap();
        counted(&idem, "span-1", &runs, 2, 1).await.unwrap();
        let _ = idem
            .operation(NS, "span-2")
            .run(|_| async { Err::<u32, _>(AppError::Declined) })
            .await;
        idem.operation("core::outer", "span-3")
            .run(|_| async {
                tokio::task::yield_now().await;
                counted(&idem, "span-3-inner", &runs, 2, 1).await
            })
            .await
            .unwrap();
        idem.operation("core::detached", "span-4")
            .detach()
            .run(|_| async { Ok::<_, AppError>(yielding(3, 1_u32).await) })
            .await
            .unwrap();
    });
    drop(rt);
    let closed = spans.fields();
    let outcomes: Vec<_> = closed
        .iter()
        .map(|f| f.get("outcome").cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        outcomes,
        [
            "executed", "replayed", "failed", "executed", "executed", "executed"
        ],
        "{closed:#?}"
    );
    let inner = &closed[3];
    assert_eq!(
        inner.get("parent").map(String::as_str),
        Some("idempotent:core::outer"),
        "{closed:#?}"
    );
}

// ---------------------------------------------------------------------------------------------------
// Steps.

/// A body with steps that panics after its first step: the panic reaches the caller, the key is free,
/// and a retry resumes after the finished step (which does not run again).
#[tokio::test(flavor = "current_thread")]
async fn a_body_with_steps_panicking_after_a_step_resumes() {
    let s = setup(|b| b);
    let (first, second) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let call = |panic: bool| {
        let (first, second) = (&first, &second);
        AssertUnwindSafe(
            s.idem
                .operation(NS, "steps")
                .steps()
                .run(move |cx| async move {
                    let (steps, ()) = cx.into_parts();
                    let a = steps
                        .run("a", || async {
                            first.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, AppError>(yielding(2, 10_u32).await)
                        })
                        .await?;
                    assert!(!panic, "panics between steps");
                    let b = steps
                        .run("b", || async {
                            second.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, AppError>(yielding(2, 1_u32).await)
                        })
                        .await?;
                    Ok::<_, AppError>(a + b)
                }),
        )
        .catch_unwind()
    };
    assert!(call(true).await.is_err());
    assert_eq!(call(false).await.unwrap().unwrap(), 11);
    assert_eq!(
        (first.load(Ordering::SeqCst), second.load(Ordering::SeqCst)),
        (1, 1)
    );
}

// ---------------------------------------------------------------------------------------------------
// The exchange left behind by a nested call's core that panicked.

/// A store whose claims (when armed) first make an idempotent call on `nested` inside `catch_unwind`
/// (a store adapter that turns its inner work's panics into nothing, as a resilient wrapper might),
/// then yield once before forwarding the claim. The nested call's own store panics in its first
/// heartbeat: the panic leaves that call's core while it waits for its body.
struct CatchingClaim {
    nested: Mutex<Option<Setup>>,
    armed: AtomicBool,
    /// The same in the completion (`transition` to COMPLETED) instead of the claim.
    armed_complete: AtomicBool,
    caught: AtomicUsize,
}

impl std::fmt::Debug for CatchingClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CatchingClaim")
    }
}

#[async_trait::async_trait]
impl Override<Forward> for Catching {
    fn kind(&self) -> &'static str {
        "core-catching-claim"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.catch_a_nested_panic().await;
        }
        inner.claim(request).await
    }

    async fn transition(
        &self,
        inner: &Forward,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if matches!(transition.change, Change::Complete { .. })
            && self.armed_complete.swap(false, Ordering::SeqCst)
        {
            self.catch_a_nested_panic().await;
        }
        inner.transition(transition).await
    }
}

impl CatchingClaim {
    /// A nested call whose core panics while it waits for its body, caught; then one yield, so that
    /// the request is still on its way when the outer core's poll ends.
    async fn catch_a_nested_panic(&self) {
        let (idem, hooks) = {
            let nested = self.nested.lock().unwrap();
            let nested = nested.as_ref().unwrap();
            (nested.idem.clone(), nested.hooks.clone())
        };
        hooks.panic_in_beat.store(true, Ordering::SeqCst);
        let n = self.caught.load(Ordering::SeqCst);
        let call = idem.operation("core::nested", &n).run(|_| async {
            // Longer than a third of the nested call's lease: its first heartbeat goes, and panics.
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok::<_, Error>(1_u32)
        });
        let caught = AssertUnwindSafe(call).catch_unwind().await;
        assert!(caught.is_err(), "the nested call's heartbeat panicked");
        self.caught.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
    }
}

/// [`CatchingClaim`], shared, as the store's override (the orphan rule wants a local type).
#[derive(Debug)]
struct Catching(Arc<CatchingClaim>);

impl std::ops::Deref for Catching {
    type Target = CatchingClaim;
    fn deref(&self) -> &CatchingClaim {
        &self.0
    }
}

fn catching_setup() -> (Idempotency, Arc<dyn Store>, Arc<CatchingClaim>) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let catching = Arc::new(CatchingClaim {
        nested: Mutex::new(Some(setup(|b| b.default_lease(Duration::from_secs(1))))),
        armed: AtomicBool::new(false),
        armed_complete: AtomicBool::new(false),
        caught: AtomicUsize::new(0),
    });
    let wrapped = Arc::new(Delegating::new(
        Forward(store.clone()),
        Catching(catching.clone()),
    ));
    (Idempotency::builder_arc(wrapped).build(), store, catching)
}

/// A duplicate whose claim's store future catches the panic of a nested call's core (which
/// panicked while that core waited for its body, leaving `Asked` in the thread's exchange) and is then
/// still pending: were the exchange not put back when the nested poll unwinds, the outer shim would
/// read the stale `Asked` as its own core's question and poll the duplicate's body before its claim
/// is answered (the body would run twice for one key).
#[tokio::test(flavor = "current_thread")]
async fn a_duplicates_body_never_runs_after_a_nested_core_panicked_in_its_claim() {
    let (idem, store, catching) = catching_setup();
    let runs = AtomicUsize::new(0);
    let call = || {
        idem.operation(NS, "stale-exchange").run(|_| async {
            // The body's side effect, before its first await.
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            Ok::<_, AppError>(runs.load(Ordering::SeqCst))
        })
    };
    assert_eq!(call().await.unwrap(), 1);
    assert_eq!(
        record(&*store, NS, "stale-exchange").await.unwrap().status,
        Status::Completed
    );
    catching.armed.store(true, Ordering::SeqCst);
    let replayed = call().await.unwrap();
    assert_eq!(
        catching.caught.load(Ordering::SeqCst),
        1,
        "the nested panic was caught"
    );
    assert_eq!(replayed, 1, "the duplicate gets the stored value");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate's body ran");
}

/// The same with a body that ends at its first poll: its end goes into the exchange while
/// the core is still claiming, and the shim would panic (`unreachable!`: "a call's core takes the
/// body's end it asked for") instead of returning the stored value.
#[tokio::test(flavor = "current_thread")]
async fn a_duplicate_replays_after_a_nested_core_panicked_in_its_claim() {
    let (idem, _store, catching) = catching_setup();
    let runs = AtomicUsize::new(0);
    let call = || {
        idem.operation(NS, "stale-exchange-now").run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AppError>(7_u32)
        })
    };
    assert_eq!(call().await.unwrap(), 7);
    catching.armed.store(true, Ordering::SeqCst);
    let again = AssertUnwindSafe(call()).catch_unwind().await;
    let again = again.map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default()
    });
    assert_eq!(
        catching.caught.load(Ordering::SeqCst),
        1,
        "the nested panic was caught"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate's body ran");
    assert_eq!(again.expect("a duplicate does not panic").unwrap(), 7);
}

/// The same on a first call: the body must not be polled while its claim is on its way (it would run
/// before the key is held, and a second caller racing for the key might run it too).
#[tokio::test(flavor = "current_thread")]
async fn a_body_is_not_polled_before_its_claim_is_answered() {
    let (idem, _store, catching) = catching_setup();
    let claimed = Arc::new(AtomicBool::new(false));
    catching.armed.store(true, Ordering::SeqCst);
    let started_unclaimed = AtomicBool::new(false);
    let v = idem
        .operation(NS, "before-claim")
        .run(|_| async {
            // The claim has been answered iff the store's record is PENDING under some token.
            let key = idempotent_runtime::derive_key(NS, "before-claim").unwrap();
            let held = idem.store().get(&key).await.unwrap().is_some();
            claimed.store(held, Ordering::SeqCst);
            if !held {
                started_unclaimed.store(true, Ordering::SeqCst);
            }
            Ok::<_, AppError>(1_u32)
        })
        .await;
    assert_eq!(
        catching.caught.load(Ordering::SeqCst),
        1,
        "the nested panic was caught"
    );
    assert!(
        !started_unclaimed.load(Ordering::SeqCst),
        "the body started before its claim was stored"
    );
    let _ = v;
}

/// The same while storing: the completion's store future catches a nested core's panic and is still
/// pending; a stale `Asked` would make the shim take its core to be waiting for the body again and
/// poll the finished body (its `async` block panics: resumed after completion), so that the caller of a
/// body that ran and returned `Ok` got a panic. It gets its value.
#[tokio::test(flavor = "current_thread")]
async fn a_call_gets_its_value_after_a_nested_core_panicked_in_its_completion() {
    let (idem, store, catching) = catching_setup();
    catching.armed_complete.store(true, Ordering::SeqCst);
    let runs = AtomicUsize::new(0);
    let first = AssertUnwindSafe(idem.operation(NS, "stale-complete").run(|_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        Ok::<_, AppError>(5_u32)
    }))
    .catch_unwind()
    .await;
    assert_eq!(
        catching.caught.load(Ordering::SeqCst),
        1,
        "the nested panic was caught"
    );
    assert!(first.is_ok(), "the call panicked");
    assert_eq!(first.unwrap().unwrap(), 5);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let r = record(&*store, NS, "stale-complete").await.unwrap();
    assert_eq!(r.status, Status::Completed);
}

// ---------------------------------------------------------------------------------------------------
// Coalescing: a replay's hold on the key's flight, handed from the core to the shim.

/// Concurrent duplicates on one thread, coalesced, with `wait`: one body runs, every caller gets its
/// value; then a burst of duplicates of the stored key, led by one replay whose flight the shim
/// decodes: every caller gets the value, none runs the body.
#[tokio::test(flavor = "current_thread")]
async fn coalesced_duplicates_and_replays_on_one_thread() {
    let s = setup(|b| b.coalesce(true).default_lease(Duration::from_secs(1)));
    let runs = AtomicUsize::new(0);
    let call = || {
        s.idem
            .operation(NS, "coalesced")
            .wait(Duration::from_secs(3))
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(400)).await;
                Ok::<_, AppError>("once".to_owned())
            })
    };
    let first = futures_util::future::join_all((0..16).map(|_| call())).await;
    assert!(first.into_iter().all(|v| v.unwrap() == "once"));
    let again = futures_util::future::join_all((0..16).map(|_| call())).await;
    assert!(again.into_iter().all(|v| v.unwrap() == "once"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
