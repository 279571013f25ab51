//! The audit as a Lambda stream consumer: [`Change::from_lambda`] and [`Auditor::observe_lambda`] take
//! `aws_lambda_events`' DynamoDB stream event.

use std::collections::HashMap;

use aws_lambda_events::event::dynamodb::{Event, EventRecord};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::{Auditor, Change, Finding, Identity};

impl Change {
    /// The change a Lambda stream event's record carries. Its images are converted to the SDK's
    /// attribute values (which the store's decoder reads); an absent `ApproximateCreationDateTime`
    /// (the event's default, the epoch) is `None`.
    #[must_use]
    pub fn from_lambda(record: &EventRecord) -> Self {
        let change = &record.change;
        let image = |item: &serde_dynamo::Item| {
            (!item.is_empty()).then(|| {
                item.iter()
                    .map(|(name, value)| (name.clone(), from_lambda_value(value)))
                    .collect::<HashMap<_, _>>()
            })
        };
        let at = change.approximate_creation_date_time.timestamp();
        Self {
            sequence_number: change.sequence_number.clone().unwrap_or_default(),
            created_at_s: u64::try_from(at).ok().filter(|&s| s > 0),
            event_name: record.event_name.clone(),
            identity: record.user_identity.as_ref().map(|id| Identity {
                kind: id.type_.clone(),
                principal: id.principal_id.clone(),
            }),
            old_image: image(&change.old_image),
            new_image: image(&change.new_image),
        }
    }
}

impl Auditor {
    /// Takes in every record of a Lambda stream consumer's `event`, in order; returns the findings.
    ///
    /// A Lambda function keeps its auditor between invocations while its instance lives (in a
    /// `static`, or the handler's state): a deletion and a later claim of the same key are matched when
    /// the same instance sees both (a stream's shard is processed by one invocation at a time; a batch
    /// retried after an error is recognised and not counted twice).
    ///
    /// ```no_run
    /// use idempotent_runtime::audit::{AuditConfig, Auditor, Finding};
    /// use idempotent_runtime::DynamoDbStore;
    /// # fn f(store: DynamoDbStore, event: aws_lambda_events::event::dynamodb::Event) {
    /// let mut auditor = Auditor::new(&store, AuditConfig::default());
    /// for finding in auditor.observe_lambda(&event) {
    ///     if let Finding::LateRetry(retry) = finding {
    ///         eprintln!("{} claimed {} s after TTL deleted it", retry.key, retry.after_deletion_s);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn observe_lambda(&mut self, event: &Event) -> Vec<Finding> {
        event
            .records
            .iter()
            .filter_map(|record| self.observe(&Change::from_lambda(record)))
            .collect()
    }
}

fn from_lambda_value(value: &serde_dynamo::AttributeValue) -> AttributeValue {
    use serde_dynamo::AttributeValue as L;
    match value {
        L::N(n) => AttributeValue::N(n.clone()),
        L::S(s) => AttributeValue::S(s.clone()),
        L::Bool(b) => AttributeValue::Bool(*b),
        L::B(b) => AttributeValue::B(Blob::new(b.clone())),
        L::Null(b) => AttributeValue::Null(*b),
        L::M(m) => AttributeValue::M(
            m.iter()
                .map(|(k, v)| (k.clone(), from_lambda_value(v)))
                .collect(),
        ),
        L::L(l) => AttributeValue::L(l.iter().map(from_lambda_value).collect()),
        L::Ss(v) => AttributeValue::Ss(v.clone()),
        L::Ns(v) => AttributeValue::Ns(v.clone()),
        L::Bs(v) => AttributeValue::Bs(v.iter().map(|b| Blob::new(b.clone())).collect()),
    }
}
