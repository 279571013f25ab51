//! Every condition and update expression [`DynamoDbStore`](super::DynamoDbStore) sends, exactly as sent,
//! and the `#placeholders` that stand for the configured [`AttributeNames`].
//!
//! Public so that the protocol can be read (and audited, or reproduced by tools that send the same
//! requests, like this repository's benchmark) without reading the store: the table in the
//! [module docs](super) says which request carries which expression.
//!
//! Placeholders: `#pk` key, `#st` status, `#tk` token, `#at` attempt, `#lu` lease end, `#ex` expiry, `#fp`
//! fingerprint, `#rs` response, `#er` error, `#ru` replay end, `#cw` claim-time writes in effect, `#ci`
//! the region that completed the record, `#sp` the finished steps of an operation run with steps, `#rl`
//! the tokens of calls that released their claim before it landed, `#rd` until when their claims can
//! hold the key, `#rt` the greatest token released by a release that found them full (every token up
//! to it is released). Values: `:pending`, `:completed`, `:failed` (the [`Status`]
//! texts), `:tk` (the fencing token), `:lu`, `:ex`, `:ru` (the new lease end, expiry and replay end),
//! `:ex_ms` (the new expiry in milliseconds),
//! `:now_ms`, `:now_s` (the caller's clock less its clock-skew margin), `:fp`, `:rs`, `:er`, `:ci` (the
//! store's region), `:sp` (the steps), `:prev` (the steps a step's write extends), `:tks` (a set
//! holding the token), `:max` ([`MAX_RELEASED`](crate::MAX_RELEASED)), `:rd` (a release's end),
//! `:seen_rd`, `:seen_ex` (the record's release end and expiry as a release read them), `:one` (1)
//! and `:true`.
//!
//! `#pk` is always the *partition* key attribute: in a [`Layout`](super::Layout) with a sort key, every
//! request names the item by its full primary key, and `attribute_not_exists(#pk)` holds exactly when
//! no item with that full key exists.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::AttributeNames;
use crate::record::Status;
use crate::store::{Change, ClaimRequest, Marking, StepsClaim, Transition};

/// The claim's condition: the record is absent, expired, FAILED, or a PENDING claim whose lease ran out
/// (the rule of [`Record::is_claimable`](crate::Record::is_claimable)).
pub const CLAIMABLE: &str = "attribute_not_exists(#pk) OR #ex < :now_s OR #st = :failed OR (#st = :pending AND #lu < :now_ms)";

/// The condition of a claim with business writes: the record is absent or expired (a new operation), or
/// claimable with no claim-time writes in effect (the rule of
/// [`Record::is_claimable_with_writes`](crate::Record::is_claimable_with_writes)).
pub const CLAIMABLE_WITH_WRITES: &str = "attribute_not_exists(#pk) OR #ex < :now_s OR ((#st = :failed OR (#st = :pending AND #lu < :now_ms)) AND attribute_not_exists(#cw))";

/// The condition of a plain claim that keeps the record's claim-time writes in effect: the record is
/// claimable (FAILED, or a lapsed PENDING claim), not expired, and its writes are still in effect (the
/// rule of [`Record::is_claimable_keeping_writes`](crate::Record::is_claimable_keeping_writes)). An
/// absent item fails it.
pub const CLAIMABLE_KEEPING_WRITES: &str = "attribute_exists(#cw) AND #ex >= :now_s AND (#st = :failed OR (#st = :pending AND #lu < :now_ms))";

/// The condition of every transition out of (or within) PENDING but a step's: the record is PENDING
/// under the caller's fencing token, and the new expiry (`:ex_ms`, the `:ex` second in milliseconds)
/// is no earlier than the end of the record's released tokens (`#rd`), so that TTL never deletes the
/// record before a released claim it keeps out could land (the rule of
/// [`Record::outlives_released`](crate::Record::outlives_released)). A transition refused by that
/// clause alone is sent again with its expiry raised to that end (`DynamoDbStore`'s `transition`).
pub const HELD_BY_TOKEN: &str =
    "#st = :pending AND #tk = :tk AND (attribute_not_exists(#rd) OR #rd <= :ex_ms)";

/// The condition of a failure with compensating writes: [`HELD_BY_TOKEN`], and the claim-time writes
/// still in effect, so that a compensation never undoes them twice.
pub const HELD_WITH_CLAIM_WRITES: &str = "#st = :pending AND #tk = :tk AND (attribute_not_exists(#rd) OR #rd <= :ex_ms) AND attribute_exists(#cw)";

/// The condition of a step's write ([`SAVE_STEPS`]): [`HELD_BY_TOKEN`], and the record holds exactly
/// the steps the write extends (`:prev`, [`Change::SaveSteps`]'s `previous`). A late copy of an earlier
/// step's write (the first copy of a request the SDK sent again, applied after a later step's) finds
/// later steps there and is refused, so that the steps never move back. One request still: the
/// condition is part of the `UpdateItem`, and a refusal returns the record (`ALL_OLD`), which tells
/// the caller whether it was its own earlier copy that landed (the record holds exactly its `:sp`).
pub const HELD_WITH_STEPS: &str = "#st = :pending AND #tk = :tk AND #sp = :prev";

/// What every claim adds to its condition: the record is not a FAILED one under the claim's own token,
/// which only the claim's own call writes when it gives the claim up ([`RELEASE`]), and does not hold
/// that token among its released ones ([`MARK_RELEASED`]) nor a `released_through` token no less than
/// it ([`MARK_RELEASED_THROUGH`]), so that a claim of that call that lands after its release is refused (the rule of [`Record::released_token`](crate::Record::released_token)).
pub const NOT_RELEASED: &str = "NOT (#st = :failed AND #tk = :tk) AND NOT contains(#rl, :tk) AND (attribute_not_exists(#rt) OR #rt < :tk)";

/// What every claim adds to its condition, and what [`HELD_BY_TOKEN`] ends with: the new expiry
/// (`:ex_ms`, the `:ex` second in milliseconds) is no earlier than the end of the record's released
/// tokens (`#rd`), so that no write ever makes a record expire, and TTL delete it, while a released
/// claim it keeps out could still land (the rule of
/// [`Record::outlives_released`](crate::Record::outlives_released)). A claim or transition refused
/// by that clause alone is sent again with its expiry raised to that end (`DynamoDbStore`'s `claim`,
/// `transition`).
pub const OUTLIVES_RELEASED: &str = "(attribute_not_exists(#rd) OR #rd <= :ex_ms)";

/// The condition of a release's mark ([`Change::Release`]): no record at all (the call's claim has not
/// landed).
pub const RELEASABLE: &str = "attribute_not_exists(#pk) OR #ex < :now_s";

/// A release mark's item: FAILED under the caller's token, which is also its only released one (a
/// claim that takes the mark over keeps it), no claim attempt made (`#at` 0).
pub const RELEASE: &str = "SET #st = :failed, #tk = :tk, #er = :er, #ex = :ex, #at = :zero, #rl = :tks, #rd = :rd REMOVE #lu, #fp, #rs, #ru, #cw, #ci, #sp, #rt";

/// The condition of a [`Change::MarkReleased`] that adds the caller's token: a live record (not
/// expired: an expired one is replaced by a [`RELEASE`]) that is not PENDING under the caller's token
/// (the call's claim has not landed) nor COMPLETED (final until it expires), still holding the expiry the caller read (`:seen_ex`) and no
/// `released_until` (it was never marked, or marked before it was kept), with fewer than `:max`
/// released tokens.
pub const MARKABLE: &str = "attribute_exists(#pk) AND NOT (#st = :pending AND #tk = :tk) AND #st <> :completed AND #ex >= :now_s AND #ex = :seen_ex AND attribute_not_exists(#rd) AND (attribute_not_exists(#rl) OR size(#rl) < :max)";

/// [`MARKABLE`] for a record whose `released_until` the caller read (`:seen_rd`).
pub const MARKABLE_SEEN: &str = "attribute_exists(#pk) AND NOT (#st = :pending AND #tk = :tk) AND #st <> :completed AND #ex >= :now_s AND #ex = :seen_ex AND #rd = :seen_rd AND (attribute_not_exists(#rl) OR size(#rl) < :max)";

/// The condition of a [`Change::MarkReleased`] that replaces the released tokens: as
/// [`MARKABLE_SEEN`], but for a record whose released tokens are all stale (`#rd` before `:now_ms`),
/// however many it holds.
pub const REPLACEABLE: &str = "attribute_exists(#pk) AND NOT (#st = :pending AND #tk = :tk) AND #st <> :completed AND #ex >= :now_s AND #ex = :seen_ex AND #rd = :seen_rd AND #rd < :now_ms";

/// A [`Change::MarkReleased`]'s update that adds the token: the caller's token (`:tks`, a set of one)
/// joins the record's released tokens, whose `released_until` and the record's expiry become the
/// caller's (never earlier than the ones it read); nothing else changes.
pub const MARK_RELEASED: &str = "ADD #rl :tks SET #rd = :rd, #ex = :ex";

/// A [`Change::MarkReleased`]'s update that replaces the stale released tokens with the caller's
/// (and removes the record's `released_through`, as stale as they are).
pub const REPLACE_RELEASED: &str = "SET #rl = :tks, #rd = :rd, #ex = :ex REMOVE #rt";

/// The condition of a [`Change::MarkReleased`] that raises `released_through` to the caller's token:
/// as [`MARKABLE`], on a record holding `:max` released tokens whose `released_through`, if any, is
/// less than the token.
pub const THROUGHABLE: &str = "attribute_exists(#pk) AND NOT (#st = :pending AND #tk = :tk) AND #st <> :completed AND #ex >= :now_s AND #ex = :seen_ex AND attribute_not_exists(#rd) AND size(#rl) >= :max AND (attribute_not_exists(#rt) OR #rt < :tk)";

/// [`THROUGHABLE`] for a record whose `released_until` the caller read (`:seen_rd`).
pub const THROUGHABLE_SEEN: &str = "attribute_exists(#pk) AND NOT (#st = :pending AND #tk = :tk) AND #st <> :completed AND #ex >= :now_s AND #ex = :seen_ex AND #rd = :seen_rd AND size(#rl) >= :max AND (attribute_not_exists(#rt) OR #rt < :tk)";

/// The condition of a [`Change::MarkReleased`] that only raises the end and the expiry: as
/// [`MARKABLE`], on a record that already refuses the token (among its released tokens, or no
/// greater than its `released_through`).
pub const EXTENDABLE: &str = "attribute_exists(#pk) AND NOT (#st = :pending AND #tk = :tk) AND #st <> :completed AND #ex >= :now_s AND #ex = :seen_ex AND attribute_not_exists(#rd) AND (contains(#rl, :tk) OR #rt >= :tk)";

/// [`EXTENDABLE`] for a record whose `released_until` the caller read (`:seen_rd`).
pub const EXTENDABLE_SEEN: &str = "attribute_exists(#pk) AND NOT (#st = :pending AND #tk = :tk) AND #st <> :completed AND #ex >= :now_s AND #ex = :seen_ex AND #rd = :seen_rd AND (contains(#rl, :tk) OR #rt >= :tk)";

/// A [`Change::MarkReleased`]'s update that only raises the released tokens' end and the record's
/// expiry.
pub const MARK_EXTENDED: &str = "SET #rd = :rd, #ex = :ex";

/// The condition of a [`Change::MarkReleased`] that keeps a COMPLETED record until a released claim's
/// end ([`Marking::KeepCompleted`]): a live COMPLETED record still holding the expiry the caller
/// read.
pub const KEEPABLE: &str = "#st = :completed AND #ex >= :now_s AND #ex = :seen_ex";

/// [`KEEPABLE`]'s update: the later expiry alone.
pub const KEEP_COMPLETED: &str = "SET #ex = :ex";

/// A [`Change::MarkReleased`]'s update that raises `released_through` to the caller's token (`:tk`):
/// every token up to it is refused; the released tokens' end and the record's expiry become the
/// caller's, as [`MARK_RELEASED`]'s.
pub const MARK_RELEASED_THROUGH: &str = "SET #rt = :tk, #rd = :rd, #ex = :ex";

/// The heartbeat's update: a later lease end and expiry.
pub const EXTEND_LEASE: &str = "SET #lu = :lu, #ex = :ex";

/// A step's update: the values of every step finished so far (an operation run with steps), under
/// [`HELD_WITH_STEPS`].
pub const SAVE_STEPS: &str = "SET #sp = :sp";

/// What a claim of an operation *without* steps adds to its condition: the record holds no steps.
/// Code without steps never takes over an operation run with steps while its record lives (its body
/// would run the finished steps again). An expired record with steps refuses it too, and the store
/// sends the claim again as [`STEPS_CLEARED`] (a new operation must not inherit the old one's steps):
/// so the steps of an expired record are removed by any claim that takes it, with or without steps
/// (the rule of the memory store, which decides both in one step).
pub const STEPS_UNTOUCHED: &str = "attribute_not_exists(#sp)";

/// The condition a claim of an operation without steps adds when it is sent again for an expired
/// record with steps ([`STEPS_UNTOUCHED`] refused it): the record is expired. Its update also removes
/// the steps (`REMOVE .., #sp`).
pub const STEPS_CLEARED: &str = "#ex < :now_s";

/// What a claim of an operation run with steps adds to its condition when it starts afresh: the record
/// holds no steps, or is expired (a new operation) (the rule of
/// [`Record::allows_steps_claim`](crate::Record::allows_steps_claim) for
/// [`StepsClaim::Fresh`]). Its update also sets the steps of a new operation (`SET .., #sp = :sp`).
pub const STEPS_FRESH: &str = "attribute_not_exists(#sp) OR #ex < :now_s";

/// [`STEPS_FRESH`] for an operation that restarts from scratch after a failure: the steps of the
/// FAILED record it judged restartable (`:seen`) are replaced too, and only those (a record restarted
/// or pinned since holds other steps).
pub const STEPS_FRESH_AFTER_FAILURE: &str =
    "attribute_not_exists(#sp) OR #ex < :now_s OR (#st = :failed AND #sp = :seen)";

/// What a claim of an operation run with steps adds to its condition when it resumes: the record is not
/// expired and holds exactly the steps the caller saw (`:sp`). Its update keeps them.
pub const STEPS_RESUME: &str = "#sp = :sp AND #ex >= :now_s";

/// [`STEPS_RESUME`] for an operation that restarts from scratch after a failure: never a FAILED record.
pub const STEPS_RESUME_UNLESS_FAILED: &str = "#sp = :sp AND #ex >= :now_s AND #st = :pending";

/// The claim's update: PENDING under a new token, one more attempt, the old outcome removed.
/// `fingerprint`: the call has a payload fingerprint (else any old one is removed); `claim_writes`: a
/// claim with business writes, which marks them as in effect (a plain claim leaves the mark as it is).
#[must_use]
pub const fn claim_update(fingerprint: bool, claim_writes: bool) -> &'static str {
    match (fingerprint, claim_writes) {
        (false, false) => {
            "SET #st = :pending, #tk = :tk, #lu = :lu, #ex = :ex ADD #at :one REMOVE #rs, #er, #ru, #ci, #fp"
        }
        (true, false) => {
            "SET #st = :pending, #tk = :tk, #lu = :lu, #ex = :ex, #fp = :fp ADD #at :one REMOVE #rs, #er, #ru, #ci"
        }
        (false, true) => {
            "SET #st = :pending, #tk = :tk, #lu = :lu, #ex = :ex, #cw = :true ADD #at :one REMOVE #rs, #er, #ru, #ci, #fp"
        }
        (true, true) => {
            "SET #st = :pending, #tk = :tk, #lu = :lu, #ex = :ex, #fp = :fp, #cw = :true ADD #at :one REMOVE #rs, #er, #ru, #ci"
        }
    }
}

/// The completion's update: COMPLETED with a new expiry, the lease (and any stored steps and released
/// tokens) removed. `response`: the response is
/// stored (else the record replays as too large); `replay_until`: with retention, the end of the
/// replay window; `region`: the store knows its region, and records it as the one that completed the
/// record.
#[must_use]
pub const fn complete_update(response: bool, replay_until: bool, region: bool) -> &'static str {
    match (response, replay_until, region) {
        (true, false, false) => {
            "SET #st = :completed, #ex = :ex, #rs = :rs REMOVE #lu, #sp, #rl, #rd, #rt"
        }
        (true, true, false) => {
            "SET #st = :completed, #ex = :ex, #rs = :rs, #ru = :ru REMOVE #lu, #sp, #rl, #rd, #rt"
        }
        (false, false, false) => {
            "SET #st = :completed, #ex = :ex REMOVE #lu, #rs, #sp, #rl, #rd, #rt"
        }
        (false, true, false) => {
            "SET #st = :completed, #ex = :ex, #ru = :ru REMOVE #lu, #rs, #sp, #rl, #rd, #rt"
        }
        (true, false, true) => {
            "SET #st = :completed, #ex = :ex, #rs = :rs, #ci = :ci REMOVE #lu, #sp, #rl, #rd, #rt"
        }
        (true, true, true) => {
            "SET #st = :completed, #ex = :ex, #rs = :rs, #ru = :ru, #ci = :ci REMOVE #lu, #sp, #rl, #rd, #rt"
        }
        (false, false, true) => {
            "SET #st = :completed, #ex = :ex, #ci = :ci REMOVE #lu, #rs, #sp, #rl, #rd, #rt"
        }
        (false, true, true) => {
            "SET #st = :completed, #ex = :ex, #ru = :ru, #ci = :ci REMOVE #lu, #rs, #sp, #rl, #rd, #rt"
        }
    }
}

/// The failure's update: FAILED with the error's text and a short expiry, the lease removed.
/// `release_claim_writes`: compensating writes commit with it, so the claim-time writes stop being in
/// effect.
#[must_use]
pub const fn fail_update(release_claim_writes: bool) -> &'static str {
    if release_claim_writes {
        "SET #st = :failed, #er = :er, #ex = :ex REMOVE #lu, #cw"
    } else {
        "SET #st = :failed, #er = :er, #ex = :ex REMOVE #lu"
    }
}

/// The `ExpressionAttributeNames` of a request: each `#placeholder` used in `expressions`, mapped to its
/// attribute in `names` (DynamoDB rejects a request that maps a placeholder it does not use).
///
/// # Panics
/// On a placeholder that is not one of the store's (listed in the [module docs](self)).
#[must_use]
pub fn attribute_names(names: &AttributeNames, expressions: &[&str]) -> HashMap<String, String> {
    let mut map = HashMap::with_capacity(10);
    for expression in expressions {
        let mut rest = *expression;
        while let Some(start) = rest.find('#') {
            let tail = &rest[start..];
            let end = tail[1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(tail.len(), |i| i + 1);
            let placeholder = &tail[..end];
            if !map.contains_key(placeholder) {
                map.insert(
                    placeholder.to_owned(),
                    attribute(names, placeholder).to_owned(),
                );
            }
            rest = &tail[end..];
        }
    }
    map
}

/// The values of a [`Change::Release`], and its update and names.
fn release_values<'n>(
    names: &'n PreparedNames,
    transition: &Transition<'_>,
    values: &mut HashMap<String, AttributeValue>,
) -> (&'static str, &'n HashMap<String, String>) {
    let Change::Release {
        now_ms,
        error,
        expires_at_s,
        released_until_ms,
    } = transition.change
    else {
        unreachable!("called for a release only")
    };
    values.insert(":now_s".to_owned(), n(now_ms / 1000));
    values.insert(":failed".to_owned(), s(Status::Failed.as_str()));
    values.insert(":er".to_owned(), s(error));
    values.insert(":ex".to_owned(), n(expires_at_s));
    values.insert(":rd".to_owned(), n(released_until_ms));
    values.insert(":zero".to_owned(), n(0));
    values.insert(
        ":tks".to_owned(),
        AttributeValue::Ss(vec![transition.token.to_owned()]),
    );
    (RELEASE, &names.release)
}

/// The values of a [`Change::MarkReleased`], and its update and names.
fn mark_values<'n>(
    names: &'n PreparedNames,
    transition: &Transition<'_>,
    values: &mut HashMap<String, AttributeValue>,
) -> (&'static str, &'n HashMap<String, String>) {
    let Change::MarkReleased {
        now_ms,
        released_until_ms,
        expires_at_s,
        seen_until_ms,
        seen_expires_at_s,
        marking,
    } = transition.change
    else {
        unreachable!("called for a mark only")
    };
    values.insert(":completed".to_owned(), s(Status::Completed.as_str()));
    values.insert(":now_s".to_owned(), n(now_ms / 1000));
    if matches!(marking, Marking::Join | Marking::Replace) {
        values.insert(
            ":tks".to_owned(),
            AttributeValue::Ss(vec![transition.token.to_owned()]),
        );
    }
    values.insert(":ex".to_owned(), n(expires_at_s));
    values.insert(":seen_ex".to_owned(), n(seen_expires_at_s));
    if marking == Marking::KeepCompleted {
        return (KEEP_COMPLETED, &names.keep_completed);
    }
    values.insert(":rd".to_owned(), n(released_until_ms));
    if marking == Marking::Replace {
        values.insert(":now_ms".to_owned(), n(now_ms));
        // A replacement of tokens whose end was never read holds for no record.
        values.insert(":seen_rd".to_owned(), n(seen_until_ms.unwrap_or(u64::MAX)));
        return (REPLACE_RELEASED, &names.replace_released);
    }
    if marking != Marking::Extend {
        values.insert(":max".to_owned(), n(crate::MAX_RELEASED as u64));
    }
    if let Some(seen) = seen_until_ms {
        values.insert(":seen_rd".to_owned(), n(seen));
    }
    match (marking, seen_until_ms) {
        (Marking::Through, Some(_)) => (MARK_RELEASED_THROUGH, &names.mark_through_seen),
        (Marking::Through, None) => (MARK_RELEASED_THROUGH, &names.mark_through),
        (Marking::Extend, Some(_)) => (MARK_EXTENDED, &names.mark_extended_seen),
        (Marking::Extend, None) => (MARK_EXTENDED, &names.mark_extended),
        (Marking::KeepCompleted, _) => unreachable!("returned above"),
        (_, Some(_)) => (MARK_RELEASED, &names.mark_released_seen),
        (_, None) => (MARK_RELEASED, &names.mark_released),
    }
}

/// The attribute behind a placeholder.
fn attribute<'n>(names: &'n AttributeNames, placeholder: &str) -> &'n str {
    match placeholder {
        "#pk" => &names.key,
        "#st" => &names.status,
        "#tk" => &names.token,
        "#at" => &names.attempt,
        "#lu" => &names.lease_until,
        "#ex" => &names.expires_at,
        "#fp" => &names.fingerprint,
        "#rs" => &names.response,
        "#er" => &names.error,
        "#ru" => &names.replay_until,
        "#cw" => &names.claim_writes,
        "#ci" => &names.completed_in,
        "#sp" => &names.steps,
        "#rl" => &names.released,
        "#rd" => &names.released_until,
        "#rt" => &names.released_through,
        other => panic!("`{other}` is not a placeholder of the DynamoDB store's expressions"),
    }
}

/// One conditional update of a record, everything but its table and key: what an `UpdateItem`, or a
/// transaction's `Update` action, carries.
#[derive(Debug)]
pub(super) struct RecordUpdate {
    /// The update expression.
    pub(super) update: &'static str,
    /// The condition expression.
    pub(super) condition: &'static str,
    /// The `ExpressionAttributeNames` of both.
    pub(super) names: HashMap<String, String>,
    /// The `ExpressionAttributeValues` of both.
    pub(super) values: HashMap<String, AttributeValue>,
}

impl RecordUpdate {
    /// A claim; `with_writes`: a claim with business writes (`claim_with`), which marks them as in
    /// effect and is refused while earlier ones are; `clearing_steps`: a claim without steps sent
    /// again for an expired record with steps ([`STEPS_CLEARED`]), which removes them.
    pub(super) fn claim(
        names: &PreparedNames,
        request: &ClaimRequest<'_>,
        with_writes: bool,
        clearing_steps: bool,
    ) -> Self {
        let mut values = HashMap::with_capacity(11);
        values.insert(":pending".to_owned(), s(Status::Pending.as_str()));
        values.insert(":failed".to_owned(), s(Status::Failed.as_str()));
        values.insert(":tk".to_owned(), s(request.token));
        values.insert(":lu".to_owned(), n(request.lease_until_ms));
        values.insert(":ex".to_owned(), n(request.expires_at_s));
        values.insert(
            ":ex_ms".to_owned(),
            n(request.expires_at_s.saturating_mul(1000)),
        );
        values.insert(":one".to_owned(), n(1));
        values.insert(":now_s".to_owned(), n(request.now_ms / 1000));
        values.insert(":now_ms".to_owned(), n(request.now_ms));
        if let Some(fp) = request.fingerprint {
            values.insert(":fp".to_owned(), s(fp));
        }
        if with_writes {
            values.insert(":true".to_owned(), AttributeValue::Bool(true));
        }
        if let StepsClaim::Fresh { initial: steps, .. } | StepsClaim::Resume { steps, .. } =
            request.steps
        {
            values.insert(":sp".to_owned(), AttributeValue::B(steps.to_vec().into()));
        }
        if let StepsClaim::Fresh {
            restarts: Some(seen),
            ..
        } = request.steps
        {
            values.insert(":seen".to_owned(), AttributeValue::B(seen.to_vec().into()));
        }
        let kind = if with_writes {
            ClaimKind::WithWrites
        } else if request.keep_claim_writes {
            ClaimKind::KeepingWrites
        } else {
            ClaimKind::Plain
        };
        let mode = if clearing_steps {
            StepsMode::Cleared
        } else {
            StepsMode::of(request.steps)
        };
        let (update, condition, names) = names.claim(request.fingerprint.is_some(), kind, mode);
        Self {
            update,
            condition,
            names: names.clone(),
            values,
        }
    }

    /// A fenced transition.
    /// `region`: the store's region, recorded by a completion.
    pub(super) fn transition(
        names: &PreparedNames,
        transition: &Transition<'_>,
        region: Option<&str>,
    ) -> Self {
        let mut values = HashMap::with_capacity(6);
        // Every transition's condition but a release mark's names the status held, and the token,
        // but a mark that keeps a COMPLETED record.
        let keeps_completed = matches!(
            transition.change,
            Change::MarkReleased {
                marking: Marking::KeepCompleted,
                ..
            }
        );
        if !matches!(transition.change, Change::Release { .. }) && !keeps_completed {
            values.insert(":pending".to_owned(), s(Status::Pending.as_str()));
        }
        if !keeps_completed {
            values.insert(":tk".to_owned(), s(transition.token));
        }
        let (update, names) = match transition.change {
            Change::Complete {
                response,
                expires_at_s,
                replay_until_s,
            } => {
                values.insert(":completed".to_owned(), s(Status::Completed.as_str()));
                values.insert(":ex".to_owned(), n(expires_at_s));
                values.insert(":ex_ms".to_owned(), n(expires_at_s.saturating_mul(1000)));
                if let Some(bytes) = response {
                    values.insert(":rs".to_owned(), AttributeValue::B(bytes.to_vec().into()));
                }
                if let Some(until) = replay_until_s {
                    values.insert(":ru".to_owned(), n(until));
                }
                if let Some(region) = region {
                    values.insert(":ci".to_owned(), s(region));
                }
                names.complete(
                    response.is_some(),
                    replay_until_s.is_some(),
                    region.is_some(),
                )
            }
            Change::Fail {
                error,
                expires_at_s,
                release_claim_writes,
            } => {
                values.insert(":failed".to_owned(), s(Status::Failed.as_str()));
                values.insert(":er".to_owned(), s(error));
                values.insert(":ex".to_owned(), n(expires_at_s));
                values.insert(":ex_ms".to_owned(), n(expires_at_s.saturating_mul(1000)));
                names.fail(release_claim_writes)
            }
            Change::SaveSteps { steps, previous } => {
                values.insert(":sp".to_owned(), AttributeValue::B(steps.to_vec().into()));
                values.insert(
                    ":prev".to_owned(),
                    AttributeValue::B(previous.to_vec().into()),
                );
                (SAVE_STEPS, &names.save_steps)
            }
            Change::Release { .. } => release_values(names, transition, &mut values),
            Change::MarkReleased { .. } => mark_values(names, transition, &mut values),
            Change::ExtendLease {
                lease_until_ms,
                expires_at_s,
            } => {
                values.insert(":lu".to_owned(), n(lease_until_ms));
                values.insert(":ex".to_owned(), n(expires_at_s));
                values.insert(":ex_ms".to_owned(), n(expires_at_s.saturating_mul(1000)));
                names.extend_lease()
            }
        };
        let condition = match transition.change {
            Change::Fail {
                release_claim_writes: true,
                ..
            } => HELD_WITH_CLAIM_WRITES,
            Change::Release { .. } => RELEASABLE,
            Change::MarkReleased {
                marking,
                seen_until_ms,
                ..
            } => match (marking, seen_until_ms.is_some()) {
                (Marking::Replace, _) => REPLACEABLE,
                (Marking::Through, true) => THROUGHABLE_SEEN,
                (Marking::Through, false) => THROUGHABLE,
                (Marking::Extend, true) => EXTENDABLE_SEEN,
                (Marking::Extend, false) => EXTENDABLE,
                (Marking::Join, true) => MARKABLE_SEEN,
                (Marking::Join, false) => MARKABLE,
                (Marking::KeepCompleted, _) => KEEPABLE,
            },
            Change::SaveSteps { .. } => HELD_WITH_STEPS,
            _ => HELD_BY_TOKEN,
        };
        Self {
            update,
            condition,
            names: names.clone(),
            values,
        }
    }
}

/// Which of the three claims a request is.
#[derive(Debug, Clone, Copy)]
enum ClaimKind {
    /// A plain claim ([`CLAIMABLE`]).
    Plain,
    /// A claim with business writes ([`CLAIMABLE_WITH_WRITES`]).
    WithWrites,
    /// A plain claim that keeps claim-time writes in effect ([`CLAIMABLE_KEEPING_WRITES`]).
    KeepingWrites,
}

impl ClaimKind {
    const ALL: [ClaimKind; 3] = [
        ClaimKind::Plain,
        ClaimKind::WithWrites,
        ClaimKind::KeepingWrites,
    ];

    /// The condition of the claim without steps.
    const fn condition(self) -> &'static str {
        match self {
            ClaimKind::Plain => CLAIMABLE,
            ClaimKind::WithWrites => CLAIMABLE_WITH_WRITES,
            ClaimKind::KeepingWrites => CLAIMABLE_KEEPING_WRITES,
        }
    }
}

/// What a claim does with stored steps ([`StepsClaim`]), as far as its expressions go.
#[derive(Debug, Clone, Copy)]
enum StepsMode {
    Untouched,
    Fresh,
    FreshAfterFailure,
    Resume,
    ResumeUnlessFailed,
    /// A claim without steps, sent again for an expired record with steps: it removes them.
    Cleared,
}

impl StepsMode {
    const ALL: [StepsMode; 6] = [
        StepsMode::Untouched,
        StepsMode::Fresh,
        StepsMode::FreshAfterFailure,
        StepsMode::Resume,
        StepsMode::ResumeUnlessFailed,
        StepsMode::Cleared,
    ];

    fn of(claim: StepsClaim<'_>) -> Self {
        match claim {
            StepsClaim::Untouched => StepsMode::Untouched,
            StepsClaim::Fresh { restarts: None, .. } => StepsMode::Fresh,
            StepsClaim::Fresh {
                restarts: Some(_), ..
            } => StepsMode::FreshAfterFailure,
            StepsClaim::Resume {
                restart_failed: false,
                ..
            } => StepsMode::Resume,
            StepsClaim::Resume {
                restart_failed: true,
                ..
            } => StepsMode::ResumeUnlessFailed,
        }
    }

    /// What the mode adds to the claim's condition.
    const fn condition(self) -> &'static str {
        match self {
            StepsMode::Untouched => STEPS_UNTOUCHED,
            StepsMode::Cleared => STEPS_CLEARED,
            StepsMode::Fresh => STEPS_FRESH,
            StepsMode::FreshAfterFailure => STEPS_FRESH_AFTER_FAILURE,
            StepsMode::Resume => STEPS_RESUME,
            StepsMode::ResumeUnlessFailed => STEPS_RESUME_UNLESS_FAILED,
        }
    }

    /// Whether the claim replaces the stored steps with new ones.
    const fn starts_afresh(self) -> bool {
        matches!(self, StepsMode::Fresh | StepsMode::FreshAfterFailure)
    }
}

/// Every claim's update and condition, by [`claim_index`]: the constants above, with the steps
/// condition of the claim's [`StepsMode`] (a claim with steps that starts afresh sets new steps; a
/// claim without steps sent again for an expired record removes them).
/// Built once.
static CLAIMS: std::sync::LazyLock<Vec<(&'static str, &'static str)>> =
    std::sync::LazyLock::new(|| {
        let mut claims = vec![("", ""); 2 * ClaimKind::ALL.len() * StepsMode::ALL.len()];
        for fingerprint in [false, true] {
            for kind in ClaimKind::ALL {
                for mode in StepsMode::ALL {
                    let update = claim_update(fingerprint, matches!(kind, ClaimKind::WithWrites));
                    let steps = mode.condition();
                    let update = if mode.starts_afresh() {
                        leak(update.replacen(" ADD ", ", #sp = :sp ADD ", 1))
                    } else if matches!(mode, StepsMode::Cleared) {
                        // The claim's update ends with its REMOVE clause.
                        leak(format!("{update}, #sp"))
                    } else {
                        update
                    };
                    let expressions = (
                        update,
                        leak(format!(
                            "({}) AND ({steps}) AND {NOT_RELEASED} AND {OUTLIVES_RELEASED}",
                            kind.condition()
                        )),
                    );
                    claims[claim_index(fingerprint, kind, mode)] = expressions;
                }
            }
        }
        claims
    });

/// A claim expression built once for the process (a fixed set, see [`CLAIMS`]).
fn leak(expression: String) -> &'static str {
    Box::leak(expression.into_boxed_str())
}

/// The `ExpressionAttributeNames` of every record update a store sends, built once per store from its
/// [`AttributeNames`] and cloned into each request: parsing the expressions and hashing their
/// placeholders anew for every request costs more than the copy.
#[derive(Debug, Clone)]
pub(super) struct PreparedNames {
    /// By [`claim_index`].
    claim: Vec<HashMap<String, String>>,
    /// By [`complete_index`].
    complete: [HashMap<String, String>; 8],
    /// By `release_claim_writes as usize`.
    fail: [HashMap<String, String>; 2],
    extend_lease: HashMap<String, String>,
    save_steps: HashMap<String, String>,
    release: HashMap<String, String>,
    mark_released: HashMap<String, String>,
    mark_released_seen: HashMap<String, String>,
    replace_released: HashMap<String, String>,
    mark_through: HashMap<String, String>,
    mark_through_seen: HashMap<String, String>,
    mark_extended: HashMap<String, String>,
    mark_extended_seen: HashMap<String, String>,
    keep_completed: HashMap<String, String>,
}

impl PreparedNames {
    pub(super) fn new(names: &AttributeNames) -> Self {
        let mut prepared = Self {
            claim: CLAIMS
                .iter()
                .map(|(update, condition)| attribute_names(names, &[update, condition]))
                .collect(),
            complete: Default::default(),
            fail: Default::default(),
            extend_lease: attribute_names(names, &[EXTEND_LEASE, HELD_BY_TOKEN]),
            save_steps: attribute_names(names, &[SAVE_STEPS, HELD_WITH_STEPS]),
            release: attribute_names(names, &[RELEASE, RELEASABLE]),
            mark_released: attribute_names(names, &[MARK_RELEASED, MARKABLE]),
            mark_released_seen: attribute_names(names, &[MARK_RELEASED, MARKABLE_SEEN]),
            replace_released: attribute_names(names, &[REPLACE_RELEASED, REPLACEABLE]),
            mark_through: attribute_names(names, &[MARK_RELEASED_THROUGH, THROUGHABLE]),
            mark_through_seen: attribute_names(names, &[MARK_RELEASED_THROUGH, THROUGHABLE_SEEN]),
            mark_extended: attribute_names(names, &[MARK_EXTENDED, EXTENDABLE]),
            mark_extended_seen: attribute_names(names, &[MARK_EXTENDED, EXTENDABLE_SEEN]),
            keep_completed: attribute_names(names, &[KEEP_COMPLETED, KEEPABLE]),
        };
        for response in [false, true] {
            for replay_until in [false, true] {
                for region in [false, true] {
                    let update = complete_update(response, replay_until, region);
                    prepared.complete[complete_index(response, replay_until, region)] =
                        attribute_names(names, &[update, HELD_BY_TOKEN]);
                }
            }
        }
        for release_claim_writes in [false, true] {
            let condition = if release_claim_writes {
                HELD_WITH_CLAIM_WRITES
            } else {
                HELD_BY_TOKEN
            };
            prepared.fail[usize::from(release_claim_writes)] =
                attribute_names(names, &[fail_update(release_claim_writes), condition]);
        }
        prepared
    }

    /// A claim's update, its condition and their names.
    fn claim(
        &self,
        fingerprint: bool,
        kind: ClaimKind,
        mode: StepsMode,
    ) -> (&'static str, &'static str, &HashMap<String, String>) {
        let index = claim_index(fingerprint, kind, mode);
        let (update, condition) = CLAIMS[index];
        (update, condition, &self.claim[index])
    }

    /// A completion's update and the names of it and [`HELD_BY_TOKEN`].
    fn complete(
        &self,
        response: bool,
        replay_until: bool,
        region: bool,
    ) -> (&'static str, &HashMap<String, String>) {
        (
            complete_update(response, replay_until, region),
            &self.complete[complete_index(response, replay_until, region)],
        )
    }

    /// A failure's update and the names of it and [`HELD_BY_TOKEN`].
    fn fail(&self, release_claim_writes: bool) -> (&'static str, &HashMap<String, String>) {
        (
            fail_update(release_claim_writes),
            &self.fail[usize::from(release_claim_writes)],
        )
    }

    /// The heartbeat's update and the names of it and [`HELD_BY_TOKEN`].
    fn extend_lease(&self) -> (&'static str, &HashMap<String, String>) {
        (EXTEND_LEASE, &self.extend_lease)
    }
}

/// Where [`PreparedNames`] and [`CLAIMS`] keep a claim's expressions and names.
fn claim_index(fingerprint: bool, kind: ClaimKind, mode: StepsMode) -> usize {
    usize::from(fingerprint) + 2 * (kind as usize) + 2 * ClaimKind::ALL.len() * (mode as usize)
}

/// Where [`PreparedNames`] keeps a completion's names.
fn complete_index(response: bool, replay_until: bool, region: bool) -> usize {
    usize::from(response) | usize::from(replay_until) << 1 | usize::from(region) << 2
}

fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The `prefix`ed placeholders (`#..` or `:..`) in `expressions`.
    fn placeholders(prefix: char, expressions: &[&str]) -> BTreeSet<String> {
        expressions
            .iter()
            .flat_map(|e| e.split(|c: char| !(c.is_ascii_alphanumeric() || "_#:".contains(c))))
            .filter(|word| word.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }

    fn keys<V>(map: &HashMap<String, V>) -> BTreeSet<String> {
        map.keys().cloned().collect()
    }

    /// DynamoDB rejects a request whose expressions use a name or value it does not define, or that
    /// defines one they do not use: every request shape defines exactly the ones it uses.
    fn assert_complete(update: &RecordUpdate) {
        let expressions = [update.update, update.condition];
        assert_eq!(
            keys(&update.names),
            placeholders('#', &expressions),
            "{update:?}"
        );
        assert_eq!(
            keys(&update.values),
            placeholders(':', &expressions),
            "{update:?}"
        );
    }

    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "every kind of request, listed where it is checked"
    )]
    fn every_request_defines_exactly_the_names_and_values_it_uses() {
        let names = PreparedNames::new(&AttributeNames::default());
        for fingerprint in [None, Some("fp")] {
            for (with_writes, keep_claim_writes, steps) in
                [(false, false), (true, false), (false, true)]
                    .into_iter()
                    .flat_map(|(w, k)| {
                        [
                            StepsClaim::Untouched,
                            StepsClaim::Fresh {
                                initial: b"{}",
                                restarts: None,
                            },
                            StepsClaim::Fresh {
                                initial: b"{}",
                                restarts: Some(b"[]"),
                            },
                            StepsClaim::Resume {
                                steps: b"{}",
                                restart_failed: false,
                            },
                            StepsClaim::Resume {
                                steps: b"{}",
                                restart_failed: true,
                            },
                        ]
                        .map(|steps| (w, k, steps))
                    })
            {
                let request = ClaimRequest {
                    key: "ns#k",
                    token: "token",
                    attempt: 1,
                    now_ms: 1_000_000,
                    lease_until_ms: 1_060_000,
                    expires_at_s: 90_000,
                    fingerprint,
                    keep_claim_writes,
                    steps,
                };
                assert_complete(&RecordUpdate::claim(&names, &request, with_writes, false));
                if matches!(steps, StepsClaim::Untouched) {
                    let cleared = RecordUpdate::claim(&names, &request, with_writes, true);
                    assert_complete(&cleared);
                    assert!(cleared.update.ends_with(", #sp"), "{cleared:?}");
                    assert!(
                        cleared.condition.contains("AND (#ex < :now_s) AND"),
                        "{cleared:?}"
                    );
                }
            }
        }
        let mut changes = vec![
            Change::ExtendLease {
                lease_until_ms: 1,
                expires_at_s: 2,
            },
            Change::SaveSteps {
                steps: b"{}",
                previous: b"{ }",
            },
            Change::Release {
                now_ms: 1_000,
                error: "released",
                expires_at_s: 2,
                released_until_ms: 3,
            },
        ];
        for (seen_until_ms, marking) in [
            (None, Marking::Join),
            (Some(4), Marking::Join),
            (Some(4), Marking::Replace),
            (None, Marking::Through),
            (Some(4), Marking::Through),
            (None, Marking::Extend),
            (Some(4), Marking::Extend),
            (None, Marking::KeepCompleted),
        ] {
            changes.push(Change::MarkReleased {
                now_ms: 1_000,
                released_until_ms: 5,
                expires_at_s: 6,
                seen_until_ms,
                seen_expires_at_s: 2,
                marking,
            });
        }
        for release_claim_writes in [false, true] {
            changes.push(Change::Fail {
                error: "declined",
                expires_at_s: 2,
                release_claim_writes,
            });
        }
        for response in [None, Some(&b"{}"[..])] {
            for replay_until_s in [None, Some(3)] {
                changes.push(Change::Complete {
                    response,
                    expires_at_s: 2,
                    replay_until_s,
                });
            }
        }
        for change in changes {
            let transition = Transition {
                key: "ns#k",
                token: "token",
                change,
            };
            for region in [None, Some("eu-west-1")] {
                assert_complete(&RecordUpdate::transition(&names, &transition, region));
            }
        }
    }

    /// Every combination of payload, claim kind and steps has its own expressions: a claim is never
    /// sent with another claim's condition.
    #[test]
    fn every_claim_is_its_own() {
        let mut seen = std::collections::HashSet::new();
        for fingerprint in [false, true] {
            for kind in ClaimKind::ALL {
                for mode in StepsMode::ALL {
                    let index = claim_index(fingerprint, kind, mode);
                    assert!(seen.insert(index), "{fingerprint} {kind:?} {mode:?}");
                    let (update, condition) = CLAIMS[index];
                    assert_eq!(update.contains(":fp"), fingerprint);
                    assert!(condition.contains(kind.condition()), "{condition}");
                    // Every claim is refused by its own call's release.
                    let steps = mode.condition();
                    assert!(
                        condition.ends_with(&format!(
                            "AND ({steps}) AND {NOT_RELEASED} AND {OUTLIVES_RELEASED}"
                        )),
                        "{condition}"
                    );
                    assert_eq!(update.contains("#sp = :sp"), mode.starts_afresh());
                }
            }
        }
        assert_eq!(seen.len(), CLAIMS.len());
    }

    #[test]
    fn placeholders_resolve_to_the_configured_attribute_names() {
        let names = AttributeNames {
            status: "state".to_owned(),
            ..AttributeNames::default()
        };
        let map = attribute_names(&names, &[HELD_BY_TOKEN, EXTEND_LEASE]);
        assert_eq!(
            map,
            HashMap::from([
                ("#st".to_owned(), "state".to_owned()),
                ("#tk".to_owned(), "token".to_owned()),
                ("#lu".to_owned(), "lease_until".to_owned()),
                ("#ex".to_owned(), "expires_at".to_owned()),
                ("#rd".to_owned(), "released_until".to_owned()),
            ])
        );
    }

    #[test]
    fn prepared_names_are_the_configured_ones_for_every_request() {
        let names = AttributeNames {
            status: "state".to_owned(),
            token: "fence".to_owned(),
            ..AttributeNames::default()
        };
        let prepared = PreparedNames::new(&names);
        let transition = Transition {
            key: "ns#k",
            token: "token",
            change: Change::Fail {
                error: "declined",
                expires_at_s: 2,
                release_claim_writes: false,
            },
        };
        let update = RecordUpdate::transition(&prepared, &transition, None);
        assert_eq!(
            update.names,
            attribute_names(&names, &[update.update, update.condition])
        );
        assert_eq!(update.names["#st"], "state");
        assert_eq!(update.names["#tk"], "fence");
    }
}
