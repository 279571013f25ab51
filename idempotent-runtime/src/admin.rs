//! What the `idempotent` command line computes, as a library: a record decoded for operators
//! ([`KeyReport`]), releasing a stuck key ([`release`]), and write capacity from first principles
//! ([`capacity`]). Behind the `cli` feature.

use std::time::Duration;

use serde::Serialize;

use crate::record::{AttributeNames, Record, Status};
use crate::store::{Change, Store, StoreError, Transition, WriteOutcome};

/// How many bytes of a stored response [`KeyReport`] shows.
pub const PREVIEW_BYTES: usize = 200;

/// A record, decoded for an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyReport {
    /// The partition key: `"{namespace}#{hex(sha256(canonical_json(key)))}"`.
    pub key: String,
    /// `PENDING`, `COMPLETED` or `FAILED`.
    pub status: String,
    /// Claims made on the key so far.
    pub attempt: u64,
    /// While PENDING: milliseconds until the lease runs out (negative: it ran out that long ago).
    pub lease_left_ms: Option<i64>,
    /// The expiry, epoch seconds.
    pub expires_at: u64,
    /// The expiry, as an RFC 3339 date.
    pub expires_at_utc: String,
    /// Seconds until the record counts as absent (negative: it expired that long ago).
    pub expires_in_s: i64,
    /// The stored response's size as stored (gzip-compressed when large), if any.
    pub response_bytes: Option<usize>,
    /// The start of the decoded response (JSON), if any.
    pub response_preview: Option<String>,
    /// A FAILED record's error text.
    pub error: Option<String>,
    /// Whether claim-time writes (`claim_with`) are in effect.
    pub claim_writes_in_effect: bool,
    /// Whether a payload fingerprint is stored.
    pub has_fingerprint: bool,
    /// The region whose store completed the record, when it knew its region.
    pub completed_in: Option<String>,
}

impl KeyReport {
    /// `record` as seen at `now_ms`.
    #[must_use]
    pub fn new(record: &Record, now_ms: u64) -> Self {
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let expires_at_utc = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + Duration::from_secs(record.expires_at_s),
        )
        .to_string();
        let preview = record.response.as_deref().map(|bytes| {
            let text = match crate::codec::decode::<serde_json::Value>(bytes) {
                Ok(value) => value.to_string(),
                Err(crate::codec::DecodeError::NotSerialized(reason)) => {
                    format!("<not stored: the response did not serialize: {reason}>")
                }
                Err(e) => format!("<undecodable: {e:?}>"),
            };
            let cut = text.floor_char_boundary(PREVIEW_BYTES);
            if cut < text.len() {
                format!("{}…", &text[..cut])
            } else {
                text
            }
        });
        Self {
            key: record.key.clone(),
            status: record.status.as_str().to_owned(),
            attempt: record.attempt,
            lease_left_ms: record
                .lease_until_ms
                .filter(|_| record.status == Status::Pending)
                .map(|until| signed(until) - signed(now_ms)),
            expires_at: record.expires_at_s,
            expires_at_utc,
            expires_in_s: signed(record.expires_at_s) - signed(now_ms / 1000),
            response_bytes: record.response.as_ref().map(Vec::len),
            response_preview: preview,
            error: record.error.clone(),
            claim_writes_in_effect: record.claim_writes_in_effect,
            has_fingerprint: record.fingerprint.is_some(),
            completed_in: record.completed_in.clone(),
        }
    }
}

/// What [`release`] did.
#[allow(
    clippy::large_enum_variant,
    reason = "an operator's one-off command: the record is handed back as the store returned it"
)]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The PENDING record is now FAILED: the next call claims it at once.
    Released,
    /// The record changed since it was read (completed, failed, or claimed again); nothing was written.
    Changed(Option<Record>),
    /// The record is not PENDING: there is no claim to release; nothing was written.
    NotPending(Status),
}

/// Moves the PENDING `record` to FAILED, fenced by the token it holds, so the key may be claimed at once.
/// If its worker is in fact still running, that worker's result will not be stored
/// ([`LeaseLost`](crate::Error::LeaseLost)) and the next call runs the body again.
///
/// The FAILED record expires in an hour, or, when its claim-time writes are in effect
/// ([`Record::claim_writes_in_effect`]), at the claim's own expiry if that is later: the writes stay in
/// effect, and a retry must still find the record that says so.
///
/// # Errors
/// The store's error when the write fails.
pub async fn release(
    store: &dyn Store,
    record: &Record,
    now_ms: u64,
) -> Result<Released, StoreError> {
    if record.status != Status::Pending {
        return Ok(Released::NotPending(record.status));
    }
    // A claim whose claim-time writes are in effect keeps its expiry (the operation's ttl, counted
    // from the claim): the FAILED record must remember the writes as long as the claim would have, or
    // a retry after it expired would apply them again. So does one with finished steps: a retry after
    // it expired would be a new operation, and run them again.
    let released_for = now_ms.div_ceil(1000) + 3600;
    let expires_at_s = if record.claim_writes_in_effect || record.steps.is_some() {
        released_for.max(record.expires_at_s)
    } else {
        released_for
    };
    let transition = Transition {
        key: &record.key,
        token: &record.token,
        change: Change::Fail {
            error: "released by an operator (`idempotent key release`)",
            expires_at_s,
            release_claim_writes: false,
        },
    };
    Ok(match store.transition(&transition).await? {
        WriteOutcome::Applied => Released::Released,
        WriteOutcome::Rejected(now) => Released::Changed(now),
    })
}

/// The traffic to size a table for ([`capacity`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    /// First calls (new keys) per second at peak.
    pub peak_rps: f64,
    /// Duplicates per first call: duplicates arrive at `peak_rps × duplicate_ratio`.
    pub duplicate_ratio: f64,
    /// The stored response's size in bytes.
    pub response_bytes: u64,
    /// Whether completions are transactions (`transact = tx`).
    pub transactional: bool,
    /// Business items written per transactional completion.
    pub business_items: u64,
    /// Each business item's size in bytes.
    pub business_item_bytes: u64,
    /// The body's running time, for heartbeats (every third of the lease).
    pub body: Option<Duration>,
    /// The lease.
    pub lease: Duration,
    /// Steps per first call, for a body run with steps (`run_steps`): one write each.
    pub steps: u64,
    /// Each step's stored value in bytes (JSON; a step's write carries every step before it).
    pub step_bytes: u64,
}

/// Write capacity units per second, by where they go ([`capacity`]); each rounded up to a whole unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Capacity {
    /// Claims: one conditional write per first call.
    pub claims_wcu: u64,
    /// Completions: one write per first call (a transaction: twice the size of every item written).
    pub completions_wcu: u64,
    /// Duplicates: a failed conditional write still consumes the size of the item it read.
    pub duplicates_wcu: u64,
    /// Heartbeats of long bodies.
    pub heartbeats_wcu: u64,
    /// Step writes of bodies run with steps: one per step, each the record with the steps so far.
    pub steps_wcu: u64,
    /// All of it.
    pub total_wcu: u64,
    /// The simpler `peak × (1 + duplicate ratio)`, for comparison; it counts one write per call.
    pub reference_wcu: u64,
    /// The record's estimated size with the response, in bytes.
    pub record_bytes: u64,
}

/// Write capacity units a write of `bytes` consumes: one per started kilobyte.
fn wcu(bytes: u64) -> f64 {
    // At most a few hundred: exact in f64.
    #[allow(clippy::cast_precision_loss)]
    let units = bytes.div_ceil(1024).max(1) as f64;
    units
}

/// Write capacity per second for `traffic`, from first principles: a first call costs its claim (the
/// record without a response) plus its completion (the record with it); a duplicate's failed condition
/// consumes the size of the existing, completed record; a transactional completion costs twice per item
/// written; a body running longer than a third of its lease adds a heartbeat per third; a body run with
/// steps adds one write per step, of the record with every step finished so far.
#[must_use]
pub fn capacity(traffic: &Traffic) -> Capacity {
    // The record besides its response, with a typical key and a fingerprint, counted as DynamoDB does.
    let overhead = u64::try_from(
        crate::size::MAX_ITEM_BYTES
            - crate::size::response_budget(
                &AttributeNames::default(),
                &format!("{}#{}", "billing::charge", "0".repeat(64)),
                Some(&"0".repeat(64)),
            ),
    )
    .unwrap_or(u64::MAX);
    let record_bytes = overhead + traffic.response_bytes;
    let peak = traffic.peak_rps;
    let claims_wcu = peak * wcu(overhead);
    let completions_wcu = if traffic.transactional {
        #[allow(clippy::cast_precision_loss)]
        let items = traffic.business_items as f64;
        peak * 2.0 * (wcu(record_bytes) + items * wcu(traffic.business_item_bytes))
    } else {
        peak * wcu(record_bytes)
    };
    let duplicates_wcu = peak * traffic.duplicate_ratio * wcu(record_bytes);
    let heartbeats_wcu = traffic.body.map_or(0.0, |body| {
        let every = (traffic.lease / 3).max(Duration::from_millis(1));
        #[allow(clippy::cast_precision_loss)]
        let beats = (body.as_millis() / every.as_millis()) as f64;
        peak * beats * wcu(overhead)
    });
    // The steps' origin and encoding: about 60 bytes beside the values.
    let steps_wcu: f64 = (1..=traffic.steps)
        .map(|done| peak * wcu(overhead + 60 + done * (traffic.step_bytes + 16)))
        .sum();
    // Rates of at most billions of units: a whole number of them fits u64 exactly.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let units = |x: f64| x.max(0.0).ceil() as u64;
    let (claims, completions, duplicates, heartbeats, steps) = (
        units(claims_wcu),
        units(completions_wcu),
        units(duplicates_wcu),
        units(heartbeats_wcu),
        units(steps_wcu),
    );
    Capacity {
        claims_wcu: claims,
        completions_wcu: completions,
        duplicates_wcu: duplicates,
        heartbeats_wcu: heartbeats,
        steps_wcu: steps,
        total_wcu: claims + completions + duplicates + heartbeats + steps,
        reference_wcu: units(peak * (1.0 + traffic.duplicate_ratio)),
        record_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic() -> Traffic {
        Traffic {
            peak_rps: 2000.0,
            duplicate_ratio: 0.15,
            response_bytes: 200,
            transactional: false,
            business_items: 0,
            business_item_bytes: 512,
            body: None,
            lease: Duration::from_mins(1),
            steps: 0,
            step_bytes: 0,
        }
    }

    #[test]
    fn a_first_call_costs_two_writes_and_a_duplicate_one() {
        let c = capacity(&traffic());
        assert_eq!(
            (
                c.claims_wcu,
                c.completions_wcu,
                c.duplicates_wcu,
                c.total_wcu
            ),
            (2000, 2000, 300, 4300)
        );
        assert_eq!(c.reference_wcu, 2300);
    }

    #[test]
    fn a_transactional_completion_costs_twice_per_item() {
        let c = capacity(&Traffic {
            transactional: true,
            business_items: 1,
            ..traffic()
        });
        assert_eq!(c.completions_wcu, 8000);
        assert_eq!(c.total_wcu, 10_300);
    }

    #[test]
    fn each_step_costs_a_write_of_the_record_with_the_steps_so_far() {
        let c = capacity(&Traffic {
            steps: 3,
            step_bytes: 100,
            ..traffic()
        });
        // Three small steps: a kilobyte each.
        assert_eq!(c.steps_wcu, 6000);
        assert_eq!(c.total_wcu, 4300 + 6000);
        // Steps of 400 bytes: the second and third writes carry 0.8 and 1.2 KB of values beside the
        // record's own bytes, two units each.
        let c = capacity(&Traffic {
            steps: 3,
            step_bytes: 400,
            ..traffic()
        });
        assert_eq!(c.steps_wcu, 2000 * (1 + 2 + 2));
    }

    #[test]
    fn large_responses_and_long_bodies_cost_more() {
        let c = capacity(&Traffic {
            response_bytes: 3000,
            body: Some(Duration::from_secs(45)),
            ..traffic()
        });
        // 3,000 bytes and the record's own: 4 KB per completion and per duplicate.
        assert_eq!((c.completions_wcu, c.duplicates_wcu), (8000, 1200));
        // 45 s of body with a 60 s lease: a heartbeat at 20 s and at 40 s.
        assert_eq!(c.heartbeats_wcu, 4000);
    }
}
