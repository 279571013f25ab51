//! Key derivation: `"{namespace}#{hex(sha256(canonical_json(key)))}"`, payload fingerprints, and the
//! missing-key rule (`DerivedKey::resolve`).
//!
//! Canonical JSON is what `serde_json::to_vec(&serde_json::to_value(x)?)` gives: object keys sorted,
//! no whitespace. [`Canonical`] writes those same bytes directly, without building the `Value` tree
//! (a `String` per key and per string, a `BTreeMap` per object, a `Value` per leaf), with one output
//! buffer and one scratch stack for the whole value, kept by each thread for its next key or
//! fingerprint: about 2.4 times faster for a small key and 1.9 times for a 10 KB payload (`cargo bench
//! -p idempotent-examples --bench wrapper -- key/`). It also notes as it writes whether the value is a
//! missing key, which the `Value` path's bytes are scanned for. Whatever it does
//! not handle itself, it leaves to the `Value` path, so the bytes are the same in every case (the tests
//! compare both paths over every shape serde has).
//!
//! A value whose JSON repeats a key within one object is refused, on both paths: a `Value` (a map)
//! keeps only the last of the entries, so two different values would have one canonical form, and a
//! caller could choose the entry that survives. With `struct Lookup { tenant: String,
//! #[serde(flatten)] params: BTreeMap<String, String> }`, params holding `tenant = "bob"` would
//! otherwise derive bob's record key and be answered with bob's stored response.

use std::cell::Cell;
use std::ops::Range;

use serde::Serialize;
use serde::ser::{self, Error as _};
use sha2::{Digest, Sha256};

use crate::Error;
use crate::call::{Call, MissingKey};

pub(crate) mod http;

/// `value`'s canonical JSON, as [`with_canonical_json`] gives it.
#[cfg(test)]
fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    with_canonical_json(value, |json, _| json.to_vec())
}

/// Scratch buffers up to this many bytes are kept for the thread's next key or fingerprint; a larger
/// one (a large payload's) is freed.
const SCRATCH_KEPT: usize = 4096;

thread_local! {
    /// The scratch space of the thread's last canonical serialization, kept for its next one: a call
    /// derives a key and a fingerprint, each of which would otherwise allocate its buffers anew.
    static SCRATCH: Cell<Buf> = const {
        Cell::new(Buf {
            bytes: Vec::new(),
            entries: Vec::new(),
            keys: String::new(),
            null_element: false,
            non_finite: false,
            repeated: None,
        })
    };
}

/// Gives `f` the canonical JSON of `value` (object keys sorted, so that maps of any order hash the same,
/// and no whitespace) and whether it is a missing key (see [`is_missing`]). Written in the thread's
/// scratch space, which a serialization nested in `value`'s own `Serialize` finds taken, and then does
/// without.
fn with_canonical_json<T: Serialize + ?Sized, R>(
    value: &T,
    f: impl FnOnce(&[u8], bool) -> R,
) -> Result<R, serde_json::Error> {
    let mut buf = SCRATCH.try_with(Cell::take).unwrap_or_default();
    buf.bytes.clear();
    buf.entries.clear();
    buf.keys.clear();
    buf.null_element = false;
    buf.non_finite = false;
    buf.repeated = None;
    let result = match value.serialize(Canonical::top(&mut buf)) {
        Ok(()) => {
            let missing = buf.null_element || buf.bytes == b"null";
            Ok(f(&buf.bytes, missing))
        }
        Err(_) if buf.non_finite => Err(non_finite_float()),
        Err(_) if buf.repeated.is_some() => {
            Err(repeated_key(buf.repeated.as_deref().unwrap_or("")))
        }
        // Something the direct path leaves to serde_json (serde_json's own private types, a map key
        // `Value` refuses), or a value that does not serialize: the `Value` path gives the same bytes,
        // or the same error. It writes a non-finite float as `null`, so a value with a `null` is
        // checked for one; and it merges repeated keys, so the value is checked for those too.
        Err(_) => canonical_json_via_value(value).and_then(|json| {
            if crate::codec::non_finite(value, &json).is_some() {
                return Err(non_finite_float());
            }
            // What the `Value` path would lose: a repeated key, merged; an integer beyond 64 bits
            // (from raw JSON), rounded to a float, so that two such values would share one record.
            let plain = serde_json::to_vec(value)?;
            if let Some(integer) = wide_integer(&plain) {
                return Err(wide_integer_error(integer));
            }
            if let Some(key) = first_repeated_key(&plain)? {
                return Err(repeated_key(&key));
            }
            Ok(f(&json, is_missing(&json)))
        }),
    };
    if buf.bytes.capacity() <= SCRATCH_KEPT
        && buf.entries.capacity() * std::mem::size_of::<Entry>() <= SCRATCH_KEPT
        && buf.keys.capacity() <= SCRATCH_KEPT
    {
        // On a thread being torn down, the buffers are freed instead.
        let _ = SCRATCH.try_with(|scratch| scratch.set(buf));
    }
    result
}

/// The error of a key or payload with a NaN or an infinity: JSON has neither, and `serde_json` writes
/// `null` for all three (and for `None`), so calls keyed on them would share one record.
#[cold]
fn non_finite_float() -> serde_json::Error {
    serde_json::Error::custom(
        "it contains a non-finite float (NaN or ±infinity), which has no canonical JSON form; use a finite value, or a string for these cases",
    )
}

/// The error of a key or payload whose JSON repeats the object key `key`: a `Value` would keep one of
/// the entries, so two different values would share one canonical form (one record, one fingerprint).
#[cold]
fn repeated_key(key: &str) -> serde_json::Error {
    // The key may be a caller's input: shown quoted and escaped, and cut short.
    const SHOWN: usize = 64;
    let cut = &key[..key.floor_char_boundary(SHOWN)];
    let more = if cut.len() < key.len() { "…" } else { "" };
    serde_json::Error::custom(format_args!(
        "it repeats the object key {cut:?}{more} (a field and an entry of a `#[serde(flatten)]` map with the same name, say), which canonical JSON cannot hold: the entries would merge, and different values would share one record; rename the field, or keep the map in a field of its own"
    ))
}

/// The first object key that `value`'s JSON repeats within one object, if any. For the values the
/// direct path leaves to the `Value` path: their plain JSON (`to_vec`, which keeps every entry, and
/// writes map keys as `to_value` does) is read back, entry by entry.
fn first_repeated_key(json: &[u8]) -> Result<Option<String>, serde_json::Error> {
    Ok(serde_json::from_slice::<repeated::FirstRepeated>(json)?.0)
}

/// The first integer in `json` (outside strings) that neither `i64` nor `u64` holds: canonical JSON
/// (through `serde_json::Value`) would round it to a float.
fn wide_integer(json: &[u8]) -> Option<&str> {
    let mut i = 0;
    let mut in_string = false;
    while i < json.len() {
        let byte = json[i];
        if in_string {
            match byte {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if byte == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if byte == b'-' || byte.is_ascii_digit() {
            let start = i;
            i += 1;
            while json
                .get(i)
                .is_some_and(|c| matches!(c, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-'))
            {
                i += 1;
            }
            let token = std::str::from_utf8(&json[start..i]).ok()?;
            let integer = token.bytes().all(|c| c.is_ascii_digit() || c == b'-');
            if integer && token.parse::<i64>().is_err() && token.parse::<u64>().is_err() {
                return Some(token);
            }
            continue;
        }
        i += 1;
    }
    None
}

#[cold]
fn wide_integer_error(integer: &str) -> serde_json::Error {
    const SHOWN: usize = 40;
    let cut = &integer[..integer.len().min(SHOWN)];
    serde_json::Error::custom(format_args!(
        "it holds the integer {cut} beyond 64 bits, which canonical JSON cannot keep exact (two such values would share one record); send it as a string"
    ))
}

/// The reference: `serde_json::Value` keeps objects in a `BTreeMap`, which sorts their keys.
fn canonical_json_via_value<T: Serialize + ?Sized>(
    value: &T,
) -> Result<Vec<u8>, serde_json::Error> {
    let value = serde_json::to_value(value)?;
    serde_json::to_vec(&value)
}

/// The two lowercase hex digits of every byte, looked up a byte at a time: the `hex` crate's encoder
/// goes a nibble at a time through an iterator, about four times the instructions for a digest.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0_u8; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [DIGITS[byte >> 4], DIGITS[byte & 0xf]];
        byte += 1;
    }
    pairs
};

/// `prefix` followed by the hex SHA-256 of `json`.
fn sha256_hex(json: &[u8], prefix: &[&str]) -> String {
    let digest = Sha256::digest(json);
    let mut hex = [0_u8; 64];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(digest) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(byte)]);
    }
    let mut out = String::with_capacity(prefix.iter().map(|p| p.len()).sum::<usize>() + hex.len());
    for part in prefix {
        out.push_str(part);
    }
    out.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
    out
}

/// `"{namespace}#{hex(sha256(json))}"`, in one allocation.
fn record_key(namespace: &str, json: &[u8]) -> String {
    sha256_hex(json, &[namespace, "#"])
}

/// The record key for `key` in `namespace`: fixed length past the namespace, no personal data, and two
/// namespaces never collide.
///
/// Equal keys give equal record keys when they serialize equally: map and struct entries are sorted, so
/// a `HashMap`'s order does not matter, but a sequence's order is part of its value, and a `HashSet`
/// serializes as a sequence in its (arbitrary) iteration order — key on a `BTreeSet` or a sorted `Vec`.
///
/// Every key is hashed, a missing one (see [`MissingKey`]) included: this is the key a call with
/// [`MissingKey::Allow`] uses. `#[idempotent]` and [`Idempotency::operation`](crate::Idempotency::operation)
/// apply their [`MissingKey`] policy before they get this far.
///
/// A key whose JSON repeats an object key is refused: a struct field and an entry of a
/// `#[serde(flatten)]` map with the same name, map keys of different types with the same text (`1` and
/// `"1"`), a hand-written `Serialize` that writes a field twice. JSON objects hold one value per key,
/// so merging the entries would give two different keys one record: with `struct Lookup { tenant,
/// #[serde(flatten)] params }`, a caller sending the parameter `tenant=bob` would be answered with
/// bob's stored response.
///
/// # Errors
/// `serde_json`'s error when `key` does not serialize (a map with non-string keys, a failing
/// `Serialize`), holds a NaN or an infinity (JSON has neither; `serde_json` would write `null`, the
/// same as for `None`, and calls keyed on them would share one record), or repeats an object key (the
/// error names it).
///
/// ```
/// use std::collections::BTreeMap;
/// #[derive(serde::Serialize)]
/// struct Lookup {
///     tenant: String,
///     #[serde(flatten)]
///     params: BTreeMap<String, String>,
/// }
/// let forged = Lookup {
///     tenant: "alice".into(),
///     params: BTreeMap::from([("tenant".into(), "bob".into())]),
/// };
/// let e = idempotent_runtime::derive_key("shop::lookup", &forged).unwrap_err();
/// assert!(e.to_string().contains("repeats the object key \"tenant\""));
///
/// assert!(idempotent_runtime::derive_key("stats::rate", &("acme", f64::NAN)).is_err());
/// let key = idempotent_runtime::derive_key("billing::charge", &("acme", 42)).unwrap();
/// assert!(key.starts_with("billing::charge#"));
/// assert_eq!(key.len(), "billing::charge#".len() + 64);
/// ```
pub fn derive_key<T: Serialize + ?Sized>(
    namespace: &str,
    key: &T,
) -> Result<String, serde_json::Error> {
    with_canonical_json(key, |json, _| record_key(namespace, json))
}

/// The fingerprint stored for a `payload`: hex SHA-256 of its canonical JSON.
///
/// A payload whose JSON repeats an object key is refused, as in [`derive_key`]: merged, `{amount:
/// 5000}` with a flattened extra entry `amount: 5` would have the fingerprint of `{amount: 5}`, and
/// pass for it.
///
/// # Errors
/// `serde_json`'s error when `payload` does not serialize, holds a NaN or an infinity, or repeats an
/// object key.
pub fn fingerprint<T: Serialize + ?Sized>(payload: &T) -> Result<String, serde_json::Error> {
    with_canonical_json(payload, |json, _| sha256_hex(json, &[]))
}

/// The fingerprint of `call`'s payload ([`fingerprint`]), a payload that does not serialize reported as
/// the call's [`Error::Serialize`].
pub(crate) fn fingerprint_for<T: Serialize + ?Sized>(
    call: &Call,
    payload: &T,
) -> Result<String, Error> {
    fingerprint(payload).map_err(|source| Error::Serialize {
        namespace: call.namespace.to_owned(),
        what: "payload",
        source,
    })
}

/// A record key, and whether the key it was derived from is missing. Both front doors (the attribute's
/// generated code and [`Operation`](crate::Operation)) derive one first and decide what it means later,
/// with `resolve`, once the call's [`MissingKey`] policy is known.
#[derive(Debug, Clone)]
pub struct DerivedKey {
    key: String,
    missing: bool,
}

impl DerivedKey {
    /// Derives the record key for `key` in `namespace` (as [`derive_key`]) and tells whether `key` is
    /// missing, from the one canonical serialization both need.
    pub(crate) fn new<T: Serialize + ?Sized>(
        namespace: &str,
        key: &T,
    ) -> Result<Self, serde_json::Error> {
        with_canonical_json(key, |json, missing| DerivedKey {
            missing,
            key: record_key(namespace, json),
        })
    }

    /// The record key for `call` ([`DerivedKey::new`] in its namespace), a key that does not serialize
    /// reported as the call's [`Error::Serialize`].
    pub(crate) fn for_call<T: Serialize + ?Sized>(call: &Call, key: &T) -> Result<Self, Error> {
        Self::new(call.namespace, key).map_err(|source| Error::Serialize {
            namespace: call.namespace.to_owned(),
            what: "key",
            source,
        })
    }

    /// Applies `call`'s [`MissingKey`] policy: the record key to run with, or `None` to run the body
    /// without idempotency ([`MissingKey::Skip`]). `stages_writes` says the call has business writes
    /// that can only commit together with a record (`transact`, `claim_with`): skipping would drop them
    /// silently, so a missing key is rejected there whatever the policy says, unless it is `Allow`.
    ///
    /// # Errors
    /// [`Error::MissingKey`] when the key is missing and the policy does not allow it.
    pub(crate) fn resolve(self, call: &Call, stages_writes: bool) -> Result<Option<String>, Error> {
        if !self.missing {
            return Ok(Some(self.key));
        }
        match call.missing_key {
            MissingKey::Allow => Ok(Some(self.key)),
            MissingKey::Skip if !stages_writes => {
                tracing::warn!(
                    namespace = call.namespace,
                    "the idempotency key is missing; running the body without idempotency (missing_key = \"skip\")"
                );
                crate::telemetry::finish_early(call.namespace, crate::telemetry::Outcome::Skipped);
                Ok(None)
            }
            MissingKey::Reject | MissingKey::Skip => {
                crate::telemetry::finish_early(
                    call.namespace,
                    crate::telemetry::Outcome::MissingKey,
                );
                Err(Error::MissingKey {
                    namespace: call.namespace.to_owned(),
                })
            }
        }
    }
}

/// Whether the canonical JSON `json` is a missing key: `null`, or a top-level array (tuples serialize as
/// arrays) with a `null` element. Deeper nulls are values: `(1, (None, 2))` and `{"a": null}` are keys.
/// The direct path tells as it writes (`Buf::null_element`); this reads it back from the `Value` path's
/// bytes.
fn is_missing(json: &[u8]) -> bool {
    match json {
        b"null" => true,
        // Without an `n` anywhere (one vectorized search), there is no `null` to find.
        [b'[', ..] => json.contains(&b'n') && has_null_element(json),
        _ => false,
    }
}

/// Whether the canonical JSON array `array` has a `null` element at its top level.
fn has_null_element(array: &[u8]) -> bool {
    let mut depth = 0_usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in array {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth -= 1,
            // Canonical JSON has no whitespace, and no number or boolean contains an `n`: outside
            // strings, it can only begin a `null`.
            b'n' if depth == 1 => return true,
            _ => {}
        }
    }
    false
}

/// Tells [`with_canonical_json`] to take the `Value` path; never seen by callers.
fn unsupported() -> serde_json::Error {
    serde_json::Error::custom("not on the direct canonical path")
}

/// `serde_json`'s own types (`Number` under `arbitrary_precision`, `RawValue`) announce themselves with
/// these names and are special-cased by `to_value`.
fn is_serde_json_private(name: &str) -> bool {
    name.starts_with("$serde_json::private::")
}

/// Writes a leaf exactly as `to_vec(&to_value(leaf))` would (floats become `null` when not finite,
/// 128-bit integers fail outside 64 bits).
fn leaf_via_value<T: Serialize + ?Sized>(out: &mut Buf, leaf: &T) -> Result<(), serde_json::Error> {
    serde_json::to_writer(&mut out.bytes, &serde_json::to_value(leaf)?)
}

fn write_json<T: Serialize + ?Sized>(out: &mut Buf, leaf: &T) -> Result<(), serde_json::Error> {
    serde_json::to_writer(&mut out.bytes, leaf)
}

/// The output, and the scratch space objects share (one stack of entries and of owned keys for the whole
/// value, so that nested objects allocate nothing of their own).
#[derive(Default)]
struct Buf {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
    keys: String,
    /// Whether the value is an array with a `null` element at its top level.
    null_element: bool,
    /// Whether the serializer stopped at a non-finite float (see [`non_finite_float`]).
    non_finite: bool,
    /// The object key the serializer stopped at for being repeated (see [`repeated_key`]).
    repeated: Option<String>,
}

/// One object entry: its key, and where its value's canonical bytes sit in the output for now.
struct Entry {
    key: Key,
    value: Range<usize>,
}

/// A struct field's name, or a map key's text in [`Buf::keys`].
enum Key {
    Static(&'static str),
    Owned(Range<usize>),
}

impl Key {
    fn text<'k>(&'k self, keys: &'k str) -> &'k str {
        match self {
            Key::Static(name) => name,
            Key::Owned(range) => &keys[range.clone()],
        }
    }
}

/// The canonical-JSON serializer: writes scalars and sequences as they come, and buffers each object's
/// entries to write them sorted by key (a key written twice is refused: see [`repeated_key`]).
struct Canonical<'a> {
    out: &'a mut Buf,
    /// Whether this is the whole value (or all of it but a newtype or `Some` around it), whose array's
    /// `null` elements make a missing key.
    top: bool,
}

/// A sequence (or tuple) being written; `close` ends it (`]`, or `]}` inside a tuple variant).
struct Seq<'a> {
    out: &'a mut Buf,
    first: bool,
    close: &'static [u8],
    /// The value's top-level array: a `null` element is noted in `Buf::null_element`.
    top: bool,
}

/// An object being collected: each value's canonical bytes go to the output after `start` for now, its
/// entry onto the buffer's shared stack (from `base`); `finish` writes them sorted in their place.
struct Object<'a> {
    out: &'a mut Buf,
    start: usize,
    base: usize,
    keys_base: usize,
    next_key: Option<Key>,
    close: &'static [u8],
}

impl<'a> Object<'a> {
    fn new(out: &'a mut Buf, close: &'static [u8]) -> Self {
        Object {
            start: out.bytes.len(),
            base: out.entries.len(),
            keys_base: out.keys.len(),
            out,
            next_key: None,
            close,
        }
    }

    fn key<K: Serialize + ?Sized>(&mut self, key: &K) -> Result<(), serde_json::Error> {
        let from = self.out.keys.len();
        key.serialize(MapKey {
            keys: &mut self.out.keys,
        })?;
        self.next_key = Some(Key::Owned(from..self.out.keys.len()));
        Ok(())
    }

    fn field(&mut self, name: &'static str) {
        self.next_key = Some(Key::Static(name));
    }

    fn value<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), serde_json::Error> {
        let key = self
            .next_key
            .take()
            .ok_or_else(|| serde_json::Error::custom("map value without a key"))?;
        let from = self.out.bytes.len();
        // A nested object pushes its entries above ours and pops them before it returns.
        value.serialize(Canonical::nested(self.out))?;
        let to = self.out.bytes.len();
        self.out.entries.push(Entry {
            key,
            value: from..to,
        });
        Ok(())
    }

    fn finish(self) -> Result<(), serde_json::Error> {
        let Object {
            out,
            start,
            base,
            keys_base,
            close,
            ..
        } = self;
        let Buf {
            bytes,
            entries,
            keys,
            repeated,
            ..
        } = out;
        let entries_here = &mut entries[base..];
        entries_here.sort_unstable_by(|a, b| a.key.text(keys).cmp(b.key.text(keys)));
        if let Some(pair) = entries_here
            .windows(2)
            .find(|pair| pair[0].key.text(keys) == pair[1].key.text(keys))
        {
            *repeated = Some(pair[0].key.text(keys).to_owned());
            return Err(repeated_key(pair[0].key.text(keys)));
        }
        // Write the object after the values, then move it over them.
        let sorted = bytes.len();
        bytes.push(b'{');
        let mut first = true;
        for entry in entries_here.iter() {
            let key = entry.key.text(keys);
            if !first {
                bytes.push(b',');
            }
            first = false;
            serde_json::to_writer(&mut *bytes, key)?;
            bytes.push(b':');
            bytes.extend_from_within(entry.value.clone());
        }
        bytes.extend_from_slice(close);
        let len = bytes.len() - sorted;
        bytes.copy_within(sorted.., start);
        bytes.truncate(start + len);
        entries.truncate(base);
        keys.truncate(keys_base);
        Ok(())
    }
}

impl<'a> Canonical<'a> {
    /// The serializer of a whole value.
    fn top(out: &'a mut Buf) -> Self {
        Canonical { out, top: true }
    }

    /// The serializer of a value inside another.
    fn nested(out: &'a mut Buf) -> Self {
        Canonical { out, top: false }
    }

    fn seq(self, close: &'static [u8]) -> Seq<'a> {
        self.out.bytes.push(b'[');
        Seq {
            out: self.out,
            first: true,
            // A tuple variant's array (`{"V":[..]}`) is inside an object.
            top: self.top && close == b"]",
            close,
        }
    }

    /// `{"variant":` — the opening of an externally tagged enum variant with data.
    fn tag(&mut self, variant: &str) -> Result<(), serde_json::Error> {
        self.out.bytes.push(b'{');
        write_json(self.out, variant)?;
        self.out.bytes.push(b':');
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        if !self.first {
            self.out.bytes.push(b',');
        }
        self.first = false;
        let from = self.out.bytes.len();
        value.serialize(Canonical::nested(self.out))?;
        if self.top && self.out.bytes[from..] == *b"null" {
            self.out.null_element = true;
        }
        Ok(())
    }

    fn end(self) -> Result<(), Self::Error> {
        self.out.bytes.extend_from_slice(self.close);
        Ok(())
    }
}

impl ser::SerializeTuple for Seq<'_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }

    fn end(self) -> Result<(), Self::Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleStruct for Seq<'_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }

    fn end(self) -> Result<(), Self::Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleVariant for Seq<'_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }

    fn end(self) -> Result<(), Self::Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Self::Error> {
        self.key(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        self.value(value)
    }

    fn end(self) -> Result<(), Self::Error> {
        self.finish()
    }
}

impl ser::SerializeStruct for Object<'_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        self.field(key);
        self.value(value)
    }

    fn end(self) -> Result<(), Self::Error> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Object<'_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        self.field(key);
        self.value(value)
    }

    fn end(self) -> Result<(), Self::Error> {
        self.finish()
    }
}

impl<'a> ser::Serializer for Canonical<'a> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_i8(self, v: i8) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), Self::Error> {
        leaf_via_value(self.out, &v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), Self::Error> {
        write_json(self.out, &v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Self::Error> {
        leaf_via_value(self.out, &v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Self::Error> {
        if !v.is_finite() {
            self.out.non_finite = true;
            return Err(non_finite_float());
        }
        leaf_via_value(self.out, &v)
    }
    fn serialize_f64(self, v: f64) -> Result<(), Self::Error> {
        if !v.is_finite() {
            self.out.non_finite = true;
            return Err(non_finite_float());
        }
        leaf_via_value(self.out, &v)
    }
    fn serialize_char(self, v: char) -> Result<(), Self::Error> {
        write_json(self.out, v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Self::Error> {
        write_json(self.out, v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Self::Error> {
        // `to_value` makes bytes an array of numbers.
        let mut seq = self.seq(b"]");
        for b in v {
            ser::SerializeSeq::serialize_element(&mut seq, b)?;
        }
        ser::SerializeSeq::end(seq)
    }
    fn serialize_none(self) -> Result<(), Self::Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Self::Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Self::Error> {
        self.out.bytes.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Self::Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Self::Error> {
        write_json(self.out, variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        if is_serde_json_private(name) {
            return Err(unsupported());
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        self.tag(variant)?;
        value.serialize(Canonical::nested(self.out))?;
        self.out.bytes.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, Self::Error> {
        Ok(self.seq(b"]"))
    }
    fn serialize_tuple(self, _len: usize) -> Result<Seq<'a>, Self::Error> {
        Ok(self.seq(b"]"))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, Self::Error> {
        Ok(self.seq(b"]"))
    }
    fn serialize_tuple_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, Self::Error> {
        self.tag(variant)?;
        Ok(self.seq(b"]}"))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Object<'a>, Self::Error> {
        Ok(Object::new(self.out, b"}"))
    }
    fn serialize_struct(self, name: &'static str, _len: usize) -> Result<Object<'a>, Self::Error> {
        if is_serde_json_private(name) {
            return Err(unsupported());
        }
        Ok(Object::new(self.out, b"}"))
    }
    fn serialize_struct_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Object<'a>, Self::Error> {
        self.tag(variant)?;
        Ok(Object::new(self.out, b"}}"))
    }
}

/// A map key, as `to_value` turns it into an object key: strings, chars, booleans, integers, finite
/// floats (in `serde_json`'s own shortest form) and unit variants, written as text. Anything else is
/// left to the `Value` path.
struct MapKey<'a> {
    keys: &'a mut String,
}

impl MapKey<'_> {
    // Returns the serializer methods' result type, so that they can end with it.
    #[allow(clippy::unnecessary_wraps)]
    fn text(self, text: &str) -> Result<(), serde_json::Error> {
        self.keys.push_str(text);
        Ok(())
    }

    fn integer(self, v: impl std::fmt::Display) -> Result<(), serde_json::Error> {
        use std::fmt::Write as _;
        write!(self.keys, "{v}").map_err(serde_json::Error::custom)
    }

    /// A finite float as `serde_json` writes it, in a number or a map key alike; a non-finite one, which
    /// `to_value` refuses as a key, is left to it for its error.
    fn float<F: Serialize>(self, v: F, finite: bool) -> Result<(), serde_json::Error> {
        if !finite {
            return Err(unsupported());
        }
        self.text(&serde_json::to_string(&v)?)
    }
}

impl ser::Serializer for MapKey<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = ser::Impossible<(), serde_json::Error>;
    type SerializeTuple = ser::Impossible<(), serde_json::Error>;
    type SerializeTupleStruct = ser::Impossible<(), serde_json::Error>;
    type SerializeTupleVariant = ser::Impossible<(), serde_json::Error>;
    type SerializeMap = ser::Impossible<(), serde_json::Error>;
    type SerializeStruct = ser::Impossible<(), serde_json::Error>;
    type SerializeStructVariant = ser::Impossible<(), serde_json::Error>;

    fn serialize_bool(self, v: bool) -> Result<(), Self::Error> {
        self.text(if v { "true" } else { "false" })
    }
    fn serialize_i8(self, v: i8) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Self::Error> {
        self.integer(v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Self::Error> {
        self.float(v, v.is_finite())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Self::Error> {
        self.float(v, v.is_finite())
    }
    fn serialize_char(self, v: char) -> Result<(), Self::Error> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Self::Error> {
        self.text(v)
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Self::Error> {
        Err(unsupported())
    }
    fn serialize_none(self) -> Result<(), Self::Error> {
        Err(unsupported())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), Self::Error> {
        Err(unsupported())
    }
    fn serialize_unit(self) -> Result<(), Self::Error> {
        Err(unsupported())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Self::Error> {
        Err(unsupported())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Self::Error> {
        self.text(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        if is_serde_json_private(name) {
            return Err(unsupported());
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Self::Error> {
        Err(unsupported())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Self::Error> {
        Err(unsupported())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Self::Error> {
        Err(unsupported())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Self::Error> {
        Err(unsupported())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Self::Error> {
        Err(unsupported())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Self::Error> {
        Err(unsupported())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Self::Error> {
        Err(unsupported())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Self::Error> {
        Err(unsupported())
    }
}

/// Reads JSON back to find the first object key repeated within one object ([`first_repeated_key`]):
/// a `Deserialize` that keeps nothing but that key.
mod repeated {
    use std::collections::HashSet;
    use std::fmt;

    use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// The first repeated object key in a JSON document, if any.
    pub(super) struct FirstRepeated(pub(super) Option<String>);

    impl<'de> Deserialize<'de> for FirstRepeated {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(Find)
        }
    }

    struct Find;

    impl<'de> Visitor<'de> for Find {
        type Value = FirstRepeated;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_bool<E>(self, _: bool) -> Result<FirstRepeated, E> {
            Ok(FirstRepeated(None))
        }
        fn visit_i64<E>(self, _: i64) -> Result<FirstRepeated, E> {
            Ok(FirstRepeated(None))
        }
        fn visit_u64<E>(self, _: u64) -> Result<FirstRepeated, E> {
            Ok(FirstRepeated(None))
        }
        fn visit_i128<E>(self, _: i128) -> Result<FirstRepeated, E> {
            Ok(FirstRepeated(None))
        }
        fn visit_u128<E>(self, _: u128) -> Result<FirstRepeated, E> {
            Ok(FirstRepeated(None))
        }
        fn visit_f64<E>(self, _: f64) -> Result<FirstRepeated, E> {
            Ok(FirstRepeated(None))
        }
        fn visit_str<E>(self, _: &str) -> Result<FirstRepeated, E> {
            Ok(FirstRepeated(None))
        }
        fn visit_unit<E>(self) -> Result<FirstRepeated, E> {
            Ok(FirstRepeated(None))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstRepeated, A::Error> {
            let mut found = None;
            while let Some(FirstRepeated(inner)) = seq.next_element()? {
                found = found.or(inner);
            }
            Ok(FirstRepeated(found))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FirstRepeated, A::Error> {
            let mut seen = HashSet::new();
            let mut found = None;
            while let Some(key) = map.next_key::<String>()? {
                if found.is_some() {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                let FirstRepeated(inner) = map.next_value()?;
                if seen.contains(&key) {
                    found = Some(key);
                } else {
                    found = inner;
                    seen.insert(key);
                }
            }
            Ok(FirstRepeated(found))
        }
    }

    #[cfg(test)]
    #[test]
    fn finds_a_key_repeated_at_any_depth() {
        let find = |json: &str| serde_json::from_str::<FirstRepeated>(json).unwrap().0;
        assert_eq!(find(r#"{"a":1,"b":2}"#), None);
        assert_eq!(find(r#"{"a":1,"b":{"a":2}}"#), None);
        assert_eq!(find(r#"{"a":1,"a":2}"#).as_deref(), Some("a"));
        assert_eq!(
            find(r#"[0,{"x":[{"k":1,"\u006b":2}]}]"#).as_deref(),
            Some("k")
        );
        assert_eq!(find(r#""a""#), None);
    }
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

    /// Record keys and fingerprints as stored: a key with a string and a payload whose strings need
    /// escaping, against SHA-256 of their canonical JSON computed elsewhere. Records written before
    /// must still be found and matched, whatever writes the JSON or the hex digits.
    #[test]
    fn stored_keys_and_fingerprints_are_pinned() {
        #[derive(Serialize)]
        struct Charge {
            tenant: u32,
            order_id: &'static str,
            amount_cents: u64,
            currency: &'static str,
            note: &'static str,
        }
        assert_eq!(
            derive_key("billing::charge", &(7, "order-1")).unwrap(),
            "billing::charge#74b52055c4b98f58ea481081ce07206f5b644f77e36051e0e34067743538a392"
        );
        let charge = Charge {
            tenant: 7,
            order_id: "order-1",
            amount_cents: 4_200,
            currency: "EUR",
            note: "say \"hi\"\n",
        };
        // {"amount_cents":4200,"currency":"EUR","note":"say \"hi\"\n","order_id":"order-1","tenant":7}
        assert_eq!(
            fingerprint(&charge).unwrap(),
            "70585f591ad7ea44b2dd8e297095e5eaa3665078ef2d12a9084149566dc62060"
        );
    }

    #[test]
    fn hex_digits_are_the_hex_crates_for_every_byte() {
        let every: Vec<u8> = (0..=u8::MAX).collect();
        let ours: Vec<u8> = every
            .iter()
            .flat_map(|&b| HEX_PAIRS[usize::from(b)])
            .collect();
        assert_eq!(String::from_utf8(ours).unwrap(), hex::encode(&every));
    }

    /// A payload whose own `Serialize` takes a fingerprint: the inner one finds the thread's scratch
    /// space taken by the outer one, and both give what they give on their own.
    #[test]
    fn a_fingerprint_taken_while_serializing_another_is_unaffected() {
        struct Signed(u32);
        impl Serialize for Signed {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let inner = fingerprint(&self.0).map_err(S::Error::custom)?;
                (self.0, inner).serialize(s)
            }
        }
        let inner = fingerprint(&7_u32).unwrap();
        let expected = sha256_hex(&serde_json::to_vec(&(7_u32, &inner)).unwrap(), &[]);
        assert_eq!(fingerprint(&Signed(7)).unwrap(), expected);
        // And the scratch space left behind serves the next call as a fresh one would.
        assert_eq!(fingerprint(&7_u32).unwrap(), inner);
        assert_eq!(fingerprint(&(7_u32, &inner)).unwrap(), expected);
    }

    /// A large payload's buffer is freed after its fingerprint, not kept for the thread's next call.
    #[test]
    fn a_large_payloads_scratch_space_is_not_kept() {
        let kept = || {
            SCRATCH.with(|scratch| {
                let buf = scratch.take();
                let capacity = buf.bytes.capacity();
                scratch.set(buf);
                capacity
            })
        };
        fingerprint(&("a", 1)).unwrap();
        assert!(kept() > 0, "a small payload's buffer is kept");
        fingerprint(&"x".repeat(10 * SCRATCH_KEPT)).unwrap();
        assert!(kept() <= SCRATCH_KEPT, "kept {} bytes", kept());
    }

    #[test]
    fn unserializable_key_is_an_error() {
        let bad: HashMap<(i32, i32), i32> = [((1, 2), 3)].into();
        assert!(derive_key("n", &bad).is_err());
    }

    use std::collections::BTreeMap;

    /// [`same`], and the direct path handled the value itself (no fallback).
    #[track_caller]
    fn direct<T: Serialize + ?Sized>(value: &T) {
        let mut buf = Buf::default();
        if let Err(e) = value.serialize(Canonical::top(&mut buf)) {
            panic!("left to the Value path: {e}");
        }
        same(value);
    }

    /// The direct path must give exactly the `Value` path's bytes (and fail where it fails).
    #[track_caller]
    fn same<T: Serialize + ?Sized>(value: &T) {
        let mut buf = Buf::default();
        let direct = value
            .serialize(Canonical::top(&mut buf))
            .map(|()| buf.bytes);
        let reference = canonical_json_via_value(value);
        match (&direct, &reference) {
            (Ok(d), Ok(r)) => assert_eq!(
                String::from_utf8_lossy(d),
                String::from_utf8_lossy(r),
                "direct and Value paths differ"
            ),
            // The direct path may leave a value to the `Value` path; the public result is then the
            // reference's, which is what `canonical_json` returns.
            (Err(_), _) => {}
            (Ok(d), Err(e)) => panic!(
                "direct gave {:?}, Value failed: {e}",
                String::from_utf8_lossy(d)
            ),
        }
        match (canonical_json(value), reference) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("canonical_json {a:?} vs reference {b:?}"),
        }
    }

    #[derive(Serialize)]
    struct Inner {
        z: u8,
        a: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<u8>,
    }

    #[derive(Serialize)]
    struct Outer {
        zeta: Vec<Inner>,
        alpha: (u32, &'static str, char),
        #[serde(flatten)]
        extra: BTreeMap<String, i64>,
        unit: (),
        newtype: Newtype,
        unit_struct: UnitStruct,
        tuple_struct: TupleStruct,
        kinds: Vec<Kind>,
        float: f64,
        small: f32,
    }

    #[derive(Serialize)]
    struct Newtype(i16);
    #[derive(Serialize)]
    struct UnitStruct;
    #[derive(Serialize)]
    struct TupleStruct(u8, bool);

    #[derive(Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
    enum Kind {
        Unit,
        Newtype(u8),
        Tuple(u8, String),
        Struct { y: u8, b: u8 },
    }

    #[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
    enum KeyKind {
        First,
        Second,
    }

    /// Writes the same keys twice: a `BTreeMap` would keep the last values, so it is refused.
    struct Duplicates;
    impl Serialize for Duplicates {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(None)?;
            map.serialize_entry("b", &1)?;
            map.serialize_entry("a", &2)?;
            map.serialize_entry("b", &3)?;
            map.serialize_entry("a", &4)?;
            map.end()
        }
    }

    struct Bytes(&'static [u8]);
    impl Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    struct Fails;
    impl Serialize for Fails {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("this value refuses to serialize"))
        }
    }

    #[test]
    fn direct_path_matches_value_path_for_every_shape() {
        let outer = Outer {
            zeta: vec![
                Inner {
                    z: 1,
                    a: None,
                    skipped: None,
                },
                Inner {
                    z: 2,
                    a: Some("quote \" backslash \\ newline \n é \u{1F600} \u{7}".into()),
                    skipped: Some(3),
                },
            ],
            alpha: (7, "order-1", 'ß'),
            extra: [("mid".to_owned(), -5), ("aa".to_owned(), i64::MIN)].into(),
            unit: (),
            newtype: Newtype(-3),
            unit_struct: UnitStruct,
            tuple_struct: TupleStruct(9, true),
            kinds: vec![
                Kind::Unit,
                Kind::Newtype(1),
                Kind::Tuple(2, "x".into()),
                Kind::Struct { y: 1, b: 2 },
            ],
            float: 0.1,
            small: 0.1,
        };
        direct(&outer);
        direct(&(1_u8, -1_i8, u64::MAX, i64::MIN, true, false, 'x', "s"));
        direct(&[0.5_f64, -0.0, 1e300, 3.0]);
        direct(&[0.1_f32, 16_777_217.0]);
        // JSON has no NaN or infinity (serde_json writes `null`, as for `None`): an error on both
        // paths, so that keys differing only there never share a record.
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(canonical_json(&[0.5, v]).is_err());
            assert!(canonical_json(&(Some(v), 1_u8)).is_err());
            // Where the direct path gives up first (at a 128-bit map key), the `Value` path checks too.
            assert!(canonical_json(&(HashMap::from([(1_u128, 1_u8)]), [v])).is_err());
        }
        assert!(canonical_json(&[f32::NAN]).is_err());
        direct(&(1_i128, -1_i128, u128::from(u64::MAX)));
        same(&u128::MAX); // out of range for `Value`: the same error on both paths
        same(&i128::MIN);
        direct(&Bytes(b"\x00\x01\xff"));
        refused(&Duplicates, "a");
        same(&Fails);
        direct(&vec![Some(1), None]);
        direct(&BTreeMap::<String, u8>::new());
        direct(&Vec::<u8>::new());
        direct(&serde_json::json!({"b": [1, {"d": 1, "c": 2}], "a": null, "": "empty key"}));
    }

    #[test]
    fn map_keys_are_turned_into_strings_like_value_does() {
        direct(&HashMap::from([(3_u8, "c"), (1, "a"), (20, "b")]));
        direct(&HashMap::from([(-3_i64, 1), (i64::MAX, 2)]));
        direct(&HashMap::from([(u128::MAX, 1), (0, 2)]));
        direct(&HashMap::from([(true, 1), (false, 2)]));
        direct(&HashMap::from([('b', 1), ('a', 2), ('"', 3)]));
        direct(&BTreeMap::from([(KeyKind::Second, 1), (KeyKind::First, 2)]));
        direct(&HashMap::from([
            ("b\"".to_owned(), 1),
            ("b\\".to_owned(), 2),
            ("b".to_owned(), 3),
        ]));
        // Keys `Value` turns into strings itself (floats) or refuses (tuples, newtype variants,
        // options): left to the `Value` path, with its result or its error.
        same(&HashMap::from([((1, 2), 3)]));
        same(&BTreeMap::from([(Kind::Newtype(1), 1)]));
        same(&BTreeMap::from([(Some(1), 1)]));
    }

    /// A map with float keys, which `Value` formats itself.
    struct FloatKeys;
    impl Serialize for FloatKeys {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(Some(2))?;
            map.serialize_entry(&2.5_f64, "b")?;
            map.serialize_entry(&-1.0_f32, "a")?;
            map.end()
        }
    }

    #[test]
    fn float_map_keys_are_written_as_value_writes_them() {
        direct(&FloatKeys);
        direct(&Entries(vec![(0.1_f32, 1), (-0.0, 2), (3e38_f32, 3)]));
        direct(&Entries(vec![
            (1e-7_f64, 1),
            (123_456_789.5, 2),
            (0.0, 3),
            (1e300, 4),
        ]));
        // A non-finite key, which `Value` refuses: its error on both paths.
        same(&Entries(vec![(f64::INFINITY, 1)]));
        assert!(canonical_json(&Entries(vec![(f64::NAN, 1)])).is_err());
    }

    /// `value`'s canonical JSON is refused for repeating the object key `key`, on the direct path and
    /// on the `Value` path (which would merge the entries).
    #[track_caller]
    fn refused<T: Serialize + ?Sized>(value: &T, key: &str) {
        let shown = format!("repeats the object key {key:?}");
        match canonical_json(value) {
            Err(e) => assert!(e.to_string().contains(&shown), "{e}"),
            Ok(json) => panic!("accepted as {}", String::from_utf8_lossy(&json)),
        }
        if let Err(e) = value.serialize(Canonical::top(&mut Buf::default())) {
            assert!(
                e.to_string().contains(&shown) || e.to_string().contains("direct"),
                "{e}"
            );
        }
        // The `Value` path's check finds one too (the first in the order written).
        assert!(
            first_repeated_key(&serde_json::to_vec(value).unwrap())
                .unwrap()
                .is_some()
        );
        assert!(derive_key("n", value).is_err());
        assert!(fingerprint(value).is_err());
    }

    /// A map that writes `entries` as they are, repeated keys included.
    struct Entries<K, V>(Vec<(K, V)>);
    impl<K: Serialize, V: Serialize> Serialize for Entries<K, V> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(Some(self.0.len()))?;
            for (k, v) in &self.0 {
                map.serialize_entry(k, v)?;
            }
            map.end()
        }
    }

    /// A field and an entry of a flattened map with the same name.
    #[derive(Serialize)]
    struct Lookup {
        tenant: &'static str,
        #[serde(flatten)]
        params: BTreeMap<&'static str, &'static str>,
    }

    /// A struct that names one field twice, as a hand-written `Serialize` may.
    struct TwiceNamed;
    impl Serialize for TwiceNamed {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeStruct;
            let mut st = s.serialize_struct("TwiceNamed", 2)?;
            st.serialize_field("amount", &5000)?;
            st.serialize_field("amount", &5)?;
            st.end()
        }
    }

    /// A float key and a string key with the same text.
    struct FloatAndText;
    impl Serialize for FloatAndText {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(Some(2))?;
            map.serialize_entry(&1.0_f64, &1)?;
            map.serialize_entry("1.0", &2)?;
            map.end()
        }
    }

    #[test]
    fn repeated_object_keys_are_refused_on_every_path() {
        // A field shadowed by a flattened map's entry: the record key of another tenant otherwise.
        refused(
            &Lookup {
                tenant: "alice",
                params: BTreeMap::from([("order", "1"), ("tenant", "bob")]),
            },
            "tenant",
        );
        direct(&Lookup {
            tenant: "alice",
            params: BTreeMap::from([("order", "1")]),
        });
        refused(&TwiceNamed, "amount");
        // Keys of different types that turn into the same text.
        refused(
            &Entries(vec![(serde_json::json!(1), 1), (serde_json::json!("1"), 2)]),
            "1",
        );
        refused(&(1, Entries(vec![("x", 1), ("x", 1)])), "x");
        refused(
            &[
                Entries(vec![(true, 1)]),
                Entries(vec![(false, 1), (false, 2)]),
            ],
            "false",
        );
        // Float keys, which the direct path writes itself: `1.0` and the string "1.0".
        refused(&FloatAndText, "1.0");
        // What only the `Value` path writes (serde_json's raw JSON): checked there.
        let raw =
            serde_json::value::RawValue::from_string(r#"{"a":1,"b":{"k":1,"\u006b":2}}"#.into())
                .unwrap();
        refused(&raw, "k");
        refused(&(raw.as_ref(), 2), "k");
        let fine =
            serde_json::value::RawValue::from_string(r#"{"a":1,"b":{"k":1}}"#.into()).unwrap();
        same(&fine);
        assert!(canonical_json(&fine).is_ok());
        // A long key is shown cut short.
        let long: &'static str = "k".repeat(1000).leak();
        let e = canonical_json(&Entries(vec![(long, 1), (long, 2)])).unwrap_err();
        assert!(e.to_string().len() < 600, "{e}");
    }

    #[test]
    fn nested_objects_share_the_scratch_space_correctly() {
        let inner: BTreeMap<String, Vec<BTreeMap<String, u8>>> = [
            (
                "z".to_owned(),
                vec![[("b".to_owned(), 1), ("a".to_owned(), 2)].into()],
            ),
            (
                "m".to_owned(),
                vec![BTreeMap::new(), [("k".to_owned(), 3)].into()],
            ),
        ]
        .into();
        direct(&HashMap::from([
            ("outer-b", serde_json::to_value(&inner).unwrap()),
            (
                "outer-a",
                serde_json::json!({"y": {"x": [{"d": 4, "c": 3}]}}),
            ),
        ]));
        refused(
            &vec![
                (Duplicates, Kind::Struct { y: 2, b: 1 }),
                (Duplicates, Kind::Unit),
            ],
            "a",
        );
        refused(
            &HashMap::from([(1_u8, vec![Duplicates]), (0_u8, vec![])]),
            "a",
        );
        // An object refused deep inside leaves the scratch space fit for the next value.
        direct(&vec![(
            Kind::Struct { y: 2, b: 1 },
            BTreeMap::from([("z", 1), ("a", 2)]),
        )]);
    }

    /// Whether `key` is missing.
    fn missing<T: Serialize + ?Sized>(key: &T) -> bool {
        DerivedKey::new("n", key).unwrap().missing
    }

    #[derive(Serialize)]
    struct Order {
        tenant: u32,
        id: Option<String>,
    }

    #[test]
    fn null_and_null_parts_of_a_tuple_or_array_are_missing() {
        assert!(missing(&None::<String>));
        // serde writes `Some(None)` as a plain `null`: nothing tells it from `None`.
        assert!(missing(&Some(None::<u8>)));
        assert!(missing(&(1, None::<u8>)));
        assert!(missing(&(None::<u8>,)));
        assert!(missing(&[Some(1), None]));
        assert!(missing(&vec![None::<u8>, Some(2)]));
        assert!(missing(&serde_json::Value::Null));
        // A null after nested containers and strings that look like JSON is still at the top level.
        assert!(missing(&(
            vec![vec![1]],
            BTreeMap::from([("a", [None::<u8>])]),
            "]}\"null\\",
            None::<u8>
        )));
        // What counts is the JSON: `()` has no other value than `null` either.
        assert!(missing(&()));
        assert!(
            DerivedKey::new("n", &(1, f64::NAN)).is_err(),
            "a NaN is not `null`"
        );
    }

    #[test]
    fn empty_and_false_values_and_deeper_nulls_are_keys() {
        assert!(!missing(""));
        assert!(!missing(&0));
        assert!(!missing(&false));
        assert!(!missing(&Vec::<u8>::new()));
        assert!(!missing(&BTreeMap::<String, u8>::new()));
        assert!(!missing(&Some(0)));
        assert!(!missing(&("", 0, false)));
        assert!(!missing("null"));
        assert!(!missing(&("null", "n")));
        // An escaped quote or backslash does not end the string early.
        assert!(!missing(&("a\"n", 1)));
        assert!(!missing(&("back\\", "n")));
        // Only the top level counts.
        assert!(!missing(&(1, (None::<u8>, 2))));
        assert!(!missing(&[[None::<u8>]]));
        assert!(!missing(&Order {
            tenant: 1,
            id: None
        }));
        assert!(!missing(&(serde_json::json!({"a": null}),)));
        assert!(!missing(&Kind::Newtype(0)));
        assert!(!missing(&Some(Kind::Unit)));
    }

    /// JSON values over a few leaves chosen to trip a scanner (strings holding `null`, brackets, quotes,
    /// backslashes), nested `depth` levels deep: arrays of up to two elements, objects of one entry.
    fn values(depth: usize) -> Vec<serde_json::Value> {
        use serde_json::{Value, json};
        let mut all = vec![
            Value::Null,
            json!(true),
            json!(false),
            json!(0),
            json!(-1.5e3),
            json!(""),
            json!("n"),
            json!("null"),
            json!("\\"),
            json!("\""),
            json!("\\\",null,\""),
            json!("]n["),
            json!("{"),
        ];
        if depth > 0 {
            let inner = values(depth - 1);
            all.push(json!([]));
            for a in &inner {
                all.push(json!([a]));
                all.push(json!({ "n": a }));
                for b in &inner {
                    all.push(json!([a, b]));
                }
            }
        }
        all
    }

    #[test]
    fn the_scan_agrees_with_the_json_tree_on_every_small_value() {
        use serde_json::Value;
        let values = values(2);
        assert!(values.len() > 40_000, "{}", values.len());
        for value in values {
            let expected = value.is_null()
                || value
                    .as_array()
                    .is_some_and(|elements| elements.iter().any(Value::is_null));
            let json = canonical_json(&value).unwrap();
            assert_eq!(
                is_missing(&json),
                expected,
                "{}",
                String::from_utf8_lossy(&json)
            );
            // The direct path's own answer, noted as it wrote the bytes.
            let noted = with_canonical_json(&value, |_, missing| missing).unwrap();
            assert_eq!(noted, expected, "{}", String::from_utf8_lossy(&json));
        }
    }

    #[test]
    fn a_missing_key_hashes_as_derive_key_does() {
        // `MissingKey::Allow` keeps the record key that keyless calls have always had.
        let derived = DerivedKey::new("n", &None::<String>).unwrap();
        assert_eq!(derived.key, derive_key("n", &None::<String>).unwrap());
        let derived = DerivedKey::new("n", &("a", 1)).unwrap();
        assert_eq!(derived.key, derive_key("n", &("a", 1)).unwrap());
    }

    #[test]
    fn the_policy_decides_what_a_missing_key_means() {
        let call = |missing_key| Call {
            missing_key,
            ..Call::new("n")
        };
        let resolve = |key: Option<&str>, policy, stages_writes| {
            DerivedKey::new("n", &key)
                .unwrap()
                .resolve(&call(policy), stages_writes)
        };
        let is_rejected = |result: Result<Option<String>, Error>| matches!(result, Err(Error::MissingKey { namespace }) if namespace == "n");
        let present = derive_key("n", &Some("k")).unwrap();
        let null = derive_key("n", &None::<&str>).unwrap();
        for policy in [MissingKey::Reject, MissingKey::Allow, MissingKey::Skip] {
            for stages_writes in [false, true] {
                let key = resolve(Some("k"), policy, stages_writes).unwrap();
                assert_eq!(key.as_ref(), Some(&present), "{policy:?}");
            }
        }
        assert!(is_rejected(resolve(None, MissingKey::Reject, false)));
        assert!(is_rejected(resolve(None, MissingKey::Reject, true)));
        assert_eq!(
            resolve(None, MissingKey::Allow, false).unwrap(),
            Some(null.clone())
        );
        assert_eq!(resolve(None, MissingKey::Allow, true).unwrap(), Some(null));
        assert_eq!(resolve(None, MissingKey::Skip, false).unwrap(), None);
        // Skipping would drop the writes that only commit with a record.
        assert!(is_rejected(resolve(None, MissingKey::Skip, true)));
    }

    #[test]
    fn struct_fields_are_sorted() {
        assert_eq!(
            canonical_json(&Inner {
                z: 1,
                a: Some("x".into()),
                skipped: None
            })
            .unwrap(),
            br#"{"a":"x","z":1}"#
        );
    }
}
