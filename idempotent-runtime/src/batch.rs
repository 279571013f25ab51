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

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Error, Execution, Idempotency};

/// A batch consumer: the namespace of its records and how many messages it runs at once. Start with
/// [`Idempotency::batch`].
#[derive(Debug, Clone)]
#[must_use = "a batch does nothing until `process` is awaited"]
pub struct Batch<'a> {
    idem: &'a Idempotency,
    namespace: &'static str,
    concurrency: usize,
    ttl: Option<Duration>,
    lease: Option<Duration>,
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
    /// The handler failed, or the message could not be processed (another delivery in flight, a store
    /// failure): the message should be delivered again. The text is the error's.
    Failed(String),
}

/// One message's line in a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// The message's id, as the queue knows it (SQS's `messageId`).
    pub id: String,
    /// How it went.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// What happened to each message of a batch, in the batch's order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// One per message, in the order they were given.
    pub items: Vec<Item>,
}

/// SQS's partial-batch response (`ReportBatchItemFailures`): the messages to deliver again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResponse {
    /// The failed messages.
    #[serde(rename = "batchItemFailures")]
    pub batch_item_failures: Vec<ItemFailure>,
}

/// One message to deliver again.
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

impl Batch<'_> {
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

    /// Processes `messages`: `id` names a message for the report, `key` says which work it is (two
    /// messages with equal keys are one piece of work), `handler` does the work. The result of a
    /// successful handler is stored and replayed to duplicates; a failed one lets the next delivery run
    /// again. Never fails as a whole: every problem is one message's [`Outcome::Failed`].
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
    {
        // Group by record key, keeping the batch's order within each group.
        let mut groups: Vec<Vec<(usize, String, K, M)>> = Vec::new();
        let mut group_of: HashMap<String, usize> = HashMap::new();
        for (index, message) in messages.into_iter().enumerate() {
            let message_key = key(&message);
            let record_key = crate::derive_key(self.namespace, &message_key)
                // A key that does not serialize fails on its own in `run`; it joins no group.
                .unwrap_or_else(|_| format!("\0{index}"));
            let group = *group_of.entry(record_key).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[group].push((index, id(&message), message_key, message));
        }
        let handler = &handler;
        let mut items: Vec<(usize, Item)> = futures_util::stream::iter(groups)
            .map(|group| async move {
                let mut done = Vec::with_capacity(group.len());
                for (index, id, key, message) in group {
                    let outcome = self.one(&key, || handler(message)).await;
                    done.push((index, Item { id, outcome }));
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

    async fn one<K, T, E, Fut>(&self, key: &K, body: impl FnOnce() -> Fut) -> Outcome
    where
        K: Serialize,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Display,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut operation = self.idem.operation(self.namespace, key);
        if let Some(ttl) = self.ttl {
            operation = operation.ttl(ttl);
        }
        if let Some(lease) = self.lease {
            operation = operation.lease(lease);
        }
        match crate::observe(operation.run(body)).await {
            (Ok(_), Some(Execution::Replayed)) => Outcome::Replayed,
            (Ok(_), _) => Outcome::Executed,
            (Err(e), _) => Outcome::Failed(e.to_string()),
        }
    }
}
