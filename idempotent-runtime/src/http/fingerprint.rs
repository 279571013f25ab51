//! The digest of a request body in the layer's default fingerprint: of what the body says, not of the
//! framing a client draws anew each time it encodes the same request. A retry that compresses its body
//! again (Python's `gzip.compress` stamps the current second into the gzip header) or builds its form
//! again (requests and urllib3 draw a random multipart boundary per encoding) is the same request, and
//! is replayed rather than refused as a key reuse.
//!
//! - `Content-Encoding: gzip` (or `x-gzip`), alone: the SHA-256 of the bytes the body inflates to, so
//!   the header's timestamp, file name, operating system and extra fields, and the compression level,
//!   do not count. Inflating is bounded ([`MAX_INFLATED_BYTES`]); a body that inflates to more, or
//!   does not inflate, is hashed as its compressed stream without its header (the same compressor
//!   gives the same stream), prefixed `gzip-stream`.
//! - `Content-Type: multipart/..; boundary=..`: the SHA-256 of the parts between the boundary
//!   delimiters (RFC 2046 §5.1.1; a delimiter cannot occur inside a part), each with its length, so
//!   the boundary does not count; prefixed `multipart`. A body without one delimiter is hashed as it
//!   is.
//! - Any other body: the SHA-256 of its bytes, as it always was.

use std::io::Read as _;

use axum::http::HeaderMap;
use axum::http::header;
use sha2::{Digest, Sha256};

/// The most bytes a gzip body is inflated to for its digest (16 MiB): the bound on what a small
/// request can cost the layer before its handler runs, on the service's own task. Inflating and
/// hashing 64 MiB from a 66 KB body took 61 ms (release build, a shared machine), 16 MiB 29 ms. A
/// body past it still gets a fingerprint that ignores its header (the compressed stream), so a retry
/// from the same client is still recognised.
pub(super) const MAX_INFLATED_BYTES: u64 = 16 << 20;

/// The digest of `body`, a request body with `headers`.
pub(super) fn body_digest(headers: &HeaderMap, body: &[u8]) -> String {
    if is_gzip(headers) {
        return gzip_digest(body);
    }
    if let Some(digest) = multipart_boundary(headers).and_then(|b| multipart_digest(body, &b)) {
        return digest;
    }
    hex::encode(Sha256::digest(body))
}

/// Whether the body's only content coding is gzip.
fn is_gzip(headers: &HeaderMap) -> bool {
    let mut codings = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|coding| !coding.is_empty());
    matches!(
        (codings.next(), codings.next()),
        (Some(coding), None) if coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip")
    )
}

/// The digest of a gzip body: of its content, inflated (all its members) up to
/// [`MAX_INFLATED_BYTES`]; else of its stream without the first member's header.
fn gzip_digest(body: &[u8]) -> String {
    gzip_digest_within(body, MAX_INFLATED_BYTES)
}

/// [`gzip_digest`], inflating up to `limit` bytes.
fn gzip_digest_within(body: &[u8], limit: u64) -> String {
    let mut inflated = flate2::read::MultiGzDecoder::new(body).take(limit + 1);
    let mut hasher = Sha256::new();
    let mut buffer = vec![0_u8; 32 << 10];
    let mut total = 0_u64;
    loop {
        match inflated.read(&mut buffer) {
            Ok(0) if total <= limit => return hex::encode(hasher.finalize()),
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n as u64;
                hasher.update(&buffer[..n]);
            }
        }
    }
    match gzip_header_len(body) {
        Some(len) => format!("gzip-stream {}", hex::encode(Sha256::digest(&body[len..]))),
        None => hex::encode(Sha256::digest(body)),
    }
}

/// The length of the gzip member header that opens `body` (RFC 1952 §2.3), when it is one.
fn gzip_header_len(body: &[u8]) -> Option<usize> {
    const FHCRC: u8 = 0x02;
    const FEXTRA: u8 = 0x04;
    const FNAME: u8 = 0x08;
    const FCOMMENT: u8 = 0x10;
    if body.len() < 10 || body[..3] != [0x1f, 0x8b, 0x08] {
        return None;
    }
    let flags = body[3];
    let mut at = 10;
    if flags & FEXTRA != 0 {
        let len = u16::from_le_bytes([*body.get(at)?, *body.get(at + 1)?]);
        at += 2 + usize::from(len);
    }
    for field in [FNAME, FCOMMENT] {
        if flags & field != 0 {
            at += body.get(at..)?.iter().position(|b| *b == 0)? + 1;
        }
    }
    if flags & FHCRC != 0 {
        at += 2;
    }
    (at <= body.len()).then_some(at)
}

/// The boundary of a `multipart/*` body, from its `Content-Type` (quoted or not).
fn multipart_boundary(headers: &HeaderMap) -> Option<String> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let mut fields = content_type.split(';');
    let media_type = fields.next()?.trim();
    if !media_type
        .get(..10)
        .is_some_and(|t| t.eq_ignore_ascii_case("multipart/"))
    {
        return None;
    }
    fields.find_map(|parameter| {
        let (name, value) = parameter.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        // RFC 2046: 1 to 70 characters.
        (1..=70).contains(&value.len()).then(|| value.to_owned())
    })
}

/// The digest of a multipart body's parts, the text between its delimiters (`--boundary` opening the
/// body, or `CRLF--boundary`) each with its length: the preamble, every part with its headers, and what
/// follows the last delimiter (its closing `--` and the epilogue). `None` without a delimiter.
fn multipart_digest(body: &[u8], boundary: &str) -> Option<String> {
    let delimiter = format!("\r\n--{boundary}");
    let delimiter = delimiter.as_bytes();
    let mut hasher = Sha256::new();
    let mut piece = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    let mut rest = body;
    let mut found = false;
    if let Some(after) = rest.strip_prefix(&delimiter[2..]) {
        piece(&[]);
        rest = after;
        found = true;
    }
    while let Some(at) = find(rest, delimiter) {
        piece(&rest[..at]);
        rest = &rest[at + delimiter.len()..];
        found = true;
    }
    piece(rest);
    found.then(|| format!("multipart {}", hex::encode(hasher.finalize())))
}

/// Where `needle` (which starts with `\r`) first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\r')
        .map(|(at, _)| at)
        .find(|at| haystack[*at..].starts_with(needle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::io::Write as _;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| (name.clone(), HeaderValue::from_str(value).unwrap()))
            .collect()
    }

    fn gzip(content: &[u8], mtime: u32, name: Option<&str>, level: u32) -> Vec<u8> {
        let mut builder = flate2::GzBuilder::new().mtime(mtime).operating_system(255);
        if let Some(name) = name {
            builder = builder.filename(name);
        }
        let mut encoder = builder.write(Vec::new(), flate2::Compression::new(level));
        encoder.write_all(content).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn gzip_bodies_are_hashed_by_their_content() {
        let gz = headers(&[(header::CONTENT_ENCODING, "gzip")]);
        let content = br#"{"amount":4200,"currency":"eur"}"#;
        let a = body_digest(&gz, &gzip(content, 1_700_000_000, None, 9));
        assert_eq!(a, hex::encode(Sha256::digest(content)));
        assert_eq!(a, body_digest(&gz, &gzip(content, 1_700_000_001, None, 9)));
        assert_eq!(a, body_digest(&gz, &gzip(content, 0, Some("body.json"), 1)));
        let x_gzip = headers(&[(header::CONTENT_ENCODING, " X-GZIP ")]);
        assert_eq!(a, body_digest(&x_gzip, &gzip(content, 7, None, 6)));
        assert_ne!(a, body_digest(&gz, &gzip(b"{}", 1_700_000_000, None, 9)));
        // Two codings: the bytes as they are.
        let two = headers(&[(header::CONTENT_ENCODING, "gzip, br")]);
        let bytes = gzip(content, 1, None, 9);
        assert_eq!(
            body_digest(&two, &bytes),
            hex::encode(Sha256::digest(&bytes))
        );
    }

    #[test]
    fn a_gzip_body_that_does_not_inflate_is_hashed_without_its_header() {
        let gz = headers(&[(header::CONTENT_ENCODING, "gzip")]);
        let mut first = gzip(b"abc", 1, None, 9);
        let mut second = gzip(b"abc", 2, Some("abc.txt"), 9);
        // A broken checksum: the stream does not inflate.
        for bytes in [&mut first, &mut second] {
            let at = bytes.len() - 5;
            bytes[at] ^= 0xff;
        }
        let digest = body_digest(&gz, &first);
        assert!(digest.starts_with("gzip-stream "), "{digest}");
        assert_eq!(digest, body_digest(&gz, &second));
        // Not gzip at all: its bytes.
        assert_eq!(
            body_digest(&gz, b"plain"),
            hex::encode(Sha256::digest(b"plain"))
        );
    }

    #[test]
    fn a_gzip_bomb_is_not_inflated_past_the_bound() {
        let zeros = vec![0_u8; 1 << 20];
        let bomb = gzip(&zeros, 1, None, 9);
        let again = gzip(&zeros, 2, None, 9);
        let within = gzip_digest_within(&bomb, 1 << 20);
        assert_eq!(within, hex::encode(Sha256::digest(&zeros)));
        let past = gzip_digest_within(&bomb, (1 << 20) - 1);
        assert!(past.starts_with("gzip-stream "), "{past}");
        assert_eq!(past, gzip_digest_within(&again, (1 << 20) - 1));
    }

    fn form(boundary: &str, fields: &[(&str, &str)]) -> Vec<u8> {
        use std::fmt::Write as _;
        let mut body = String::new();
        for (name, value) in fields {
            write!(
                body,
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .unwrap();
        }
        write!(body, "--{boundary}--\r\n").unwrap();
        body.into_bytes()
    }

    #[test]
    fn multipart_bodies_are_hashed_without_their_boundary() {
        let with = |boundary: &str| {
            headers(&[(
                header::CONTENT_TYPE,
                &format!("multipart/form-data; boundary={boundary}"),
            )])
        };
        let fields = [("amount", "4200"), ("note", "--not a delimiter\r\n--x")];
        let a = body_digest(&with("7f3c"), &form("7f3c", &fields));
        assert!(a.starts_with("multipart "), "{a}");
        assert_eq!(a, body_digest(&with("b91e0d"), &form("b91e0d", &fields)));
        let quoted = headers(&[(
            header::CONTENT_TYPE,
            "Multipart/Form-Data; charset=utf-8; Boundary=\"b91e0d\"",
        )]);
        assert_eq!(a, body_digest(&quoted, &form("b91e0d", &fields)));
        assert_ne!(
            a,
            body_digest(&with("7f3c"), &form("7f3c", &[("amount", "4201")]))
        );
        // No delimiter: the bytes as they are.
        assert_eq!(
            body_digest(&with("zz"), b"{}"),
            hex::encode(Sha256::digest(b"{}"))
        );
    }
}
