//! What a test sees of the calls' ends ([`Seen`]): every closed span's name and fields ([`ClosedSpans`]),
//! and `idempotency_calls_total` by namespace and outcome, under a subscriber and a metrics recorder
//! of the test's own ([`watching`]), in a child process of its own ([`apart`]).

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde::{Deserialize, Serialize};
use tracing::Dispatch;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::spans::{Closed, ClosedSpans};

/// What the calls made under [`watching`] reported.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Seen {
    /// Every closed span, in the order they closed.
    pub spans: Vec<Closed>,
    /// `idempotency_calls_total` by namespace and outcome.
    pub counted: Vec<(String, String, u64)>,
}

impl Seen {
    /// The outcomes of the `idempotent` spans of `namespace`, in the order they closed.
    #[must_use]
    pub fn spans_of(&self, namespace: &str) -> Vec<String> {
        self.spans
            .iter()
            .filter(|s| s.name == "idempotent" && s.get("namespace") == namespace)
            .map(|s| s.get("outcome"))
            .collect()
    }

    /// The field `field` of the spans named `name` (not the calls'), "" for none, in the order they
    /// closed.
    #[must_use]
    pub fn others_named(&self, name: &str, field: &str) -> Vec<String> {
        self.spans
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.get(field))
            .collect()
    }

    /// `idempotency_calls_total{namespace}` by outcome, sorted.
    #[must_use]
    pub fn counted_of(&self, namespace: &str) -> Vec<(String, u64)> {
        let mut counted: Vec<(String, u64)> = self
            .counted
            .iter()
            .filter(|(n, _, c)| n == namespace && *c > 0)
            .map(|(_, o, c)| (o.clone(), *c))
            .collect();
        counted.sort();
        counted
    }

    /// Each call of `namespace` closed its span with exactly one of the outcomes of `expected` (in any
    /// order), and counted once under it.
    #[track_caller]
    pub fn assert_closed(&self, namespace: &str, expected: &[&str]) {
        let mut want: Vec<(String, u64)> = Vec::new();
        for outcome in expected {
            match want.iter_mut().find(|(o, _)| o == outcome) {
                Some((_, n)) => *n += 1,
                None => want.push(((*outcome).to_owned(), 1)),
            }
        }
        want.sort();
        let mut expected: Vec<String> = expected.iter().map(|o| (*o).to_owned()).collect();
        expected.sort();
        let mut spans = self.spans_of(namespace);
        spans.sort();
        assert_eq!(
            (spans, self.counted_of(namespace)),
            (expected, want),
            "{namespace}: (the outcome of each `idempotent` span as it closed, sorted, \"\" for none; \
             idempotency_calls_total by outcome)"
        );
    }

    /// `calls` calls of `namespace` each closed a span with an outcome, and counted once.
    #[track_caller]
    pub fn assert_each_closed_with_an_outcome(&self, namespace: &str, calls: usize) {
        let spans = self.spans_of(namespace);
        let counted = self.counted_of(namespace);
        let total: u64 = counted.iter().map(|(_, n)| n).sum();
        assert!(
            spans.len() == calls && spans.iter().all(|o| !o.is_empty()) && total == calls as u64,
            "{calls} calls of {namespace}, each to close its span with an outcome and count once; \
             the spans closed with {spans:?} (\"\": no outcome), idempotency_calls_total counted \
             {counted:?}"
        );
    }
}

/// How [`watching`] installs its subscriber.
#[derive(Clone, Copy)]
pub enum Install {
    /// As the thread's default, for all of `f`.
    ThreadDefault,
    /// As the thread's default, behind a global filter that turns the runtime's own spans and events
    /// off (`idempotent_runtime`), as a service that keeps only its own spans does.
    ThreadDefaultWithoutTheRuntimes,
    /// Not at all: `f` gets it, to hand to the futures it wants observed (`WithSubscriber`).
    Scoped,
}

/// Runs `f` with a metrics recorder of this thread's own and a `tracing` subscriber that keeps every
/// closed span (installed as `install` says; `f` gets its `Dispatch`), then reads what they reported.
///
/// # Panics
/// When `idempotency_calls_total` is not a counter.
pub fn watching(install: Install, f: impl FnOnce(&Dispatch)) -> Seen {
    let closed = ClosedSpans::default();
    let dispatch = match install {
        Install::ThreadDefault | Install::Scoped => {
            Dispatch::new(tracing_subscriber::registry().with(closed.clone()))
        }
        Install::ThreadDefaultWithoutTheRuntimes => Dispatch::new(
            tracing_subscriber::registry()
                .with(tracing_subscriber::filter::filter_fn(|meta| {
                    !meta.target().starts_with("idempotent_runtime")
                }))
                .with(closed.clone()),
        ),
    };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || match install {
        Install::Scoped => f(&dispatch),
        Install::ThreadDefault | Install::ThreadDefaultWithoutTheRuntimes => {
            tracing::dispatcher::with_default(&dispatch, || f(&dispatch));
        }
    });
    let counted = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == "idempotency_calls_total")
        .map(|(key, _, _, value)| {
            let label = |name: &str| {
                key.key()
                    .labels()
                    .find(|l| l.key() == name)
                    .map(|l| l.value().to_owned())
                    .unwrap_or_default()
            };
            let n = match value {
                DebugValue::Counter(n) => n,
                other => panic!("{other:?}"),
            };
            (label("namespace"), label("outcome"), n)
        })
        .collect();
    let spans = closed.all();
    Seen { spans, counted }
}

/// The line a child process prints what it saw on ([`apart`]).
const SEEN: &str = "IDEMPOTENT_TESTS_SEEN ";
/// Set in the child process that runs one test of [`apart`].
const APART: &str = "IDEMPOTENT_TESTS_APART";

/// [`watching`], in a process of its own (the test `test`, its full path in its test binary, runs
/// again alone in a child process, which prints what it saw); the parent gets it, `None` in the child.
/// Alone, because the tests of a binary run in parallel, each with a subscriber of its own, and a span
/// made while another test's subscriber comes or goes may be left disabled.
///
/// # Panics
/// When the child process fails, or prints nothing of what it saw.
#[must_use]
pub fn apart(test: &str, install: Install, f: impl FnOnce(&Dispatch)) -> Option<Seen> {
    if std::env::var_os(APART).is_some() {
        let seen = watching(install, f);
        println!("{SEEN}{}", serde_json::to_string(&seen).unwrap());
        return None;
    }
    let out = crate::spans::in_child(test, APART);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seen = stdout
        .lines()
        .find_map(|l| l.split_once(SEEN).map(|(_, seen)| seen));
    match (out.status.success(), seen) {
        (true, Some(seen)) => Some(serde_json::from_str(seen).unwrap()),
        _ => panic!(
            "the child process of {test} failed: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
