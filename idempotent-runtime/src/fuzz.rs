//! Property tests that throw generated input at every decoder and at key derivation.
//!
//! - record decoding ([`parse_item`]): arbitrary DynamoDB items — every attribute type, missing and extra
//!   attributes, huge and malformed numbers, broken gzip, truncated JSON — give a record or
//!   [`StoreError::Corrupt`], never a panic and never another error;
//! - response decoding ([`codec::decode`]): arbitrary bytes, gzip with flipped or missing bytes, JSON cut
//!   anywhere give a value or a decode error; what `pack` stores decodes to what was stored;
//! - key derivation ([`derive_key`]): equal values give equal keys, the order a map is serialized in
//!   never matters, the key is DESIGN's `{namespace}#{hex(sha256(canonical_json))}` computed another
//!   way, and 100,000 distinct generated values give 100,000 distinct keys.
//!
//! Each test prints how many cases it ran and how many per second. `IDEMPOTENT_FUZZ_CASES` multiplies
//! the case counts (e.g. `IDEMPOTENT_FUZZ_CASES=20` for a long run). A failure prints the shrunk input.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::time::Instant;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use proptest::collection::{btree_map, hash_map, vec};
use proptest::prelude::*;
use proptest::strategy::ValueTree as _;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde::ser::SerializeMap as _;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::codec;
use crate::derive_key;
use crate::record::{AttributeNames, Status};
use crate::store::StoreError;
use crate::store::dynamodb::parse_item;

fn multiplier() -> u32 {
    std::env::var("IDEMPOTENT_FUZZ_CASES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(1)
}

/// Runs `test` on `cases` generated values (times the multiplier) and reports the rate.
fn fuzz<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: Debug,
{
    let cases = cases * multiplier();
    let mut runner = TestRunner::new(Config {
        cases,
        // Shrunk failures are printed; nothing is written into the source tree.
        failure_persistence: None,
        ..Config::default()
    });
    let started = Instant::now();
    let result = runner.run(&strategy, test);
    let elapsed = started.elapsed();
    println!(
        "fuzz [{name}]: {cases} cases in {elapsed:.2?} ({:.0} cases/s)",
        f64::from(cases) / elapsed.as_secs_f64()
    );
    if let Err(e) = result {
        panic!("fuzz [{name}]: {e}");
    }
}

// ---------------------------------------------------------------------------------------------------
// Generators

/// Number texts DynamoDB may hold, and some it never would.
fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[0-9]{19,40}",
        "-?[0-9]{0,3}\\.[0-9]{0,3}(e-?[0-9]{1,3})?",
        Just("18446744073709551616".to_owned()),
        Just("1e400".to_owned()),
        Just("-0".to_owned()),
        "\\PC{0,6}",
    ]
}

fn blob() -> impl Strategy<Value = Blob> {
    vec(any::<u8>(), 0..24).prop_map(Blob::new)
}

/// Any attribute value, nested a few levels.
fn attribute_value() -> impl Strategy<Value = AttributeValue> {
    let leaf = prop_oneof![
        "\\PC{0,12}".prop_map(AttributeValue::S),
        number_text().prop_map(AttributeValue::N),
        blob().prop_map(AttributeValue::B),
        any::<bool>().prop_map(AttributeValue::Bool),
        Just(AttributeValue::Null(true)),
        vec("\\PC{0,4}", 0..3).prop_map(AttributeValue::Ss),
        vec(number_text(), 0..3).prop_map(AttributeValue::Ns),
        vec(blob(), 0..3).prop_map(AttributeValue::Bs),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(AttributeValue::L),
            hash_map("[a-z_]{1,6}", inner, 0..4).prop_map(AttributeValue::M),
        ]
    })
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        "\\PC{0,10}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            btree_map("\\PC{0,6}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Stored response bytes: what `pack` writes, and every way of breaking it.
fn response_bytes() -> impl Strategy<Value = Vec<u8>> {
    let packed = json_value()
        .prop_map(|v| codec::pack(codec::to_json(&v).expect("JSON serializes")))
        .boxed();
    // Large enough to be compressed: the value repeated past `COMPRESS_ABOVE`.
    let compressed = json_value()
        .prop_map(|v| {
            let one = codec::to_json(&v).expect("JSON serializes").len();
            let many = vec![v; codec::COMPRESS_ABOVE / (one + 1) + 1];
            codec::pack(codec::to_json(&many).expect("JSON serializes"))
        })
        .boxed();
    prop_oneof![
        packed.clone(),
        compressed.clone(),
        (compressed.clone(), any::<prop::sample::Index>())
            .prop_map(|(bytes, at)| bytes[..at.index(bytes.len())].to_vec()),
        (compressed, any::<prop::sample::Index>(), any::<u8>()).prop_map(
            |(mut bytes, at, flip)| {
                let at = at.index(bytes.len());
                bytes[at] ^= flip | 1;
                bytes
            }
        ),
        (packed, any::<prop::sample::Index>())
            .prop_map(|(bytes, at)| bytes[..at.index(bytes.len())].to_vec()),
        vec(any::<u8>(), 0..64),
        vec(any::<u8>(), 0..64).prop_map(|b| [&[0x1f, 0x8b][..], &b].concat()),
    ]
}

/// One record attribute: usually well-formed for its name, sometimes missing, sometimes anything.
fn attribute(
    valid: BoxedStrategy<AttributeValue>,
) -> impl Strategy<Value = Option<AttributeValue>> {
    prop_oneof![
        4 => valid.prop_map(Some),
        1 => Just(None),
        1 => attribute_value().prop_map(Some),
    ]
}

fn n(strategy: impl Strategy<Value = u64> + 'static) -> BoxedStrategy<AttributeValue> {
    strategy
        .prop_map(|v| AttributeValue::N(v.to_string()))
        .boxed()
}

fn s(strategy: impl Strategy<Value = String> + 'static) -> BoxedStrategy<AttributeValue> {
    strategy.prop_map(AttributeValue::S).boxed()
}

/// Items that look like records, broken in every way, with extra attributes.
fn record_item() -> impl Strategy<Value = HashMap<String, AttributeValue>> {
    let names = AttributeNames::default();
    let status = prop_oneof![
        Just("PENDING".to_owned()),
        Just("COMPLETED".to_owned()),
        Just("FAILED".to_owned()),
        "\\PC{0,9}",
    ];
    let fields = (
        (
            attribute(s("[a-z:]{1,8}#[0-9a-f]{64}")),
            attribute(s(status)),
            attribute(s("[0-9a-f-]{36}")),
            attribute(n(any::<u64>())),
            attribute(n(any::<u64>())),
            attribute(n(any::<u64>())),
        ),
        (
            attribute(s("[0-9a-f]{64}")),
            attribute(
                response_bytes()
                    .prop_map(|b| AttributeValue::B(Blob::new(b)))
                    .boxed(),
            ),
            attribute(s("\\PC{0,20}")),
            attribute(n(any::<u64>())),
            attribute(any::<bool>().prop_map(AttributeValue::Bool).boxed()),
        ),
        hash_map("[a-z_]{1,12}", attribute_value(), 0..3),
    );
    fields.prop_map(
        move |((pk, st, tk, at, lu, ex), (fp, rs, er, ru, cw), extra)| {
            let mut item = extra;
            for (name, value) in [
                (&names.key, pk),
                (&names.status, st),
                (&names.token, tk),
                (&names.attempt, at),
                (&names.lease_until, lu),
                (&names.expires_at, ex),
                (&names.fingerprint, fp),
                (&names.response, rs),
                (&names.error, er),
                (&names.replay_until, ru),
                (&names.claim_writes, cw),
            ] {
                match value {
                    Some(value) => item.insert(name.clone(), value),
                    None => item.remove(name),
                };
            }
            item
        },
    )
}

// ---------------------------------------------------------------------------------------------------
// Record and response decoding

#[test]
fn record_decoding_gives_a_record_or_corrupt() {
    let names = AttributeNames::default();
    fuzz("parse_item", 4_000, record_item(), |item| {
        match parse_item(&names, &item) {
            Ok(record) => {
                // A record is only what the item says.
                prop_assert_eq!(&item[&names.key], &AttributeValue::S(record.key.clone()));
                prop_assert_eq!(
                    &item[&names.status],
                    &AttributeValue::S(record.status.as_str().to_owned())
                );
                prop_assert_eq!(
                    &item[&names.expires_at],
                    &AttributeValue::N(record.expires_at_s.to_string())
                );
                prop_assert!(record.status != Status::Pending || record.lease_until_ms.is_some());
                match (item.get(&names.response), &record.response) {
                    (Some(AttributeValue::B(b)), Some(r)) => prop_assert_eq!(b.as_ref(), &r[..]),
                    (None, None) => {}
                    (stored, parsed) => {
                        prop_assert!(false, "response {stored:?} parsed as {parsed:?}");
                    }
                }
                // Whatever the stored response is, decoding it is a value or an error.
                if let Some(bytes) = &record.response {
                    let _ = codec::decode::<Value>(bytes);
                }
            }
            Err(StoreError::Corrupt(_)) => {}
            Err(other) => prop_assert!(false, "expected Corrupt, got {other:?}"),
        }
        Ok(())
    });
}

#[test]
fn any_item_at_all_gives_a_record_or_corrupt() {
    let names = AttributeNames::default();
    fuzz(
        "parse_item, arbitrary items",
        2_000,
        hash_map("[a-z_]{1,12}", attribute_value(), 0..12),
        |item| {
            prop_assert!(matches!(
                parse_item(&names, &item),
                Ok(_) | Err(StoreError::Corrupt(_))
            ));
            Ok(())
        },
    );
}

#[test]
fn response_decoding_gives_a_value_or_an_error() {
    fuzz("codec::decode", 1_500, response_bytes(), |bytes| {
        // Typed targets too: a mismatch is an error, not a panic.
        let _ = codec::decode::<Value>(&bytes);
        let _ = codec::decode::<Vec<u64>>(&bytes);
        let _ = codec::decode::<(String, Option<bool>)>(&bytes);
        Ok(())
    });
}

#[test]
fn stored_responses_decode_to_what_was_stored() {
    fuzz("pack/decode round trip", 1_500, json_value(), |value| {
        let small = codec::pack(codec::to_json(&value).expect("JSON serializes"));
        prop_assert_eq!(codec::decode::<Value>(&small).ok(), Some(value.clone()));
        let one = codec::to_json(&value).expect("JSON serializes").len();
        let large = vec![value; codec::COMPRESS_ABOVE / (one + 1) + 1];
        let packed = codec::pack(codec::to_json(&large).expect("JSON serializes"));
        prop_assert_eq!(codec::decode::<Vec<Value>>(&packed).ok(), Some(large));
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------------
// Key derivation

const NAMESPACE: &str = "fuzz::key";

/// DESIGN's definition, computed the slow way: `serde_json::Value` sorts object keys.
fn reference_key(value: &Value) -> String {
    let json = serde_json::to_vec(value).expect("a Value serializes");
    format!("{NAMESPACE}#{}", hex::encode(Sha256::digest(json)))
}

/// A map serialized in exactly the order of its entries.
struct InOrder<'a>(&'a [(String, Value)]);

impl serde::Serialize for InOrder<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[test]
fn equal_values_give_equal_keys() {
    fuzz("derive_key, equal values", 3_000, json_value(), |value| {
        let key = derive_key(NAMESPACE, &value).expect("a Value serializes");
        prop_assert_eq!(&key, &derive_key(NAMESPACE, &value.clone()).unwrap());
        prop_assert_eq!(&key, &reference_key(&value));
        // The same value through its JSON text, parsed again.
        let text = serde_json::to_string(&value).unwrap();
        let reparsed: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&key, &derive_key(NAMESPACE, &reparsed).unwrap());
        Ok(())
    });
}

#[test]
fn map_order_never_matters() {
    let entries = btree_map("\\PC{0,6}", json_value(), 0..8)
        .prop_map(|m| m.into_iter().collect::<Vec<_>>())
        .prop_flat_map(|entries| (Just(entries.clone()), Just(entries).prop_shuffle()));
    fuzz(
        "derive_key, map order",
        2_000,
        entries,
        |(sorted, shuffled)| {
            let key = derive_key(NAMESPACE, &InOrder(&sorted)).unwrap();
            prop_assert_eq!(&key, &derive_key(NAMESPACE, &InOrder(&shuffled)).unwrap());
            let btree: BTreeMap<_, _> = shuffled.iter().cloned().collect();
            prop_assert_eq!(&key, &derive_key(NAMESPACE, &btree).unwrap());
            let hashed: HashMap<_, _> = shuffled.into_iter().collect();
            prop_assert_eq!(&key, &derive_key(NAMESPACE, &hashed).unwrap());
            // Nested: the order inside a map inside a tuple does not matter either.
            prop_assert_eq!(
                derive_key(NAMESPACE, &(1, &hashed)).unwrap(),
                derive_key(NAMESPACE, &(1, &btree)).unwrap()
            );
            Ok(())
        },
    );
}

#[test]
fn distinct_values_never_share_a_key() {
    const DISTINCT: usize = 100_000;
    let started = Instant::now();
    let mut runner = TestRunner::deterministic();
    let strategy = prop_oneof![
        1 => json_value(),
        // Small values collide most easily if anything does: short strings, numbers, tuples.
        2 => (any::<u16>(), "[a-z]{0,3}").prop_map(|(n, s)| serde_json::json!([n, s])),
        2 => any::<i32>().prop_map(Value::from),
    ];
    let mut keys: HashMap<String, Vec<u8>> = HashMap::with_capacity(DISTINCT);
    let mut generated = 0_usize;
    while keys.len() < DISTINCT {
        let value = strategy
            .new_tree(&mut runner)
            .expect("values generate")
            .current();
        generated += 1;
        let canonical = serde_json::to_vec(&value).unwrap();
        let key = derive_key(NAMESPACE, &value).unwrap();
        if let Some(earlier) = keys.insert(key.clone(), canonical.clone()) {
            assert_eq!(
                earlier,
                canonical,
                "two distinct values share the key {key}: {} and {}",
                String::from_utf8_lossy(&earlier),
                String::from_utf8_lossy(&canonical)
            );
        }
    }
    let elapsed = started.elapsed();
    println!(
        "fuzz [derive_key, distinct values]: {DISTINCT} distinct values ({generated} generated) gave {DISTINCT} distinct keys in {elapsed:.2?} ({:.0} values/s)",
        f64::from(u32::try_from(generated).unwrap()) / elapsed.as_secs_f64()
    );
}
