//! The requests the cases send, for tests of a store beside the suite (hidden: not part of the API).
//!
//! One clock ([`NOW`]) and one lease ([`LEASE`]) for every request, so a test that checks a record the
//! suite's requests wrote knows its times.

use crate::Record;
use crate::store::{Change, ClaimRequest, Transition};

/// The requests' clock: 2100-01-01, in epoch milliseconds. Far ahead, so that a record a case writes
/// never expires by the wall clock either (a table's TTL sweeper would delete it during the case).
pub const NOW: u64 = 4_102_444_800_000;
/// The requests' lease.
pub const LEASE: u64 = 60_000;

/// A claim of `key` by `token` at `now_ms`: a lease of [`LEASE`], an hour of TTL after it, and the
/// fingerprint `fp-1`.
#[must_use]
pub fn claim<'a>(key: &'a str, token: &'a str, now_ms: u64) -> ClaimRequest<'a> {
    let mut request = ClaimRequest::new(
        key,
        token,
        now_ms,
        now_ms + LEASE,
        (now_ms + LEASE) / 1000 + 3600,
    );
    request.fingerprint = Some("fp-1");
    request
}

/// Completes `key` under `token` with `response`, kept until `expires_at_s`.
#[must_use]
pub fn complete<'a>(
    key: &'a str,
    token: &'a str,
    response: &'a [u8],
    expires_at_s: u64,
) -> Transition<'a> {
    Transition::new(
        key,
        token,
        Change::Complete {
            response: Some(response),
            expires_at_s,
            replay_until_s: None,
        },
    )
}

/// Releases `key` for `token` at [`NOW`] (kept a minute after it): see [`Change::Release`].
#[must_use]
pub fn release<'a>(key: &'a str, token: &'a str) -> Transition<'a> {
    release_at(key, token, NOW)
}

/// Releases `key` for `token` at `now_ms` (kept a minute after [`NOW`]): see [`Change::Release`].
#[must_use]
pub fn release_at<'a>(key: &'a str, token: &'a str, now_ms: u64) -> Transition<'a> {
    Transition::new(
        key,
        token,
        Change::Release {
            now_ms,
            error: "released",
            expires_at_s: NOW / 1000 + 60,
            released_until_ms: NOW + LEASE,
        },
    )
}

/// Leaves `token` on `seen`, the record of `key` as the caller read it (`None`: none), at `now_ms`,
/// for a claim that can hold the key until `until_ms` ([`Change::MarkReleased`], computed as the
/// runtime's release computes it): the token joins the released ones (or replaces them, on a full set
/// whose end has passed), and their end and the record's expiry become no earlier than `until_ms`.
#[must_use]
pub fn mark_released<'a>(
    key: &'a str,
    token: &'a str,
    now_ms: u64,
    seen: Option<&Record>,
    until_ms: u64,
) -> Transition<'a> {
    let seen = seen.map_or(crate::handler::decide::Seen::NOTHING, |record| {
        crate::handler::decide::Seen::of(record, token)
    });
    Transition::new(
        key,
        token,
        crate::handler::decide::mark(seen, now_ms, until_ms),
    )
}

/// Fails `key` under `token` (error `declined`, kept a minute after [`NOW`]).
#[must_use]
pub fn fail<'a>(key: &'a str, token: &'a str) -> Transition<'a> {
    Transition::new(
        key,
        token,
        Change::Fail {
            error: "declined",
            expires_at_s: NOW / 1000 + 60,
            release_claim_writes: false,
        },
    )
}

/// Extends the lease of `key` under `token` to five leases after [`NOW`].
#[must_use]
pub fn extend<'a>(key: &'a str, token: &'a str) -> Transition<'a> {
    Transition::new(
        key,
        token,
        Change::ExtendLease {
            lease_until_ms: NOW + 5 * LEASE,
            expires_at_s: NOW / 1000 + 9_999,
        },
    )
}
