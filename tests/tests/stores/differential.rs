//! Differential tests of the memory store's DynamoDB emulator against DynamoDB Local.
//!
//! Each case seeds two tables (one with a partition key, one with a sort key too) with generated items,
//! then sends one generated `TransactWriteItems` — `Put`, `Update`, `Delete` and `ConditionCheck` with
//! generated condition and update expressions over everything the emulator claims to model — to
//! DynamoDB Local and, as the business writes of a claim, to a [`MemoryStore`]. Both must agree on the
//! outcome (committed, canceled, or refused as invalid), on every cancellation reason's code and
//! `ALL_OLD` item, and on every item afterwards.
//!
//! The run prints its seed; `IDEMPOTENT_DIFF_SEED=<seed>` replays it, `IDEMPOTENT_DIFF_CASE=<n>` runs
//! only case `n` of it (printing the request), and `IDEMPOTENT_DIFF_CASES=<count>` sets how many cases
//! run (default 2,000).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata as _;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConditionCheck, Delete, KeySchemaElement,
    KeyType, KeysAndAttributes, Put, PutRequest, ReturnValuesOnConditionCheckFailure,
    ScalarAttributeType, TransactWriteItem, Update, WriteRequest,
};
use idempotent_runtime::MemoryStore;
use idempotent_runtime::store::{ClaimRequest, Store as _, TransactOutcome};
use idempotent_tests::{client, unique_table};
use proptest::prelude::Rng as _;
use proptest::test_runner::{RngAlgorithm, TestRng};

type Item = HashMap<String, AttributeValue>;

/// Cases in flight at once against DynamoDB Local.
const CONCURRENCY: usize = 8;

// ---------------------------------------------------------------------------------------------------
// Generation

/// A seeded random source for one case.
struct Gen(TestRng);

impl Gen {
    fn new(seed: u64, case: u64) -> Self {
        let mut bytes = [0_u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        bytes[8..16].copy_from_slice(&case.to_le_bytes());
        Self(TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.0.next_u64() % u64::try_from(n).unwrap()).unwrap()
    }

    /// `true` with probability `percent` / 100.
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }
}

const STRINGS: [&str; 6] = ["", "a", "ab", "abc", "b", "ba"];
const NUMBERS: [&str; 12] = [
    "0",
    "1",
    "-1",
    "2.5",
    "10",
    "1e2",
    "100",
    "0.10",
    "-0",
    "3",
    "1E-2",
    "9999999999999999999999999999999999999",
];
/// Numbers no two of which are equal, for sets that must be valid.
const SET_NUMBERS: [&str; 6] = ["1", "-1", "2.5", "10", "1e2", "0.10"];
/// Numbers in ascending order, as many as [`STRINGS`], for BETWEEN bounds.
const SORTED_NUMBERS: [&str; 6] = ["-1", "0", "1", "2.5", "10", "1e2"];
const BINARIES: [&[u8]; 4] = [b"", b"\x00", b"ab", b"b"];
/// Attribute names used without placeholders.
const PLAIN: [&str; 5] = ["a", "b", "c", "n", "s"];
/// Names only reachable through `#placeholders`: reserved words, and a name with a dot.
const RESERVED: [&str; 4] = ["size", "status", "name", "x.y"];

fn scalar(g: &mut Gen) -> AttributeValue {
    match g.below(5) {
        0 => AttributeValue::S((*g.pick(&STRINGS)).to_owned()),
        1 => AttributeValue::N((*g.pick(&NUMBERS)).to_owned()),
        2 => AttributeValue::B(Blob::new(*g.pick(&BINARIES))),
        3 => AttributeValue::Bool(g.chance(50)),
        _ => AttributeValue::Null(true),
    }
}

fn set(g: &mut Gen, allow_empty: bool) -> AttributeValue {
    let len = if allow_empty && g.chance(5) {
        0
    } else {
        1 + g.below(3)
    };
    match g.below(3) {
        0 => {
            let v: BTreeSet<_> = (0..len).map(|_| (*g.pick(&STRINGS)).to_owned()).collect();
            AttributeValue::Ss(v.into_iter().collect())
        }
        1 => {
            // Distinct texts may be equal numbers ("1e2", "100"): DynamoDB refuses such a set, so both
            // must; only where invalid requests are allowed.
            let from: &[&str] = if allow_empty { &NUMBERS } else { &SET_NUMBERS };
            let v: BTreeSet<_> = (0..len).map(|_| (*g.pick(from)).to_owned()).collect();
            AttributeValue::Ns(v.into_iter().collect())
        }
        _ => {
            let v: BTreeSet<_> = (0..len).map(|_| g.pick(&BINARIES).to_vec()).collect();
            AttributeValue::Bs(v.into_iter().map(Blob::new).collect())
        }
    }
}

fn value(g: &mut Gen, allow_invalid: bool) -> AttributeValue {
    match g.below(10) {
        0..=5 => scalar(g),
        6 | 7 => set(g, allow_invalid),
        8 => AttributeValue::L((0..g.below(3)).map(|_| scalar(g)).collect()),
        _ => AttributeValue::M(
            (0..g.below(3))
                .map(|i| (format!("k{i}"), scalar(g)))
                .collect(),
        ),
    }
}

/// The tables of every case: `t1` keyed by `pk` (S), `t2` by `pk` (S) and `sk` (N).
#[derive(Clone)]
struct Tables {
    t1: String,
    t2: String,
}

/// One item's key in one table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    table: String,
    pk: String,
    sk: Option<&'static str>,
}

impl Target {
    fn key(&self) -> Item {
        let mut key = HashMap::from([("pk".to_owned(), AttributeValue::S(self.pk.clone()))]);
        if let Some(sk) = self.sk {
            key.insert("sk".to_owned(), AttributeValue::N(sk.to_owned()));
        }
        key
    }
}

/// The expressions of one action and their placeholders.
#[derive(Default)]
struct Expr {
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
    allow_invalid: bool,
}

impl Expr {
    fn path(&mut self, g: &mut Gen) -> String {
        if g.chance(70) {
            return (*g.pick(&PLAIN)).to_owned();
        }
        let name = if g.chance(80) {
            *g.pick(&RESERVED)
        } else {
            // The key attribute, by placeholder.
            "pk"
        };
        // A raw reserved word now and then: both must refuse it.
        if self.allow_invalid && g.chance(3) && name != "x.y" {
            return name.to_owned();
        }
        let placeholder = format!("#n{}", self.names.len());
        self.names.insert(placeholder.clone(), name.to_owned());
        placeholder
    }

    fn value(&mut self, v: AttributeValue) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), v);
        placeholder
    }

    fn any_value(&mut self, g: &mut Gen) -> String {
        let v = value(g, self.allow_invalid);
        self.value(v)
    }

    /// A value `<`, `BETWEEN` and `begins_with` accept (S, N or B), but anything now and then where invalid
    /// requests are allowed: DynamoDB refuses the others before evaluating anything.
    fn ordered_value(&mut self, g: &mut Gen) -> String {
        if self.allow_invalid && g.chance(20) {
            return self.any_value(g);
        }
        let v = match g.below(3) {
            0 => AttributeValue::S((*g.pick(&STRINGS)).to_owned()),
            1 => AttributeValue::N((*g.pick(&NUMBERS)).to_owned()),
            _ => AttributeValue::B(Blob::new(*g.pick(&BINARIES))),
        };
        self.value(v)
    }

    /// Bounds of one type in order (DynamoDB refuses others), or anything where invalid requests are
    /// allowed.
    fn bounds(&mut self, g: &mut Gen) -> (String, String) {
        if self.allow_invalid && g.chance(30) {
            return (self.ordered_value(g), self.ordered_value(g));
        }
        let (mut i, mut j) = (g.below(SORTED_NUMBERS.len()), g.below(SORTED_NUMBERS.len()));
        if i > j {
            std::mem::swap(&mut i, &mut j);
        }
        let (low, high) = match g.below(3) {
            0 => (
                AttributeValue::N(SORTED_NUMBERS[i].to_owned()),
                AttributeValue::N(SORTED_NUMBERS[j].to_owned()),
            ),
            1 => (
                AttributeValue::S(STRINGS[i].to_owned()),
                AttributeValue::S(STRINGS[j].to_owned()),
            ),
            _ => (
                AttributeValue::B(Blob::new(BINARIES[i.min(3)])),
                AttributeValue::B(Blob::new(BINARIES[j.min(3)])),
            ),
        };
        (self.value(low), self.value(high))
    }

    /// A path, or a number: what `+` and `-` accept.
    fn arithmetic_operand(&mut self, g: &mut Gen) -> String {
        if g.chance(50) {
            self.path(g)
        } else if self.allow_invalid && g.chance(20) {
            self.any_value(g)
        } else {
            self.value(AttributeValue::N((*g.pick(&NUMBERS)).to_owned()))
        }
    }

    fn operand(&mut self, g: &mut Gen) -> String {
        if g.chance(50) {
            self.path(g)
        } else {
            self.any_value(g)
        }
    }

    fn condition(&mut self, g: &mut Gen, depth: usize) -> String {
        let leaf = depth == 0 || g.chance(50);
        if leaf {
            return match g.below(8) {
                0 | 1 => {
                    let op = *g.pick(&["=", "<>", "<", "<=", ">", ">="]);
                    let left = self.path(g);
                    let right = if g.chance(50) {
                        self.path(g)
                    } else if op == "=" || op == "<>" {
                        self.any_value(g)
                    } else {
                        self.ordered_value(g)
                    };
                    format!("{left} {op} {right}")
                }
                2 => {
                    let path = self.path(g);
                    let (lo, hi) = self.bounds(g);
                    format!("{path} BETWEEN {lo} AND {hi}")
                }
                3 => {
                    let path = self.path(g);
                    let list: Vec<_> = (0..=g.below(3)).map(|_| self.any_value(g)).collect();
                    format!("{path} IN ({})", list.join(", "))
                }
                4 => format!("attribute_exists({})", self.path(g)),
                5 => format!("attribute_not_exists({})", self.path(g)),
                6 => {
                    let path = self.path(g);
                    let prefix = self.ordered_value(g);
                    format!("begins_with({path}, {prefix})")
                }
                _ => {
                    let op = *g.pick(&["=", "<>", "<", ">="]);
                    let left = if op == "=" || op == "<>" {
                        self.any_value(g)
                    } else {
                        self.ordered_value(g)
                    };
                    let right = self.path(g);
                    format!("{left} {op} {right}")
                }
            };
        }
        // Parentheses only where they change the meaning: DynamoDB refuses redundant ones, which the
        // emulator does not model (see its docs).
        match g.below(4) {
            0 => format!("NOT {}", self.condition(g, depth - 1)),
            1 => format!(
                "({} OR {}) AND {}",
                self.condition(g, depth - 1),
                self.condition(g, depth - 1),
                self.condition(g, depth - 1)
            ),
            2 => format!(
                "{} AND {}",
                self.condition(g, depth - 1),
                self.condition(g, depth - 1)
            ),
            _ => format!(
                "{} OR {}",
                self.condition(g, depth - 1),
                self.condition(g, depth - 1)
            ),
        }
    }

    fn update(&mut self, g: &mut Gen) -> String {
        let mut clauses = Vec::new();
        if g.chance(70) {
            let sets: Vec<_> = (0..=g.below(2))
                .map(|_| {
                    let path = self.path(g);
                    let value = match g.below(4) {
                        0 => {
                            let a = self.arithmetic_operand(g);
                            let b = self.arithmetic_operand(g);
                            format!("{a} {} {b}", g.pick(&["+", "-"]))
                        }
                        1 => {
                            let p = self.path(g);
                            let v = self.operand(g);
                            format!("if_not_exists({p}, {v})")
                        }
                        _ => self.operand(g),
                    };
                    format!("{path} = {value}")
                })
                .collect();
            clauses.push(format!("SET {}", sets.join(", ")));
        }
        if g.chance(30) {
            clauses.push(format!("REMOVE {}", self.path(g)));
        }
        if g.chance(30) {
            let path = self.path(g);
            let v = if g.chance(50) {
                AttributeValue::N((*g.pick(&NUMBERS)).to_owned())
            } else {
                set(g, self.allow_invalid)
            };
            let v = self.value(v);
            clauses.push(format!("ADD {path} {v}"));
        }
        if g.chance(20) {
            let path = self.path(g);
            let v = set(g, self.allow_invalid);
            let v = self.value(v);
            clauses.push(format!("DELETE {path} {v}"));
        }
        if clauses.is_empty() {
            clauses.push(format!("REMOVE {}", self.path(g)));
        }
        clauses.join(" ")
    }

    fn names(&self) -> Option<HashMap<String, String>> {
        (!self.names.is_empty()).then(|| self.names.clone())
    }

    fn values(&self) -> Option<HashMap<String, AttributeValue>> {
        (!self.values.is_empty()).then(|| self.values.clone())
    }
}

fn attributes(g: &mut Gen, allow_invalid: bool) -> Item {
    (0..g.below(4))
        .map(|_| {
            let name = if g.chance(80) {
                *g.pick(&PLAIN)
            } else {
                *g.pick(&RESERVED)
            };
            (name.to_owned(), value(g, allow_invalid))
        })
        .collect()
}

/// One case: the items to seed, and the transaction.
struct Case {
    seed: Vec<(String, Item)>,
    targets: Vec<Target>,
    writes: Vec<TransactWriteItem>,
}

fn generate(g: &mut Gen, tables: &Tables, case: u64) -> Case {
    let targets: Vec<Target> = (0..3)
        .flat_map(|k| {
            [
                Target {
                    table: tables.t1.clone(),
                    pk: format!("c{case}-k{k}"),
                    sk: None,
                },
                Target {
                    table: tables.t2.clone(),
                    pk: format!("c{case}-k{k}"),
                    sk: Some(if k == 0 { "1" } else { "2" }),
                },
            ]
        })
        .collect();
    let mut seed = Vec::new();
    for t in &targets {
        if g.chance(50) {
            let mut item = attributes(g, false);
            item.extend(t.key());
            seed.push((t.table.clone(), item));
        }
    }
    let allow_invalid = g.chance(15);
    // Distinct items, except now and then (DynamoDB refuses two actions on one item).
    let mut pool = targets.clone();
    let writes = (0..=g.below(3))
        .map(|_| {
            let target = if g.chance(10) || pool.is_empty() {
                g.pick(&targets).clone()
            } else {
                pool.remove(g.below(pool.len()))
            };
            action(g, &target, allow_invalid)
        })
        .collect();
    Case {
        seed,
        targets,
        writes,
    }
}

fn action(g: &mut Gen, target: &Target, allow_invalid: bool) -> TransactWriteItem {
    let mut expr = Expr {
        allow_invalid,
        ..Expr::default()
    };
    let return_old = g
        .chance(50)
        .then_some(ReturnValuesOnConditionCheckFailure::AllOld);
    let with_condition = g.chance(70);
    match g.below(4) {
        0 => {
            let mut item = attributes(g, allow_invalid);
            item.extend(target.key());
            let condition = with_condition.then(|| expr.condition(g, 2));
            let put = Put::builder()
                .table_name(&target.table)
                .set_item(Some(item))
                .set_condition_expression(condition)
                .set_expression_attribute_names(expr.names())
                .set_expression_attribute_values(expr.values())
                .set_return_values_on_condition_check_failure(return_old)
                .build()
                .unwrap();
            TransactWriteItem::builder().put(put).build()
        }
        1 => {
            let update_expression = expr.update(g);
            let condition = with_condition.then(|| expr.condition(g, 2));
            let update = Update::builder()
                .table_name(&target.table)
                .set_key(Some(target.key()))
                .update_expression(update_expression)
                .set_condition_expression(condition)
                .set_expression_attribute_names(expr.names())
                .set_expression_attribute_values(expr.values())
                .set_return_values_on_condition_check_failure(return_old)
                .build()
                .unwrap();
            TransactWriteItem::builder().update(update).build()
        }
        2 => {
            let condition = with_condition.then(|| expr.condition(g, 2));
            let delete = Delete::builder()
                .table_name(&target.table)
                .set_key(Some(target.key()))
                .set_condition_expression(condition)
                .set_expression_attribute_names(expr.names())
                .set_expression_attribute_values(expr.values())
                .set_return_values_on_condition_check_failure(return_old)
                .build()
                .unwrap();
            TransactWriteItem::builder().delete(delete).build()
        }
        _ => {
            let condition = expr.condition(g, 2);
            let check = ConditionCheck::builder()
                .table_name(&target.table)
                .set_key(Some(target.key()))
                .condition_expression(condition)
                .set_expression_attribute_names(expr.names())
                .set_expression_attribute_values(expr.values())
                .set_return_values_on_condition_check_failure(return_old)
                .build()
                .unwrap();
            TransactWriteItem::builder().condition_check(check).build()
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Running one case on both

/// An outcome both sides can be compared on.
#[derive(Debug, PartialEq)]
enum Outcome {
    Committed,
    /// Each action's reason code and `ALL_OLD` item (normalized).
    Canceled(Vec<(String, Option<Normal>)>),
    Invalid,
}

/// An item in a comparable form: sets sorted, numbers as DynamoDB prints them.
type Normal = BTreeMap<String, String>;

fn normal(item: &Item) -> Normal {
    item.iter()
        .map(|(k, v)| (k.clone(), normal_value(v)))
        .collect()
}

fn normal_value(v: &AttributeValue) -> String {
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    match v {
        AttributeValue::N(n) => format!("N({})", number_key(n)),
        AttributeValue::Ss(s) => format!("SS{:?}", sorted(s.clone())),
        AttributeValue::Ns(n) => {
            format!("NS{:?}", sorted(n.iter().map(|n| number_key(n)).collect()))
        }
        AttributeValue::Bs(b) => format!(
            "BS{:?}",
            sorted(b.iter().map(|b| format!("{:?}", b.as_ref())).collect())
        ),
        AttributeValue::L(l) => format!(
            "L[{}]",
            l.iter().map(normal_value).collect::<Vec<_>>().join(", ")
        ),
        AttributeValue::M(m) => format!("M{:?}", normal(m)),
        other => format!("{other:?}"),
    }
}

/// A number's value as text (`"1e2"`, `"100"` and `"100.0"` give one key). DynamoDB Local keeps some
/// numbers as written (added with ADD, inside lists and maps) and rewrites others in canonical text; the
/// value is what both must agree on.
fn number_key(text: &str) -> String {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (decimal, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (
            &unsigned[..at],
            unsigned[at + 1..].parse::<i64>().unwrap_or(0),
        ),
        None => (unsigned, 0),
    };
    let (whole, fraction) = decimal.split_once('.').unwrap_or((decimal, ""));
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() {
        return "0".to_owned();
    }
    let trimmed = significant.trim_end_matches('0');
    let exponent = exponent - i64::try_from(fraction.len()).unwrap()
        + i64::try_from(significant.len() - trimmed.len()).unwrap();
    format!("{}{trimmed}e{exponent}", if negative { "-" } else { "" })
}

async fn on_dynamodb(client: &Client, case: &Case) -> (Outcome, String) {
    let outcome = client
        .transact_write_items()
        .set_transact_items(Some(case.writes.clone()))
        .send()
        .await;
    match outcome {
        Ok(_) => (Outcome::Committed, String::new()),
        Err(e) => {
            let message = format!("{:?}: {:?}", e.code(), e.message());
            match e.into_service_error() {
                TransactWriteItemsError::TransactionCanceledException(canceled) => (
                    Outcome::Canceled(
                        canceled
                            .cancellation_reasons()
                            .iter()
                            .map(|r| (r.code().unwrap_or("None").to_owned(), r.item().map(normal)))
                            .collect(),
                    ),
                    message,
                ),
                other if other.code() == Some("ValidationException") => (Outcome::Invalid, message),
                other => panic!("unexpected error from DynamoDB Local: {other:?}"),
            }
        }
    }
}

async fn on_memory(store: &MemoryStore, case: &Case) -> (Outcome, String) {
    let request = ClaimRequest::new(
        "differential#record",
        "token",
        1_000_000,
        1_060_000,
        100_000,
    );
    match store
        .claim_transaction(&request, &case.writes.iter().cloned().collect())
        .await
    {
        Ok(TransactOutcome::Committed) => (Outcome::Committed, String::new()),
        Ok(TransactOutcome::Canceled(reasons)) => {
            let message = format!("{reasons:?}");
            // Index 0 is the idempotency record, which DynamoDB's side does not have.
            let reasons = reasons
                .into_iter()
                .skip(1)
                .map(|r| (r.code, r.item.as_ref().map(normal)))
                .collect();
            (Outcome::Canceled(reasons), message)
        }
        Ok(other) => panic!("the claim of a fresh key was rejected: {other:?}"),
        Err(idempotent_runtime::StoreError::Invalid(e)) => (Outcome::Invalid, e.to_string()),
        Err(e) => panic!("unexpected memory store error: {e}"),
    }
}

async fn dynamodb_items(client: &Client, case: &Case) -> BTreeMap<Target, Normal> {
    let mut request = client.batch_get_item();
    let mut by_table: BTreeMap<&str, Vec<Item>> = BTreeMap::new();
    for t in &case.targets {
        by_table.entry(&t.table).or_default().push(t.key());
    }
    for (table, keys) in by_table {
        request = request.request_items(
            table,
            KeysAndAttributes::builder()
                .set_keys(Some(keys))
                .consistent_read(true)
                .build()
                .unwrap(),
        );
    }
    let response = request
        .send()
        .await
        .expect("BatchGetItem on DynamoDB Local");
    let mut items = BTreeMap::new();
    for (table, found) in response.responses().into_iter().flatten() {
        for item in found {
            let Some(AttributeValue::S(pk)) = item.get("pk") else {
                continue;
            };
            let target = case
                .targets
                .iter()
                .find(|t| &t.table == table && &t.pk == pk && t.key().get("sk") == item.get("sk"))
                .expect("an item we asked for")
                .clone();
            items.insert(target, normal(item));
        }
    }
    items
}

fn memory_items(store: &MemoryStore, case: &Case) -> BTreeMap<Target, Normal> {
    case.targets
        .iter()
        .filter_map(|t| Some((t.clone(), normal(&store.get_item(&t.table, &t.key())?))))
        .collect()
}

async fn seed(client: &Client, store: &MemoryStore, case: &Case) {
    let mut request = client.batch_write_item();
    let mut by_table: BTreeMap<&str, Vec<WriteRequest>> = BTreeMap::new();
    for (table, item) in &case.seed {
        store
            .put_item(table, item.clone())
            .expect("seed the memory store");
        by_table.entry(table).or_default().push(
            WriteRequest::builder()
                .put_request(
                    PutRequest::builder()
                        .set_item(Some(item.clone()))
                        .build()
                        .unwrap(),
                )
                .build(),
        );
    }
    if by_table.is_empty() {
        return;
    }
    for (table, writes) in by_table {
        request = request.request_items(table, writes);
    }
    let response = request.send().await.expect("seed DynamoDB Local");
    assert!(
        response.unprocessed_items().is_none_or(HashMap::is_empty),
        "DynamoDB Local left seed items unprocessed"
    );
}

/// Runs one case: how both ended, or `Err` describing the divergence.
async fn run_case(
    client: &Client,
    tables: &Tables,
    seed_value: u64,
    n: u64,
) -> Result<&'static str, String> {
    let mut g = Gen::new(seed_value, n);
    let case = generate(&mut g, tables, n);
    let store = MemoryStore::new();
    store.create_table(&tables.t1, "pk", None).unwrap();
    store.create_table(&tables.t2, "pk", Some("sk")).unwrap();
    seed(client, &store, &case).await;

    let (ddb, ddb_message) = on_dynamodb(client, &case).await;
    let (mem, mem_message) = on_memory(&store, &case).await;
    let ddb_items = dynamodb_items(client, &case).await;
    let mem_items = memory_items(&store, &case);

    if let Some(known) = known_difference(&ddb, &ddb_message, &mem, &mem_message) {
        // Neither side wrote anything: the items must still agree.
        return if ddb_items == mem_items {
            Ok(known)
        } else {
            Err(format!(
                "case {n}: {known}, but the items differ: DynamoDB {ddb_items:#?}\nmemory {mem_items:#?}"
            ))
        };
    }
    let mut problems = String::new();
    if ddb != mem {
        let _ = writeln!(
            problems,
            "outcome: DynamoDB {ddb:?} ({ddb_message})\n         memory   {mem:?} ({mem_message})"
        );
    }
    if ddb_items != mem_items {
        let _ = writeln!(
            problems,
            "items after: DynamoDB {ddb_items:#?}\n             memory   {mem_items:#?}"
        );
    }
    if problems.is_empty() {
        Ok(match ddb {
            Outcome::Committed => "committed",
            Outcome::Canceled(_) => "canceled",
            Outcome::Invalid => "refused as invalid",
        })
    } else {
        Err(format!(
            "case {n}: {problems}seeded: {:#?}\ntransaction: {:#?}",
            case.seed, case.writes
        ))
    }
}

/// Where DynamoDB Local parts from DynamoDB's documented behaviour, which the emulator follows (listed in
/// its docs): both refuse the transaction and write nothing, one with a cancellation reason and the other
/// with a `ValidationException`.
fn known_difference(
    ddb: &Outcome,
    ddb_message: &str,
    mem: &Outcome,
    mem_message: &str,
) -> Option<&'static str> {
    let reasons_include = |outcome: &Outcome, code: &str| matches!(outcome, Outcome::Canceled(reasons) if reasons.iter().any(|(c, _)| c == code));
    match (ddb, mem) {
        // DynamoDB Local evaluates the conditions before it refuses two actions on one item.
        (Outcome::Canceled(_), Outcome::Invalid)
            if mem_message.contains("multiple operations on one item") =>
        {
            Some("known difference: two actions on one item")
        }
        // DynamoDB Local reports a key attribute's update as a cancellation reason, after the
        // conditions; the emulator refuses it up front.
        (Outcome::Canceled(_), Outcome::Invalid)
            if mem_message.contains("This attribute is part of the key") =>
        {
            Some("known difference: an update of a key attribute")
        }
        // DynamoDB Local refuses the request for an update that fails on the item's values; DynamoDB
        // documents a `ValidationError` cancellation reason.
        (Outcome::Invalid, _)
            if reasons_include(mem, "ValidationError")
                && (ddb_message.contains("refers to an attribute that does not exist")
                    || ddb_message.contains("incorrect data type")
                    || ddb_message.contains("precision up to 38 digits")) =>
        {
            Some("known difference: an update that fails on the item's values")
        }
        _ => None,
    }
}

async fn create_tables(client: &Client) -> Tables {
    let tables = Tables {
        t1: unique_table("diff1"),
        t2: unique_table("diff2"),
    };
    for (name, sort) in [(&tables.t1, false), (&tables.t2, true)] {
        let mut definitions = vec![
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        ];
        let mut schema = vec![
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        ];
        if sort {
            definitions.push(
                AttributeDefinition::builder()
                    .attribute_name("sk")
                    .attribute_type(ScalarAttributeType::N)
                    .build()
                    .unwrap(),
            );
            schema.push(
                KeySchemaElement::builder()
                    .attribute_name("sk")
                    .key_type(KeyType::Range)
                    .build()
                    .unwrap(),
            );
        }
        client
            .create_table()
            .table_name(name)
            .set_attribute_definitions(Some(definitions))
            .set_key_schema(Some(schema))
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await
            .expect("create a table on DynamoDB Local");
    }
    tables
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_transacts_like_dynamodb_local() {
    let (client, _) = client();
    let tables = Arc::new(create_tables(&client).await);
    let seed = env_u64("IDEMPOTENT_DIFF_SEED").unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        u64::try_from(nanos % u128::from(u64::MAX)).unwrap()
    });
    let cases: Vec<u64> = match env_u64("IDEMPOTENT_DIFF_CASE") {
        Some(only) => vec![only],
        None => (0..env_u64("IDEMPOTENT_DIFF_CASES").unwrap_or(2_000)).collect(),
    };
    println!(
        "differential: seed {seed} (replay: IDEMPOTENT_DIFF_SEED={seed}), {} cases",
        cases.len()
    );
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut outcomes = BTreeMap::<&str, usize>::new();
    for chunk in cases.chunks(CONCURRENCY) {
        let mut tasks = tokio::task::JoinSet::new();
        for &n in chunk {
            let client = client.clone();
            let tables = Arc::clone(&tables);
            tasks.spawn(async move { (n, run_case(&client, &tables, seed, n).await) });
        }
        while let Some(done) = tasks.join_next().await {
            let (n, result) = done.expect("a case panicked");
            match result {
                Ok(kind) => *outcomes.entry(kind).or_default() += 1,
                Err(report) => failures.push((n, report)),
            }
        }
    }
    let elapsed = started.elapsed();
    let count = f64::from(u32::try_from(cases.len()).unwrap());
    println!(
        "differential: {} cases in {elapsed:.1?} ({:.0} cases/s), {} divergent; agreed: {outcomes:?}",
        cases.len(),
        count / elapsed.as_secs_f64(),
        failures.len()
    );
    failures.sort_by_key(|(n, _)| *n);
    for (n, report) in &failures {
        let first: String = report.lines().take(2).collect::<Vec<_>>().join(" / ");
        println!(
            "divergent case {n}: {}",
            first.chars().take(400).collect::<String>()
        );
    }
    if let Some((n, report)) = failures.first() {
        panic!(
            "{} of {} cases diverged; the first (replay: IDEMPOTENT_DIFF_SEED={seed} IDEMPOTENT_DIFF_CASE={n}):\n{report}",
            failures.len(),
            cases.len()
        );
    }
}
