//! Condition and update expressions, as far as the emulator models them: a tokenizer, a
//! recursive-descent parser into a small tree, and the tree's evaluation against one item.
//!
//! Placeholders (`#name`, `:value`) are resolved while parsing, so the trees hold attribute names and
//! values and evaluation cannot fail on a missing placeholder. What DynamoDB accepts but this module does
//! not model (nested paths, `size`, `contains`, `attribute_type`, `list_append`) is an
//! [`ExpressionError::Unsupported`] naming the exact part, never a silent approximation; what DynamoDB
//! rejects (syntax, reserved words, undefined or unused placeholders, wrong literal types) is an
//! [`ExpressionError::Invalid`] with DynamoDB's message, so that a test passing here does not fail on
//! DynamoDB for a reason this module ignored.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;

use super::number::Number;
use super::reserved::is_reserved;

/// One item: attribute name → value.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// What the emulator models, for error messages.
pub(crate) const SUPPORTED: &str = "top-level attributes (plain or `#name`) and `:values`; conditions with \
    `=`, `<>`, `<`, `<=`, `>`, `>=`, BETWEEN, IN, attribute_exists, attribute_not_exists, begins_with, AND, OR, \
    NOT and parentheses; updates with SET (`=`, `+`, `-`, if_not_exists), REMOVE, ADD and DELETE";

/// Why an expression cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExpressionError {
    /// Valid DynamoDB that the memory store does not model: what it is, and the expression's text for it.
    Unsupported {
        /// What kind of thing, e.g. "a nested attribute path".
        what: String,
        /// The offending text, e.g. `a.b`.
        part: String,
    },
    /// An expression DynamoDB rejects too (syntax, undefined or unused placeholders, wrong operand types).
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> ExpressionError {
    ExpressionError::Invalid(message.into())
}

// ---------------------------------------------------------------------------------------------------
// Placeholders

/// The `ExpressionAttributeNames` and `ExpressionAttributeValues` of one action, and which of them its
/// expressions used: DynamoDB rejects an action that defines a placeholder none of its expressions uses.
#[derive(Debug)]
pub(crate) struct Placeholders<'a> {
    names: Option<&'a HashMap<String, String>>,
    values: Option<&'a HashMap<String, AttributeValue>>,
    used_names: BTreeSet<String>,
    used_values: BTreeSet<String>,
}

impl<'a> Placeholders<'a> {
    pub(crate) fn new(
        names: Option<&'a HashMap<String, String>>,
        values: Option<&'a HashMap<String, AttributeValue>>,
    ) -> Self {
        Self {
            names,
            values,
            used_names: BTreeSet::new(),
            used_values: BTreeSet::new(),
        }
    }

    fn name(&mut self, placeholder: &str) -> Result<String, ExpressionError> {
        let name = self.names.and_then(|m| m.get(placeholder)).ok_or_else(|| {
            invalid(format!(
                "An expression attribute name used in the document path is not defined; attribute name: {placeholder}"
            ))
        })?;
        self.used_names.insert(placeholder.to_owned());
        Ok(name.clone())
    }

    fn value(&mut self, placeholder: &str) -> Result<AttributeValue, ExpressionError> {
        let value = self.values.and_then(|m| m.get(placeholder)).ok_or_else(|| {
            invalid(format!(
                "An expression attribute value used in expression is not defined; attribute value: {placeholder}"
            ))
        })?;
        validate_value(value).map_err(|e| {
            invalid(format!(
                "ExpressionAttributeValues contains an invalid value for {placeholder}: {e}"
            ))
        })?;
        self.used_values.insert(placeholder.to_owned());
        Ok(value.clone())
    }

    /// Fails, with DynamoDB's message, if a defined placeholder was not used by any expression.
    pub(crate) fn check_all_used(&self) -> Result<(), ExpressionError> {
        fn unused<'k>(
            defined: impl Iterator<Item = &'k String>,
            used: &BTreeSet<String>,
        ) -> Vec<&'k str> {
            let mut keys: Vec<&str> = defined
                .filter(|k| !used.contains(*k))
                .map(String::as_str)
                .collect();
            keys.sort_unstable();
            keys
        }
        let names = unused(
            self.names.into_iter().flat_map(HashMap::keys),
            &self.used_names,
        );
        if !names.is_empty() {
            return Err(invalid(format!(
                "Value provided in ExpressionAttributeNames unused in expressions: keys: {{{}}}",
                names.join(", ")
            )));
        }
        let values = unused(
            self.values.into_iter().flat_map(HashMap::keys),
            &self.used_values,
        );
        if !values.is_empty() {
            return Err(invalid(format!(
                "Value provided in ExpressionAttributeValues unused in expressions: keys: {{{}}}",
                values.join(", ")
            )));
        }
        Ok(())
    }
}

/// Checks what DynamoDB checks on every value it receives: numbers are numbers, sets are not empty.
fn no_duplicates<T: Eq + std::hash::Hash>(set: &[T]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::with_capacity(set.len());
    if set.iter().all(|v| seen.insert(v)) {
        Ok(())
    } else {
        Err("Input collection contains duplicates".into())
    }
}

pub(crate) fn validate_value(value: &AttributeValue) -> Result<(), String> {
    match value {
        AttributeValue::N(n) => Number::parse(n).map(drop),
        AttributeValue::Ns(set) if !set.is_empty() => {
            let numbers = set
                .iter()
                .map(|n| Number::parse(n))
                .collect::<Result<Vec<_>, _>>()?;
            // `"1e2"` and `"100"` are one number: DynamoDB refuses the set (found by the differential
            // tests).
            no_duplicates(&numbers)
        }
        AttributeValue::Ss(set) if set.is_empty() => Err("a string set may not be empty".into()),
        AttributeValue::Ns(_) => Err("a number set may not be empty".into()),
        AttributeValue::Bs(set) if set.is_empty() => Err("a binary set may not be empty".into()),
        AttributeValue::Ss(set) => no_duplicates(set),
        AttributeValue::Bs(set) => {
            no_duplicates(&set.iter().map(AsRef::as_ref).collect::<Vec<&[u8]>>())
        }
        AttributeValue::L(list) => list.iter().try_for_each(validate_value),
        AttributeValue::M(map) => map.values().try_for_each(validate_value),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------------
// Trees

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Comparator {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Comparator {
    fn symbol(self) -> &'static str {
        match self {
            Comparator::Eq => "=",
            Comparator::Ne => "<>",
            Comparator::Lt => "<",
            Comparator::Le => "<=",
            Comparator::Gt => ">",
            Comparator::Ge => ">=",
        }
    }
}

/// An attribute of the item, or a value from `ExpressionAttributeValues`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Operand {
    Path(String),
    Value(AttributeValue),
}

/// A parsed condition expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Condition {
    Compare(Operand, Comparator, Operand),
    Between {
        operand: Operand,
        low: Operand,
        high: Operand,
    },
    AttributeExists(String),
    AttributeNotExists(String),
    BeginsWith(Operand, Operand),
    /// `operand IN (candidates)`.
    In(Operand, Vec<Operand>),
    Not(Box<Condition>),
    And(Box<Condition>, Box<Condition>),
    Or(Box<Condition>, Box<Condition>),
}

/// One side of a SET action's arithmetic.
#[derive(Debug, Clone, PartialEq)]
enum Term {
    Operand(Operand),
    /// `if_not_exists(path, operand)`: the attribute if present, else the operand.
    IfNotExists(String, Operand),
}

/// The right-hand side of a SET action.
#[derive(Debug, Clone, PartialEq)]
enum SetValue {
    Term(Term),
    Sum(Term, Term),
    Difference(Term, Term),
}

/// A parsed update expression. Every right-hand side is evaluated against the item as it was before
/// the update, as DynamoDB does.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Update {
    set: Vec<(String, SetValue)>,
    remove: Vec<String>,
    add: Vec<(String, AttributeValue)>,
    delete: Vec<(String, AttributeValue)>,
}

// ---------------------------------------------------------------------------------------------------
// Tokens

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A plain attribute name, a keyword or a function name.
    Word,
    /// `#name`.
    Name,
    /// `:value`.
    Value,
    /// Digits: only meaningful as a list index, which is a nested path.
    Integer,
    LParen,
    RParen,
    Comma,
    Dot,
    LBracket,
    RBracket,
    Plus,
    Minus,
    Compare(Comparator),
}

#[derive(Debug, Clone, Copy)]
struct Token<'s> {
    kind: Kind,
    text: &'s str,
    /// Byte offset in the expression.
    start: usize,
}

impl Token<'_> {
    fn end(&self) -> usize {
        self.start + self.text.len()
    }

    fn is_keyword(&self, keyword: &str) -> bool {
        self.kind == Kind::Word && self.text.eq_ignore_ascii_case(keyword)
    }
}

const KEYWORDS: [&str; 9] = [
    "AND", "OR", "NOT", "BETWEEN", "IN", "SET", "REMOVE", "ADD", "DELETE",
];

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn tokenize(source: &str) -> Result<Vec<Token<'_>>, ExpressionError> {
    let mut tokens = Vec::new();
    let mut chars = source.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        let mut take_while = |pred: fn(char) -> bool| {
            let mut end = start + c.len_utf8();
            while let Some(&(i, next)) = chars.peek().filter(|(_, next)| pred(*next)) {
                end = i + next.len_utf8();
                chars.next();
            }
            end
        };
        let (kind, end) = match c {
            '(' => (Kind::LParen, start + 1),
            ')' => (Kind::RParen, start + 1),
            ',' => (Kind::Comma, start + 1),
            '.' => (Kind::Dot, start + 1),
            '[' => (Kind::LBracket, start + 1),
            ']' => (Kind::RBracket, start + 1),
            '+' => (Kind::Plus, start + 1),
            '-' => (Kind::Minus, start + 1),
            '=' => (Kind::Compare(Comparator::Eq), start + 1),
            '<' | '>' => {
                let second = chars.peek().map(|&(_, next)| next);
                let (comparator, len) = match (c, second) {
                    ('<', Some('>')) => (Comparator::Ne, 2),
                    ('<', Some('=')) => (Comparator::Le, 2),
                    ('>', Some('=')) => (Comparator::Ge, 2),
                    ('<', _) => (Comparator::Lt, 1),
                    _ => (Comparator::Gt, 1),
                };
                if len == 2 {
                    chars.next();
                }
                (Kind::Compare(comparator), start + len)
            }
            '#' | ':' => {
                let end = take_while(is_word_char);
                if end == start + 1 {
                    return Err(invalid(format!(
                        "syntax error: `{c}` at character {start} must be followed by a placeholder name"
                    )));
                }
                (if c == '#' { Kind::Name } else { Kind::Value }, end)
            }
            c if c.is_ascii_digit() => (Kind::Integer, take_while(|c| c.is_ascii_digit())),
            c if c.is_ascii_alphabetic() || c == '_' => (Kind::Word, take_while(is_word_char)),
            other => {
                return Err(invalid(format!(
                    "syntax error: unexpected character `{other}` at character {start}"
                )));
            }
        };
        tokens.push(Token {
            kind,
            text: &source[start..end],
            start,
        });
    }
    Ok(tokens)
}

// ---------------------------------------------------------------------------------------------------
// Parser

/// Parses a condition expression, resolving its placeholders.
pub(crate) fn parse_condition(
    source: &str,
    placeholders: &mut Placeholders<'_>,
) -> Result<Condition, ExpressionError> {
    let mut parser = Parser::new(source, placeholders)?;
    let condition = parser.condition()?;
    parser.finish()?;
    Ok(condition)
}

/// Parses an update expression, resolving its placeholders.
pub(crate) fn parse_update(
    source: &str,
    placeholders: &mut Placeholders<'_>,
) -> Result<Update, ExpressionError> {
    let mut parser = Parser::new(source, placeholders)?;
    let update = parser.update()?;
    parser.finish()?;
    update.check_paths_distinct()?;
    Ok(update)
}

struct Parser<'s, 'p, 'a> {
    source: &'s str,
    tokens: Vec<Token<'s>>,
    next: usize,
    placeholders: &'p mut Placeholders<'a>,
}

impl<'s, 'p, 'a> Parser<'s, 'p, 'a> {
    fn new(
        source: &'s str,
        placeholders: &'p mut Placeholders<'a>,
    ) -> Result<Self, ExpressionError> {
        let tokens = tokenize(source)?;
        if tokens.is_empty() {
            return Err(invalid("the expression can not be empty"));
        }
        Ok(Self {
            source,
            tokens,
            next: 0,
            placeholders,
        })
    }

    // --- token helpers

    fn peek(&self) -> Option<Token<'s>> {
        self.tokens.get(self.next).copied()
    }

    fn peek_kind(&self) -> Option<Kind> {
        self.peek().map(|t| t.kind)
    }

    fn advance(&mut self) -> Option<Token<'s>> {
        let token = self.peek()?;
        self.next += 1;
        Some(token)
    }

    fn eat(&mut self, kind: Kind) -> bool {
        let matched = self.peek_kind() == Some(kind);
        if matched {
            self.next += 1;
        }
        matched
    }

    fn at_keyword(&self, keyword: &str) -> bool {
        self.peek().is_some_and(|t| t.is_keyword(keyword))
    }

    fn eat_keyword(&mut self, keyword: &str) -> bool {
        let matched = self.at_keyword(keyword);
        if matched {
            self.next += 1;
        }
        matched
    }

    /// Whether a function call starts here (`name(`).
    fn at_call(&self) -> bool {
        self.peek_kind() == Some(Kind::Word)
            && self.tokens.get(self.next + 1).map(|t| t.kind) == Some(Kind::LParen)
    }

    fn expect(&mut self, kind: Kind, what: &str) -> Result<Token<'s>, ExpressionError> {
        match self.peek() {
            Some(token) if token.kind == kind => {
                self.next += 1;
                Ok(token)
            }
            _ => Err(self.expected(what)),
        }
    }

    /// A syntax error at the next token.
    fn expected(&self, what: &str) -> ExpressionError {
        match self.peek() {
            Some(token) => invalid(format!(
                "syntax error: expected {what}, found `{}` at character {}",
                token.text, token.start
            )),
            None => invalid(format!(
                "syntax error: expected {what}, found the end of the expression"
            )),
        }
    }

    fn finish(&self) -> Result<(), ExpressionError> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(self.expected("the end of the expression")),
        }
    }

    /// Skips a balanced `( ... )` that starts at the next token; returns the end offset.
    fn skip_parenthesized(&mut self) -> usize {
        let mut depth = 0usize;
        let mut end = self.peek().map_or(self.source.len(), |t| t.start);
        while let Some(token) = self.advance() {
            end = token.end();
            match token.kind {
                Kind::LParen => depth += 1,
                Kind::RParen => depth = depth.saturating_sub(1),
                _ => {}
            }
            if depth == 0 {
                break;
            }
        }
        end
    }

    fn unsupported(&self, what: impl Into<String>, start: usize, end: usize) -> ExpressionError {
        ExpressionError::Unsupported {
            what: what.into(),
            part: self.source[start..end].to_owned(),
        }
    }

    // --- operands

    /// A top-level attribute: a plain name or a `#name`.
    fn path(&mut self) -> Result<String, ExpressionError> {
        let token = match self.peek() {
            Some(t) if t.kind == Kind::Word && !KEYWORDS.iter().any(|k| t.is_keyword(k)) => t,
            Some(t) if t.kind == Kind::Name => t,
            _ => return Err(self.expected("an attribute name")),
        };
        self.next += 1;
        if matches!(self.peek_kind(), Some(Kind::Dot | Kind::LBracket)) {
            let end = self.skip_nested_path();
            return Err(self.unsupported("a nested attribute path", token.start, end));
        }
        match token.kind {
            Kind::Name => self.placeholders.name(token.text),
            _ if is_reserved(token.text) => Err(invalid(format!(
                "Attribute name is a reserved keyword; reserved keyword: {}",
                token.text
            ))),
            _ => Ok(token.text.to_owned()),
        }
    }

    /// Skips the `.name` and `[index]` parts after a path's first name; returns the end offset.
    fn skip_nested_path(&mut self) -> usize {
        let mut end = self.peek().map_or(self.source.len(), |t| t.start);
        while matches!(self.peek_kind(), Some(Kind::Dot | Kind::LBracket)) {
            let opener = self.advance().map(|t| t.kind);
            while let Some(token) = self.advance() {
                end = token.end();
                let closes = opener == Some(Kind::Dot) || token.kind == Kind::RBracket;
                if closes {
                    break;
                }
            }
        }
        end
    }

    /// A path or a `:value`.
    fn operand(&mut self) -> Result<Operand, ExpressionError> {
        match self.peek() {
            Some(t) if t.kind == Kind::Value => {
                self.next += 1;
                Ok(Operand::Value(self.placeholders.value(t.text)?))
            }
            Some(_) if self.at_call() => Err(self.misplaced_function(Place::Condition)),
            _ => Ok(Operand::Path(self.path()?)),
        }
    }

    /// The error for a function call that `place` does not model: valid DynamoDB the memory store does
    /// not evaluate, a function DynamoDB does not allow there, or no function at all.
    fn misplaced_function(&mut self, place: Place) -> ExpressionError {
        let Some(name) = self.peek() else {
            return self.expected("a function");
        };
        self.next += 1;
        let end = self.skip_parenthesized();
        let (unmodelled, expression): (&[&str], _) = match place {
            Place::Condition => (&["size", "contains", "attribute_type"], "a condition"),
            Place::Update => (&["list_append"], "an update"),
        };
        if unmodelled.contains(&name.text) {
            self.unsupported(format!("the function `{}`", name.text), name.start, end)
        } else if FUNCTIONS.contains(&name.text) {
            invalid(format!(
                "The function is not allowed in {expression} expression; function: {}",
                name.text
            ))
        } else {
            // Function names are case-sensitive in DynamoDB, so `ATTRIBUTE_EXISTS` lands here too.
            invalid(format!("Invalid function name; function: {}", name.text))
        }
    }

    // --- conditions

    /// `condition := conjunction (OR conjunction)*`
    fn condition(&mut self) -> Result<Condition, ExpressionError> {
        let mut left = self.conjunction()?;
        while self.eat_keyword("OR") {
            let right = self.conjunction()?;
            left = Condition::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    /// `conjunction := negation (AND negation)*`
    fn conjunction(&mut self) -> Result<Condition, ExpressionError> {
        let mut left = self.negation()?;
        while self.eat_keyword("AND") {
            let right = self.negation()?;
            left = Condition::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    /// `negation := NOT negation | primary`
    fn negation(&mut self) -> Result<Condition, ExpressionError> {
        if self.eat_keyword("NOT") {
            return Ok(Condition::Not(Box::new(self.negation()?)));
        }
        self.primary()
    }

    /// `primary := ( condition ) | function | operand comparator operand | operand BETWEEN operand AND operand
    ///   | operand IN ( operand, ... )`
    fn primary(&mut self) -> Result<Condition, ExpressionError> {
        if self.eat(Kind::LParen) {
            let inner = self.condition()?;
            self.expect(Kind::RParen, "`)`")?;
            return Ok(inner);
        }
        if self.at_call() {
            return self.function_condition();
        }
        let left = self.operand()?;
        if self.eat_keyword("BETWEEN") {
            return self.between(left);
        }
        if self.eat_keyword("IN") {
            return self.one_of(left);
        }
        let Some(Kind::Compare(comparator)) = self.peek_kind() else {
            return Err(
                self.expected("a comparator (`=`, `<>`, `<`, `<=`, `>`, `>=`), BETWEEN or IN")
            );
        };
        self.next += 1;
        let right = self.operand()?;
        check_distinct(comparator.symbol(), &left, &[&right])?;
        if comparator != Comparator::Eq && comparator != Comparator::Ne {
            check_ordered_operand(comparator.symbol(), &left)?;
            check_ordered_operand(comparator.symbol(), &right)?;
        }
        Ok(Condition::Compare(left, comparator, right))
    }

    /// The rest of `operand BETWEEN low AND high`.
    fn between(&mut self, operand: Operand) -> Result<Condition, ExpressionError> {
        let low = self.operand()?;
        if !self.eat_keyword("AND") {
            return Err(self.expected("AND (of BETWEEN)"));
        }
        let high = self.operand()?;
        for side in [&operand, &low, &high] {
            check_ordered_operand("BETWEEN", side)?;
        }
        check_distinct("BETWEEN", &operand, &[&low, &high])?;
        if let (Operand::Value(l), Operand::Value(h)) = (&low, &high)
            && type_name(l) != type_name(h)
        {
            return Err(invalid(format!(
                "The BETWEEN operator requires same data type for lower and upper bounds; lower bound operand type: {}, upper bound operand type: {}",
                type_name(l),
                type_name(h)
            )));
        }
        if let (Operand::Value(l), Operand::Value(h)) = (&low, &high)
            && order(l, h) == Some(Ordering::Greater)
        {
            return Err(invalid(
                "the BETWEEN operator requires upper bound to be greater than or equal to lower bound",
            ));
        }
        Ok(Condition::Between { operand, low, high })
    }

    /// The rest of `operand IN (candidate, ...)`.
    fn one_of(&mut self, operand: Operand) -> Result<Condition, ExpressionError> {
        self.expect(Kind::LParen, "`(` after IN")?;
        let mut candidates = vec![self.operand()?];
        while self.eat(Kind::Comma) {
            candidates.push(self.operand()?);
        }
        self.expect(Kind::RParen, "`)`")?;
        if candidates.len() > 100 {
            return Err(invalid(format!(
                "The IN operator is provided with too many operands; number of operands: {}",
                candidates.len()
            )));
        }
        Ok(Condition::In(operand, candidates))
    }

    /// `attribute_exists(path) | attribute_not_exists(path) | begins_with(operand, operand)`
    fn function_condition(&mut self) -> Result<Condition, ExpressionError> {
        let Some(name) = self.peek() else {
            return Err(self.expected("a function"));
        };
        let condition = match name.text {
            "attribute_exists" | "attribute_not_exists" => {
                self.next += 2;
                let path = self.path()?;
                if name.text == "attribute_exists" {
                    Condition::AttributeExists(path)
                } else {
                    Condition::AttributeNotExists(path)
                }
            }
            "begins_with" => {
                self.next += 2;
                let subject = self.operand()?;
                self.expect(Kind::Comma, "`,`")?;
                let prefix = self.operand()?;
                if let Operand::Value(v) = &prefix
                    && !matches!(v, AttributeValue::S(_) | AttributeValue::B(_))
                {
                    return Err(invalid(format!(
                        "Incorrect operand type for operator or function; operator or function: begins_with, operand type: {}",
                        type_name(v)
                    )));
                }
                Condition::BeginsWith(subject, prefix)
            }
            _ => return Err(self.misplaced_function(Place::Condition)),
        };
        self.expect(Kind::RParen, "`)`")?;
        Ok(condition)
    }

    // --- updates

    /// `update := (SET set_action, ... | REMOVE path, ... | ADD path value, ... | DELETE path value, ...)+`
    fn update(&mut self) -> Result<Update, ExpressionError> {
        let mut update = Update::default();
        let mut seen: Vec<&str> = Vec::new();
        while self.peek().is_some() {
            let Some(clause) = ["SET", "REMOVE", "ADD", "DELETE"]
                .into_iter()
                .find(|k| self.at_keyword(k))
            else {
                return Err(self.expected("SET, REMOVE, ADD or DELETE"));
            };
            self.next += 1;
            if seen.contains(&clause) {
                return Err(invalid(format!(
                    "the \"{clause}\" section can only be used once in an update expression"
                )));
            }
            seen.push(clause);
            loop {
                match clause {
                    "SET" => {
                        let path = self.path()?;
                        self.expect(Kind::Compare(Comparator::Eq), "`=`")?;
                        update.set.push((path, self.set_value()?));
                    }
                    "REMOVE" => update.remove.push(self.path()?),
                    _ => {
                        let path = self.path()?;
                        let value = self.set_operand(clause)?;
                        if clause == "ADD" {
                            update.add.push((path, value));
                        } else {
                            update.delete.push((path, value));
                        }
                    }
                }
                if !self.eat(Kind::Comma) {
                    break;
                }
            }
        }
        Ok(update)
    }

    /// The `:value` of an ADD (a number or a set) or DELETE (a set) action.
    fn set_operand(&mut self, clause: &str) -> Result<AttributeValue, ExpressionError> {
        let token = self.expect(Kind::Value, "a `:value`")?;
        let value = self.placeholders.value(token.text)?;
        let fits = match value {
            AttributeValue::Ns(_) | AttributeValue::Ss(_) | AttributeValue::Bs(_) => true,
            AttributeValue::N(_) => clause == "ADD",
            _ => false,
        };
        if !fits {
            return Err(invalid(format!(
                "Incorrect operand type for operator or function; operator: {clause}, operand type: {}",
                type_name(&value)
            )));
        }
        Ok(value)
    }

    /// `set_value := term | term + term | term - term`
    fn set_value(&mut self) -> Result<SetValue, ExpressionError> {
        let left = self.term()?;
        let sum = if self.eat(Kind::Plus) {
            true
        } else if self.eat(Kind::Minus) {
            false
        } else {
            return Ok(SetValue::Term(left));
        };
        let right = self.term()?;
        let symbol = if sum { "+" } else { "-" };
        for term in [&left, &right] {
            if let Term::Operand(Operand::Value(v)) = term
                && !matches!(v, AttributeValue::N(_))
            {
                return Err(invalid(format!(
                    "Incorrect operand type for operator or function; operator or function: {symbol}, operand type: {}",
                    type_name(v)
                )));
            }
        }
        Ok(if sum {
            SetValue::Sum(left, right)
        } else {
            SetValue::Difference(left, right)
        })
    }

    /// `term := operand | if_not_exists(path, operand)`
    fn term(&mut self) -> Result<Term, ExpressionError> {
        if !self.at_call() {
            return Ok(Term::Operand(self.operand()?));
        }
        if self.peek().is_some_and(|t| t.text == "if_not_exists") {
            self.next += 2;
            let path = self.path()?;
            self.expect(Kind::Comma, "`,`")?;
            let fallback = self.operand()?;
            self.expect(Kind::RParen, "`)`")?;
            check_distinct("if_not_exists", &Operand::Path(path.clone()), &[&fallback])?;
            return Ok(Term::IfNotExists(path, fallback));
        }
        Err(self.misplaced_function(Place::Update))
    }
}

/// Where a function call is.
#[derive(Debug, Clone, Copy)]
enum Place {
    Condition,
    Update,
}

/// Every DynamoDB expression function (each allowed in only one kind of expression).
const FUNCTIONS: [&str; 8] = [
    "attribute_exists",
    "attribute_not_exists",
    "attribute_type",
    "begins_with",
    "contains",
    "size",
    "if_not_exists",
    "list_append",
];

/// DynamoDB refuses a comparison of an attribute with itself (`a <= a`, `a BETWEEN a AND :x`): "the first
/// operand must be distinct from the remaining operands".
fn check_distinct(
    operator: &str,
    first: &Operand,
    rest: &[&Operand],
) -> Result<(), ExpressionError> {
    match first {
        Operand::Path(path) if rest.contains(&first) => Err(invalid(format!(
            "The first operand must be distinct from the remaining operands for this operator or function; operator: {operator}, first operand: [{path}]"
        ))),
        _ => Ok(()),
    }
}

/// `<`, `<=`, `>`, `>=` and BETWEEN take numbers, strings and binaries; DynamoDB rejects other literals.
fn check_ordered_operand(operator: &str, operand: &Operand) -> Result<(), ExpressionError> {
    match operand {
        Operand::Value(v)
            if !matches!(
                v,
                AttributeValue::N(_) | AttributeValue::S(_) | AttributeValue::B(_)
            ) =>
        {
            Err(invalid(format!(
                "Incorrect operand type for operator or function; operator or function: {operator}, operand type: {}",
                type_name(v)
            )))
        }
        _ => Ok(()),
    }
}

/// DynamoDB's short name of a value's type.
fn type_name(value: &AttributeValue) -> &'static str {
    match value {
        AttributeValue::B(_) => "B",
        AttributeValue::Bool(_) => "BOOL",
        AttributeValue::Bs(_) => "BS",
        AttributeValue::L(_) => "L",
        AttributeValue::M(_) => "M",
        AttributeValue::N(_) => "N",
        AttributeValue::Ns(_) => "NS",
        AttributeValue::Null(_) => "NULL",
        AttributeValue::S(_) => "S",
        AttributeValue::Ss(_) => "SS",
        _ => "unknown",
    }
}

impl Update {
    /// Every attribute the update writes or removes.
    pub(crate) fn targets(&self) -> impl Iterator<Item = &str> {
        self.set
            .iter()
            .map(|(p, _)| p)
            .chain(&self.remove)
            .chain(self.add.iter().map(|(p, _)| p))
            .chain(self.delete.iter().map(|(p, _)| p))
            .map(String::as_str)
    }

    /// DynamoDB rejects an update that touches one attribute twice.
    fn check_paths_distinct(&self) -> Result<(), ExpressionError> {
        let mut seen = BTreeSet::new();
        for path in self.targets() {
            if !seen.insert(path) {
                return Err(invalid(format!(
                    "Two document paths overlap with each other; must remove or rewrite one of these paths; path one: [{path}], path two: [{path}]"
                )));
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------------
// Evaluation

fn resolve<'v>(operand: &'v Operand, item: Option<&'v Item>) -> Option<&'v AttributeValue> {
    match operand {
        Operand::Path(path) => item?.get(path),
        Operand::Value(value) => Some(value),
    }
}

impl Condition {
    /// Whether the condition holds for `item` (`None`: there is no item).
    ///
    /// Like DynamoDB, a comparison with a missing attribute or between different types is false (and
    /// `<>` is its negation, so true).
    pub(crate) fn holds(&self, item: Option<&Item>) -> bool {
        match self {
            Condition::Compare(left, comparator, right) => {
                let (Some(a), Some(b)) = (resolve(left, item), resolve(right, item)) else {
                    return *comparator == Comparator::Ne;
                };
                match comparator {
                    Comparator::Eq => equal(a, b),
                    Comparator::Ne => !equal(a, b),
                    Comparator::Lt => order(a, b) == Some(Ordering::Less),
                    Comparator::Le => order(a, b).is_some_and(Ordering::is_le),
                    Comparator::Gt => order(a, b) == Some(Ordering::Greater),
                    Comparator::Ge => order(a, b).is_some_and(Ordering::is_ge),
                }
            }
            Condition::Between { operand, low, high } => {
                let (Some(v), Some(l), Some(h)) = (
                    resolve(operand, item),
                    resolve(low, item),
                    resolve(high, item),
                ) else {
                    return false;
                };
                order(v, l).is_some_and(Ordering::is_ge) && order(v, h).is_some_and(Ordering::is_le)
            }
            Condition::AttributeExists(path) => item.is_some_and(|i| i.contains_key(path)),
            Condition::AttributeNotExists(path) => !item.is_some_and(|i| i.contains_key(path)),
            Condition::BeginsWith(subject, prefix) => {
                match (resolve(subject, item), resolve(prefix, item)) {
                    (Some(AttributeValue::S(s)), Some(AttributeValue::S(p))) => {
                        s.starts_with(p.as_str())
                    }
                    (Some(AttributeValue::B(b)), Some(AttributeValue::B(p))) => {
                        b.as_ref().starts_with(p.as_ref())
                    }
                    _ => false,
                }
            }
            Condition::In(operand, candidates) => resolve(operand, item).is_some_and(|v| {
                candidates
                    .iter()
                    .any(|c| resolve(c, item).is_some_and(|c| equal(v, c)))
            }),
            Condition::Not(inner) => !inner.holds(item),
            Condition::And(a, b) => a.holds(item) && b.holds(item),
            Condition::Or(a, b) => a.holds(item) || b.holds(item),
        }
    }
}

/// DynamoDB's equality: numbers by value, sets regardless of order, lists and maps element-wise.
fn equal(a: &AttributeValue, b: &AttributeValue) -> bool {
    use AttributeValue as V;
    match (a, b) {
        (V::N(x), V::N(y)) => numbers_equal(x, y),
        (V::Ns(x), V::Ns(y)) => same_set(x, y, |a, b| numbers_equal(a, b)),
        (V::Ss(x), V::Ss(y)) => same_set(x, y, PartialEq::eq),
        (V::Bs(x), V::Bs(y)) => same_set(x, y, PartialEq::eq),
        (V::L(x), V::L(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b)),
        (V::M(x), V::M(y)) => {
            x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| equal(a, b)))
        }
        _ => a == b,
    }
}

fn numbers_equal(x: &str, y: &str) -> bool {
    match (Number::parse(x), Number::parse(y)) {
        (Ok(a), Ok(b)) => a == b,
        // Values were validated on the way in; text equality is the only sensible fallback.
        _ => x == y,
    }
}

/// Sets hold no duplicates, so equal length and containment mean equality.
fn same_set<T>(x: &[T], y: &[T], eq: impl Fn(&T, &T) -> bool) -> bool {
    x.len() == y.len() && x.iter().all(|a| y.iter().any(|b| eq(a, b)))
}

/// DynamoDB's ordering: numbers by value, strings and binaries by bytes; other pairs do not compare.
fn order(a: &AttributeValue, b: &AttributeValue) -> Option<Ordering> {
    match (a, b) {
        (AttributeValue::N(x), AttributeValue::N(y)) => {
            Some(Number::parse(x).ok()?.cmp(&Number::parse(y).ok()?))
        }
        (AttributeValue::S(x), AttributeValue::S(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        (AttributeValue::B(x), AttributeValue::B(y)) => Some(x.as_ref().cmp(y.as_ref())),
        _ => None,
    }
}

/// DynamoDB's messages for an update that fails on the item's data (a `ValidationError` reason).
const MISSING_ATTRIBUTE: &str =
    "The provided expression refers to an attribute that does not exist in the item";
const WRONG_TYPE: &str = "An operand in the update expression has an incorrect data type";

impl Update {
    /// The item after the update, or DynamoDB's message when the item's data does not allow it (an
    /// operand that does not exist, arithmetic on a non-number).
    pub(crate) fn apply(&self, old: &Item) -> Result<Item, String> {
        let mut writes: Vec<(&String, AttributeValue)> = Vec::new();
        let mut removals: Vec<&String> = self.remove.iter().collect();
        for (path, value) in &self.set {
            writes.push((path, evaluate_set(value, old)?));
        }
        for (path, amount) in &self.add {
            writes.push((path, added(old.get(path), amount)?));
        }
        for (path, subtracted) in &self.delete {
            match deleted(old.get(path), subtracted)? {
                Some(rest) => writes.push((path, rest)),
                // DynamoDB removes a set that becomes empty.
                None => removals.push(path),
            }
        }
        let mut new = old.clone();
        for (path, value) in writes {
            new.insert(path.clone(), value);
        }
        for path in removals {
            new.remove(path);
        }
        Ok(new)
    }
}

fn evaluate_term(term: &Term, item: &Item) -> Result<AttributeValue, String> {
    let operand = match term {
        Term::IfNotExists(_, fallback) | Term::Operand(fallback) => fallback,
    };
    // DynamoDB resolves the fallback of `if_not_exists` even when the attribute exists: a fallback
    // naming an attribute the item lacks fails the update either way (found by the differential tests).
    let value = resolve(operand, Some(item)).ok_or_else(|| MISSING_ATTRIBUTE.to_owned())?;
    match term {
        Term::IfNotExists(path, _) => Ok(item.get(path).unwrap_or(value).clone()),
        Term::Operand(_) => Ok(value.clone()),
    }
}

fn evaluate_set(value: &SetValue, item: &Item) -> Result<AttributeValue, String> {
    let (left, right, sum) = match value {
        SetValue::Term(term) => return evaluate_term(term, item),
        SetValue::Sum(l, r) => (l, r, true),
        SetValue::Difference(l, r) => (l, r, false),
    };
    let a = number(&evaluate_term(left, item)?)?;
    let b = number(&evaluate_term(right, item)?)?;
    let result = if sum {
        a.checked_add(b)
    } else {
        a.checked_sub(b)
    };
    result
        .map(|n| AttributeValue::N(n.to_string()))
        .ok_or_else(overflow)
}

fn number(value: &AttributeValue) -> Result<Number, String> {
    match value {
        AttributeValue::N(n) => Number::parse(n),
        _ => Err(WRONG_TYPE.to_owned()),
    }
}

fn overflow() -> String {
    "the result needs more than the 38 significant digits DynamoDB keeps".to_owned()
}

/// ADD: a missing attribute counts as 0 or the empty set.
fn added(old: Option<&AttributeValue>, amount: &AttributeValue) -> Result<AttributeValue, String> {
    use AttributeValue as V;
    match (old, amount) {
        (None, _) => Ok(amount.clone()),
        (Some(V::N(a)), V::N(b)) => Number::parse(a)?
            .checked_add(Number::parse(b)?)
            .map(|n| V::N(n.to_string()))
            .ok_or_else(overflow),
        (Some(V::Ns(a)), V::Ns(b)) => Ok(V::Ns(union(a, b, |x, y| numbers_equal(x, y)))),
        (Some(V::Ss(a)), V::Ss(b)) => Ok(V::Ss(union(a, b, PartialEq::eq))),
        (Some(V::Bs(a)), V::Bs(b)) => Ok(V::Bs(union(a, b, PartialEq::eq))),
        _ => Err(WRONG_TYPE.to_owned()),
    }
}

/// DELETE: the set without the given elements (`None` when nothing is left or there was no set).
fn deleted(
    old: Option<&AttributeValue>,
    subtracted: &AttributeValue,
) -> Result<Option<AttributeValue>, String> {
    use AttributeValue as V;
    let rest = match (old, subtracted) {
        (None, _) => return Ok(None),
        (Some(V::Ns(a)), V::Ns(b)) => V::Ns(difference(a, b, |x, y| numbers_equal(x, y))),
        (Some(V::Ss(a)), V::Ss(b)) => V::Ss(difference(a, b, PartialEq::eq)),
        (Some(V::Bs(a)), V::Bs(b)) => V::Bs(difference(a, b, PartialEq::eq)),
        _ => return Err(WRONG_TYPE.to_owned()),
    };
    let empty = matches!(&rest, V::Ns(s) if s.is_empty())
        || matches!(&rest, V::Ss(s) if s.is_empty())
        || matches!(&rest, V::Bs(s) if s.is_empty());
    Ok((!empty).then_some(rest))
}

fn union<T: Clone>(a: &[T], b: &[T], eq: impl Fn(&T, &T) -> bool) -> Vec<T> {
    let mut result = a.to_vec();
    for x in b {
        if !result.iter().any(|y| eq(x, y)) {
            result.push(x.clone());
        }
    }
    result
}

fn difference<T: Clone>(a: &[T], b: &[T], eq: impl Fn(&T, &T) -> bool) -> Vec<T> {
    a.iter()
        .filter(|x| !b.iter().any(|y| eq(x, y)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(v: &str) -> AttributeValue {
        AttributeValue::N(v.to_owned())
    }

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    fn item(pairs: &[(&str, AttributeValue)]) -> Item {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    /// The placeholders most tests use.
    fn values() -> HashMap<String, AttributeValue> {
        item(&[
            (":q", n("3")),
            (":ten", n("10")),
            (":zero", n("0")),
            (":one", n("1")),
            (":a", s("apple")),
            (":b", s("banana")),
            (
                ":tags",
                AttributeValue::Ss(vec!["red".into(), "green".into()]),
            ),
            (":red", AttributeValue::Ss(vec!["red".into()])),
            (":flag", AttributeValue::Bool(true)),
        ])
    }

    fn names() -> HashMap<String, String> {
        HashMap::from([
            ("#st".to_owned(), "status".to_owned()),
            ("#av".to_owned(), "available".to_owned()),
        ])
    }

    fn condition(source: &str) -> Result<Condition, ExpressionError> {
        let (names, values) = (names(), values());
        parse_condition(source, &mut Placeholders::new(Some(&names), Some(&values)))
    }

    fn update(source: &str) -> Result<Update, ExpressionError> {
        let (names, values) = (names(), values());
        parse_update(source, &mut Placeholders::new(Some(&names), Some(&values)))
    }

    fn holds(source: &str, item: Option<&Item>) -> bool {
        condition(source)
            .unwrap_or_else(|e| panic!("{source}: {e:?}"))
            .holds(item)
    }

    fn applied(source: &str, old: &Item) -> Result<Item, String> {
        update(source)
            .unwrap_or_else(|e| panic!("{source}: {e:?}"))
            .apply(old)
    }

    fn unsupported(what: &str, part: &str) -> ExpressionError {
        ExpressionError::Unsupported {
            what: what.to_owned(),
            part: part.to_owned(),
        }
    }

    fn invalid_message(result: Result<impl std::fmt::Debug, ExpressionError>) -> String {
        match result {
            Err(ExpressionError::Invalid(message)) => message,
            other => panic!("expected an invalid expression, got {other:?}"),
        }
    }

    // --- conditions

    #[test]
    fn compares_numbers_numerically() {
        let stock = item(&[("available", n("10"))]);
        assert!(holds("available >= :q", Some(&stock)));
        assert!(holds("available > :q", Some(&stock)));
        assert!(holds("available <> :q", Some(&stock)));
        assert!(holds("available = :ten", Some(&stock)));
        assert!(holds("available <= :ten", Some(&stock)));
        assert!(!holds("available < :ten", Some(&stock)));
        assert!(
            !holds("available < :q", Some(&stock)),
            "10 < 3 textually, not as numbers"
        );
        assert!(
            holds(":q < available", Some(&stock)),
            "values may come first"
        );
        let spelled = item(&[("available", n("10.0"))]);
        assert!(holds("available = :ten", Some(&spelled)));
    }

    #[test]
    fn compares_strings_by_bytes() {
        let fruit = item(&[("fruit", s("banana"))]);
        assert!(holds("fruit > :a", Some(&fruit)));
        assert!(holds("fruit = :b", Some(&fruit)));
        assert!(!holds("fruit < :a", Some(&fruit)));
    }

    #[test]
    fn compares_two_attributes() {
        let both = item(&[("reserved", n("4")), ("available", n("12"))]);
        assert!(holds("reserved < available", Some(&both)));
        assert!(!holds("reserved = available", Some(&both)));
    }

    #[test]
    fn a_absent_attribute_or_another_type_compares_false_except_with_not_equal() {
        let other_type = item(&[("available", s("10"))]);
        for subject in [None, Some(&other_type)] {
            assert!(!holds("available = :ten", subject));
            assert!(!holds("available >= :q", subject));
            assert!(!holds("available < :ten", subject));
            assert!(!holds("available BETWEEN :zero AND :ten", subject));
            assert!(holds("available <> :ten", subject));
        }
    }

    #[test]
    fn attribute_exists_and_attribute_not_exists() {
        let stock = item(&[("sku", s("apple"))]);
        assert!(holds("attribute_exists(sku)", Some(&stock)));
        assert!(!holds("attribute_not_exists(sku)", Some(&stock)));
        assert!(!holds("attribute_exists(sku)", None));
        assert!(holds("attribute_not_exists(sku)", None));
        assert!(holds("attribute_not_exists(#av)", Some(&stock)));
    }

    #[test]
    fn placeholders_name_attributes_that_plain_names_cannot() {
        let order = item(&[("status", s("apple")), ("available", n("3"))]);
        assert!(holds("#st = :a AND #av = :q", Some(&order)));
    }

    #[test]
    fn not_binds_tighter_than_and_which_binds_tighter_than_or() {
        let x = item(&[("a", n("1")), ("b", n("0")), ("c", n("0"))]);
        // a = 1 OR (b = 1 AND c = 1)
        assert!(holds("a = :one OR b = :one AND c = :one", Some(&x)));
        // (a = 1 OR b = 1) AND c = 1
        assert!(!holds("(a = :one OR b = :one) AND c = :one", Some(&x)));
        // (NOT a = 1) AND b = 0
        assert!(!holds("NOT a = :one AND b = :zero", Some(&x)));
        assert!(holds("NOT (a = :zero AND b = :zero)", Some(&x)));
        assert!(holds("NOT NOT a = :one", Some(&x)));
    }

    #[test]
    fn keywords_are_case_insensitive() {
        let x = item(&[("a", n("1")), ("b", n("3"))]);
        assert!(holds("a = :one and not b = :zero", Some(&x)));
        assert!(holds("a = :zero Or b between :one aNd :ten", Some(&x)));
    }

    #[test]
    fn between_is_inclusive() {
        for (value, inside) in [
            ("0", true),
            ("3", true),
            ("10", true),
            ("-1", false),
            ("11", false),
        ] {
            let x = item(&[("a", n(value))]);
            assert_eq!(
                holds("a BETWEEN :zero AND :ten", Some(&x)),
                inside,
                "{value}"
            );
        }
    }

    #[test]
    fn in_is_membership_by_equality() {
        let order = item(&[("status", s("banana")), ("available", n("10.0"))]);
        assert!(holds("#st IN (:a, :b)", Some(&order)));
        assert!(!holds("#st IN (:a)", Some(&order)));
        assert!(holds("#av in (:q, :ten)", Some(&order)), "numbers by value");
        assert!(!holds("absent IN (:a, :b)", Some(&order)));
        let many = (0..101).map(|i| format!(":v{i}")).collect::<Vec<_>>();
        let values: Item = many.iter().map(|k| (k.clone(), n("1"))).collect();
        let source = format!("a IN ({})", many.join(", "));
        let message = invalid_message(parse_condition(
            &source,
            &mut Placeholders::new(None, Some(&values)),
        ));
        assert!(
            message.contains("too many operands; number of operands: 101"),
            "{message}"
        );
    }

    #[test]
    fn reserved_words_must_be_placeholders() {
        for source in ["status = :a", "attribute_exists(Name)", "COUNT > :one"] {
            let message = invalid_message(condition(source));
            assert!(
                message.starts_with("Attribute name is a reserved keyword; reserved keyword: "),
                "{message}"
            );
        }
        assert!(invalid_message(update("SET total = :one")).ends_with("reserved keyword: total"));
        assert!(holds("#st = :a", Some(&item(&[("status", s("apple"))]))));
    }

    #[test]
    fn begins_with_strings_and_binaries() {
        let x = item(&[
            ("fruit", s("apple pie")),
            ("bytes", AttributeValue::B(b"apple".to_vec().into())),
            ("hits", n("1")),
        ]);
        assert!(holds("begins_with(fruit, :a)", Some(&x)));
        assert!(!holds("begins_with(fruit, :b)", Some(&x)));
        assert!(!holds("begins_with(hits, :a)", Some(&x)));
        assert!(
            !holds("begins_with(bytes, :a)", Some(&x)),
            "a binary does not begin with a string"
        );
        let prefix = item(&[(":p", AttributeValue::B(b"app".to_vec().into()))]);
        let c = parse_condition(
            "begins_with(bytes, :p)",
            &mut Placeholders::new(None, Some(&prefix)),
        )
        .unwrap();
        assert!(c.holds(Some(&x)));
    }

    #[test]
    fn equality_follows_dynamodb_for_sets_and_documents() {
        let x = item(&[
            (
                "tags",
                AttributeValue::Ss(vec!["green".into(), "red".into()]),
            ),
            ("doc", AttributeValue::M(item(&[("n", n("1.0"))]))),
        ]);
        assert!(holds("tags = :tags", Some(&x)), "sets are unordered");
        assert!(!holds("tags = :red", Some(&x)));
        let one = item(&[(":doc", AttributeValue::M(item(&[("n", n("1"))])))]);
        let c = parse_condition("doc = :doc", &mut Placeholders::new(None, Some(&one))).unwrap();
        assert!(c.holds(Some(&x)), "numbers inside maps compare by value");
    }

    // --- updates

    #[test]
    fn set_with_arithmetic_reads_the_old_item() {
        let old = item(&[
            ("sku", s("apple")),
            ("available", n("10")),
            ("reserved", n("1")),
        ]);
        let new = applied(
            "SET available = available - :q, reserved = reserved + :q",
            &old,
        )
        .unwrap();
        assert_eq!(new["available"], n("7"));
        assert_eq!(new["reserved"], n("4"));
        assert_eq!(new["sku"], s("apple"));
        let swapped = applied("SET available = reserved, reserved = available", &old).unwrap();
        assert_eq!(
            (&swapped["available"], &swapped["reserved"]),
            (&n("1"), &n("10"))
        );
        let negative = applied("SET available = :q - available", &old).unwrap();
        assert_eq!(negative["available"], n("-7"));
    }

    #[test]
    fn set_decimal_arithmetic_is_exact() {
        let prices = item(&[(":d", n("0.2"))]);
        let u = parse_update(
            "SET price = price + :d",
            &mut Placeholders::new(None, Some(&prices)),
        )
        .unwrap();
        let new = u.apply(&item(&[("price", n("1.10"))])).unwrap();
        assert_eq!(new["price"], n("1.3"));
    }

    #[test]
    fn set_if_not_exists() {
        let new = applied(
            "SET n = if_not_exists(n, :zero) + :one, #st = if_not_exists(#st, :a)",
            &Item::new(),
        )
        .unwrap();
        assert_eq!((&new["n"], &new["status"]), (&n("1"), &s("apple")));
        let again = applied(
            "SET n = if_not_exists(n, :zero) + :one, #st = if_not_exists(#st, :b)",
            &new,
        )
        .unwrap();
        assert_eq!((&again["n"], &again["status"]), (&n("2"), &s("apple")));
    }

    #[test]
    fn several_clauses_in_any_order() {
        let old = item(&[
            ("a", n("1")),
            ("b", n("2")),
            ("c", n("3")),
            ("tags", AttributeValue::Ss(vec!["red".into()])),
        ]);
        let new = applied(
            "REMOVE a, b SET d = :q, e = :a ADD c :ten, tags :tags",
            &old,
        )
        .unwrap();
        assert!(!new.contains_key("a") && !new.contains_key("b"));
        assert_eq!(
            (&new["c"], &new["d"], &new["e"]),
            (&n("13"), &n("3"), &s("apple"))
        );
        let AttributeValue::Ss(tags) = &new["tags"] else {
            panic!("{new:?}")
        };
        assert_eq!(tags, &["red", "green"]);
        let lower = applied("set d = :q remove a", &old).unwrap();
        assert_eq!(lower["d"], n("3"));
    }

    #[test]
    fn add_to_a_absent_attribute_starts_from_nothing() {
        let new = applied("ADD visits :one, tags :tags", &Item::new()).unwrap();
        assert_eq!(new["visits"], n("1"));
        assert_eq!(
            new["tags"],
            AttributeValue::Ss(vec!["red".into(), "green".into()])
        );
    }

    #[test]
    fn delete_removes_set_elements_and_an_emptied_set() {
        let old = item(&[(
            "tags",
            AttributeValue::Ss(vec!["red".into(), "green".into()]),
        )]);
        let new = applied("DELETE tags :red", &old).unwrap();
        assert_eq!(new["tags"], AttributeValue::Ss(vec!["green".into()]));
        let gone = applied("DELETE tags :tags", &old).unwrap();
        assert!(!gone.contains_key("tags"));
    }

    #[test]
    fn data_errors_carry_dynamodb_messages() {
        let old = item(&[("fruit", s("apple"))]);
        assert_eq!(
            applied("SET a = absent + :one", &old).unwrap_err(),
            MISSING_ATTRIBUTE
        );
        assert_eq!(
            applied("SET a = absent", &old).unwrap_err(),
            MISSING_ATTRIBUTE
        );
        assert_eq!(
            applied("SET a = fruit + :one", &old).unwrap_err(),
            WRONG_TYPE
        );
        assert_eq!(applied("ADD fruit :one", &old).unwrap_err(), WRONG_TYPE);
        assert_eq!(applied("DELETE fruit :red", &old).unwrap_err(), WRONG_TYPE);
        let big = item(&[
            ("n", n("99999999999999999999999999999999999999")),
            (":tiny", n("0.1")),
        ]);
        let u = parse_update(
            "SET n = n + :tiny",
            &mut Placeholders::new(None, Some(&big)),
        )
        .unwrap();
        assert!(u.apply(&big).unwrap_err().contains("38 significant digits"));
    }

    #[test]
    fn targets_lists_every_written_attribute() {
        let u = update("SET a = :one REMOVE b ADD c :one DELETE d :red").unwrap();
        assert_eq!(u.targets().collect::<Vec<_>>(), ["a", "b", "c", "d"]);
    }

    // --- what the memory store does not model

    #[test]
    fn nested_paths_are_unsupported_and_named() {
        let nested = "a nested attribute path";
        assert_eq!(
            condition("a.b = :one").unwrap_err(),
            unsupported(nested, "a.b")
        );
        assert_eq!(
            condition("attribute_exists(a[0])").unwrap_err(),
            unsupported(nested, "a[0]")
        );
        assert_eq!(
            condition("#st.#av[2].c > :one").unwrap_err(),
            unsupported(nested, "#st.#av[2].c")
        );
        assert_eq!(
            update("SET a.b = :one").unwrap_err(),
            unsupported(nested, "a.b")
        );
        assert_eq!(
            update("REMOVE tags[1]").unwrap_err(),
            unsupported(nested, "tags[1]")
        );
        assert_eq!(
            update("SET a = b.c + :one").unwrap_err(),
            unsupported(nested, "b.c")
        );
    }

    #[test]
    fn unmodelled_functions_are_unsupported_and_named() {
        for (source, function, part) in [
            ("size(tags) > :one", "size", "size(tags)"),
            ("contains(tags, :a)", "contains", "contains(tags, :a)"),
            (
                "attribute_type(a, :a) OR a = :one",
                "attribute_type",
                "attribute_type(a, :a)",
            ),
            ("a = :one AND :one < size(tags)", "size", "size(tags)"),
        ] {
            assert_eq!(
                condition(source).unwrap_err(),
                unsupported(&format!("the function `{function}`"), part),
                "{source}"
            );
        }
        assert_eq!(
            update("SET l = list_append(l, :tags)").unwrap_err(),
            unsupported("the function `list_append`", "list_append(l, :tags)")
        );
    }

    // --- what DynamoDB rejects too

    #[test]
    fn syntax_errors_say_where() {
        assert!(invalid_message(condition("")).contains("can not be empty"));
        assert!(
            invalid_message(condition("available >=")).contains("found the end of the expression")
        );
        assert!(invalid_message(condition("available :q")).contains("expected a comparator"));
        assert!(invalid_message(condition("a = :one :q")).contains("`:q` at character 9"));
        assert!(invalid_message(condition("a = :one;")).contains("unexpected character `;`"));
        assert!(invalid_message(condition("(a = :one")).contains("expected `)`"));
        assert!(invalid_message(condition("a BETWEEN :one :ten")).contains("AND (of BETWEEN)"));
        assert!(
            invalid_message(update("a = :one")).contains("expected SET, REMOVE, ADD or DELETE")
        );
        assert!(invalid_message(update("SET a :one")).contains("expected `=`"));
        assert!(invalid_message(update("SET AND = :one")).contains("expected an attribute name"));
        assert!(invalid_message(condition("a = #")).contains("placeholder name"));
    }

    #[test]
    fn placeholders_must_be_defined_and_used() {
        assert!(invalid_message(condition("a = :nope")).contains("attribute value: :nope"));
        assert!(invalid_message(condition("#nope = :one")).contains("attribute name: #nope"));
        let (names, values) = (names(), values());
        let mut placeholders = Placeholders::new(Some(&names), Some(&values));
        parse_condition("#st = :a", &mut placeholders).unwrap();
        let unused = invalid_message(placeholders.check_all_used());
        assert_eq!(
            unused,
            "Value provided in ExpressionAttributeNames unused in expressions: keys: {#av}"
        );
        let mut placeholders = Placeholders::new(None, Some(&values));
        parse_update("SET a = :q", &mut placeholders).unwrap();
        assert!(invalid_message(placeholders.check_all_used()).starts_with(
            "Value provided in ExpressionAttributeValues unused in expressions: keys: {:a, :b,"
        ));
    }

    #[test]
    fn values_must_be_valid_dynamodb_values() {
        let bad = item(&[(":n", n("ten"))]);
        let message = invalid_message(parse_condition(
            "a = :n",
            &mut Placeholders::new(None, Some(&bad)),
        ));
        assert!(message.contains("`ten` is not a number"), "{message}");
        let empty = item(&[(":s", AttributeValue::Ss(vec![]))]);
        let message = invalid_message(parse_update(
            "ADD a :s",
            &mut Placeholders::new(None, Some(&empty)),
        ));
        assert!(message.contains("may not be empty"), "{message}");
    }

    #[test]
    fn operand_types_are_checked_like_dynamodb() {
        assert!(
            invalid_message(condition("a < :flag"))
                .contains("operator or function: <, operand type: BOOL")
        );
        assert!(
            invalid_message(condition("a BETWEEN :tags AND :b"))
                .contains("BETWEEN, operand type: SS")
        );
        assert!(
            invalid_message(condition("begins_with(a, :q)"))
                .contains("begins_with, operand type: N")
        );
        assert!(invalid_message(condition("a BETWEEN :ten AND :one")).contains("upper bound"));
        assert!(invalid_message(update("SET a = a + :a")).contains("+, operand type: S"));
        assert!(invalid_message(update("ADD a :a")).contains("operator: ADD, operand type: S"));
        assert!(
            invalid_message(update("DELETE a :one")).contains("operator: DELETE, operand type: N")
        );
        assert!(condition("a = :flag").is_ok(), "equality takes any type");
    }

    #[test]
    fn misplaced_and_unknown_functions_are_invalid() {
        for (source, function) in [
            ("if_not_exists(a, :one)", "if_not_exists"),
            ("list_append(a, :tags) = :tags", "list_append"),
        ] {
            assert_eq!(
                invalid_message(condition(source)),
                format!(
                    "The function is not allowed in a condition expression; function: {function}"
                )
            );
        }
        for function in [
            "attribute_exists(b)",
            "begins_with(b, :a)",
            "size(b)",
            "contains(b, :a)",
        ] {
            let message = invalid_message(update(&format!("SET a = {function}")));
            assert!(
                message
                    .starts_with("The function is not allowed in an update expression; function: "),
                "{message}"
            );
        }
        assert_eq!(
            invalid_message(condition("ATTRIBUTE_EXISTS(a)")),
            "Invalid function name; function: ATTRIBUTE_EXISTS"
        );
        assert_eq!(
            invalid_message(condition("frob(a)")),
            "Invalid function name; function: frob"
        );
    }

    #[test]
    fn an_update_touches_each_attribute_once() {
        assert!(
            invalid_message(update("SET a = :one SET b = :one"))
                .contains("\"SET\" section can only be used once")
        );
        assert!(
            invalid_message(update("SET a = :one REMOVE a")).contains("Two document paths overlap")
        );
        assert!(invalid_message(update("ADD a :one, a :q")).contains("path one: [a]"));
    }

    /// Divergences from DynamoDB Local found by the differential tests (`tests/tests/stores/differential.rs`).
    #[test]
    fn refuses_what_dynamodb_local_refuses() {
        assert!(
            invalid_message(condition("a BETWEEN :one AND :a"))
                .contains("same data type for lower and upper bounds")
        );
        for source in ["a <= a", "#av = available", "a BETWEEN :one AND a"] {
            assert!(
                invalid_message(condition(source)).contains("must be distinct"),
                "{source}"
            );
        }
        assert!(
            invalid_message(update("SET a = if_not_exists(b, b)")).contains("must be distinct")
        );
    }

    #[test]
    fn if_not_exists_needs_its_fallback_even_when_the_attribute_exists() {
        let u = update("SET a = if_not_exists(b, gone)").unwrap();
        let present = item(&[("b", n("1"))]);
        assert!(u.apply(&present).unwrap_err().contains("does not exist"));
        let u = update("SET a = if_not_exists(b, :one)").unwrap();
        assert_eq!(u.apply(&present).unwrap()["a"], n("1"));
    }

    /// Found by the differential tests: a set whose elements are equal is refused, numbers by value.
    #[test]
    fn sets_with_duplicates_are_refused() {
        let ns = AttributeValue::Ns(vec!["1e2".into(), "100".into()]);
        assert!(validate_value(&ns).unwrap_err().contains("duplicates"));
        let ss = AttributeValue::Ss(vec!["a".into(), "a".into()]);
        assert!(validate_value(&ss).unwrap_err().contains("duplicates"));
        assert!(validate_value(&AttributeValue::Ns(vec!["1".into(), "2".into()])).is_ok());
    }
}
