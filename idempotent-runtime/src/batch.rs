//! Queue batches delivered at least once, processed exactly once per message: feature `batch`.
//!
//! Queues such as SQS deliver each message at least once: a batch may hold the same message twice, and a
//! later batch may bring it again. [`Batch::process`] runs each message's handler through the state
//! machine, keyed by what identifies the *work* (an order id, a payload digest, the producer's
//! deduplication id), so a duplicate gets the stored result instead of running again, with up to
//! [`concurrency`](Batch::concurrency) messages at once. The [`Report`] says, per message, whether it was
//! executed, replayed or failed, and [`Report::batch_response`] turns it into SQS's partial-batch
//! response, so only the failed messages are delivered again.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use idempotent_runtime::{Error, Idempotency};
//! use idempotent_runtime::batch::Outcome;
//!
//! struct Msg { id: &'static str, order: u32 }
//! let idem = Idempotency::in_memory();
//! let batch = [Msg { id: "m1", order: 7 }, Msg { id: "m2", order: 7 }, Msg { id: "m3", order: 0 }];
//! let report = idem
//!     .batch("orders::ship")
//!     .concurrency(8)
//!     .process(batch, |m| m.id.to_owned(), |m| m.order, |m| async move {
//!         if m.order == 0 { return Err(Error::MissingKey { namespace: "demo".into() }) }
//!         Ok::<_, Error>(format!("shipped {}", m.order))
//!     })
//!     .await;
//! let outcomes: Vec<_> = report.items.iter().map(|i| i.outcome.clone()).collect();
//! assert!(matches!(outcomes[..], [Outcome::Executed, Outcome::Replayed, Outcome::Failed(_)]));
//! let response = serde_json::to_string(&report.batch_response()).unwrap();
//! assert_eq!(response, r#"{"batchItemFailures":[{"itemIdentifier":"m3"}]}"#);
//! # }
//! ```
//!
//! Messages with the same key in one batch run one after the other (the first executes, the others
//! replay its result, one store round trip each), never side by side, where all but one would fail with
//! [`Error::InProgress`] and be delivered again for nothing. Messages with different keys run
//! concurrently, up to the bound. Each message's outcome is found with [`observe`](crate::observe).
//!
//! On a FIFO queue, [`Batch::fifo`] keeps each message group's order: a group's messages run one after
//! the other, and the first failure stops its group (its later messages are reported for redelivery
//! without running) while the other groups go on. In a Lambda, [`Batch::deadline`] bounds the claims by
//! the invocation's deadline.
//!
//! What each message's outcome means for the queue:
//!
//! | the message | outcome | redelivered |
//! |---|---|---|
//! | its work ran now and succeeded | [`Outcome::Executed`] | no |
//! | an earlier delivery's stored result is replayed | [`Outcome::Replayed`] | no |
//! | the work was done (now or by an earlier delivery), but its result cannot be replayed: too large to store ([`Error::ResponseTooLarge`]), not serializable, such as a NaN ([`Error::Serialize`] of the response now, [`Error::ResponseNotSerialized`] later), expired with only its tombstone retained ([`Error::Expired`], [`Builder::retain`](crate::Builder::retain)), or no longer of the handler's output type ([`Error::Deserialize`]) | [`Outcome::Done`] | no |
//! | the handler failed, or it or the message's key panicked (`panicked: <message>`; the other messages go on) | [`Outcome::Failed`] | yes |
//! | its key was used with another body ([`payload`](Batch::payload)): [`Error::PayloadMismatch`] | [`Outcome::Failed`] | yes |
//! | another delivery of the key is in flight, or the store failed | [`Outcome::Failed`] | yes |
//! | in a [`fifo`](Batch::fifo) batch, an earlier message of its group failed (it did not run) | [`Outcome::Failed`] | yes |
//! | its turn came after the batch's [`deadline`](Batch::deadline) (it was not claimed) | [`Outcome::Failed`] | yes |

use std::collections::HashMap;
use std::fmt::{self, Display};
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures_util::{FutureExt as _, StreamExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Error, Execution, Idempotency, Operation};

/// A batch consumer: the namespace of its records, how many messages it runs at once, and what of a
/// message is its payload. Start with [`Idempotency::batch`].
///
/// `P` says what of a message is checked against the stored payload: [`NoPayload`] unless
/// [`payload`](Self::payload) gave a function. `O` says which messages must keep their order:
/// [`Unordered`] unless [`fifo`](Self::fifo) gave a message's group.
#[derive(Clone)]
#[must_use = "a batch does nothing until `process` is awaited"]
pub struct Batch<'a, P = NoPayload, O = Unordered> {
    idem: &'a Idempotency,
    namespace: &'static str,
    concurrency: usize,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    deadline: Option<SystemTime>,
    payload: P,
    order: O,
}

impl<P, O> fmt::Debug for Batch<'_, P, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("idem", self.idem)
            .field("namespace", &self.namespace)
            .field("concurrency", &self.concurrency)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

/// The default of [`Batch`]: messages are not checked against a payload, only their keys matter.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPayload;

/// What of a message is its payload, whose fingerprint is stored with its record and checked on every
/// later message with its key: [`NoPayload`], or any `Fn(&M) -> P` with `P: Serialize` (see
/// [`Batch::payload`]).
pub trait Payload<M> {
    /// `operation`, with `message`'s payload when there is one.
    fn apply<'o>(&self, message: &M, operation: Operation<'o>) -> Operation<'o>;
}

impl<M> Payload<M> for NoPayload {
    fn apply<'o>(&self, _: &M, operation: Operation<'o>) -> Operation<'o> {
        operation
    }
}

impl<M, P: Serialize, F: Fn(&M) -> P> Payload<M> for F {
    fn apply<'o>(&self, message: &M, operation: Operation<'o>) -> Operation<'o> {
        operation.payload(&self(message))
    }
}

/// The default of [`Batch`]: messages are independent (a standard queue); only messages with the same
/// key run one after the other.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unordered;

/// Which messages of a batch must keep their order: [`Unordered`], or any `Fn(&M) -> G` giving a
/// message's group (SQS FIFO's `MessageGroupId`; see [`Batch::fifo`]).
pub trait Order<M> {
    /// What names a group.
    type Group: Hash + Eq;

    /// `message`'s group, or `None` when it is ordered with no other message.
    fn group(&self, message: &M) -> Option<Self::Group>;
}

impl<M> Order<M> for Unordered {
    type Group = ();

    fn group(&self, _: &M) -> Option<()> {
        None
    }
}

impl<M, G: Hash + Eq, F: Fn(&M) -> G> Order<M> for F {
    type Group = G;

    fn group(&self, message: &M) -> Option<G> {
        Some(self(message))
    }
}

/// The default bound on messages processed at once.
pub const DEFAULT_CONCURRENCY: usize = 10;

impl Idempotency {
    /// A consumer of queue batches whose records live in `namespace`; see [`batch`](crate::batch).
    pub fn batch(&self, namespace: &'static str) -> Batch<'_> {
        Batch {
            idem: self,
            namespace,
            concurrency: DEFAULT_CONCURRENCY,
            ttl: None,
            lease: None,
            deadline: None,
            payload: NoPayload,
            order: Unordered,
        }
    }
}

/// How one message went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "error", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and succeeded; its result is stored.
    Executed,
    /// An earlier delivery's stored result was used; the handler did not run.
    Replayed,
    /// The handler failed or panicked (`panicked: <message>`), or the message could not be processed
    /// (another delivery in flight, a different payload, a store failure): the message should be
    /// delivered again. The text is the error's.
    Failed(String),
    /// The work was done, by this delivery or an earlier one, but its result cannot be replayed: it
    /// was too large to store ([`Error::ResponseTooLarge`]), it did not serialize, such as a NaN
    /// ([`Error::Serialize`] of the response for the delivery that ran it, then
    /// [`Error::ResponseNotSerialized`]), it expired and only its tombstone is retained
    /// ([`Error::Expired`]), or it no longer deserializes into the handler's output type
    /// ([`Error::Deserialize`]; a batch never uses it). The handler does not run again for the key;
    /// the message is done and is not delivered again (delivering it again would only end the same
    /// way, until it is dead-lettered). The text is the error's, which says which.
    Done(String),
}

/// One message's line in a [`Report`].
///
/// Built only by the batch; `#[non_exhaustive]`, so a line may say more later (the attempt, say)
/// without breaking a caller that reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Item {
    /// The message's id, as the queue knows it (SQS's `messageId`).
    pub id: String,
    /// How it went.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// What happened to each message of a batch, in the batch's order.
///
/// Built by the batch (or empty, with `Default`); `#[non_exhaustive]`, so a report may say more later
/// without breaking a caller that reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Report {
    /// One per message, in the order they were given.
    pub items: Vec<Item>,
}

/// SQS's partial-batch response (`ReportBatchItemFailures`): the messages to deliver again.
///
/// Frozen, with public fields a caller may build it from: its shape is Lambda's wire format for a
/// partial-batch response, which this type serializes to exactly; it changes only if AWS changes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResponse {
    /// The failed messages.
    #[serde(rename = "batchItemFailures")]
    pub batch_item_failures: Vec<ItemFailure>,
}

/// One message to deliver again.
///
/// Frozen, like [`BatchResponse`]: Lambda's wire format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemFailure {
    /// Its id (SQS's `messageId`).
    #[serde(rename = "itemIdentifier")]
    pub item_identifier: String,
}

impl Report {
    /// How many messages ended with `outcome`'s kind (the text of [`Outcome::Failed`] is ignored).
    #[must_use]
    pub fn count(&self, outcome: &Outcome) -> usize {
        self.items
            .iter()
            .filter(|i| std::mem::discriminant(&i.outcome) == std::mem::discriminant(outcome))
            .count()
    }

    /// The partial-batch response that has the queue deliver the failed messages again, and only them.
    #[must_use]
    pub fn batch_response(&self) -> BatchResponse {
        BatchResponse {
            batch_item_failures: self
                .items
                .iter()
                .filter(|i| matches!(i.outcome, Outcome::Failed(_)))
                .map(|i| ItemFailure {
                    item_identifier: i.id.clone(),
                })
                .collect(),
        }
    }
}

impl<'a, O> Batch<'a, NoPayload, O> {
    /// Checks each message's payload, as [`Operation::payload`] does: `payload` gives what of a
    /// message is its payload (its body, say), whose fingerprint is stored with the record. A later
    /// message with the same key and another payload — in this batch or a later one — is not replayed
    /// another message's result: it fails alone with [`Error::PayloadMismatch`] (its
    /// [`Outcome::Failed`] says so). `payload` returns an owned value (or a `&'static` one); annotate
    /// the message's type:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use idempotent_runtime::{Error, Idempotency};
    /// use idempotent_runtime::batch::Outcome;
    ///
    /// struct Msg { id: &'static str, order: u32, body: String }
    /// let msg = |id, body: &str| Msg { id, order: 7, body: body.to_owned() };
    /// let idem = Idempotency::in_memory();
    /// let report = idem
    ///     .batch("orders::ship")
    ///     .payload(|m: &Msg| m.body.clone())
    ///     .process([msg("m1", "2 boxes"), msg("m2", "3 boxes")], |m| m.id.to_owned(), |m| m.order, |m| async move {
    ///         Ok::<_, Error>(format!("shipped {}", m.body))
    ///     })
    ///     .await;
    /// assert_eq!(report.items[0].outcome, Outcome::Executed);
    /// assert!(matches!(&report.items[1].outcome, Outcome::Failed(why) if why.contains("different payload")));
    /// # }
    /// ```
    pub fn payload<M, P, F>(self, payload: F) -> Batch<'a, F, O>
    where
        F: Fn(&M) -> P,
        P: Serialize,
    {
        Batch {
            idem: self.idem,
            namespace: self.namespace,
            concurrency: self.concurrency,
            ttl: self.ttl,
            lease: self.lease,
            deadline: self.deadline,
            payload,
            order: self.order,
        }
    }
}

impl<'a, P> Batch<'a, P, Unordered> {
    /// Keeps the order of each message group, as a FIFO queue requires (SQS FIFO: the
    /// `MessageGroupId`): `group_of` gives a message's group. The messages of a group run one after the
    /// other, in the batch's order; the first that fails stops its group: every later message of that
    /// group is reported [`Outcome::Failed`] without running (so the queue delivers them again, after
    /// the failed one), while the other groups go on, up to [`concurrency`](Self::concurrency) at once.
    /// A message whose work is [done](Outcome::Done) or replayed does not stop its group.
    ///
    /// This is the rule AWS gives for partial batch responses from FIFO queues (stop at the first
    /// failure, report it and every message after it), per group: other groups' order does not depend
    /// on it. Without `fifo`, a failed message is reported alone and the rest of the batch goes on,
    /// which on a FIFO queue would run (and delete) a group's later messages before the failed one.
    /// `group_of` must not panic, as `id` must not.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use idempotent_runtime::{Error, Idempotency};
    /// use idempotent_runtime::batch::Outcome;
    ///
    /// struct Msg { id: &'static str, account: &'static str, op: &'static str }
    /// let msg = |id, account, op| Msg { id, account, op };
    /// let idem = Idempotency::in_memory();
    /// let batch = [
    ///     msg("m1", "acct-1", "debit"),
    ///     msg("m2", "acct-2", "open"),
    ///     msg("m3", "acct-1", "close"), // after m1's failure: not run, delivered again
    /// ];
    /// let report = idem
    ///     .batch("accounts::apply")
    ///     .fifo(|m: &Msg| m.account)
    ///     .process(batch, |m| m.id.to_owned(), |m| m.id, |m| async move {
    ///         if m.op == "debit" { return Err(Error::MissingKey { namespace: "demo".into() }) }
    ///         Ok::<_, Error>(m.op.to_owned())
    ///     })
    ///     .await;
    /// let response = serde_json::to_string(&report.batch_response()).unwrap();
    /// assert_eq!(response, r#"{"batchItemFailures":[{"itemIdentifier":"m1"},{"itemIdentifier":"m3"}]}"#);
    /// assert_eq!(report.items[1].outcome, Outcome::Executed);
    /// # }
    /// ```
    pub fn fifo<M, G, F>(self, group_of: F) -> Batch<'a, P, F>
    where
        F: Fn(&M) -> G,
        G: Hash + Eq,
    {
        Batch {
            idem: self.idem,
            namespace: self.namespace,
            concurrency: self.concurrency,
            ttl: self.ttl,
            lease: self.lease,
            deadline: self.deadline,
            payload: self.payload,
            order: group_of,
        }
    }
}

impl<P, O> Batch<'_, P, O> {
    /// At most `n` messages processed at once (default [`DEFAULT_CONCURRENCY`]; 0 counts as 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How long a result is replayed to later deliveries (default: the handle's `ttl`). Make it longer
    /// than the queue keeps a message (SQS: up to 14 days), so a very late redelivery is still known.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long a message's claim blocks other deliveries if its worker dies (default: the handle's).
    /// Keep it under the queue's visibility timeout, so a redelivery after a crash finds it free.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Bounds the batch by a deadline after which this process will not be running handlers any more,
    /// such as an AWS Lambda invocation's (`lambda_runtime::Context::deadline()`), as
    /// [`Operation::deadline`] does for one call: no message's claim asks for a lease past `deadline`,
    /// so a claim whose invocation was killed at the deadline is free again right after it. A message
    /// whose turn comes with less than [`MIN_LEASE`](crate::MIN_LEASE) left is not claimed: it is
    /// reported [`Outcome::Failed`] (delivered again), and in a [`fifo`](Self::fifo) batch stops its
    /// group. Build the handle with [`Builder::heartbeat(false)`](crate::Builder::heartbeat), as for
    /// `Operation::deadline`.
    pub fn deadline(mut self, deadline: SystemTime) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Processes `messages`: `id` names a message for the report, `key` says which work it is (two
    /// messages with equal keys are one piece of work), `handler` does the work. The result of a
    /// successful handler is stored and replayed to duplicates; a failed one lets the next delivery run
    /// again. Never fails as a whole: every problem is one message's [`Outcome::Failed`], a handler
    /// or a `key` that panics included (the panic is caught, and the other messages go on). Only `id`
    /// must not panic: a message without an id cannot be reported for redelivery.
    pub async fn process<M, K, T, E, Fut>(
        &self,
        messages: impl IntoIterator<Item = M>,
        id: impl Fn(&M) -> String,
        key: impl Fn(&M) -> K,
        handler: impl Fn(M) -> Fut,
    ) -> Report
    where
        K: Serialize,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Display,
        Fut: Future<Output = Result<T, E>>,
        P: Payload<M>,
        O: Order<M>,
    {
        let lanes = self.lanes(messages, &id, &key);
        let handler = &handler;
        let mut items: Vec<(usize, Item)> = futures_util::stream::iter(lanes)
            .map(|lane| async move {
                let mut done = Vec::with_capacity(lane.len());
                // The groups of this lane that stopped, with the message that failed first.
                let mut stopped: HashMap<usize, String> = HashMap::new();
                for entry in lane {
                    let earlier = entry.group.and_then(|group| stopped.get(&group));
                    let outcome = match (earlier, entry.work) {
                        (Some(failed), _) => Outcome::Failed(format!(
                            "not processed: message `{failed}` of its group failed before it; it is delivered again after that one"
                        )),
                        (None, Err(why)) => Outcome::Failed(why),
                        // A panic is this message's failure: caught here, so that the other
                        // messages (the rest of this lane included) go on. Nothing of this batch's
                        // is left half-updated by it: each message's state is its own future's,
                        // dropped with it.
                        (None, Ok((key, message))) => AssertUnwindSafe(self.one(&key, message, handler))
                            .catch_unwind()
                            .await
                            .unwrap_or_else(|panic| Outcome::Failed(panicked(&*panic))),
                    };
                    if let (Outcome::Failed(_), Some(group)) = (&outcome, entry.group) {
                        stopped.entry(group).or_insert_with(|| entry.id.clone());
                    }
                    done.push((entry.index, Item { id: entry.id, outcome }));
                }
                futures_util::stream::iter(done)
            })
            .buffer_unordered(self.concurrency)
            .flatten()
            .collect()
            .await;
        items.sort_unstable_by_key(|(index, _)| *index);
        Report {
            items: items.into_iter().map(|(_, item)| item).collect(),
        }
    }

    /// Sorts `messages` into lanes, each run one message after the other in the batch's order, the
    /// lanes side by side: messages with the same record key share a lane (the first executes, the
    /// others replay it, never racing into [`Error::InProgress`]), and so do the messages of a FIFO
    /// group; a lane that holds two of them holds both whole.
    fn lanes<M, K>(
        &self,
        messages: impl IntoIterator<Item = M>,
        id: &impl Fn(&M) -> String,
        key: &impl Fn(&M) -> K,
    ) -> Vec<Vec<Entry<K, M>>>
    where
        K: Serialize,
        O: Order<M>,
    {
        // Union-find over lanes: two lanes merge when a message belongs to both.
        fn root(parent: &mut [usize], mut lane: usize) -> usize {
            while parent[lane] != lane {
                parent[lane] = parent[parent[lane]];
                lane = parent[lane];
            }
            lane
        }
        let mut parent: Vec<usize> = Vec::new();
        let mut entries = Vec::new();
        let mut lane_of_key: HashMap<String, usize> = HashMap::new();
        // Each FIFO group by number, in the order of first appearance, and its lane.
        let mut group_number: HashMap<O::Group, usize> = HashMap::new();
        let mut lane_of_group: Vec<usize> = Vec::new();
        for (index, message) in messages.into_iter().enumerate() {
            let id = id(&message);
            let group = self.order.group(&message).map(|group| {
                let next = group_number.len();
                *group_number.entry(group).or_insert(next)
            });
            // A key that panics (the closure, or the key's `Serialize`) is this message's failure, as
            // a handler's panic is: the other messages go on (in a FIFO batch, its group stops).
            let keyed = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let message_key = key(&message);
                let record_key = crate::derive_key(self.namespace, &message_key)
                    // A key that does not serialize fails on its own in `one`; it joins no lane.
                    .unwrap_or_else(|_| format!("\0{index}"));
                (message_key, record_key)
            }));
            let (work, record_key) = match keyed {
                Ok((message_key, record_key)) => (Ok((message_key, message)), Some(record_key)),
                Err(panic) => (Err(panicked(&*panic)), None),
            };
            let by_key = record_key
                .as_ref()
                .and_then(|k| lane_of_key.get(k).copied());
            let by_group = group.and_then(|group| lane_of_group.get(group).copied());
            let lane = match (by_key, by_group) {
                (Some(a), Some(b)) => {
                    let (a, b) = (root(&mut parent, a), root(&mut parent, b));
                    parent[b] = a;
                    a
                }
                (Some(lane), None) | (None, Some(lane)) => root(&mut parent, lane),
                (None, None) => {
                    parent.push(parent.len());
                    parent.len() - 1
                }
            };
            if let Some(record_key) = record_key {
                lane_of_key.entry(record_key).or_insert(lane);
            }
            if group == Some(lane_of_group.len()) {
                lane_of_group.push(lane);
            }
            entries.push((lane, index, id, group, work));
        }
        let mut lanes: Vec<Vec<Entry<K, M>>> = Vec::new();
        let mut position: HashMap<usize, usize> = HashMap::new();
        for (lane, index, id, group, work) in entries {
            let lane = root(&mut parent, lane);
            let at = *position.entry(lane).or_insert_with(|| {
                lanes.push(Vec::new());
                lanes.len() - 1
            });
            lanes[at].push(Entry {
                index,
                id,
                group,
                work,
            });
        }
        lanes
    }

    async fn one<M, K, T, E, Fut>(
        &self,
        key: &K,
        message: M,
        handler: &impl Fn(M) -> Fut,
    ) -> Outcome
    where
        K: Serialize,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Display,
        Fut: Future<Output = Result<T, E>>,
        P: Payload<M>,
        O: Order<M>,
    {
        let mut operation = self.idem.operation(self.namespace, key);
        if let Some(ttl) = self.ttl {
            operation = operation.ttl(ttl);
        }
        if let Some(lease) = self.lease {
            operation = operation.lease(lease);
        }
        if let Some(deadline) = self.deadline {
            // Nothing is claimed once the invocation may be gone: the queue delivers it again.
            if SystemTime::now() >= deadline {
                return Outcome::Failed(
                    "not processed: the batch's deadline passed before its turn; it is delivered again"
                        .to_owned(),
                );
            }
            operation = operation.deadline(deadline);
        }
        let operation = self.payload.apply(&message, operation);
        // The handler's errors are kept apart from the library's, so that work an earlier delivery
        // did is told from a failure.
        let body = |_| async move { handler(message).await.map_err(Failure::Handler) };
        match crate::observe(operation.run(body)).await {
            (Ok(_), Some(Execution::Replayed)) => Outcome::Replayed,
            (Ok(_), _) => Outcome::Executed,
            // Work done (now or by an earlier delivery) whose result cannot be replayed. A batch never
            // uses a replayed value, so a stored one that no longer deserializes (the handler's output
            // type changed in a deploy) is done work too; `Deserialize` comes only from a stored
            // response. A result that does not serialize (a NaN) is recorded as COMPLETED without it:
            // the first delivery gets `Serialize` of the response, every later one
            // `ResponseNotSerialized`, and the handler never runs again for the key.
            (
                Err(Failure::Library(
                    e @ (Error::ResponseTooLarge { .. }
                    | Error::Expired { .. }
                    | Error::Deserialize { .. }
                    | Error::ResponseNotSerialized { .. }
                    | Error::Serialize {
                        what: "response", ..
                    }),
                )),
                _,
            ) => Outcome::Done(e.to_string()),
            (Err(Failure::Library(e)), _) => Outcome::Failed(E::from(e).to_string()),
            (Err(Failure::Handler(e)), _) => Outcome::Failed(e.to_string()),
        }
    }
}

/// A message in its lane: its place in the batch, its id, its FIFO group's number, and its key with
/// the message, or why it failed before its turn (its key panicked).
struct Entry<K, M> {
    index: usize,
    id: String,
    group: Option<usize>,
    work: Result<(K, M), String>,
}

/// A message's failure: its handler's error, or the library's (not yet converted into the handler's
/// error type, so that it can be told apart). Displays as the error it holds: the text stored on a
/// FAILED record is the handler's error's.
enum Failure<E> {
    Handler(E),
    Library(Error),
}

impl<E> From<Error> for Failure<E> {
    fn from(e: Error) -> Self {
        Failure::Library(e)
    }
}

impl<E: Display> Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Handler(e) => e.fmt(f),
            Failure::Library(e) => e.fmt(f),
        }
    }
}

/// The text of a message whose handler panicked: `panicked: <message>`, as the runtime stores it.
fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    format!("panicked: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report's JSON: a done message says why, and is not among the failures.
    #[test]
    fn a_done_message_is_reported_and_not_redelivered() {
        let report = Report {
            items: vec![
                Item {
                    id: "m1".into(),
                    outcome: Outcome::Done("too large".into()),
                },
                Item {
                    id: "m2".into(),
                    outcome: Outcome::Failed("no".into()),
                },
            ],
        };
        assert_eq!(
            serde_json::to_value(&report.items[0]).unwrap(),
            serde_json::json!({ "id": "m1", "outcome": "done", "error": "too large" })
        );
        assert_eq!(
            serde_json::to_value(report.batch_response()).unwrap(),
            serde_json::json!({ "batchItemFailures": [{ "itemIdentifier": "m2" }] })
        );
    }

    /// Both kinds of panic payload give their message: a literal's `&str` and a formatted `String`.
    #[tokio::test]
    async fn a_panic_is_reported_with_its_message() {
        let idem = Idempotency::in_memory();
        let report = idem
            .batch("batch::panics")
            .process(
                [1_u8, 2, 3],
                ToString::to_string,
                |m| *m,
                |m| async move {
                    match m {
                        1 => panic!("a literal"),
                        2 => std::panic::panic_any(format!("formatted {m}")),
                        _ => Ok::<_, Error>(m),
                    }
                },
            )
            .await;
        let outcomes: Vec<&Outcome> = report.items.iter().map(|i| &i.outcome).collect();
        assert_eq!(
            outcomes,
            [
                &Outcome::Failed("panicked: a literal".into()),
                &Outcome::Failed("panicked: formatted 2".into()),
                &Outcome::Executed,
            ]
        );
    }
}
