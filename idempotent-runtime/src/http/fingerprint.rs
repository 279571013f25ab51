//! The digest of a request body in the layer's default fingerprint: of what the body says, not of the
//! framing a client draws anew each time it encodes the same request. A retry that compresses its body
//! again (Python's `gzip.compress` stamps the current second into the gzip header) or builds its form
//! again (requests and urllib3 draw a random multipart boundary per encoding) is the same request, and
//! is replayed rather than refused as a key reuse.
//!
//! - `Content-Encoding: gzip` (or `x-gzip`), alone: the SHA-256 of the bytes the body inflates to, so
//!   the header's timestamp, file name, operating system and extra fields, and the compression level,
//!   do not count. A body of several gzip members is hashed as each member's content with its length,
//!   prefixed `gzip-members`: a server that inflates only the first member reads `gzip(a) + gzip(b)`
//!   as `a`, and `gzip(a + b)` as `a + b`. Inflating is bounded ([`MAX_INFLATED_BYTES`]); a body that
//!   inflates to more, or does not inflate, is hashed as its compressed stream without its header (the
//!   same compressor gives the same stream), prefixed `gzip-stream`.
//! - `Content-Type: multipart/..; boundary=..`, with its parameters read as RFC 9110 reads them (a
//!   quoted value may hold `;`) and exactly one `boundary`: the SHA-256 of the media type
//!   (`multipart/form-data` and `multipart/mixed` differ) and of the parts between the boundary
//!   delimiters (RFC 2046 §5.1.1; a delimiter cannot occur inside a part), each with its length, so
//!   the boundary does not count; prefixed `multipart`. A body without one delimiter, or whose
//!   `Content-Type` does not parse or has no or several `boundary` parameters, is hashed as it is.
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
    if let Some(digest) = multipart_boundary(headers)
        .and_then(|(media_type, boundary)| multipart_digest(body, &media_type, &boundary))
    {
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

/// The digest of a gzip body: of its content, inflated up to [`MAX_INFLATED_BYTES`] in all; else of
/// its stream without the first member's header.
fn gzip_digest(body: &[u8]) -> String {
    gzip_digest_within(body, MAX_INFLATED_BYTES)
}

/// [`gzip_digest`], inflating up to `limit` bytes.
///
/// A body of one member is hashed as its content. A body of several members (`gzip(a) + gzip(b)`) is
/// hashed as each member's content with its length, prefixed `gzip-members`: many servers inflate only
/// the first member (flate2's `GzDecoder`, async-compression's default), so `gzip(a) + gzip(b)` and
/// `gzip(a + b)` are two requests to them, and must not share a fingerprint.
fn gzip_digest_within(body: &[u8], limit: u64) -> String {
    if let Some(members) = inflate_members(body, limit) {
        return match members.as_slice() {
            [(_, only)] => hex::encode(only),
            members => {
                let mut hasher = Sha256::new();
                for (len, digest) in members {
                    hasher.update(len.to_be_bytes());
                    hasher.update(digest);
                }
                format!("gzip-members {}", hex::encode(hasher.finalize()))
            }
        };
    }
    match gzip_header_len(body) {
        Some(len) => format!("gzip-stream {}", hex::encode(Sha256::digest(&body[len..]))),
        None => hex::encode(Sha256::digest(body)),
    }
}

/// The length and SHA-256 of each gzip member's content in `body`, in order; `None` when `body` is not
/// a run of whole members or inflates to more than `limit` bytes in all.
fn inflate_members(body: &[u8], limit: u64) -> Option<Vec<(u64, [u8; 32])>> {
    let mut members = Vec::new();
    let mut rest = body;
    let mut buffer = vec![0_u8; 32 << 10];
    let mut total = 0_u64;
    loop {
        // The `bufread` decoder takes from `rest` only the member it inflates.
        let mut member = flate2::bufread::GzDecoder::new(rest);
        let mut hasher = Sha256::new();
        let mut len = 0_u64;
        loop {
            match member.read(&mut buffer).ok()? {
                0 => break,
                n => {
                    len += n as u64;
                    total += n as u64;
                    if total > limit {
                        return None;
                    }
                    hasher.update(&buffer[..n]);
                }
            }
        }
        members.push((len, hasher.finalize().into()));
        rest = member.into_inner();
        if rest.is_empty() {
            return Some(members);
        }
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

/// The media type (`multipart/form-data`, lower case) and boundary of a `multipart/*` body, from its
/// `Content-Type` read as RFC 9110 §8.3.1 reads it (a quoted parameter value may hold `;` or
/// `boundary=`). `None` unless it parses and has exactly one `boundary` parameter, of 1 to 70 bytes
/// (RFC 2046): a header a parser may read two ways is hashed with the body's bytes as they are.
fn multipart_boundary(headers: &HeaderMap) -> Option<(String, Vec<u8>)> {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let (Some(content_type), None) = (values.next(), values.next()) else {
        return None;
    };
    let (media_type, parameters) = media_type(content_type.as_bytes())?;
    if !media_type.starts_with("multipart/") {
        return None;
    }
    let mut boundaries = parameters
        .into_iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("boundary"));
    match (boundaries.next(), boundaries.next()) {
        (Some((_, boundary)), None) if (1..=70).contains(&boundary.len()) => {
            Some((media_type, boundary))
        }
        _ => None,
    }
}

/// A parameter of a media type: its name, and its value (a quoted string's unquoted).
type Parameter = (String, Vec<u8>);

/// A media type and its parameters (RFC 9110 §5.6.6, §8.3.1): `type/subtype`, lower case, and each
/// parameter's name and value, a quoted string's value unquoted. `None` when `value` does not parse.
fn media_type(value: &[u8]) -> Option<(String, Vec<Parameter>)> {
    let mut at = 0;
    let kind = token(value, &mut at)?;
    (value.get(at) == Some(&b'/')).then_some(())?;
    at += 1;
    let subtype = token(value, &mut at)?;
    let media_type = format!("{kind}/{subtype}").to_ascii_lowercase();
    let mut parameters = Vec::new();
    loop {
        skip_whitespace(value, &mut at);
        match value.get(at) {
            None => return Some((media_type, parameters)),
            Some(b';') => at += 1,
            Some(_) => return None,
        }
        skip_whitespace(value, &mut at);
        if matches!(value.get(at), None | Some(b';')) {
            continue;
        }
        let name = token(value, &mut at)?;
        (value.get(at) == Some(&b'=')).then_some(())?;
        at += 1;
        let parameter = if value.get(at) == Some(&b'"') {
            quoted_string(value, &mut at)?
        } else {
            token(value, &mut at)?.into_bytes()
        };
        parameters.push((name, parameter));
    }
}

/// The token (RFC 9110 §5.6.2) at `at`, at least one character, moving `at` past it.
fn token(value: &[u8], at: &mut usize) -> Option<String> {
    let start = *at;
    while value
        .get(*at)
        .is_some_and(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
    {
        *at += 1;
    }
    (*at > start).then(|| String::from_utf8_lossy(&value[start..*at]).into_owned())
}

/// The value of the quoted string (RFC 9110 §5.6.4) at `at`, its quoted pairs resolved, moving `at`
/// past its closing quote.
fn quoted_string(value: &[u8], at: &mut usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    *at += 1;
    loop {
        let b = *value.get(*at)?;
        *at += 1;
        match b {
            b'"' => return Some(out),
            b'\\' => {
                out.push(*value.get(*at)?);
                *at += 1;
            }
            _ => out.push(b),
        }
    }
}

/// Moves `at` past spaces and tabs.
fn skip_whitespace(value: &[u8], at: &mut usize) {
    while matches!(value.get(*at), Some(b' ' | b'\t')) {
        *at += 1;
    }
}

/// The digest of a multipart body of `media_type`: the media type, then the text between its
/// delimiters (`--boundary` opening the body, or `CRLF--boundary`) each with its length: the preamble,
/// every part with its headers, and what follows the last delimiter (its closing `--` and the
/// epilogue). `None` without a delimiter.
fn multipart_digest(body: &[u8], media_type: &str, boundary: &[u8]) -> Option<String> {
    let mut delimiter = b"\r\n--".to_vec();
    delimiter.extend_from_slice(boundary);
    let delimiter = delimiter.as_slice();
    let mut hasher = Sha256::new();
    let mut piece = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    piece(media_type.as_bytes());
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

    fn concat(members: &[Vec<u8>]) -> Vec<u8> {
        members.concat()
    }

    #[test]
    fn a_body_of_several_gzip_members_is_hashed_member_by_member() {
        let gz = headers(&[(header::CONTENT_ENCODING, "gzip")]);
        let whole = body_digest(&gz, &gzip(b"amount=100", 1, None, 9));
        let split = concat(&[gzip(b"amount=10", 1, None, 9), gzip(b"0", 1, None, 9)]);
        let split_digest = body_digest(&gz, &split);
        assert!(split_digest.starts_with("gzip-members "), "{split_digest}");
        assert_ne!(whole, split_digest);
        // Split elsewhere: another request to a server that reads the first member.
        let elsewhere = concat(&[gzip(b"amount=1", 1, None, 9), gzip(b"00", 1, None, 9)]);
        assert_ne!(split_digest, body_digest(&gz, &elsewhere));
        // The members' headers and levels still do not count.
        let again = concat(&[gzip(b"amount=10", 7, Some("a"), 1), gzip(b"0", 8, None, 6)]);
        assert_eq!(split_digest, body_digest(&gz, &again));
        // An empty member is a member.
        let with_empty = concat(&[gzip(b"amount=100", 1, None, 9), gzip(b"", 1, None, 9)]);
        assert_ne!(whole, body_digest(&gz, &with_empty));
        // The bound is on all members together.
        let zeros = vec![0_u8; 1 << 19];
        let two = concat(&[gzip(&zeros, 1, None, 9), gzip(&zeros, 1, None, 9)]);
        assert!(gzip_digest_within(&two, 1 << 20).starts_with("gzip-members "));
        assert!(gzip_digest_within(&two, (1 << 20) - 1).starts_with("gzip-stream "));
        // Trailing bytes that are not a member: the stream.
        let mut trailing = gzip(b"amount=100", 1, None, 9);
        trailing.extend_from_slice(b"junk");
        assert!(body_digest(&gz, &trailing).starts_with("gzip-stream "));
    }

    #[test]
    fn media_types_are_read_with_quoted_parameters() {
        let (kind, parameters) =
            media_type(br#"Multipart/Mixed ; x="a;boundary=100;\"b" ;; boundary=REAL"#).unwrap();
        assert_eq!(kind, "multipart/mixed");
        assert_eq!(
            parameters,
            [
                ("x".to_owned(), br#"a;boundary=100;"b"#.to_vec()),
                ("boundary".to_owned(), b"REAL".to_vec()),
            ]
        );
        for malformed in [
            &b"multipart"[..],
            b"multipart/form-data; boundary",
            b"multipart/form-data; boundary=\"open",
            b"multipart/form-data; boundary=a b",
            b"multipart/form-data boundary=a",
        ] {
            assert_eq!(
                media_type(malformed),
                None,
                "{:?}",
                String::from_utf8_lossy(malformed)
            );
        }
    }

    #[test]
    fn a_boundary_inside_a_quoted_parameter_is_not_the_boundary() {
        let with = |content_type: &str| headers(&[(header::CONTENT_TYPE, content_type)]);
        let body = |amount: &str| {
            format!("--REAL\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\npay\r\n--{amount}\r\n--REAL--\r\n")
                .into_bytes()
        };
        let first = body_digest(
            &with(r#"multipart/form-data; x="a;boundary=100;b"; boundary=REAL"#),
            &body("100"),
        );
        let second = body_digest(
            &with(r#"multipart/form-data; x="a;boundary=999;b"; boundary=REAL"#),
            &body("999"),
        );
        assert!(first.starts_with("multipart "), "{first}");
        assert_ne!(first, second);
        // Two `boundary` parameters, or a header that does not parse: the bytes as they are.
        for content_type in [
            "multipart/form-data; boundary=REAL; boundary=100",
            "multipart/form-data; boundary=REAL; x=\"open",
        ] {
            assert_eq!(
                body_digest(&with(content_type), &body("100")),
                hex::encode(Sha256::digest(body("100"))),
                "{content_type}"
            );
        }
    }

    #[test]
    fn the_multipart_media_type_is_part_of_the_digest() {
        let with = |media_type: &str| {
            headers(&[(header::CONTENT_TYPE, &format!("{media_type}; boundary=b1"))])
        };
        let fields = [("amount", "4200")];
        let form_data = body_digest(&with("multipart/form-data"), &form("b1", &fields));
        let mixed = body_digest(&with("multipart/mixed"), &form("b1", &fields));
        assert!(form_data.starts_with("multipart ") && mixed.starts_with("multipart "));
        assert_ne!(form_data, mixed);
        assert_eq!(
            form_data,
            body_digest(&with("MULTIPART/Form-Data"), &form("b1", &fields))
        );
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
