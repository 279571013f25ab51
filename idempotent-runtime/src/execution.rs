//! The replay signal: whether a call ran its body or replayed a stored response, told without changing
//! the function's return type.
//!
//! A `#[idempotent]` function returns the same `Result<T, E>` whether its body ran or its stored value
//! was replayed, which is the point: callers need not care. Integrations do care (an HTTP service adds
//! `Idempotent-Replayed: true`; a queue consumer reports a message as replayed), and so do metrics. The
//! runtime records what happened in a task-local slot; [`observe`] opens one around a future and hands
//! back what the idempotent calls inside it did.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idempotent_runtime::Error> {
//! use idempotent_runtime::{Error, Execution, Idempotency, observe};
//!
//! let idem = Idempotency::in_memory();
//! let charge = || idem.operation("billing::charge", "order-1").run(|_| async { Ok::<_, Error>(42) });
//!
//! let (first, execution) = observe(charge()).await;
//! assert_eq!((first?, execution), (42, Some(Execution::Executed)));
//! let (again, execution) = observe(charge()).await;
//! assert_eq!((again?, execution), (42, Some(Execution::Replayed)));
//! # Ok(()) }
//! ```
//!
//! To adjust a replayed value before the caller sees it (mark it, refresh a timestamp), either match on
//! the [`Execution`] at the call site, as above, or give the operation a hook with
//! [`Operation::on_replay`](crate::Operation::on_replay).

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static OBSERVED: Cell<Option<Execution>>;
}

/// How an idempotent call produced its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Execution {
    /// The body ran in this call (its result may be `Ok`, stored for later, or `Err`, recorded as FAILED).
    Executed,
    /// The body did not run: the value is the one stored by an earlier call with the same key (read from
    /// the store or the local cache).
    Replayed,
}

impl Execution {
    /// Whether the value was replayed rather than produced by this call.
    #[must_use]
    pub fn is_replay(self) -> bool {
        self == Execution::Replayed
    }
}

/// Runs `future` and reports how the idempotent calls inside it produced their results: `Some` with the
/// last one to finish, or `None` when none ran its body or replayed a value.
///
/// `None` means every idempotent call in `future` ended before the body could run: another call held the
/// key ([`Error::InProgress`](crate::Error::InProgress)), a different payload
/// ([`Error::PayloadMismatch`](crate::Error::PayloadMismatch)), a missing key, a store failure — or a
/// missing key under [`MissingKey::Skip`](crate::MissingKey::Skip), whose body runs outside the protocol.
///
/// "Last to finish" makes nesting come out right: when an idempotent function calls another, the outer
/// call finishes last, so it is the one reported. The slot belongs to the current task: calls in tasks
/// that `future` spawns are not seen (observe inside the spawned task instead).
pub async fn observe<F: Future>(future: F) -> (F::Output, Option<Execution>) {
    OBSERVED
        .scope(Cell::new(None), async move {
            let output = future.await;
            (output, OBSERVED.with(Cell::get))
        })
        .await
}

/// Notes how the current call produced its result, for the innermost [`observe`] around it (if any).
pub(crate) fn record(execution: Execution) {
    // Outside `observe` there is no slot, and nobody asked.
    let _ = OBSERVED.try_with(|slot| slot.set(Some(execution)));
}
