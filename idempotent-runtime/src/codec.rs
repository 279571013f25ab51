//! How a response is stored: JSON bytes.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Encodes a response for storage.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(value)
}

/// Decodes a stored response.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}
