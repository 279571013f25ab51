//! The emulator's rules and messages, one test each; `tests/tests/stores/differential.rs` checks the same
//! behaviour against DynamoDB Local on generated requests.

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update as UpdateAction,
};

use super::*;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn n(v: &str) -> AttributeValue {
    AttributeValue::N(v.to_owned())
}

fn item(pairs: &[(&str, AttributeValue)]) -> Item {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn sku(name: &str) -> Item {
    item(&[("sku", s(name))])
}

fn values(pairs: &[(&str, AttributeValue)]) -> Option<Item> {
    (!pairs.is_empty()).then(|| item(pairs))
}

/// `inventory` (key `sku`) with 10 apples and 1 pear, and `orders` (key `customer`, `order_id`), empty.
fn tables() -> Tables {
    let mut tables = Tables::default();
    tables.create_table("inventory", "sku", None).unwrap();
    tables
        .create_table("orders", "customer", Some("order_id"))
        .unwrap();
    for (name, count) in [("apple", "10"), ("pear", "1")] {
        let stock = item(&[("sku", s(name)), ("available", n(count))]);
        tables.put_item("inventory", stock).unwrap();
    }
    tables
}

fn put(
    table: &str,
    item: Item,
    condition: Option<&str>,
    values: &[(&str, AttributeValue)],
) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .set_condition_expression(condition.map(str::to_owned))
        .set_expression_attribute_values(self::values(values))
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

fn update(
    table: &str,
    key: Item,
    expression: &str,
    condition: Option<&str>,
    values: &[(&str, AttributeValue)],
) -> TransactWriteItem {
    let update = UpdateAction::builder()
        .table_name(table)
        .set_key(Some(key))
        .update_expression(expression)
        .set_condition_expression(condition.map(str::to_owned))
        .set_expression_attribute_values(self::values(values))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .build()
        .unwrap();
    TransactWriteItem::builder().update(update).build()
}

fn delete(
    table: &str,
    key: Item,
    condition: &str,
    values: &[(&str, AttributeValue)],
) -> TransactWriteItem {
    let delete = Delete::builder()
        .table_name(table)
        .set_key(Some(key))
        .condition_expression(condition)
        .set_expression_attribute_values(self::values(values))
        .build()
        .unwrap();
    TransactWriteItem::builder().delete(delete).build()
}

fn check(
    table: &str,
    key: Item,
    condition: &str,
    values: &[(&str, AttributeValue)],
    all_old: bool,
) -> TransactWriteItem {
    let check = ConditionCheck::builder()
        .table_name(table)
        .set_key(Some(key))
        .condition_expression(condition)
        .set_expression_attribute_values(self::values(values))
        .set_return_values_on_condition_check_failure(
            all_old.then_some(ReturnValuesOnConditionCheckFailure::AllOld),
        )
        .build()
        .unwrap();
    TransactWriteItem::builder().condition_check(check).build()
}

/// Takes `quantity` apples if there are that many.
fn reserve(quantity: &str) -> TransactWriteItem {
    update(
        "inventory",
        sku("apple"),
        "SET available = available - :q",
        Some("available >= :q"),
        &[(":q", n(quantity))],
    )
}

fn error_text(result: Result<Plan, Refused>) -> String {
    match result {
        Err(e) => e.to_string(),
        Ok(plan) => panic!("expected an error, got {plan:?}"),
    }
}

fn available(tables: &Tables, name: &str) -> AttributeValue {
    tables.get_item("inventory", &sku(name)).unwrap()["available"].clone()
}

#[test]
fn a_plan_changes_nothing_until_committed() {
    let mut tables = tables();
    let plan = tables.plan(&[reserve("3")]).unwrap();
    assert!(plan.holds());
    assert_eq!(available(&tables, "apple"), n("10"));
    tables.commit(plan).unwrap();
    assert_eq!(available(&tables, "apple"), n("7"));
}

#[test]
fn a_plan_that_does_not_hold_commits_nothing_and_gives_the_reasons() {
    let mut tables = tables();
    let plan = tables
        .plan(&[
            reserve("3"),
            delete(
                "inventory",
                sku("pear"),
                "available > :one",
                &[(":one", n("1"))],
            ),
        ])
        .unwrap();
    let reasons = tables.commit(plan).unwrap_err();
    let codes: Vec<_> = reasons.iter().map(|r| (r.index, r.code.as_str())).collect();
    assert_eq!(
        codes,
        [(0, "None"), (1, "None"), (2, "ConditionalCheckFailed")]
    );
    assert_eq!(
        available(&tables, "apple"),
        n("10"),
        "the reservation that held was not applied"
    );
    assert_eq!(available(&tables, "pear"), n("1"));
}

#[test]
fn put_replaces_the_whole_item_found_by_the_key_schema() {
    let mut tables = tables();
    let order = |id: &str, extra: (&str, AttributeValue)| {
        item(&[("customer", s("ada")), ("order_id", s(id)), extra])
    };
    let writes = [
        put("orders", order("o-1", ("total", n("5"))), None, &[]),
        put("orders", order("o-2", ("total", n("6"))), None, &[]),
    ];
    tables.commit(tables.plan(&writes).unwrap()).unwrap();
    let replace = put(
        "orders",
        order("o-1", ("note", s("gift"))),
        Some("attribute_exists(order_id)"),
        &[],
    );
    tables.commit(tables.plan(&[replace]).unwrap()).unwrap();
    let items = tables.items("orders");
    assert_eq!(items.len(), 2);
    assert_eq!(
        items[0],
        order("o-1", ("note", s("gift"))),
        "the old `total` is gone"
    );
    assert_eq!(items[1]["total"], n("6"));
}

#[test]
fn update_creates_a_missing_item_from_its_key() {
    let mut tables = tables();
    let upsert = update(
        "inventory",
        sku("plum"),
        "ADD available :n",
        None,
        &[(":n", n("4"))],
    );
    tables.commit(tables.plan(&[upsert]).unwrap()).unwrap();
    assert_eq!(
        tables.get_item("inventory", &sku("plum")),
        Some(item(&[("sku", s("plum")), ("available", n("4"))]))
    );
}

#[test]
fn delete_removes_the_item_and_condition_check_writes_nothing() {
    let mut tables = tables();
    let writes = [
        delete(
            "inventory",
            sku("apple"),
            "available = :ten",
            &[(":ten", n("10"))],
        ),
        check(
            "inventory",
            sku("pear"),
            "attribute_exists(sku)",
            &[],
            false,
        ),
    ];
    tables.commit(tables.plan(&writes).unwrap()).unwrap();
    assert_eq!(tables.get_item("inventory", &sku("apple")), None);
    assert_eq!(
        tables.items("inventory"),
        [item(&[("sku", s("pear")), ("available", n("1"))])]
    );
}

#[test]
fn failed_conditions_give_one_reason_per_action() {
    let tables = tables();
    let writes = [
        reserve("3"),
        check(
            "inventory",
            sku("pear"),
            "available > :many",
            &[(":many", n("100"))],
            true,
        ),
        put("inventory", sku("plum"), Some("attribute_exists(sku)"), &[]),
    ];
    let plan = tables.plan(&writes).unwrap();
    assert!(!plan.holds());
    let reasons = plan.cancellation_reasons();
    let codes: Vec<_> = reasons.iter().map(|r| (r.index, r.code.as_str())).collect();
    assert_eq!(
        codes,
        [
            (0, "None"),
            (1, "None"),
            (2, "ConditionalCheckFailed"),
            (3, "ConditionalCheckFailed")
        ]
    );
    assert_eq!(
        reasons[2].message.as_deref(),
        Some("The conditional request failed")
    );
    assert_eq!(
        reasons[2].item,
        Some(item(&[("sku", s("pear")), ("available", n("1"))])),
        "ALL_OLD returns the item as it was"
    );
    assert_eq!(reasons[3].item, None, "no ALL_OLD asked, and no item");
    assert_eq!(available(&tables, "apple"), n("10"));
}

#[test]
fn an_update_that_fails_on_the_data_is_a_validation_error() {
    let bad = update(
        "inventory",
        sku("apple"),
        "SET available = absent + :q",
        None,
        &[(":q", n("1"))],
    );
    let reasons = tables().plan(&[bad]).unwrap().cancellation_reasons();
    assert_eq!(reasons[1].code, "ValidationError");
    assert_eq!(
        reasons[1].message.as_deref(),
        Some("The provided expression refers to an attribute that does not exist in the item")
    );
}

#[test]
fn two_actions_on_one_item_are_refused_before_evaluation() {
    let tables = tables();
    let message = error_text(tables.plan(&[reserve("1"), reserve("2")]));
    assert_eq!(
        message,
        "Transaction request cannot include multiple operations on one item (actions 1 and 2 on table `inventory`)"
    );
    // A Put's key comes from its item and the table's key schema.
    let replace = put(
        "inventory",
        item(&[("sku", s("apple")), ("x", n("1"))]),
        None,
        &[],
    );
    let message = error_text(tables.plan(&[reserve("1"), replace]));
    assert!(
        message.contains("multiple operations on one item"),
        "{message}"
    );
}

#[test]
fn equal_numbers_are_one_key() {
    let mut tables = Tables::default();
    tables.create_table("counters", "id", None).unwrap();
    tables
        .put_item("counters", item(&[("id", n("1.0")), ("hits", n("1"))]))
        .unwrap();
    let bump = update(
        "counters",
        item(&[("id", n("1"))]),
        "ADD hits :one",
        None,
        &[(":one", n("1"))],
    );
    tables.commit(tables.plan(&[bump]).unwrap()).unwrap();
    let items = tables.items("counters");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["hits"], n("2"));
}

#[test]
fn a_write_to_an_unknown_table_names_it_and_create_table() {
    let message = error_text(tables().plan(&[put("stock", sku("a"), None, &[])]));
    assert_eq!(
        message,
        "action 1 (a staged Put on table `stock`): the memory store has no table `stock`; create it first \
         with `MemoryStore::create_table(\"stock\", <partition key>, <sort key or None>)`"
    );
    let seeded = tables()
        .put_item("stock", sku("a"))
        .unwrap_err()
        .to_string();
    assert!(seeded.contains("create_table(\"stock\""), "{seeded}");
}

#[test]
fn an_unsupported_expression_names_the_part_the_expression_and_the_reference() {
    let nested = update(
        "inventory",
        sku("pear"),
        "SET stock.shelf = :q",
        None,
        &[(":q", n("1"))],
    );
    let message = error_text(tables().plan(&[reserve("1"), nested]));
    assert!(
        message.starts_with(
            "the memory store does not support a nested attribute path `stock.shelf` in the UpdateExpression \
             `SET stock.shelf = :q` of action 2 (a staged Update on table `inventory`); it models top-level"
        ),
        "{message}"
    );
    assert!(
        message.ends_with(
            "DynamoDB Local is the reference for the rest: run this test against it (`scripts/test`)"
        ),
        "{message}"
    );
    let sized = check(
        "inventory",
        sku("apple"),
        "size(tags) > :q",
        &[(":q", n("1"))],
        false,
    );
    let message = error_text(tables().plan(&[sized]));
    assert!(
        message.contains(
            "the function `size` `size(tags)` in the ConditionExpression `size(tags) > :q` of action 1 \
             (a staged ConditionCheck on table `inventory`)"
        ),
        "{message}"
    );
}

#[test]
fn an_invalid_expression_says_dynamodb_rejects_it_too() {
    let incomplete = update(
        "inventory",
        sku("apple"),
        "SET available = :q",
        Some("available >="),
        &[(":q", n("1"))],
    );
    assert_eq!(
        error_text(tables().plan(&[incomplete])),
        "invalid ConditionExpression `available >=` of action 1 (a staged Update on table `inventory`): \
         syntax error: expected an attribute name, found the end of the expression (DynamoDB rejects it too)"
    );
    let unused = update(
        "inventory",
        sku("apple"),
        "SET available = :q",
        None,
        &[(":q", n("1")), (":spare", n("2"))],
    );
    assert_eq!(
        error_text(tables().plan(&[unused])),
        "invalid expressions of action 1 (a staged Update on table `inventory`): Value provided in \
         ExpressionAttributeValues unused in expressions: keys: {:spare} (DynamoDB rejects it too)"
    );
}

#[test]
fn keys_must_match_the_schema_and_stay_unchanged() {
    let tables = tables();
    let set_amount = |key| update("orders", key, "SET amount = :q", None, &[(":q", n("1"))]);
    let half_key = set_amount(item(&[("customer", s("ada"))]));
    assert!(
        error_text(tables.plan(&[half_key]))
            .ends_with("The number of conditions on the keys is invalid")
    );
    let extra = set_amount(item(&[
        ("customer", s("ada")),
        ("order_id", s("o")),
        ("x", n("1")),
    ]));
    assert!(
        error_text(tables.plan(&[extra]))
            .ends_with("The number of conditions on the keys is invalid")
    );
    let misnamed = set_amount(item(&[("customer", s("ada")), ("order", s("o"))]));
    assert!(
        error_text(tables.plan(&[misnamed]))
            .ends_with("The provided key element does not match the schema")
    );
    let keyless = put("orders", item(&[("customer", s("ada"))]), None, &[]);
    assert!(error_text(tables.plan(&[keyless])).ends_with("Missing the key order_id in the item"));
    let rekey = update(
        "inventory",
        sku("apple"),
        "SET sku = :s",
        None,
        &[(":s", s("plum"))],
    );
    assert!(
        error_text(tables.plan(&[rekey]))
            .ends_with("Cannot update attribute sku. This attribute is part of the key")
    );
}

#[test]
fn create_table_again_keeps_items_or_refuses_another_schema() {
    let mut tables = tables();
    tables.create_table("inventory", "sku", None).unwrap();
    assert_eq!(available(&tables, "apple"), n("10"));
    let message = tables
        .create_table("inventory", "id", Some("sku"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("already has a table `inventory` with the key (sku)"),
        "{message}"
    );
}

#[test]
fn at_most_99_staged_writes() {
    let tables = tables();
    let writes: Vec<_> = (0..100)
        .map(|i| put("inventory", sku(&format!("sku-{i}")), None, &[]))
        .collect();
    assert!(error_text(tables.plan(&writes)).contains("at most 100 actions"));
    assert!(tables.plan(&writes[..99]).is_ok());
}

#[test]
fn an_empty_action_is_refused() {
    let message = error_text(tables().plan(&[TransactWriteItem::builder().build()]));
    assert!(
        message.contains("exactly one of Put, Update, Delete or ConditionCheck"),
        "{message}"
    );
}

/// Found by the differential tests: DynamoDB reads back top-level numbers in canonical text.
#[test]
fn numbers_are_stored_in_canonical_text() {
    let mut tables = tables();
    let mut apple = sku("apple");
    apple.insert("available".to_owned(), n("1e2"));
    apple.insert(
        "sizes".to_owned(),
        AttributeValue::Ns(vec!["0.10".into(), "2E1".into()]),
    );
    tables.put_item("inventory", apple).unwrap();
    let stored = tables.get_item("inventory", &sku("apple")).unwrap();
    assert_eq!(stored["available"], n("100"));
    assert_eq!(
        stored["sizes"],
        AttributeValue::Ns(vec!["0.1".into(), "20".into()])
    );
}
