//! The record's size budget: DynamoDB's item size limit, attribute names included, as every store applies
//! it.
//!
//! This is DynamoDB's rule, but it stays outside `store::dynamodb` (and works without the `dynamodb`
//! feature): [`Store::response_budget`](crate::Store::response_budget) applies it by default to every
//! store, so that the memory store accepts and refuses the same responses as DynamoDB, and it needs only
//! the [`AttributeNames`], no SDK type. The sizes of SDK values (staged writes) are in
//! `store::dynamodb::size`.

use crate::record::AttributeNames;

/// DynamoDB's item size limit, attribute names included.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// The largest size DynamoDB may count for a number attribute (38 digits of precision).
const MAX_NUMBER_BYTES: usize = 21;
/// A fencing token (a hyphenated UUID).
const TOKEN_BYTES: usize = 36;

/// The most bytes of the body's error text stored on a FAILED record.
pub(crate) const MAX_ERROR_BYTES: usize = 4096;

/// The bytes every record for `key` may hold besides its response or steps, names included (counted
/// generously): the key, the longest status, a token, the attempt and expiry numbers, the claim-time
/// writes mark and the payload's fingerprint.
fn record_overhead(names: &AttributeNames, key: &str, fingerprint: Option<&str>) -> usize {
    names.key.len()
        + key.len()
        + names.status.len()
        + "COMPLETED".len()
        + names.token.len()
        + TOKEN_BYTES
        + names.attempt.len()
        + names.expires_at.len()
        + 2 * MAX_NUMBER_BYTES
        + names.claim_writes.len()
        + 1
        + fingerprint.map_or(0, |f| names.fingerprint.len() + f.len())
}

/// The most bytes the encoded steps of an operation run with steps may have so that its PENDING or
/// FAILED record for `key` fits in one item: the limit minus every other attribute such a record
/// holds, names included (counted generously): a lease, a failure's error text (up to
/// [`MAX_ERROR_BYTES`]), the released tokens (up to [`MAX_RELEASED`](crate::MAX_RELEASED) of this
/// crate's tokens), until when they hold and the token they are released through, and the steps
/// attribute's own name.
pub(crate) fn steps_budget(names: &AttributeNames, key: &str, fingerprint: Option<&str>) -> usize {
    let overhead = record_overhead(names, key, fingerprint)
        + names.lease_until.len()
        + MAX_NUMBER_BYTES
        + names.error.len()
        + MAX_ERROR_BYTES
        + names.released.len()
        + crate::MAX_RELEASED * TOKEN_BYTES
        + names.released_until.len()
        + MAX_NUMBER_BYTES
        + names.released_through.len()
        + TOKEN_BYTES
        + names.steps.len();
    MAX_ITEM_BYTES.saturating_sub(overhead)
}

/// The most bytes a response may have so that a COMPLETED record for `key` fits in one item: the limit
/// minus every other attribute, names included (counted generously).
pub(crate) fn response_budget(
    names: &AttributeNames,
    key: &str,
    fingerprint: Option<&str>,
) -> usize {
    let overhead = record_overhead(names, key, fingerprint)
        + names.replay_until.len()
        + MAX_NUMBER_BYTES
        + names.response.len();
    MAX_ITEM_BYTES.saturating_sub(overhead)
}
