//! The memory store's records, packed: each record is one heap allocation holding its key, token,
//! fingerprint, response and error, with its numbers as variable-length integers, and the map's slot
//! is that allocation's pointer and length.
//!
//! A [`Record`] as it is (a 176-byte struct, plus one allocation per text, plus the key a second time as
//! the map's key) takes about 700 resident bytes for a typical record; packed, with the token (a UUID)
//! and the fingerprint (hex) held as the bytes they spell, the same record takes about 300. Records are
//! packed when written and unpacked when read, which costs what cloning a `Record` did before: one copy
//! of its bytes.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use crate::record::{Record, Status};

/// The records, keyed by their derived key.
#[derive(Debug, Default)]
pub(super) struct Records {
    /// Hashed with foldhash (seeded per set): a call hashes its key two to four times, and `SipHash`
    /// cost 1,500 instructions of a first call on the memory store.
    packed: HashSet<Packed, foldhash::fast::RandomState>,
}

impl Records {
    /// The record at `key`, unpacked.
    pub(super) fn get(&self, key: &str) -> Option<Record> {
        // Found by the key's bytes: no UTF-8 check of the stored key on the way.
        self.packed.get(key.as_bytes()).map(|p| p.unpack_at(key))
    }

    /// Writes `record` at its key, replacing the one there.
    pub(super) fn insert(&mut self, record: Record) {
        self.packed.replace(Packed::pack(record));
    }

    /// Every record, unpacked, in no particular order.
    pub(super) fn all(&self) -> Vec<Record> {
        self.packed.iter().map(|p| p.unpack_at(p.key())).collect()
    }

    /// How many records are held.
    pub(super) fn len(&self) -> usize {
        self.packed.len()
    }

    /// Keeps the records for which `keep` holds.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Record) -> bool) {
        self.packed.retain(|p| keep(&p.unpack_at(p.key())));
    }
}

/// Flags in the packed record's second byte: which optional parts are present.
const CLAIM_WRITES: u8 = 1;
const LEASE_UNTIL: u8 = 1 << 1;
const FINGERPRINT: u8 = 1 << 2;
const RESPONSE: u8 = 1 << 3;
const ERROR: u8 = 1 << 4;
const REPLAY_UNTIL: u8 = 1 << 5;
/// In the first byte, beside the status: the record names the region that completed it.
const COMPLETED_IN: u8 = 1 << 7;
/// In the first byte, beside the status: the record holds an operation's finished steps.
const STEPS: u8 = 1 << 6;
/// In the first byte, beside the status: the record holds released tokens, their
/// `released_until_ms` or a `released_through` (in one part: that time as a varint, 0 for none, else
/// one more; `released_through` as a varint 0 for none, else 1 and the token length-prefixed; then
/// each released token length-prefixed).
const RELEASED: u8 = 1 << 5;
/// The token is a lowercase hyphenated UUID (every token this crate makes), held as its 16 bytes.
const TOKEN_UUID: u8 = 1 << 6;
/// The fingerprint is lowercase hex (every fingerprint this crate makes), held as the bytes it spells.
const FINGERPRINT_HEX: u8 = 1 << 7;

/// One record in one allocation: `[status (and COMPLETED_IN), flags, varint key length, key, ...]`, see [`Packed::pack`].
/// Equal and hashed by its key alone, so that the set finds it by key.
#[derive(Debug)]
struct Packed(Box<[u8]>);

impl Packed {
    /// The record, in the order [`Packed::unpack_at`] reads it: status, flags, the key (its length first,
    /// so the key can be read without the rest), the token, then the present optional texts and
    /// numbers.
    fn pack(record: Record) -> Self {
        let Record {
            key,
            status,
            token,
            attempt,
            lease_until_ms,
            expires_at_s,
            fingerprint,
            response,
            error,
            replay_until_s,
            claim_writes_in_effect,
            completed_in,
            steps,
            released,
            released_until_ms,
            released_through,
        } = record;
        let mut flags = 0;
        for (present, flag) in [
            (claim_writes_in_effect, CLAIM_WRITES),
            (lease_until_ms.is_some(), LEASE_UNTIL),
            (fingerprint.is_some(), FINGERPRINT),
            (response.is_some(), RESPONSE),
            (error.is_some(), ERROR),
            (replay_until_s.is_some(), REPLAY_UNTIL),
        ] {
            if present {
                flags |= flag;
            }
        }
        // Texts this crate writes are held in half the bytes, when unpacking gives them back exactly.
        let token_uuid = (token.len() == 36 && !token.bytes().any(|b| b.is_ascii_uppercase()))
            .then(|| uuid::Uuid::try_parse(&token).ok())
            .flatten();
        let fingerprint_hex = fingerprint
            .as_deref()
            .filter(|fp| fp.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .and_then(|fp| hex::decode(fp).ok());
        if token_uuid.is_some() {
            flags |= TOKEN_UUID;
        }
        if fingerprint_hex.is_some() {
            flags |= FINGERPRINT_HEX;
        }
        let completed_in_flag = u8::from(completed_in.is_some()) * COMPLETED_IN;
        let steps_flag = u8::from(steps.is_some()) * STEPS;
        let released = pack_released(&released, released_until_ms, released_through.as_deref());
        let released_flag = u8::from(released.is_some()) * RELEASED;
        let token: &[u8] = token_uuid
            .as_ref()
            .map_or(token.as_bytes(), |uuid| uuid.as_bytes());
        let fingerprint = fingerprint_hex
            .as_deref()
            .or(fingerprint.as_deref().map(str::as_bytes));
        let numbers = [
            Some(attempt),
            Some(expires_at_s),
            lease_until_ms,
            replay_until_s,
        ];
        let texts = [
            fingerprint,
            response.as_deref(),
            error.as_deref().map(str::as_bytes),
            completed_in.as_deref().map(str::as_bytes),
            steps.as_deref(),
            released.as_deref(),
        ];
        // Allocated at its exact length: no shrinking afterwards, which would leave a free fragment
        // behind every record.
        let len = 2
            + bytes_len(key.as_bytes())
            + bytes_len(token)
            + numbers
                .iter()
                .flatten()
                .map(|&n| varint_len(n))
                .sum::<usize>()
            + texts.iter().flatten().map(|t| bytes_len(t)).sum::<usize>();
        let mut out = Vec::with_capacity(len);
        out.push(status_byte(status) | completed_in_flag | steps_flag | released_flag);
        out.push(flags);
        put_bytes(&mut out, key.as_bytes());
        put_bytes(&mut out, token);
        for number in numbers.into_iter().flatten() {
            put_varint(&mut out, number);
        }
        for text in texts.into_iter().flatten() {
            put_bytes(&mut out, text);
        }
        debug_assert_eq!(out.len(), len);
        // Exactly as long as it needs to be: the slot holds the allocation for the record's life.
        Packed(out.into_boxed_slice())
    }

    /// The key's bytes: read without unpacking the rest.
    fn key_bytes(&self) -> &[u8] {
        Reader(&self.0[2..]).bytes()
    }

    /// The key, as text.
    fn key(&self) -> &str {
        text(self.key_bytes())
    }

    /// The record, whose key is `key` (the caller has it already, as text).
    fn unpack_at(&self, key: &str) -> Record {
        let (status, flags) = (self.0[0], self.0[1]);
        let mut reader = Reader(&self.0[2..]);
        let stored_key = reader.bytes();
        debug_assert_eq!(stored_key, key.as_bytes());
        let key = key.to_owned();
        let token = match reader.bytes() {
            uuid if flags & TOKEN_UUID != 0 => (*uuid::Uuid::from_slice(uuid)
                .expect("16 bytes packed from a UUID")
                .hyphenated()
                .encode_lower(&mut uuid::Uuid::encode_buffer()))
            .to_owned(),
            token => text(token).to_owned(),
        };
        let attempt = reader.varint();
        let expires_at_s = reader.varint();
        let lease_until_ms = (flags & LEASE_UNTIL != 0).then(|| reader.varint());
        let replay_until_s = (flags & REPLAY_UNTIL != 0).then(|| reader.varint());
        let fingerprint = (flags & FINGERPRINT != 0).then(|| match reader.bytes() {
            bytes if flags & FINGERPRINT_HEX != 0 => hex::encode(bytes),
            fp => text(fp).to_owned(),
        });
        let response = (flags & RESPONSE != 0).then(|| reader.bytes().to_vec());
        let error = (flags & ERROR != 0).then(|| text(reader.bytes()).to_owned());
        let completed_in = (status & COMPLETED_IN != 0).then(|| text(reader.bytes()).to_owned());
        let steps = (status & STEPS != 0).then(|| reader.bytes().to_vec());
        let mut released = Vec::new();
        let mut released_until_ms = None;
        let mut released_through = None;
        if status & RELEASED != 0 {
            let mut tokens = Reader(reader.bytes());
            released_until_ms = tokens.varint().checked_sub(1);
            if tokens.varint() != 0 {
                released_through = Some(text(tokens.bytes()).to_owned());
            }
            while !tokens.0.is_empty() {
                released.push(text(tokens.bytes()).to_owned());
            }
        }
        Record {
            key,
            status: status_of(status & !(COMPLETED_IN | STEPS | RELEASED)),
            token,
            attempt,
            lease_until_ms,
            expires_at_s,
            fingerprint,
            response,
            error,
            replay_until_s,
            claim_writes_in_effect: flags & CLAIM_WRITES != 0,
            completed_in,
            steps,
            released,
            released_until_ms,
            released_through,
        }
    }
}

/// The part of a record that says what its releases left ([`RELEASED`]), if any: until when the
/// released tokens can hold the key (0: not known, else one more), `released_through` (0: none, else 1
/// and the token), then the tokens.
fn pack_released(
    released: &[String],
    released_until_ms: Option<u64>,
    released_through: Option<&str>,
) -> Option<Vec<u8>> {
    if released.is_empty() && released_until_ms.is_none() && released_through.is_none() {
        return None;
    }
    let mut out = Vec::new();
    put_varint(
        &mut out,
        released_until_ms.map_or(0, |until| until.saturating_add(1)),
    );
    put_varint(&mut out, u64::from(released_through.is_some()));
    if let Some(through) = released_through {
        put_bytes(&mut out, through.as_bytes());
    }
    for token in released {
        put_bytes(&mut out, token.as_bytes());
    }
    Some(out)
}

fn status_byte(status: Status) -> u8 {
    match status {
        Status::Pending => 0,
        Status::Completed => 1,
        Status::Failed => 2,
    }
}

/// The status [`status_byte`] wrote.
fn status_of(byte: u8) -> Status {
    match byte {
        0 => Status::Pending,
        1 => Status::Completed,
        _ => Status::Failed,
    }
}

/// A text this module packed from a `String`.
fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("packed from a String")
}

/// LEB128: seven bits a byte, low first; the high bit says another byte follows.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let low = value.to_le_bytes()[0] & 0x7f;
        value >>= 7;
        if value == 0 {
            out.push(low);
            return;
        }
        out.push(low | 0x80);
    }
}

/// How many bytes [`put_varint`] writes for `value`.
fn varint_len(value: u64) -> usize {
    // Seven bits a byte; zero takes one.
    (64 - value.leading_zeros()).max(1).div_ceil(7) as usize
}

/// How many bytes [`put_bytes`] writes for `bytes`.
fn bytes_len(bytes: &[u8]) -> usize {
    varint_len(u64::try_from(bytes.len()).unwrap_or(u64::MAX)) + bytes.len()
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, u64::try_from(bytes.len()).unwrap_or(u64::MAX));
    out.extend_from_slice(bytes);
}

/// Reads what [`Packed::pack`] wrote, front to back.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> u64 {
        let mut value = 0;
        let mut shift = 0;
        loop {
            let byte = self.0[0];
            self.0 = &self.0[1..];
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return value;
            }
            shift += 7;
        }
    }

    fn bytes(&mut self) -> &'a [u8] {
        let len = usize::try_from(self.varint()).expect("a length this process wrote");
        let (bytes, rest) = self.0.split_at(len);
        self.0 = rest;
        bytes
    }
}

impl Borrow<[u8]> for Packed {
    fn borrow(&self) -> &[u8] {
        self.key_bytes()
    }
}

impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        self.key_bytes() == other.key_bytes()
    }
}

impl Eq for Packed {}

impl Hash for Packed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key_bytes().hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            key: "bench::charge#0123456789abcdef".to_owned(),
            status: Status::Completed,
            token: "00000000-0000-4000-8000-000000000000".to_owned(),
            attempt: 3,
            lease_until_ms: None,
            expires_at_s: 1_900_000_000,
            fingerprint: Some("0f".repeat(32)),
            response: Some(b"{\"ok\":true}".to_vec()),
            error: None,
            replay_until_s: Some(1_800_000_000),
            claim_writes_in_effect: true,
            completed_in: Some("eu-west-1".to_owned()),
            steps: Some(b"steps".to_vec()),
            released: vec![
                "10000000-0000-4000-8000-000000000000".to_owned(),
                String::new(),
                "not a uuid".to_owned(),
            ],
            released_until_ms: Some(1_900_000_000_123),
            released_through: Some("0190a4c2-7b1e-7000-8000-000000000000".to_owned()),
        }
    }

    #[test]
    fn every_field_round_trips() {
        let full = record();
        let pending = Record {
            status: Status::Pending,
            lease_until_ms: Some(u64::MAX),
            fingerprint: None,
            response: None,
            replay_until_s: None,
            claim_writes_in_effect: false,
            completed_in: None,
            steps: None,
            released: Vec::new(),
            released_until_ms: None,
            released_through: None,
            attempt: u64::MAX,
            expires_at_s: 0,
            ..record()
        };
        // Only a `released_through`, and an empty one.
        let through_only = Record {
            released: Vec::new(),
            released_until_ms: None,
            released_through: Some(String::new()),
            ..record()
        };
        let failed = Record {
            status: Status::Failed,
            error: Some("déclinée".to_owned()),
            response: Some(vec![0x1f, 0x8b, 0, 255]),
            key: String::new(),
            token: String::new(),
            ..record()
        };
        // Tokens and fingerprints that only look like the crate's own stay as they were.
        let foreign = Record {
            token: "00000000-0000-4000-8000-00000000000A".to_owned(),
            fingerprint: Some("ABCDEF".to_owned()),
            ..record()
        };
        let odd = Record {
            token: "0000000000004000800000000000000a".to_owned(),
            fingerprint: Some("abc".to_owned()),
            ..record()
        };
        for r in [full, pending, through_only, failed, foreign, odd] {
            let packed = Packed::pack(r.clone());
            assert_eq!(packed.key(), r.key);
            assert_eq!(packed.unpack_at(&r.key), r);
        }
    }

    #[test]
    fn a_varint_takes_the_bytes_its_length_says() {
        for value in [0, 1, 127, 128, 16_383, 16_384, 1 << 35, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), varint_len(value), "{value}");
            assert_eq!(Reader(&out).varint(), value);
        }
    }

    #[test]
    fn found_and_replaced_by_key() {
        let mut records = Records::default();
        let mut r = record();
        records.insert(r.clone());
        r.attempt = 4;
        records.insert(r.clone());
        assert_eq!(records.len(), 1);
        assert_eq!(records.get(&r.key), Some(r.clone()));
        assert!(records.get("other").is_none());
        records.retain(|x| x.attempt != 4);
        assert_eq!(records.len(), 0);
    }
}
