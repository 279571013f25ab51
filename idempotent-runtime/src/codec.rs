//! How a response is stored: JSON bytes, gzip-compressed when large.
//!
//! Small responses are stored as plain JSON, readable in the console. Above
//! [`COMPRESS_ABOVE`] bytes the JSON is gzip-compressed (JSON compresses well, and DynamoDB charges
//! writes per kilobyte); gzip's magic bytes `1f 8b` can never start a JSON document, so the two forms
//! are told apart without a flag.
//!
//! A value that did not serialize after its body ran is recorded as COMPLETED all the same (a success is
//! final), with a response that says why instead of the value: a NUL byte, which can start neither JSON
//! nor gzip, then the reason's text ([`not_serialized`]). Decoding it gives
//! [`DecodeError::NotSerialized`], which a duplicate reports as
//! [`Error::ResponseNotSerialized`](crate::Error::ResponseNotSerialized).
//!
//! JSON has no NaN or infinity: `serde_json` writes them as `null`, which never decodes back into the
//! float (or decodes into `None`, another value). [`finite`] finds them, so that such a value is refused
//! when it is stored rather than failing every replay.
//!
//! A stored response is untrusted input: the table may be shared with another service, or an item
//! tampered with, and a few hundred kilobytes of gzip can inflate to hundreds of megabytes. So decoding
//! inflates at most what the writer could have stored ([`decode_within`]: the handle's
//! [`max_response_bytes`](crate::Builder::max_response_bytes), which the writer respects too), and an
//! operator's preview inflates only its prefix ([`prefix`]).

use std::borrow::Cow;
use std::io::{Read as _, Write as _};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Responses of more JSON bytes than this are compressed.
pub const COMPRESS_ABOVE: usize = 4 * 1024;

/// The default bound on a response's JSON, in bytes (16 MiB): a response whose JSON is larger is not
/// stored (duplicates get [`Error::ResponseTooLarge`](crate::Error::ResponseTooLarge)), and a stored
/// response that inflates to more is refused as a corrupt record, without inflating the rest. A stored
/// item is at most 400 KB, and JSON that fits there compressed rarely inflates to more than 40 times
/// that; raise it with [`Builder::max_response_bytes`](crate::Builder::max_response_bytes).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The first byte of a response that records why the value was not stored ([`not_serialized`]).
const NOT_SERIALIZED: u8 = 0;

/// The most bytes of the reason [`not_serialized`] keeps.
const MAX_REASON_BYTES: usize = 1024;

/// Why a stored response could not be decoded.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// The bytes are not valid gzip.
    Compression(std::io::Error),
    /// The JSON does not fit the type.
    Json(serde_json::Error),
    /// The call completed, but its value did not serialize; here is why ([`not_serialized`]).
    NotSerialized(String),
}

/// The stored form of a response whose value did not serialize: the marker byte and `reason` (cut on a
/// character boundary to at most [`MAX_REASON_BYTES`]).
pub(crate) fn not_serialized(reason: &str) -> Vec<u8> {
    let reason = &reason[..reason.floor_char_boundary(MAX_REASON_BYTES)];
    let mut bytes = Vec::with_capacity(1 + reason.len());
    bytes.push(NOT_SERIALIZED);
    bytes.extend_from_slice(reason.as_bytes());
    bytes
}

/// `serde_json`'s error for a value with a non-finite float, or `None` when it has none. Only a value
/// whose JSON has a `null` can hide one, so only such a value is walked (`json` is its JSON).
pub(crate) fn non_finite<T: Serialize + ?Sized>(
    value: &T,
    json: &[u8],
) -> Option<serde_json::Error> {
    if !json.windows(4).any(|w| w == b"null") || finite::check(value) {
        return None;
    }
    Some(<serde_json::Error as serde::ser::Error>::custom(
        "it contains a non-finite float (NaN or ±infinity), which JSON cannot hold (serde_json writes `null`, which does not decode back)",
    ))
}

/// The error of a value whose JSON (its serialization) does not read back as its own type, from the
/// reading's: serde writes some values it refuses to read (nested deeper than its recursion limit, a
/// `u128` inside a buffered enum or flattened struct, or a hand-written `Serialize` its `Deserialize`
/// does not match).
#[cold]
pub(crate) fn not_read_back(e: &serde_json::Error) -> serde_json::Error {
    <serde_json::Error as serde::ser::Error>::custom(format_args!(
        "its JSON does not read back as its own type ({e}), so a duplicate could never be given it"
    ))
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

/// Decodes a stored response (or steps) whose JSON is at most [`DEFAULT_MAX_RESPONSE_BYTES`].
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    decode_within(bytes, DEFAULT_MAX_RESPONSE_BYTES)
}

/// Decodes a stored response whose JSON is at most `limit` bytes: a compressed one that inflates to
/// more is refused once `limit` bytes are out ([`DecodeError::Compression`]), before the rest is
/// inflated or anything is parsed. (Plain JSON is not inflated: its size is the item's, at most 400 KB.)
pub(crate) fn decode_within<T: DeserializeOwned>(
    bytes: &[u8],
    limit: usize,
) -> Result<T, DecodeError> {
    serde_json::from_slice(&unpack(bytes, limit)?).map_err(DecodeError::Json)
}

/// What makes a value of its own type from a stored response's JSON, and keeps it: the only part of a
/// replay made for each type. A trait of one method rather than a `dyn FnMut`, whose vtable would
/// carry a `call_once` shim for every type.
pub(crate) trait Parse {
    /// Parses `json`.
    fn parse(&mut self, json: &[u8]) -> Result<(), serde_json::Error>;
}

/// A stored response's JSON (at most `limit` bytes, as [`decode_within`]) handed to `parse`. Not
/// generic.
pub(crate) fn decode_with(
    bytes: &[u8],
    limit: usize,
    parse: &mut dyn Parse,
) -> Result<(), DecodeError> {
    parse
        .parse(&unpack(bytes, limit)?)
        .map_err(DecodeError::Json)
}

/// The JSON of a stored response ([`decode_within`]), inflated when compressed. Not generic: only
/// parsing the JSON is made for each type.
fn unpack(bytes: &[u8], limit: usize) -> Result<Cow<'_, [u8]>, DecodeError> {
    if bytes.first() == Some(&NOT_SERIALIZED) {
        return Err(not_stored(bytes));
    }
    if !bytes.starts_with(&GZIP_MAGIC) {
        return Ok(Cow::Borrowed(bytes));
    }
    let (json, whole) = inflate(bytes, limit)?;
    if !whole {
        return Err(DecodeError::Compression(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "it inflates to more than {limit} bytes, more than its writer could have stored (an item this library did not write, or one written with a higher `max_response_bytes`)"
            ),
        )));
    }
    Ok(Cow::Owned(json))
}

/// The first `max` bytes of gzip `bytes` inflated, and whether that is all of them. The buffer is sized
/// from the size gzip records in its trailer, trusted only up to `max`: an honest record is inflated
/// without a copy, and a crafted one costs at most `max` bytes.
fn inflate(bytes: &[u8], max: usize) -> Result<(Vec<u8>, bool), DecodeError> {
    let recorded = bytes
        .last_chunk::<4>()
        .map_or(0, |size| u32::from_le_bytes(*size) as usize);
    // One byte more than `max` tells whether there is more.
    let mut out = Vec::with_capacity(recorded.min(max).saturating_add(1));
    flate2::read::GzDecoder::new(bytes)
        .take(u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut out)
        .map_err(DecodeError::Compression)?;
    let whole = out.len() <= max;
    out.truncate(max);
    Ok((out, whole))
}

/// The first `max` bytes of a stored response's JSON (inflating no more than that), and whether that
/// is all of it: what an operator's preview shows, at a cost that does not grow with the response.
#[cfg(feature = "cli")]
pub(crate) fn prefix(bytes: &[u8], max: usize) -> Result<(Vec<u8>, bool), DecodeError> {
    if bytes.first() == Some(&NOT_SERIALIZED) {
        return Err(not_stored(bytes));
    }
    if bytes.starts_with(&GZIP_MAGIC) {
        return inflate(bytes, max);
    }
    let cut = bytes.len().min(max);
    Ok((bytes[..cut].to_vec(), cut == bytes.len()))
}

/// The reason a [`not_serialized`] response holds, its control characters escaped: the record's text,
/// which reaches error messages and logs.
#[cold]
fn not_stored(bytes: &[u8]) -> DecodeError {
    let reason = String::from_utf8_lossy(&bytes[1..]);
    DecodeError::NotSerialized(crate::telemetry::escaped(&reason).to_string())
}

/// Whether a value's floats are all finite: a serializer that visits the value and writes nothing.
pub(crate) mod finite {
    use serde::Serialize;
    use serde::ser;

    /// The walk stopped: a non-finite float, or the value's own error.
    #[derive(Debug)]
    pub(crate) struct Stop;

    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a non-finite float")
        }
    }

    impl std::error::Error for Stop {}

    impl ser::Error for Stop {
        fn custom<T: std::fmt::Display>(_msg: T) -> Self {
            Stop
        }
    }

    /// Whether every float in `value` is finite. Asked of values that serialized to JSON, whose own
    /// `Serialize` does not fail, so a stop is a non-finite float.
    pub(crate) fn check<T: Serialize + ?Sized>(value: &T) -> bool {
        value.serialize(Walk).is_ok()
    }

    /// The walking serializer.
    #[derive(Clone, Copy)]
    pub(crate) struct Walk;

    type R = Result<(), Stop>;

    impl ser::Serializer for Walk {
        type Ok = ();
        type Error = Stop;
        type SerializeSeq = Self;
        type SerializeTuple = Self;
        type SerializeTupleStruct = Self;
        type SerializeTupleVariant = Self;
        type SerializeMap = Self;
        type SerializeStruct = Self;
        type SerializeStructVariant = Self;

        fn serialize_bool(self, _: bool) -> R {
            Ok(())
        }
        fn serialize_i8(self, _: i8) -> R {
            Ok(())
        }
        fn serialize_i16(self, _: i16) -> R {
            Ok(())
        }
        fn serialize_i32(self, _: i32) -> R {
            Ok(())
        }
        fn serialize_i64(self, _: i64) -> R {
            Ok(())
        }
        fn serialize_i128(self, _: i128) -> R {
            Ok(())
        }
        fn serialize_u8(self, _: u8) -> R {
            Ok(())
        }
        fn serialize_u16(self, _: u16) -> R {
            Ok(())
        }
        fn serialize_u32(self, _: u32) -> R {
            Ok(())
        }
        fn serialize_u64(self, _: u64) -> R {
            Ok(())
        }
        fn serialize_u128(self, _: u128) -> R {
            Ok(())
        }
        fn serialize_f32(self, v: f32) -> R {
            if v.is_finite() { Ok(()) } else { Err(Stop) }
        }
        fn serialize_f64(self, v: f64) -> R {
            if v.is_finite() { Ok(()) } else { Err(Stop) }
        }
        fn serialize_char(self, _: char) -> R {
            Ok(())
        }
        fn serialize_str(self, _: &str) -> R {
            Ok(())
        }
        fn serialize_bytes(self, _: &[u8]) -> R {
            Ok(())
        }
        fn serialize_none(self) -> R {
            Ok(())
        }
        fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> R {
            value.serialize(self)
        }
        fn serialize_unit(self) -> R {
            Ok(())
        }
        fn serialize_unit_struct(self, _: &'static str) -> R {
            Ok(())
        }
        fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> R {
            Ok(())
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> R {
            v.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            v: &T,
        ) -> R {
            v.serialize(self)
        }
        fn serialize_seq(self, _: Option<usize>) -> Result<Self, Stop> {
            Ok(self)
        }
        fn serialize_tuple(self, _: usize) -> Result<Self, Stop> {
            Ok(self)
        }
        fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, Stop> {
            Ok(self)
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self, Stop> {
            Ok(self)
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Self, Stop> {
            Ok(self)
        }
        fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Stop> {
            Ok(self)
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self, Stop> {
            Ok(self)
        }
    }

    impl ser::SerializeSeq for Walk {
        type Ok = ();
        type Error = Stop;
        fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
            v.serialize(*self)
        }
        fn end(self) -> R {
            Ok(())
        }
    }
    impl ser::SerializeTuple for Walk {
        type Ok = ();
        type Error = Stop;
        fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
            v.serialize(*self)
        }
        fn end(self) -> R {
            Ok(())
        }
    }
    impl ser::SerializeTupleStruct for Walk {
        type Ok = ();
        type Error = Stop;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
            v.serialize(*self)
        }
        fn end(self) -> R {
            Ok(())
        }
    }
    impl ser::SerializeTupleVariant for Walk {
        type Ok = ();
        type Error = Stop;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
            v.serialize(*self)
        }
        fn end(self) -> R {
            Ok(())
        }
    }
    impl ser::SerializeMap for Walk {
        type Ok = ();
        type Error = Stop;
        fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> R {
            k.serialize(*self)
        }
        fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
            v.serialize(*self)
        }
        fn end(self) -> R {
            Ok(())
        }
    }
    impl ser::SerializeStruct for Walk {
        type Ok = ();
        type Error = Stop;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, v: &T) -> R {
            v.serialize(*self)
        }
        fn end(self) -> R {
            Ok(())
        }
    }
    impl ser::SerializeStructVariant for Walk {
        type Ok = ();
        type Error = Stop;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, v: &T) -> R {
            v.serialize(*self)
        }
        fn end(self) -> R {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(json: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(json).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn decoding_inflates_at_most_the_bound() {
        let json = serde_json::to_vec(&"a".repeat(10_000)).unwrap();
        let packed = gzip(&json);
        assert_eq!(
            decode_within::<String>(&packed, json.len()).unwrap().len(),
            10_000
        );
        let err = decode_within::<String>(&packed, json.len() - 1).unwrap_err();
        assert!(
            matches!(&err, DecodeError::Compression(e) if e.to_string().contains(&format!("more than {} bytes", json.len() - 1))),
            "{err:?}"
        );
        // A trailer that lies about the size changes nothing but the first allocation.
        let mut lying = packed.clone();
        let at = lying.len() - 4;
        lying[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_within::<String>(&lying, 100).is_err());
    }

    #[cfg(feature = "cli")]
    #[test]
    fn a_prefix_is_the_start_of_the_json() {
        let json = serde_json::to_vec(&"a".repeat(10_000)).unwrap();
        for stored in [json.clone(), gzip(&json)] {
            assert_eq!(prefix(&stored, 5).unwrap(), (b"\"aaaa".to_vec(), false));
            assert_eq!(prefix(&stored, json.len()).unwrap(), (json.clone(), true));
        }
        assert!(
            matches!(prefix(&not_serialized("why"), 5), Err(DecodeError::NotSerialized(r)) if r == "why")
        );
    }

    #[test]
    fn a_stored_reason_is_read_with_its_control_characters_escaped() {
        let stored = not_serialized("bad\r\u{1b}]0;title\u{7}");
        assert!(
            matches!(decode::<u8>(&stored), Err(DecodeError::NotSerialized(r)) if r == "bad\\r\\u{1b}]0;title\\u{7}")
        );
    }

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
    fn a_response_that_did_not_serialize_decodes_to_its_reason() {
        let stored = not_serialized("key must be a string");
        assert!(
            matches!(decode::<u8>(&stored), Err(DecodeError::NotSerialized(r)) if r == "key must be a string")
        );
        let long = not_serialized(&"é".repeat(MAX_REASON_BYTES));
        assert!(long.len() <= 1 + MAX_REASON_BYTES);
        assert!(matches!(
            decode::<u8>(&long),
            Err(DecodeError::NotSerialized(_))
        ));
    }

    #[test]
    fn non_finite_floats_are_found_wherever_they_are() {
        let nested = vec![Some((1_u8, f64::NAN))];
        assert!(non_finite(&nested, &to_json(&nested).unwrap()).is_some());
        let map = std::collections::BTreeMap::from([("rate", f32::INFINITY)]);
        assert!(non_finite(&map, &to_json(&map).unwrap()).is_some());
        let none = (None::<f64>, 0.5_f64, f64::MAX);
        assert!(non_finite(&none, &to_json(&none).unwrap()).is_none());
    }

    #[test]
    fn corrupt_compressed_bytes_are_an_error() {
        assert!(matches!(
            decode::<u8>(&[0x1f, 0x8b, 0, 1, 2]),
            Err(DecodeError::Compression(_))
        ));
    }
}
