//! Parses the attribute's arguments into [`Args`]. No code is emitted here.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser as _;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path};

use crate::diag::Diagnostics;

/// Every argument, in the order the documentation lists them.
const ARGUMENTS: &str =
    "`key`, `ttl`, `lease`, `payload`, `wait`, `name`, `store`, `transact`, `missing_key`, `crate`";

/// The accepted values of `missing_key`, as the diagnostics list them.
const MISSING_KEY_VALUES: &str = r#""reject", "allow" or "skip""#;

/// A duration given as a string literal, checked.
pub(crate) struct DurationArg {
    pub(crate) value: Duration,
    pub(crate) literal: LitStr,
}

/// `missing_key = ".."`: the runtime's `MissingKey` variant to emit, spanned on its literal.
pub(crate) struct MissingKeyArg {
    pub(crate) variant: Ident,
    pub(crate) literal: LitStr,
}

/// The parsed arguments of `#[idempotent(..)]`.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<Expr>,
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) lease: Option<DurationArg>,
    pub(crate) payload: Option<Expr>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) name: Option<LitStr>,
    pub(crate) store: Option<Expr>,
    pub(crate) transact: Option<Ident>,
    pub(crate) missing_key: Option<MissingKeyArg>,
    pub(crate) krate: Option<Path>,
}

impl Args {
    /// Parses `args`; syntax errors stop at once, semantic ones are all collected into `diag`.
    pub(crate) fn parse(args: TokenStream, diag: &mut Diagnostics) -> syn::Result<Self> {
        let mut out = Args::default();
        let mut seen: Vec<String> = Vec::new();
        let parser = syn::meta::parser(|meta| {
            let ident = meta.path.get_ident().cloned().ok_or_else(|| {
                meta.error(format!(
                    "expected an argument name; expected one of {ARGUMENTS}"
                ))
            })?;
            let name = ident.to_string();
            let has_value = meta.input.peek(syn::Token![=]);
            let value: Option<Expr> = if has_value {
                Some(meta.value()?.parse()?)
            } else {
                None
            };
            if !ARGUMENTS.contains(&format!("`{name}`")) {
                diag.error(
                    &ident,
                    format!("unknown argument `{name}`; expected one of {ARGUMENTS}"),
                );
                return Ok(());
            }
            if seen.contains(&name) {
                diag.error(&ident, format!("duplicate `{name}` argument"));
                return Ok(());
            }
            seen.push(name.clone());
            let Some(value) = value else {
                diag.error(
                    &ident,
                    format!("`{name}` needs a value: `{name} = {}`", example(&name)),
                );
                return Ok(());
            };
            match name.as_str() {
                "key" => out.key = Some(value),
                "payload" => out.payload = Some(value),
                "store" => out.store = Some(value),
                "ttl" => out.ttl = duration(&name, &value, false, diag),
                "lease" => out.lease = duration(&name, &value, false, diag),
                "wait" => out.wait = duration(&name, &value, true, diag),
                "name" => out.name = name_literal(&value, diag),
                "transact" => out.transact = transact_ident(&value, diag),
                "missing_key" => out.missing_key = missing_key(&value, diag),
                "crate" => out.krate = crate_path(&value, diag),
                _ => unreachable!("listed in ARGUMENTS"),
            }
            Ok(())
        });
        parser.parse2(args)?;
        if out.key.is_none() && !seen.iter().any(|s| s == "key") {
            diag.push(syn::Error::new(
                Span::call_site(),
                "missing `key` argument; expected `#[idempotent(key = <expr>, ttl = \"<duration>\")]`",
            ));
        }
        // Staged writes commit only with a record, so skipping it would drop them without a word.
        if let (Some(MissingKeyArg { variant, literal }), Some(_)) =
            (&out.missing_key, &out.transact)
            && variant == "Skip"
        {
            diag.error(
                literal,
                "`missing_key = \"skip\"` cannot be combined with `transact`: without a record, the staged writes would never commit; expected \"reject\" or \"allow\"",
            );
        }
        Ok(out)
    }
}

fn example(name: &str) -> &'static str {
    match name {
        "key" => "<expr>",
        "payload" => "&request",
        "store" => "self.idempotency",
        "ttl" => "\"24h\"",
        "lease" => "\"60s\"",
        "wait" => "\"5s\"",
        "name" => "\"charge-v1\"",
        "transact" => "tx",
        "missing_key" => "\"allow\"",
        _ => "\"idempotent_runtime\"",
    }
}

fn string_literal(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s),
        _ => None,
    }
}

/// Accepts one or more `<number><unit>` groups (`ms`, `s`, `m`, `h`, `d`), like `"24h"` or `"1h30m"`.
fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ms" => None,
            "s" => Some(1),
            "m" => Some(60),
            "h" => Some(3600),
            "d" => Some(86_400),
            _ => return None,
        };
        let part = match seconds_per_unit {
            None => Duration::from_millis(number),
            Some(factor) => Duration::from_secs(number.checked_mul(factor)?),
        };
        total = total.checked_add(part)?;
        rest = &rest[unit_len..];
    }
    // humantime agrees on every string accepted here; keep it as the reference for the arithmetic.
    humantime::parse_duration(text).ok().filter(|d| *d == total)
}

fn duration(
    name: &str,
    value: &Expr,
    zero_ok: bool,
    diag: &mut Diagnostics,
) -> Option<DurationArg> {
    let Some(literal) = string_literal(value) else {
        diag.error(
            value,
            format!(
                "`{name}` must be a string literal like {}, checked at compile time; variables and constants are not accepted",
                example(name)
            ),
        );
        return None;
    };
    let text = literal.value();
    let Some(parsed) = parse_duration(&text) else {
        diag.error(
            literal,
            format!(
                "invalid `{name}` {text:?}: expected a number followed by `ms`, `s`, `m`, `h` or `d` (or several, like \"1h30m\"), like {}",
                example(name)
            ),
        );
        return None;
    };
    if parsed.is_zero() && !zero_ok {
        diag.error(
            literal,
            format!("`{name}` must be longer than zero, like {}", example(name)),
        );
        return None;
    }
    Some(DurationArg {
        value: parsed,
        literal: literal.clone(),
    })
}

fn name_literal(value: &Expr, diag: &mut Diagnostics) -> Option<LitStr> {
    match string_literal(value) {
        Some(s) if !s.value().trim().is_empty() => Some(s.clone()),
        Some(s) => {
            diag.error(
                s,
                "`name` must not be empty; expected a stable namespace like \"charge-v1\"",
            );
            None
        }
        None => {
            diag.error(value, "`name` must be a string literal like \"charge-v1\"");
            None
        }
    }
}

fn missing_key(value: &Expr, diag: &mut Diagnostics) -> Option<MissingKeyArg> {
    let Some(literal) = string_literal(value) else {
        diag.error(
            value,
            format!("`missing_key` must be a string literal: {MISSING_KEY_VALUES}"),
        );
        return None;
    };
    let variant = match literal.value().as_str() {
        "reject" => "Reject",
        "allow" => "Allow",
        "skip" => "Skip",
        text => {
            diag.error(
                literal,
                format!("invalid `missing_key` {text:?}: expected {MISSING_KEY_VALUES}"),
            );
            return None;
        }
    };
    Some(MissingKeyArg {
        variant: Ident::new(variant, literal.span()),
        literal: literal.clone(),
    })
}

fn transact_ident(value: &Expr, diag: &mut Diagnostics) -> Option<Ident> {
    if let Expr::Path(p) = value
        && p.qself.is_none()
        && p.attrs.is_empty()
        && let Some(ident) = p.path.get_ident()
    {
        return Some(ident.clone());
    }
    diag.error(
        value,
        "`transact` must be an identifier to bind the transaction to in the body, like `transact = tx`",
    );
    None
}

fn crate_path(value: &Expr, diag: &mut Diagnostics) -> Option<Path> {
    let Some(literal) = string_literal(value) else {
        diag.error(
            value,
            "`crate` must be a string literal with a path, like \"idempotent_runtime\"",
        );
        return None;
    };
    let text = literal.value();
    match literal.parse_with(Path::parse_mod_style) {
        Ok(path) => Some(path),
        // The package name from Cargo.toml is the likeliest mistake: say which spelling Rust code uses.
        Err(_) if text.contains('-') && syn::parse_str::<Path>(&text.replace('-', "_")).is_ok() => {
            diag.error(
                literal,
                format!(
                    "invalid `crate` path {text:?}: Rust code spells crate names with `_` where Cargo.toml has `-`; expected {:?}",
                    text.replace('-', "_")
                ),
            );
            None
        }
        Err(_) => {
            diag.error(
                literal,
                format!(
                    "invalid `crate` path {text:?}: expected a path like \"idempotent_runtime\" or \"::my_idempotent\""
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("24h"), Some(Duration::from_hours(24)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_hours(7 * 24)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_mins(90)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        for bad in ["", "1 day", "h", "10", "5x", "-5s", "1.5h", "24 h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
