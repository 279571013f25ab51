//! How a response is stored: JSON bytes, gzip-compressed when large.
//!
//! Small responses are stored as plain JSON, readable in the console. Above
//! [`COMPRESS_ABOVE`] bytes the JSON is gzip-compressed (JSON compresses well, and DynamoDB charges
//! writes per kilobyte); gzip's magic bytes `1f 8b` can never start a JSON document, so the two forms
//! are told apart without a flag.

use std::io::{Read as _, Write as _};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Responses of more JSON bytes than this are compressed.
pub const COMPRESS_ABOVE: usize = 4 * 1024;

/// Decompressed responses larger than this are refused (a stored item is at most 400 KB; JSON rarely
/// compresses more than 100:1).
const MAX_DECOMPRESSED: u64 = 256 * 1024 * 1024;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Why a stored response could not be decoded.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// The bytes are not valid gzip.
    Compression(std::io::Error),
    /// The JSON does not fit the type.
    Json(serde_json::Error),
}

/// The JSON of a response: what its size is measured on, and what is stored when small.
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(value)
}

/// The stored form of `json`: itself when small, gzip-compressed otherwise (or when that is smaller).
pub(crate) fn pack(json: Vec<u8>) -> Vec<u8> {
    if json.len() <= COMPRESS_ABOVE {
        return json;
    }
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(json.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let compressed = encoder.write_all(&json).and_then(|()| encoder.finish());
    match compressed {
        Ok(c) if c.len() < json.len() => c,
        _ => json,
    }
}

/// Decodes a stored response.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.starts_with(&GZIP_MAGIC) {
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .take(MAX_DECOMPRESSED)
            .read_to_end(&mut json)
            .map_err(DecodeError::Compression)?;
        serde_json::from_slice(&json).map_err(DecodeError::Json)
    } else {
        serde_json::from_slice(bytes).map_err(DecodeError::Json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_responses_stay_plain_json() {
        let packed = pack(to_json(&vec![1, 2, 3]).unwrap());
        assert_eq!(packed, b"[1,2,3]");
        assert_eq!(decode::<Vec<i32>>(&packed).unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn large_responses_are_compressed_and_round_trip() {
        let value: Vec<String> = (0..2_000).map(|i| format!("line {i}")).collect();
        let json = to_json(&value).unwrap();
        let packed = pack(json.clone());
        assert!(packed.starts_with(&GZIP_MAGIC));
        assert!(
            packed.len() * 3 < json.len(),
            "{} vs {}",
            packed.len(),
            json.len()
        );
        assert_eq!(decode::<Vec<String>>(&packed).unwrap(), value);
    }

    /// Found by the decoder fuzzing: without `serde_json`'s `float_roundtrip`, these parse back one
    /// unit in the last place off, so a replay returned a different number than the body did.
    #[test]
    fn floats_replay_exactly() {
        for value in [
            1.346_949_762_001_332_3e281,
            -8.026_799_205_635_14e-268,
            0.1,
            1e-300,
        ] {
            let stored = pack(to_json(&value).unwrap());
            assert_eq!(
                decode::<f64>(&stored).unwrap().to_bits(),
                f64::to_bits(value)
            );
        }
    }

    #[test]
    fn corrupt_compressed_bytes_are_an_error() {
        assert!(matches!(
            decode::<u8>(&[0x1f, 0x8b, 0, 1, 2]),
            Err(DecodeError::Compression(_))
        ));
    }
}
