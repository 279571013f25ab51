//! Key derivation: `"{namespace}#{hex(sha256(canonical_json(key)))}"`, and payload fingerprints.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Serializes `value` to canonical JSON: object keys sorted (maps of any order hash the same), no
/// whitespace.
fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    // `serde_json::Value` keeps objects in a `BTreeMap`, which sorts their keys.
    let value = serde_json::to_value(value)?;
    serde_json::to_vec(&value)
}

fn sha256_hex<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    Ok(hex::encode(Sha256::digest(canonical_json(value)?)))
}

/// The record key for `key` in `namespace`: fixed length past the namespace, no personal data, and two
/// namespaces never collide.
///
/// # Errors
/// `serde_json`'s error when `key` does not serialize (a map with non-string keys, a failing `Serialize`).
///
/// ```
/// let key = idempotent_runtime::derive_key("billing::charge", &("acme", 42)).unwrap();
/// assert!(key.starts_with("billing::charge#"));
/// assert_eq!(key.len(), "billing::charge#".len() + 64);
/// ```
pub fn derive_key<T: Serialize + ?Sized>(
    namespace: &str,
    key: &T,
) -> Result<String, serde_json::Error> {
    let digest = sha256_hex(key)?;
    let mut out = String::with_capacity(namespace.len() + 1 + digest.len());
    out.push_str(namespace);
    out.push('#');
    out.push_str(&digest);
    Ok(out)
}

/// The fingerprint stored for a `payload`: hex SHA-256 of its canonical JSON.
///
/// # Errors
/// `serde_json`'s error when `payload` does not serialize.
pub fn fingerprint<T: Serialize + ?Sized>(payload: &T) -> Result<String, serde_json::Error> {
    sha256_hex(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn map_order_does_not_change_the_key() {
        let a: HashMap<&str, i32> = [("a", 1), ("b", 2), ("c", 3)].into();
        let b: HashMap<&str, i32> = [("c", 3), ("a", 1), ("b", 2)].into();
        assert_eq!(derive_key("n", &a).unwrap(), derive_key("n", &b).unwrap());
    }

    #[test]
    fn namespaces_do_not_collide() {
        assert_ne!(derive_key("a", &1).unwrap(), derive_key("b", &1).unwrap());
    }

    #[test]
    fn known_vector() {
        // sha256 of the two bytes `42`.
        assert_eq!(
            derive_key("n", &42).unwrap(),
            "n#73475cb40a568e8da8a045ced110137e159f890ac4da883b6b17dc651b3a8049"
        );
    }

    #[test]
    fn unserializable_key_is_an_error() {
        let bad: HashMap<(i32, i32), i32> = [((1, 2), 3)].into();
        assert!(derive_key("n", &bad).is_err());
    }
}
