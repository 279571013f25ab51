//! `ClientRequestToken`s: what makes a retried `TransactWriteItems` a no-op.
//!
//! DynamoDB applies a transaction once per token for ten minutes and refuses the same token with other
//! parameters (`IdempotentParameterMismatch`). Tokens are kept per account and region, not per table,
//! and are never stored by this crate: a token only has to be the same for the retries of one request,
//! and different for any two requests.

use sha2::{Digest, Sha256};

/// The `ClientRequestToken` of one of a call's transactions: a UUID (36 characters, version 8: custom
/// bytes) made of the first 16 bytes of a SHA-256 over (purpose, table, key, fencing token, attempt).
/// `purpose` is `claim`, `complete` or `fail`; `attempt` numbers the claim attempts of one call (0 for the
/// other purposes).
///
/// So the SDK's retries of one request, and this crate's own retries of one completion (built once, sent
/// again unchanged), keep their token and are recognised; while two claim attempts (each with its own
/// time, lease and expiry), or a call's claim and completion, never share one.
pub(super) fn request_token(
    purpose: &str,
    table: &str,
    key: &str,
    token: &str,
    attempt: u32,
) -> String {
    let digest = Sha256::new()
        .chain_update(purpose.as_bytes())
        .chain_update([0])
        .chain_update(table.as_bytes())
        .chain_update([0])
        .chain_update(key.as_bytes())
        .chain_update([0])
        .chain_update(token.as_bytes())
        .chain_update([0])
        .chain_update(attempt.to_be_bytes())
        .finalize();
    let mut bytes = [0; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::request_token;

    #[test]
    fn each_claim_attempt_has_its_own_request_token() {
        let first = request_token("claim", "t", "ns#k", "token-1", 1);
        assert_eq!(first.len(), 36);
        let parsed = uuid::Uuid::parse_str(&first).expect("a hyphenated UUID");
        assert_eq!(parsed.get_version(), Some(uuid::Version::Custom));
        assert_eq!(
            first,
            request_token("claim", "t", "ns#k", "token-1", 1),
            "a retry of one attempt keeps its token"
        );
        assert_ne!(first, request_token("claim", "t", "ns#k", "token-1", 2));
        assert_ne!(first, request_token("complete", "t", "ns#k", "token-1", 1));
        assert_ne!(first, request_token("claim", "t", "ns#k", "token-2", 1));
        assert_ne!(first, request_token("claim", "t", "ns#j", "token-1", 1));
        assert_ne!(first, request_token("claim", "u", "ns#k", "token-1", 1));
    }
}
