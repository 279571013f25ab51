//! The keys of the HTTP layer's records, without the layer (which needs the `axum` feature): a request
//! through [`IdempotencyLayer`](crate::http::IdempotencyLayer) is stored under its caller's identity and
//! its `Idempotency-Key` header, in the layer's namespace. The layer and the `idempotent key show
//! --http` command both name a record through this module, so that they cannot disagree.

/// The namespace of an HTTP layer's records when the layer names no other
/// (`IdempotencyLayer::namespace`).
pub const DEFAULT_HTTP_NAMESPACE: &str = "http";

/// The longest `Idempotency-Key` accepted, in bytes.
pub(crate) const MAX_KEY_BYTES: usize = 255;

/// What the layer keys a request's record on: the caller's identity, then the request's key. It
/// serializes as `["<identity>","<key>"]`.
pub(crate) type Scope = (String, String);

/// The [`Scope`] of a request by `identity` with the key `key` (as [`key_of_header`] read it).
pub(crate) fn scope(identity: String, key: String) -> Scope {
    (identity, key)
}

/// The key in an `Idempotency-Key` header's value (already checked to be visible ASCII): the draft
/// makes it a Structured Field string (`"8e03978e-..."`); a bare token (`8e03978e-...`) is accepted
/// too, as most clients send one. An error text when it is not one usable key.
pub(crate) fn key_of_header(value: &str) -> Result<String, &'static str> {
    let text = value.trim();
    let key = match text.strip_prefix('"') {
        Some(quoted) => unquote(quoted).ok_or("the quoted `Idempotency-Key` is malformed")?,
        None => text.to_owned(),
    };
    if key.is_empty() {
        return Err("the `Idempotency-Key` header is empty");
    }
    if key.len() > MAX_KEY_BYTES {
        return Err("the `Idempotency-Key` header is longer than 255 bytes");
    }
    Ok(key)
}

/// The content of a Structured Field string after its opening quote (RFC 8941 §3.3.3): `\"` and `\\`
/// escapes, ending at the closing quote, with nothing after it.
fn unquote(quoted: &str) -> Option<String> {
    let mut out = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                escaped @ ('"' | '\\') => out.push(escaped),
                _ => return None,
            },
            '"' => return chars.as_str().is_empty().then_some(out),
            c => out.push(c),
        }
    }
    None
}

/// The record key of a request that an HTTP layer with `namespace` (by default
/// [`DEFAULT_HTTP_NAMESPACE`]) received from the caller `identity` (what the layer's identity
/// function returned) with the `Idempotency-Key` header `idempotency_key`, read as the layer reads it
/// (a quoted Structured Field string or a bare token): for finding the record of a request in the
/// table, as `idempotent key show --http IDENTITY KEY` does.
///
/// ```
/// use idempotent_runtime::{DEFAULT_HTTP_NAMESPACE, derive_http_key};
///
/// let key = derive_http_key(DEFAULT_HTTP_NAMESPACE, "acme", "order-1").unwrap();
/// assert!(key.starts_with("http#"));
/// // The header as a Structured Field string names the same record.
/// assert_eq!(derive_http_key("http", "acme", "\"order-1\"").unwrap(), key);
/// ```
///
/// # Errors
/// Why `idempotency_key` is not a key the layer accepts (not visible ASCII, empty, malformed quoting,
/// longer than 255 bytes); the layer answers such a request with 400.
pub fn derive_http_key(
    namespace: &str,
    identity: &str,
    idempotency_key: &str,
) -> Result<String, &'static str> {
    // What the layer reads a header with (`HeaderValue::to_str`): a key outside it never has a record.
    if !idempotency_key
        .bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return Err("the `Idempotency-Key` header must be visible ASCII");
    }
    let key = key_of_header(idempotency_key)?;
    crate::derive_key(namespace, &scope(identity.to_owned(), key))
        .map_err(|_| "the key does not serialize")
}
