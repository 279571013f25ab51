//! Collects every semantic error so the user sees them all at once (as serde's `Ctxt` does).

/// Errors found so far.
#[derive(Default)]
pub(crate) struct Diagnostics {
    errors: Option<syn::Error>,
}

impl Diagnostics {
    /// Records an error at `tokens`' span.
    pub(crate) fn error(&mut self, tokens: impl quote::ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.errors {
            Some(errors) => errors.combine(error),
            None => self.errors = Some(error),
        }
    }

    /// `Ok` when nothing was recorded, else every error combined.
    pub(crate) fn finish(self) -> Result<(), syn::Error> {
        self.errors.map_or(Ok(()), Err)
    }
}

/// `tokens` as code in a message, spaced as rustfmt would space them (`Box<dyn Fn(&str) -> usize>`,
/// `req.order_id`), not as `TokenStream`'s `Display` does (`Box < dyn Fn (& str) -> usize >`).
pub(crate) fn code(tokens: impl quote::ToTokens) -> String {
    let mut pieces = Vec::new();
    flatten(tokens.into_token_stream(), &mut pieces);
    let mut out = String::new();
    let mut previous: Option<&Piece> = None;
    for (at, piece) in pieces.iter().enumerate() {
        if let Some(previous) = previous
            && spaced(
                previous,
                piece,
                at.checked_sub(2).map(|before| &pieces[before]),
            )
        {
            out.push(' ');
        }
        match piece {
            Piece::Word(text) | Piece::Op(text) => out.push_str(text),
            Piece::Open(c) | Piece::Close(c) => out.push(*c),
        }
        previous = Some(piece);
    }
    out
}

/// A token of [`code`]: an identifier or literal, an operator, or a delimiter.
#[derive(PartialEq)]
enum Piece {
    Word(String),
    Op(String),
    Open(char),
    Close(char),
}

/// The operators written as two characters.
const PAIRS: [&str; 11] = [
    "::", "->", "=>", "==", "!=", "<=", ">=", "&&", "||", "..", "+=",
];

fn flatten(tokens: proc_macro2::TokenStream, out: &mut Vec<Piece>) {
    use proc_macro2::{Delimiter, Spacing, TokenTree};
    let mut trees = tokens.into_iter().peekable();
    while let Some(tree) = trees.next() {
        match tree {
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => (Some('('), Some(')')),
                    Delimiter::Brace => (Some('{'), Some('}')),
                    Delimiter::Bracket => (Some('['), Some(']')),
                    Delimiter::None => (None, None),
                };
                out.extend(open.map(Piece::Open));
                flatten(group.stream(), out);
                out.extend(close.map(Piece::Close));
            }
            TokenTree::Punct(punct) if punct.as_char() == '\'' => {
                // A lifetime: `'` and the identifier after it.
                let name = match trees.next() {
                    Some(TokenTree::Ident(ident)) => ident.to_string(),
                    _ => String::new(),
                };
                out.push(Piece::Word(format!("'{name}")));
            }
            TokenTree::Punct(punct) => {
                let mut op = punct.as_char().to_string();
                if punct.spacing() == Spacing::Joint
                    && let Some(TokenTree::Punct(next)) = trees.peek()
                    && PAIRS.contains(&format!("{op}{}", next.as_char()).as_str())
                {
                    op.push(next.as_char());
                    trees.next();
                }
                out.push(Piece::Op(op));
            }
            other => out.push(Piece::Word(other.to_string())),
        }
    }
}

/// Whether a space goes between `previous` and `next`; `before` is the piece before `previous`.
fn spaced(previous: &Piece, next: &Piece, before: Option<&Piece>) -> bool {
    let op =
        |piece: &Piece, ops: &[&str]| matches!(piece, Piece::Op(op) if ops.contains(&op.as_str()));
    // A `-`, `*` or `!` that starts an operand (`-1`, `*const T`, `!done`), not one between two.
    let prefix = |piece: &Piece, before: Option<&Piece>| {
        op(piece, &["-", "*", "!"]) && matches!(before, None | Some(Piece::Open(_) | Piece::Op(_)))
    };
    match (previous, next) {
        (Piece::Open(_), _) | (_, Piece::Close(_)) => false,
        (_, next) if op(next, &[",", ";", ".", "::", "?", ":"]) => false,
        // A call, an index, generic arguments, a macro: `f(x)`, `a[0]`, `Vec<u8>`, `format!`.
        (Piece::Word(_) | Piece::Close(_), Piece::Open('(' | '[')) => false,
        (Piece::Word(_), next) if op(next, &["<", "!"]) => false,
        (_, next) if op(next, &[">"]) => false,
        (previous, _) if op(previous, &["&", "::", ".", "<", "#", "'"]) => false,
        (Piece::Op(op), Piece::Open(_)) if op == "!" => false,
        (previous, _) if prefix(previous, before) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::code;

    #[test]
    fn code_is_spaced_as_written() {
        for (tokens, expected) in [
            (
                quote!(Box<dyn Fn(&str) -> usize + Send + Sync>),
                "Box<dyn Fn(&str) -> usize + Send + Sync>",
            ),
            (quote!(fn(&str) -> String), "fn(&str) -> String"),
            (quote!(&'a mut Vec<u8>), "&'a mut Vec<u8>"),
            (quote!(Pin<&mut Self>), "Pin<&mut Self>"),
            (
                quote!(Result<u64, Box<dyn Error>>),
                "Result<u64, Box<dyn Error>>",
            ),
            (quote!(req.order_id), "req.order_id"),
            (quote!((tenant, -1)), "(tenant, -1)"),
            (quote!([u8; 4]), "[u8; 4]"),
            (quote!(format!("{}", a.b())), "format!(\"{}\", a.b())"),
            (quote!(*const T), "*const T"),
            (quote!(std::sync::Arc<T>), "std::sync::Arc<T>"),
            (quote!(a - b), "a - b"),
        ] {
            assert_eq!(code(tokens), expected);
        }
    }
}
