//! Parses the attribute's arguments into [`Args`]. No code is emitted here.

use std::fmt::Write as _;
use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens as _;
use syn::parse::Parser as _;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path};

use crate::diag::{Diagnostics, code};

/// One of the attribute's arguments.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Argument {
    Key,
    Ttl,
    Lease,
    Payload,
    Wait,
    Name,
    Store,
    Transact,
    Steps,
    OnFailure,
    MissingKey,
    Crate,
    Detach,
}

impl Argument {
    /// Every argument, in the order the documentation lists them.
    const ALL: [Self; 13] = [
        Self::Key,
        Self::Ttl,
        Self::Lease,
        Self::Payload,
        Self::Wait,
        Self::Name,
        Self::Store,
        Self::Transact,
        Self::Steps,
        Self::OnFailure,
        Self::MissingKey,
        Self::Crate,
        Self::Detach,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::Ttl => "ttl",
            Self::Lease => "lease",
            Self::Payload => "payload",
            Self::Wait => "wait",
            Self::Name => "name",
            Self::Store => "store",
            Self::Transact => "transact",
            Self::Steps => "steps",
            Self::OnFailure => "on_failure",
            Self::MissingKey => "missing_key",
            Self::Crate => "crate",
            Self::Detach => "detach",
        }
    }

    /// The argument spelled exactly `name`.
    fn named(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|argument| argument.name() == name)
    }

    /// A value to show in messages.
    fn example(self) -> &'static str {
        match self {
            Self::Key => "<expr>",
            Self::Ttl => "\"24h\"",
            Self::Lease => "\"60s\"",
            Self::Payload => "&request",
            Self::Wait => "\"5s\"",
            Self::Name => "\"charge-v1\"",
            Self::Store => "self.idempotency",
            Self::Transact => "tx",
            Self::Steps => "s",
            Self::OnFailure => "\"restart\"",
            Self::MissingKey => "\"allow\"",
            Self::Crate => "\"idempotent_runtime\"",
            Self::Detach => "",
        }
    }

    /// What an argument that binds a name in the body binds it to.
    fn bound(self) -> &'static str {
        match self {
            Self::Steps => "the steps",
            _ => "the transaction",
        }
    }

    /// "`key`, `ttl`, ..., `crate`".
    fn list() -> String {
        let names: Vec<String> = Self::ALL
            .iter()
            .map(|argument| format!("`{}`", argument.name()))
            .collect();
        names.join(", ")
    }
}

/// The accepted values of `missing_key`, with the runtime's variant for each.
const MISSING_KEY_VALUES: [(&str, &str); 3] =
    [("reject", "Reject"), ("allow", "Allow"), ("skip", "Skip")];

/// The accepted values of `on_failure`: whether a retry after a failure restarts the steps.
const ON_FAILURE_VALUES: [(&str, bool); 2] = [("resume", false), ("restart", true)];

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

/// `on_failure = ".."`: whether the steps start over after a failure, spanned on its literal.
pub(crate) struct OnFailureArg {
    pub(crate) restart: bool,
    pub(crate) ident: Ident,
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
    /// `steps = s`: the name the body's `Steps` is bound to.
    pub(crate) steps: Option<Ident>,
    pub(crate) on_failure: Option<OnFailureArg>,
    pub(crate) missing_key: Option<MissingKeyArg>,
    pub(crate) krate: Option<Path>,
    /// Without `crate`, the name the caller's Cargo.toml gives the runtime when it is not
    /// `idempotent_runtime` ([`renamed_runtime`]).
    pub(crate) renamed: Option<Ident>,
    /// `detach`: the body runs on a task of its own (the flag's ident, for spans).
    pub(crate) detach: Option<Ident>,
}

impl Args {
    /// Parses `args`; syntax errors stop at once, semantic ones are all collected into `diag`.
    pub(crate) fn parse(args: TokenStream, diag: &mut Diagnostics) -> syn::Result<Self> {
        let mut out = Args::default();
        let mut seen: Vec<Argument> = Vec::new();
        // What misspelled arguments were taken for: `kye = id` is one mistake, not also a missing `key`.
        let mut suggested: Vec<Argument> = Vec::new();
        // Expressions written without an argument name (`#[idempotent(order_id)]`), and their text.
        let mut bare: Vec<(Ident, String)> = Vec::new();
        let parser = syn::meta::parser(|meta| {
            let ident = meta.path.get_ident().cloned().ok_or_else(|| {
                meta.error(format!(
                    "expected an argument name; expected one of {}",
                    Argument::list()
                ))
            })?;
            let name = ident.to_string();
            let value = match value(&meta, &ident, diag)? {
                Value::Given(value) => Some(value),
                Value::Absent => None,
                Value::Bare(text) => {
                    bare.push((ident, text));
                    return Ok(());
                }
            };
            let Some(argument) = Argument::named(&name) else {
                if value.is_none() && closest(&name, Argument::ALL.map(Argument::name)).is_none() {
                    bare.push((ident.clone(), name));
                    return Ok(());
                }
                let expected = format!("expected one of {}", Argument::list());
                let guess = closest(&name, Argument::ALL.map(Argument::name));
                let message = match guess.and_then(Argument::named) {
                    Some(guess) => {
                        suggested.push(guess);
                        format!(
                            "unknown argument `{name}`; did you mean `{}`? {expected}",
                            guess.name()
                        )
                    }
                    None => format!("unknown argument `{name}`; {expected}"),
                };
                diag.error(&ident, message);
                return Ok(());
            };
            if seen.contains(&argument) {
                diag.error(&ident, format!("duplicate `{name}` argument"));
                return Ok(());
            }
            seen.push(argument);
            if argument == Argument::Detach {
                match value {
                    Some(value) => diag.error(value, "`detach` takes no value; write `detach`"),
                    None => out.detach = Some(ident),
                }
                return Ok(());
            }
            let Some(value) = value else {
                diag.error(
                    &ident,
                    format!("`{name}` needs a value: `{name} = {}`", argument.example()),
                );
                return Ok(());
            };
            match argument {
                Argument::Key => out.key = Some(value),
                Argument::Payload => out.payload = Some(value),
                Argument::Store => out.store = Some(value),
                Argument::Ttl => out.ttl = duration(argument, &value, diag),
                Argument::Lease => out.lease = duration(argument, &value, diag),
                Argument::Wait => out.wait = duration(argument, &value, diag),
                Argument::Name => out.name = name_literal(&value, diag),
                Argument::Transact => out.transact = binding(argument, &value, diag),
                Argument::Steps => out.steps = binding(argument, &value, diag),
                Argument::OnFailure => out.on_failure = on_failure(ident, &value, diag),
                Argument::MissingKey => out.missing_key = missing_key(&value, diag),
                Argument::Crate => out.krate = crate_path(&value, diag),
                Argument::Detach => unreachable!("a flag, handled above"),
            }
            Ok(())
        });
        parser.parse2(args)?;
        if report_bare(&bare, &seen, diag) {
            suggested.push(Argument::Key);
        }
        if !seen.contains(&Argument::Key) && !suggested.contains(&Argument::Key) {
            diag.push(syn::Error::new(
                Span::call_site(),
                "missing `key` argument; expected `#[idempotent(key = <expr>, ttl = \"<duration>\")]`",
            ));
        }
        out.check_steps(&seen, diag);
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

/// Reports the expressions written without an argument name: the first is taken for the key when
/// there is no `key` (whether it was, returned), the others are unknown arguments.
fn report_bare(bare: &[(Ident, String)], seen: &[Argument], diag: &mut Diagnostics) -> bool {
    let expected = format!("expected one of {}", Argument::list());
    let keyless = !seen.contains(&Argument::Key);
    for (at, (ident, text)) in bare.iter().enumerate() {
        let message = if at == 0 && keyless {
            format!("unknown argument `{text}`; did you mean `key = {text}`? {expected}")
        } else {
            format!("unknown argument `{text}`; {expected}")
        };
        diag.error(ident, message);
    }
    keyless && !bare.is_empty()
}

/// What follows an argument's name.
enum Value {
    /// `= value`, or `: value` (reported, and taken as meant).
    Given(Expr),
    /// Nothing: a flag, or an expression without a name.
    Absent,
    /// The rest of an expression without a name (`req.id`): its text, the name included.
    Bare(String),
}

/// Reads what follows the argument `ident`: `= value`; `: value`, reported with the `=` it needs;
/// `.field..`, an expression written without `key =`; or nothing.
fn value(
    meta: &syn::meta::ParseNestedMeta<'_>,
    ident: &Ident,
    diag: &mut Diagnostics,
) -> syn::Result<Value> {
    if meta.input.peek(syn::Token![=]) {
        return Ok(Value::Given(ungroup(meta.value()?.parse()?)));
    }
    if meta.input.peek(syn::Token![:]) && !meta.input.peek(syn::Token![::]) {
        // `key: id`, as a struct field is written.
        let colon: syn::Token![:] = meta.input.parse()?;
        let value = ungroup(meta.input.parse()?);
        diag.error(
            colon,
            format!(
                "expected `=` after `{ident}`, not `:`; did you mean `{ident} = {}`?",
                code(&value)
            ),
        );
        return Ok(Value::Given(value));
    }
    if meta.input.peek(syn::Token![.]) {
        // `#[idempotent(req.id)]`: the key, without `key =`.
        let rest = meta.input.step(|cursor| {
            let mut rest = TokenStream::new();
            let mut cursor = *cursor;
            while let Some((tree, next)) = cursor.token_tree() {
                if matches!(&tree, proc_macro2::TokenTree::Punct(p) if p.as_char() == ',') {
                    break;
                }
                rest.extend([tree]);
                cursor = next;
            }
            Ok((rest, cursor))
        })?;
        return Ok(Value::Bare(code(quote_tokens(ident, rest))));
    }
    Ok(Value::Absent)
}

impl Args {
    /// `steps` and `transact` bind two names in the body, so they must differ; `on_failure` says what
    /// becomes of the steps, so it needs them. `seen` is the arguments in the order written.
    fn check_steps(&self, seen: &[Argument], diag: &mut Diagnostics) {
        if let (Some(steps), Some(tx)) = (&self.steps, &self.transact)
            && steps == tx
        {
            let position = |argument| seen.iter().position(|a| *a == argument);
            // On the second of the two, as a duplicate is.
            let (second, first) = if position(Argument::Steps) > position(Argument::Transact) {
                (Argument::Steps, Argument::Transact)
            } else {
                (Argument::Transact, Argument::Steps)
            };
            diag.error(
                if second == Argument::Steps { steps } else { tx },
                format!(
                    "`{} = {steps}` binds the same name as `{} = {steps}`; give each a name of its own, like `steps = s, transact = tx`",
                    second.name(),
                    first.name()
                ),
            );
        }
        if let (Some(OnFailureArg { ident, .. }), None) = (&self.on_failure, &self.steps) {
            diag.error(
                ident,
                "`on_failure` says whether a retry after a failure resumes or restarts the finished steps, so it needs `steps`; add `steps = s` (and run each effect with `s.run(..)`), or remove `on_failure`",
            );
        }
    }
}

/// The names `steps` and `transact` bind in the body must not be parameters' (`self` included): the
/// body would see the binding where its code means the parameter, and fail to type-check far from the
/// cause.
pub(crate) fn check_bindings(args: &Args, parameters: &[Ident], diag: &mut Diagnostics) {
    for (argument, binding) in [
        (Argument::Transact, &args.transact),
        (Argument::Steps, &args.steps),
    ] {
        let Some(binding) = binding else { continue };
        if parameters.contains(binding) {
            let name = argument.name();
            diag.error(
                binding,
                format!(
                    "`{name} = {binding}` would hide the parameter `{binding}` from the body; bind {} to a name of its own, like `{name} = {}`",
                    argument.bound(),
                    argument.example()
                ),
            );
        }
    }
}

/// Why `detach` refuses a borrowing parameter.
const DETACH_BORROWS: &str = "`detach` runs the body on a task of its own, so the body must be `Send + 'static` and cannot borrow from its caller";

/// With `detach`, the body moves to a task of its own, so it cannot borrow from the caller: each
/// parameter the body uses whose type borrows ([`borrows`]), `self` included however its type is
/// written (`&self`, `self: &Self`, `self: Pin<&mut Self>`), is an error on it. A borrowing parameter
/// that only `key`, `payload` or `store` use is fine: those are evaluated before the body leaves. (A
/// type parameter that holds a borrow is left to rustc's own lifetime error.)
pub(crate) fn check_detach(args: &Args, item: &syn::ItemFn, diag: &mut Diagnostics) {
    if args.detach.is_none() {
        return;
    }
    let body = item.block.to_token_stream();
    for input in &item.sig.inputs {
        match input {
            syn::FnArg::Receiver(receiver)
                if borrows(&receiver.ty) && uses(&body, &receiver.self_token.into()) =>
            {
                diag.error(
                    receiver,
                    format!(
                        "{DETACH_BORROWS}: `{}` is a borrow, and the body uses `self`; take `self` by value (an `Arc` or a cheap clone), or remove `detach`",
                        code(receiver)
                    ),
                );
            }
            syn::FnArg::Typed(typed) if borrows(&typed.ty) => {
                let mut names = Vec::new();
                crate::item::bind(&typed.pat, &mut names);
                if names.iter().any(|name| uses(&body, name)) {
                    diag.error(
                        &typed.ty,
                        format!(
                            "{DETACH_BORROWS}: the parameter `{}` borrows (`{}`) and the body uses it; take it by value (owned, or in an `Arc`), or remove `detach`",
                            code(&typed.pat),
                            code(&typed.ty)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
}

/// Whether `tokens` use the name `name`: as an identifier, or captured by a format string
/// (`"{name}"`, `"{name:?}"`) in a macro. A local of the same name counts too: the check errs on the
/// side of the message over rustc's own.
fn uses(tokens: &TokenStream, name: &Ident) -> bool {
    use proc_macro2::TokenTree;
    let name = name.to_string();
    let captured = [format!("{{{name}}}"), format!("{{{name}:")];
    tokens.clone().into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == name,
        TokenTree::Group(group) => uses(&group.stream(), &Ident::new(&name, group.span())),
        TokenTree::Literal(literal) => {
            let text = literal.to_string();
            captured
                .iter()
                .any(|capture| text.contains(capture.as_str()))
        }
        TokenTree::Punct(_) => false,
    })
}

/// The name the calling crate's Cargo.toml gives the runtime when that is not `idempotent_runtime`
/// (`idem = { package = "idempotent-runtime", .. }`): the default of `crate = ".."`. `None` when the
/// dependency has its own name, when the crate being compiled is the runtime itself, and when the
/// runtime is not a dependency of the crate (it is reached through another crate that re-exports it:
/// `crate = ".."` says where).
pub(crate) fn renamed_runtime() -> Option<Ident> {
    match proc_macro_crate::crate_name("idempotent-runtime") {
        Ok(proc_macro_crate::FoundCrate::Name(name)) if name != "idempotent_runtime" => {
            Some(Ident::new(&name, Span::call_site()))
        }
        _ => None,
    }
}

/// Whether a value of type `ty` may borrow from the caller: a reference or a lifetime other than
/// `'static`. The arguments and output of a function pointer or an `Fn` trait (`fn(&str) -> String`,
/// `Box<dyn Fn(&str) -> usize>`) are the callee's own, higher-ranked lifetimes: only a lifetime named
/// from outside counts there.
fn borrows(ty: &syn::Type) -> bool {
    Borrows { bound: Vec::new() }.ty(ty, false)
}

/// The walk of [`borrows`]: `bound` holds the lifetimes a `for<'a>` declared.
struct Borrows {
    bound: Vec<syn::Lifetime>,
}

impl Borrows {
    /// Whether `ty` borrows; inside a function's signature (`own`), an elided lifetime is the
    /// function's own.
    fn ty(&mut self, ty: &syn::Type, own: bool) -> bool {
        use syn::Type;
        match ty {
            Type::Reference(r) => {
                r.lifetime.as_ref().map_or(!own, |l| self.lifetime(l, own)) || self.ty(&r.elem, own)
            }
            Type::BareFn(f) => {
                let count = self.declare(f.lifetimes.as_ref());
                let out = f.inputs.iter().any(|input| self.ty(&input.ty, true))
                    || matches!(&f.output, syn::ReturnType::Type(_, ty) if self.ty(ty, true));
                self.bound.truncate(self.bound.len() - count);
                out
            }
            Type::Path(p) => {
                p.qself.as_ref().is_some_and(|q| self.ty(&q.ty, own)) || self.path(&p.path, own)
            }
            Type::TraitObject(t) => t.bounds.iter().any(|b| self.bound(b, own)),
            Type::ImplTrait(t) => t.bounds.iter().any(|b| self.bound(b, own)),
            Type::Tuple(t) => t.elems.iter().any(|e| self.ty(e, own)),
            Type::Array(a) => self.ty(&a.elem, own),
            Type::Slice(s) => self.ty(&s.elem, own),
            Type::Paren(p) => self.ty(&p.elem, own),
            Type::Group(g) => self.ty(&g.elem, own),
            Type::Ptr(p) => self.ty(&p.elem, own),
            _ => false,
        }
    }

    /// Adds the lifetimes a `for<..>` declares to `bound`; how many.
    fn declare(&mut self, declared: Option<&syn::BoundLifetimes>) -> usize {
        let before = self.bound.len();
        for param in declared.into_iter().flat_map(|d| &d.lifetimes) {
            if let syn::GenericParam::Lifetime(l) = param {
                self.bound.push(l.lifetime.clone());
            }
        }
        self.bound.len() - before
    }

    fn lifetime(&self, lifetime: &syn::Lifetime, own: bool) -> bool {
        if lifetime.ident == "static" || self.bound.contains(lifetime) {
            return false;
        }
        // `'_` inside a function's signature is its own, as an elided `&` is.
        !(own && lifetime.ident == "_")
    }

    fn path(&mut self, path: &syn::Path, own: bool) -> bool {
        path.segments
            .iter()
            .any(|segment| match &segment.arguments {
                syn::PathArguments::None => false,
                syn::PathArguments::AngleBracketed(arguments) => {
                    arguments.args.iter().any(|argument| match argument {
                        syn::GenericArgument::Lifetime(l) => self.lifetime(l, own),
                        syn::GenericArgument::Type(ty) => self.ty(ty, own),
                        syn::GenericArgument::AssocType(assoc) => self.ty(&assoc.ty, own),
                        syn::GenericArgument::Constraint(c) => {
                            c.bounds.iter().any(|b| self.bound(b, own))
                        }
                        _ => false,
                    })
                }
                // `Fn(&str) -> usize`: the trait's own signature.
                syn::PathArguments::Parenthesized(f) => {
                    f.inputs.iter().any(|ty| self.ty(ty, true))
                        || matches!(&f.output, syn::ReturnType::Type(_, ty) if self.ty(ty, true))
                }
            })
    }

    fn bound(&mut self, bound: &syn::TypeParamBound, own: bool) -> bool {
        match bound {
            syn::TypeParamBound::Lifetime(l) => self.lifetime(l, own),
            syn::TypeParamBound::Trait(t) => {
                let count = self.declare(t.lifetimes.as_ref());
                let out = self.path(&t.path, own);
                self.bound.truncate(self.bound.len() - count);
                out
            }
            _ => false,
        }
    }
}

/// `ident` followed by `rest`.
fn quote_tokens(ident: &Ident, rest: TokenStream) -> TokenStream {
    let mut tokens = ident.to_token_stream();
    tokens.extend(rest);
    tokens
}

/// The candidate `name` is most likely a typo of: at most one edit per three letters, as rustc suggests
/// names, ignoring case; the first of the closest.
fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let name = name.to_lowercase();
    let limit = name.chars().count().max(3) / 3;
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(&name, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// The optimal string alignment distance: inserting, removing or replacing a character, or swapping two
/// neighbours, is one edit each.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // `rows[i][j]`: the distance between the first `i` characters of `a` and the first `j` of `b`.
    let mut rows: Vec<Vec<usize>> = (0..=a.len())
        .map(|i| (0..=b.len()).map(|j| if i == 0 { j } else { i }).collect())
        .collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let replace = rows[i - 1][j - 1] + usize::from(a[i - 1] != b[j - 1]);
            let mut distance = replace.min(rows[i - 1][j] + 1).min(rows[i][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                distance = distance.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = distance;
        }
    }
    rows[a.len()][b.len()]
}

/// `expr` without the invisible groups rustc wraps a `macro_rules!` fragment in (`$ttl:expr`, even
/// `$name:literal`), so that an argument passed through a macro means what it means written in place.
pub(crate) fn ungroup(expr: Expr) -> Expr {
    match expr {
        Expr::Group(group) => ungroup(*group.expr),
        other => other,
    }
}

/// Checks the `key` expression against the function's parameters (`self` included): a key that is the
/// same for every call makes every call share one record, so the body runs once and every later caller
/// gets the first one's result.
///
/// - A key computed from literals alone ([`is_constant`]: `"seed"`, `(1, "a")`, `String::from("a")`,
///   `stringify!(order_id)`, `{ "x" }`, `if true { 1 } else { 2 }`) is an error. When one of its strings
///   spells a parameter (`key = "order_id"`, `Some("req.order_id")`, `stringify!(order_id)`), the error
///   suggests the parameter; otherwise it says how to ask for one record for all calls deliberately:
///   through a named constant alone, which the macro cannot tell from a parameter and so takes at its
///   word.
/// - In a key that may differ between calls, a string among its parts that spells a parameter is an
///   error too (`(tenant, "order_id")`: all orders of a tenant would share one record), unless the key
///   also holds what the string spells: `("user", user)` tags the value with its name.
/// - A key that names no parameter (no identifier among its tokens is one, nor a format string's
///   capture inside a macro: [`names_any`]) is an error too, however it is computed (`(|| "seed")()`,
///   `cfg!(unix)`, `request_id()`, `(SEED, 1)`), unless the whole key is a name alone
///   ([`is_bare_path`]): a named constant, the way to ask for one record for all calls.
/// - `key = ()` serializes to `null`: every call would be a missing key.
pub(crate) fn check_key(key: &Expr, parameters: &[Ident], diag: &mut Diagnostics) {
    let constant = is_constant(key);
    let code = flat_tokens(key.to_token_stream());
    let mut named = false;
    for_each_spelling(key, &mut |spelling| {
        let Some((value, meant)) = spelling.meant() else {
            return;
        };
        if !names_parameter(&meant, parameters)
            || (!constant && contains(&code, &flat_tokens(meant.to_token_stream())))
        {
            return;
        }
        named = true;
        match spelling {
            Spelling::Literal(text) => diag.error(
                text,
                format!(
                    "`key` is the string {value:?}, the same for every call, so every call would share one record; did you mean `{value}`, without the quotes?"
                ),
            ),
            Spelling::Stringify(mac) => diag.error(
                mac,
                format!(
                    "`stringify!({value})` is the string {value:?}, the same for every call, so every call would share one record; did you mean `{value}`, without `stringify!`?"
                ),
            ),
        }
    });
    if named {
        return;
    }
    if let Expr::Tuple(unit) = key
        && unit.elems.is_empty()
    {
        diag.error(
            key,
            "`key = ()` serializes to `null`, a missing key for every call; expected an expression over the parameters, like `key = order_id`",
        );
    } else if constant
        || (!names_any(key.to_token_stream(), parameters, false) && !is_bare_path(key))
    {
        if !constant {
            diag.error(
                key,
                "`key` names no parameter of the function, so nothing in it need differ between calls: every call could share one record and the body run once; expected an expression over the parameters, like `key = order_id`, or, for an operation that runs once for all calls, a named constant (`const KEY: &str = \"seed-v1\";` and `key = KEY`)",
            );
            return;
        }
        let what = if is_literal(key) {
            "a literal"
        } else {
            "computed from literals alone"
        };
        diag.error(
            key,
            format!(
                "`key` is {what}, the same for every call, so every call would share one record and the body would run once; expected an expression over the parameters, like `key = order_id`, or, for an operation that runs once for all calls, a named constant (`const KEY: &str = \"seed-v1\";` and `key = KEY`)"
            ),
        );
    }
}

/// Whether `tokens` name one of `parameters` (`self` among them for a method): as an identifier
/// anywhere, or, inside a macro's arguments (`in_macro`), as a capture of a format string
/// (`format!("{order_id}")`).
fn names_any(tokens: TokenStream, parameters: &[Ident], in_macro: bool) -> bool {
    use proc_macro2::TokenTree;
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    trees.iter().enumerate().any(|(at, tree)| match tree {
        TokenTree::Ident(ident) => parameters.contains(ident),
        TokenTree::Group(group) => {
            // `name!(..)`: the group follows a `!` that follows a name.
            let macro_call = at >= 2
                && matches!(&trees[at - 1], TokenTree::Punct(p) if p.as_char() == '!')
                && matches!(&trees[at - 2], TokenTree::Ident(_));
            names_any(group.stream(), parameters, in_macro || macro_call)
        }
        TokenTree::Literal(literal) if in_macro => {
            syn::parse2::<LitStr>(TokenTree::Literal(literal.clone()).into()).is_ok_and(|text| {
                captured(&text.value())
                    .iter()
                    .any(|name| parameters.iter().any(|p| p == name))
            })
        }
        _ => false,
    })
}

/// The names a format string captures in braces: `order_id` in `"{order_id}"` and `"{order_id:>8}"`.
fn captured(template: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find('{') {
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('{') {
            rest = after;
            continue;
        }
        let end = rest.find(['}', ':']).unwrap_or(rest.len());
        let name = rest[..end].trim();
        if !name.is_empty() {
            names.push(name.to_owned());
        }
        rest = &rest[end..];
    }
    names
}

/// Whether the whole key is a name alone (`KEY`, `crate::KEY`, `&KEY`): a named constant, the
/// documented way to ask for one record for all calls.
fn is_bare_path(key: &Expr) -> bool {
    match key {
        Expr::Path(path) => path.qself.is_none(),
        Expr::Reference(r) => is_bare_path(&r.expr),
        Expr::Paren(p) => is_bare_path(&p.expr),
        Expr::Group(g) => is_bare_path(&g.expr),
        _ => false,
    }
}

/// A piece of a key that spells code as text: a string literal, or a `stringify!`.
enum Spelling<'a> {
    Literal(&'a LitStr),
    Stringify(&'a syn::Macro),
}

impl Spelling<'_> {
    /// The text, and the code it spells when it is an expression.
    fn meant(&self) -> Option<(String, Expr)> {
        match self {
            Self::Literal(text) => {
                let value = text.value();
                let meant = syn::parse_str::<Expr>(&value).ok()?;
                Some((value, meant))
            }
            Self::Stringify(mac) => {
                let meant = syn::parse2::<Expr>(mac.tokens.clone()).ok()?;
                Some((mac.tokens.to_string(), meant))
            }
        }
    }
}

/// Calls `f` on each spelling among the parts of the key as written (alone, in a tuple or array, behind
/// `&` or parentheses), and anywhere inside a part computed from literals alone (`String::from("id")`).
/// A literal given to code that may read something else (`header(&req, "id")`) is not a part of it.
fn for_each_spelling<'a>(expr: &'a Expr, f: &mut impl FnMut(Spelling<'a>)) {
    match expr {
        Expr::Tuple(tuple) => tuple.elems.iter().for_each(|e| for_each_spelling(e, f)),
        Expr::Array(array) => array.elems.iter().for_each(|e| for_each_spelling(e, f)),
        Expr::Reference(r) => for_each_spelling(&r.expr, f),
        Expr::Paren(p) => for_each_spelling(&p.expr, f),
        Expr::Group(g) => for_each_spelling(&g.expr, f),
        _ if is_constant(expr) => for_each_constant_spelling(expr, f),
        _ => {}
    }
}

/// [`for_each_spelling`] inside a part computed from literals alone: every spelling in it.
fn for_each_constant_spelling<'a>(expr: &'a Expr, f: &mut impl FnMut(Spelling<'a>)) {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(text),
            ..
        }) => f(Spelling::Literal(text)),
        Expr::Macro(mac) if macro_name(&mac.mac).is_some_and(|name| name == "stringify") => {
            f(Spelling::Stringify(&mac.mac));
        }
        _ => {
            if let Some(Parts::Borrowed(parts)) = parts(expr) {
                for part in parts {
                    for_each_constant_spelling(part, f);
                }
            }
        }
    }
}

/// The expressions an expression is computed from, when it is computed from them alone.
enum Parts<'a> {
    /// Written in the key.
    Borrowed(Vec<&'a Expr>),
    /// Parsed from a macro's arguments.
    Parsed(Vec<Expr>),
}

/// Whether `expr` gives the same value on every call: it is computed from literals alone. A literal is
/// constant; so is what is built from constants alone by a tuple, array, struct literal, operator, cast,
/// index, field, range, block, `if` or `match`, by a method called on a constant, by a function or
/// constructor given only constants (at least one: a call without arguments, like `Uuid::new_v4()` or
/// `request_id()`, may read what differs per call), and by the standard macros that make constants
/// (`stringify!`, `concat!`, `env!`, `line!`, ...) or format, or collect, only constants (`format!`,
/// `vec!`). Anything named (a parameter, a constant, a static, a unit struct) and any other macro is
/// taken at its word: it may differ between calls.
fn is_constant(expr: &Expr) -> bool {
    match parts(expr) {
        None => false,
        Some(Parts::Borrowed(parts)) => parts.into_iter().all(is_constant),
        Some(Parts::Parsed(parts)) => parts.iter().all(is_constant),
    }
}

/// What `expr` is computed from when its form makes it constant once they are ([`is_constant`]), or
/// `None` when its form may differ between calls whatever it is computed from.
fn parts(expr: &Expr) -> Option<Parts<'_>> {
    let parts: Vec<&Expr> = match expr {
        Expr::Lit(_) => Vec::new(),
        Expr::Tuple(tuple) => tuple.elems.iter().collect(),
        Expr::Array(array) => array.elems.iter().collect(),
        Expr::Reference(r) => vec![&r.expr],
        Expr::Paren(p) => vec![&p.expr],
        Expr::Group(g) => vec![&g.expr],
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_) | syn::UnOp::Not(_)) => vec![&u.expr],
        Expr::Cast(c) => vec![&c.expr],
        Expr::Binary(b) => vec![&b.left, &b.right],
        Expr::Repeat(r) => vec![&r.expr],
        Expr::Index(i) => vec![&i.expr, &i.index],
        Expr::Field(f) => vec![&f.base],
        Expr::Range(r) => r.start.iter().chain(&r.end).map(AsRef::as_ref).collect(),
        Expr::Struct(s) => s
            .fields
            .iter()
            .map(|field| &field.expr)
            .chain(s.rest.as_deref())
            .collect(),
        // A function or constructor given only constants: `String::from("a")`, `Some(1)`.
        Expr::Call(call) if matches!(*call.func, Expr::Path(_)) && !call.args.is_empty() => {
            call.args.iter().collect()
        }
        // A method of a constant: `"seed".to_string()`.
        Expr::MethodCall(call) => std::iter::once(&*call.receiver).chain(&call.args).collect(),
        Expr::Block(block) if block.label.is_none() => block_parts(&block.block)?,
        Expr::Unsafe(block) => block_parts(&block.block)?,
        Expr::If(i) => {
            let (_, otherwise) = i.else_branch.as_ref()?;
            let mut parts = block_parts(&i.then_branch)?;
            parts.extend([&*i.cond, &**otherwise]);
            parts
        }
        Expr::Match(m) => std::iter::once(&*m.expr)
            .chain(m.arms.iter().flat_map(|arm| {
                arm.guard
                    .iter()
                    .map(|(_, guard)| &**guard)
                    .chain([&*arm.body])
            }))
            .collect(),
        Expr::Macro(mac) => return macro_parts(&mac.mac),
        _ => return None,
    };
    Some(Parts::Borrowed(parts))
}

/// A block's statements, when it ends in a value and each of them is an expression or a `let` with
/// a value (a name it binds is then taken at its word, as any name is).
fn block_parts(block: &syn::Block) -> Option<Vec<&Expr>> {
    let Some(syn::Stmt::Expr(_, None)) = block.stmts.last() else {
        return None;
    };
    let mut parts = Vec::new();
    for stmt in &block.stmts {
        match stmt {
            syn::Stmt::Expr(expr, _) => parts.push(expr),
            syn::Stmt::Local(local) => parts.push(&*local.init.as_ref()?.expr),
            syn::Stmt::Item(_) => {}
            syn::Stmt::Macro(_) => return None,
        }
    }
    Some(parts)
}

/// The standard macros whose value is fixed when the program is compiled, whatever their arguments.
const CONSTANT_MACROS: [&str; 10] = [
    "stringify",
    "concat",
    "env",
    "option_env",
    "file",
    "line",
    "column",
    "module_path",
    "include_str",
    "include_bytes",
];

/// A standard macro's arguments, for the macros that make a constant (no parts), or format or collect
/// their arguments (`format!`, `vec!`); `None` for any other macro.
fn macro_parts(mac: &syn::Macro) -> Option<Parts<'static>> {
    let name = macro_name(mac)?;
    if CONSTANT_MACROS.contains(&name.as_str()) {
        return Some(Parts::Parsed(Vec::new()));
    }
    let tokens = &mac.tokens;
    match name.as_str() {
        // `vec![a, b]` and `vec![a; n]` read as the arrays they make.
        "vec" => {
            let array = proc_macro2::Group::new(proc_macro2::Delimiter::Bracket, tokens.clone());
            let array = syn::parse2(proc_macro2::TokenTree::Group(array).into()).ok()?;
            Some(Parts::Parsed(vec![array]))
        }
        "format" => {
            let arguments = syn::punctuated::Punctuated::<Expr, syn::Token![,]>::parse_terminated
                .parse2(tokens.clone())
                .ok()?;
            let mut arguments = arguments.into_iter();
            let Some(Expr::Lit(ExprLit {
                lit: Lit::Str(template),
                ..
            })) = arguments.next()
            else {
                return None;
            };
            // `format!("{order_id}")` reads `order_id`.
            if captures(&template.value()) {
                return None;
            }
            let arguments = arguments.map(|argument| match argument {
                Expr::Assign(named) => *named.right,
                other => other,
            });
            Some(Parts::Parsed(arguments.collect()))
        }
        _ => None,
    }
}

/// The macro's name, without its path: `stringify` for `::core::stringify!`.
fn macro_name(mac: &syn::Macro) -> Option<String> {
    mac.path
        .segments
        .last()
        .map(|segment| segment.ident.to_string())
}

/// Whether a format string names a variable in braces (`"{order_id}"`, `"{id:>8}"`).
fn captures(template: &str) -> bool {
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '{' {
            match chars.next() {
                Some('{') => {}
                Some(first) if first.is_alphabetic() || first == '_' => return true,
                _ => {}
            }
        }
    }
    false
}

/// Whether `expr` is literals only, without computation: `"seed"`, `(1, "a")`, `&-1`.
fn is_literal(expr: &Expr) -> bool {
    match expr {
        Expr::Lit(_) => true,
        Expr::Tuple(tuple) => tuple.elems.iter().all(is_literal),
        Expr::Array(array) => array.elems.iter().all(is_literal),
        Expr::Reference(r) => is_literal(&r.expr),
        Expr::Paren(p) => is_literal(&p.expr),
        Expr::Group(g) => is_literal(&g.expr),
        Expr::Unary(u) => matches!(u.op, syn::UnOp::Neg(_)) && is_literal(&u.expr),
        _ => false,
    }
}

/// The tokens of `tokens`, each as its text, groups opened and closed by their delimiters.
fn flat_tokens(tokens: TokenStream) -> Vec<String> {
    use proc_macro2::{Delimiter, TokenTree};
    let mut out = Vec::new();
    for tree in tokens {
        match tree {
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::None => ("", ""),
                };
                out.push(open.to_owned());
                out.extend(flat_tokens(group.stream()));
                out.push(close.to_owned());
            }
            other => out.push(other.to_string()),
        }
    }
    out.retain(|token| !token.is_empty());
    out
}

/// Whether `needle` is a run of `haystack`.
fn contains(haystack: &[String], needle: &[String]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// Whether `expr` (a string literal's text, parsed) starts from a parameter: `order_id`,
/// `req.order_id`, `self.id`, `(tenant, order_id)`, `&req`, `req.id.to_string()`.
fn names_parameter(expr: &Expr, parameters: &[Ident]) -> bool {
    match expr {
        Expr::Path(path) => path
            .path
            .get_ident()
            .is_some_and(|ident| parameters.contains(ident)),
        Expr::Field(field) => names_parameter(&field.base, parameters),
        Expr::Index(index) => names_parameter(&index.expr, parameters),
        Expr::MethodCall(call) => names_parameter(&call.receiver, parameters),
        Expr::Reference(r) => names_parameter(&r.expr, parameters),
        Expr::Paren(p) => names_parameter(&p.expr, parameters),
        Expr::Tuple(tuple) => tuple.elems.iter().any(|e| names_parameter(e, parameters)),
        Expr::Array(array) => array.elems.iter().any(|e| names_parameter(e, parameters)),
        _ => false,
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

/// The longest duration an argument may give: the runtime's `MAX_DURATION` (100 years), which the
/// macro cannot import (it does not depend on the runtime).
const MAX_DURATION: Duration = Duration::from_hours(100 * 365 * 24);

/// The shortest `lease`: the runtime's `MIN_LEASE` (1 s), which it refuses below at every call.
const MIN_LEASE: Duration = Duration::from_secs(1);

/// Parses a duration with `humantime`, held to the documented grammar: one or more groups of digits
/// and a unit among `ms`, `s`, `m`, `h` and `d`, like "24h" or "1h30m".
///
/// humantime alone also takes spaces, fractions, long unit names, and units from nanoseconds to weeks,
/// months and years, the month being `M` beside `m` for minutes. Those are refused, with the same duration
/// in the grammar as the suggestion (`Err(Some("24h"))` for "24hours", "1d" for "1 day"): one spelling
/// for each duration, whole milliseconds as the runtime keeps them, and no month taken for a minute. A
/// number without a unit gets seconds as the suggestion.
fn parse_duration(text: &str) -> Result<Duration, Option<String>> {
    // humantime reads the units; this keeps out what it reads beyond the grammar, and a bare "0".
    let in_grammar = text
        .bytes()
        .all(|b| b.is_ascii_digit() || b"dhms".contains(&b))
        && text.ends_with(|c: char| c.is_ascii_alphabetic());
    match humantime::parse_duration(text) {
        Ok(duration) if in_grammar => Ok(duration),
        Ok(duration) => Err(spelled(text, duration)),
        Err(_) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            Err(Some(format!("{text}s")))
        }
        Err(_) => Err(None),
    }
}

/// `duration`, read from `text`, in the grammar [`parse_duration`] accepts: the number `text` starts with
/// and the unit that keeps the duration ("24hours" → "24h"), or else largest units first ("1.5h" →
/// "1h30m", "2w" → "14d"); `None` below a millisecond.
fn spelled(text: &str, duration: Duration) -> Option<String> {
    const UNITS: [(&str, u128); 5] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        return None;
    }
    let mut millis = duration.as_millis();
    if millis == 0 {
        return Some("0s".to_owned());
    }
    let text = text.trim_start();
    let digits = &text[..text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len())];
    if let Ok(number) = digits.parse::<u128>()
        && let Some((unit, _)) = UNITS.iter().find(|(_, size)| number * size == millis)
    {
        return Some(format!("{number}{unit}"));
    }
    let mut out = String::new();
    for (unit, size) in UNITS {
        if millis >= size {
            write!(out, "{}{unit}", millis / size).expect("writing to a String");
            millis %= size;
        }
    }
    Some(out)
}

/// `ttl`, `lease` or `wait`: a string literal in the grammar of [`parse_duration`], longer than zero
/// except for `wait`.
fn duration(argument: Argument, value: &Expr, diag: &mut Diagnostics) -> Option<DurationArg> {
    let (name, example) = (argument.name(), argument.example());
    let Some(literal) = string_literal(value) else {
        // `ttl = 3600`, `ttl = 24h` (an integer with a suffix): the same duration, quoted.
        let suggestion = match value {
            Expr::Lit(ExprLit {
                lit: Lit::Int(int), ..
            }) => match parse_duration(&format!("{}{}", int.base10_digits(), int.suffix())) {
                Ok(_) => Some(format!("{}{}", int.base10_digits(), int.suffix())),
                Err(suggestion) => suggestion,
            },
            _ => None,
        };
        let hint = suggestion.map_or_else(
            || "variables and constants are not accepted".to_owned(),
            |suggestion| format!("did you mean {suggestion:?}?"),
        );
        diag.error(
            value,
            format!(
                "`{name}` must be a string literal like {example}, checked at compile time; {hint}"
            ),
        );
        return None;
    };
    let text = literal.value();
    let parsed = match parse_duration(&text) {
        Ok(parsed) => parsed,
        Err(suggestion) => {
            let hint = suggestion.map_or_else(
                || format!(", like {example}"),
                |suggestion| format!("; did you mean {suggestion:?}?"),
            );
            diag.error(
                literal,
                format!(
                    "invalid `{name}` {text:?}: expected a number followed by `ms`, `s`, `m`, `h` or `d` (or several, like \"1h30m\"){hint}"
                ),
            );
            return None;
        }
    };
    if parsed.is_zero() && argument != Argument::Wait {
        diag.error(
            literal,
            format!("`{name}` must be longer than zero, like {example}"),
        );
        return None;
    }
    // The runtime's `MIN_LEASE`: a shorter lease lapses under ordinary store latency, and the runtime
    // refuses it at every call; said here, where it is written.
    if argument == Argument::Lease && !parsed.is_zero() && parsed < MIN_LEASE {
        diag.error(
            literal,
            format!(
                "`lease` is {text:?}; a lease must be at least \"1s\": heartbeats renew it every third of it, and each renewal's round trip eats into it"
            ),
        );
        return None;
    }
    // The runtime's `MAX_DURATION`: a longer one would be saturated there without a word.
    if parsed > MAX_DURATION {
        diag.error(
            literal,
            format!("`{name}` is {text:?}; at most 100 years (\"36500d\") is supported"),
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
    let expected = r#"expected "reject", "allow" or "skip""#;
    let Some(literal) = string_literal(value) else {
        diag.error(
            value,
            format!("`missing_key` must be a string literal; {expected}"),
        );
        return None;
    };
    let text = literal.value();
    let Some((_, variant)) = MISSING_KEY_VALUES.iter().find(|(value, _)| *value == text) else {
        let did_you_mean = closest(&text, MISSING_KEY_VALUES.map(|(value, _)| value))
            .map_or_else(String::new, |guess| format!(" did you mean {guess:?}?"));
        diag.error(
            literal,
            format!("invalid `missing_key` {text:?}:{did_you_mean} {expected}"),
        );
        return None;
    };
    Some(MissingKeyArg {
        variant: Ident::new(variant, literal.span()),
        literal: literal.clone(),
    })
}

/// The name `transact` or `steps` binds in the body.
fn binding(argument: Argument, value: &Expr, diag: &mut Diagnostics) -> Option<Ident> {
    if let Expr::Path(p) = value
        && p.qself.is_none()
        && p.attrs.is_empty()
        && let Some(ident) = p.path.get_ident()
    {
        return Some(ident.clone());
    }
    diag.error(
        value,
        format!(
            "`{name}` must be an identifier to bind {what} to in the body, like `{name} = {example}`",
            name = argument.name(),
            what = argument.bound(),
            example = argument.example()
        ),
    );
    None
}

fn on_failure(ident: Ident, value: &Expr, diag: &mut Diagnostics) -> Option<OnFailureArg> {
    let expected = r#"expected "resume" (the default) or "restart""#;
    let Some(literal) = string_literal(value) else {
        diag.error(
            value,
            format!("`on_failure` must be a string literal; {expected}"),
        );
        return None;
    };
    let text = literal.value();
    let Some((_, restart)) = ON_FAILURE_VALUES.iter().find(|(value, _)| *value == text) else {
        let did_you_mean = closest(&text, ON_FAILURE_VALUES.map(|(value, _)| value))
            .map_or_else(String::new, |guess| format!(" did you mean {guess:?}?"));
        diag.error(
            literal,
            format!("invalid `on_failure` {text:?}:{did_you_mean} {expected}"),
        );
        return None;
    };
    Some(OnFailureArg {
        restart: *restart,
        ident,
        literal: literal.clone(),
    })
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
    use std::time::Duration;

    use quote::quote;

    use super::{Args, closest, edit_distance, parse_duration};
    use crate::diag::Diagnostics;

    /// The messages `args` gets.
    fn errors(args: proc_macro2::TokenStream) -> Vec<String> {
        let mut diag = Diagnostics::default();
        if let Err(e) = Args::parse(args, &mut diag) {
            diag.push(e);
        }
        diag.finish()
            .err()
            .map(|e| e.into_iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn durations_in_the_grammar() {
        for (text, expected) in [
            ("24h", Duration::from_hours(24)),
            ("7d", Duration::from_hours(7 * 24)),
            ("1h30m", Duration::from_mins(90)),
            ("90m", Duration::from_mins(90)),
            ("250ms", Duration::from_millis(250)),
            ("1m1s1ms", Duration::from_millis(61_001)),
            ("0s", Duration::ZERO),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    /// What humantime understands outside the grammar is refused with the same duration inside it.
    #[test]
    fn durations_outside_the_grammar_get_their_spelling_in_it() {
        for (text, suggestion) in [
            ("90", "90s"),
            ("0", "0s"),
            ("1 day", "1d"),
            ("24hours", "24h"),
            ("5 sec", "5s"),
            ("90 s", "90s"),
            ("1.5h", "1h30m"),
            ("2w", "14d"),
            ("24 h", "24h"),
            ("1h 30m", "1h30m"),
            ("1500 msec", "1500ms"),
            ("1.5s", "1s500ms"),
            ("1M", "30d10h33m36s"),
        ] {
            assert_eq!(
                parse_duration(text),
                Err(Some(suggestion.to_owned())),
                "{text}"
            );
        }
    }

    #[test]
    fn durations_without_a_suggestion() {
        for text in [
            "", "h", "5x", "-5s", "1H", "soon", "1h30", "500us", "1s 1ns",
        ] {
            assert_eq!(parse_duration(text), Err(None), "{text}");
        }
    }

    #[test]
    fn a_lease_under_a_second_is_refused() {
        assert_eq!(errors(quote!(key = id, lease = "1s")), Vec::<String>::new());
        let errors = errors(quote!(key = id, lease = "300ms"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("at least \"1s\""), "{errors:?}");
    }

    #[test]
    fn zero_is_a_wait_but_no_ttl_or_lease() {
        assert_eq!(errors(quote!(key = id, wait = "0s")), Vec::<String>::new());
        for argument in [quote!(ttl), quote!(lease)] {
            let errors = errors(quote!(key = id, #argument = "0s"));
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].contains("must be longer than zero"), "{errors:?}");
        }
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("ttl", "ttl"), 0);
        assert_eq!(edit_distance("tll", "ttl"), 1);
        assert_eq!(edit_distance("wiat", "wait"), 1);
        assert_eq!(edit_distance("kye", "key"), 1);
        assert_eq!(edit_distance("", "key"), 3);
        assert_eq!(edit_distance("namespace", "name"), 5);
    }

    #[test]
    fn suggestions_are_close_or_none() {
        let names = ["key", "ttl", "lease", "payload", "wait", "name", "store"];
        assert_eq!(closest("tll", names), Some("ttl"));
        assert_eq!(closest("TTL", names), Some("ttl"));
        assert_eq!(closest("leese", names), Some("lease"));
        assert_eq!(closest("timeout", names), None);
        assert_eq!(closest("namespace", names), None);
    }

    #[test]
    fn every_argument_is_known_by_its_exact_name() {
        let all = quote! {
            key = id, ttl = "1h", lease = "1m", payload = id, wait = "1s", name = "n",
            store = idem, transact = tx, steps = s, on_failure = "restart", missing_key = "allow",
            crate = "idem", detach
        };
        assert_eq!(errors(all), Vec::<String>::new());
        for unknown in [quote!(ke), quote!(keys), quote!(Key), quote!(ttl_)] {
            let errors = errors(quote!(key = id, #unknown = 1));
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].starts_with("unknown argument"), "{errors:?}");
        }
    }

    #[test]
    fn unknown_argument_names_the_closest() {
        assert_eq!(
            errors(quote!(key = id, tll = "1h")),
            [
                "unknown argument `tll`; did you mean `ttl`? expected one of `key`, `ttl`, `lease`, `payload`, `wait`, `name`, `store`, `transact`, `steps`, `on_failure`, `missing_key`, `crate`, `detach`"
            ]
        );
        assert_eq!(
            errors(quote!(key = id, timeout = "1h")),
            [
                "unknown argument `timeout`; expected one of `key`, `ttl`, `lease`, `payload`, `wait`, `name`, `store`, `transact`, `steps`, `on_failure`, `missing_key`, `crate`, `detach`"
            ]
        );
    }

    /// `kye = id` is one mistake: the suggestion says it, and `key` is not also reported missing.
    #[test]
    fn misspelled_key_is_not_also_missing() {
        let errors = errors(quote!(kye = id));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("did you mean `key`?"), "{errors:?}");
        let errors = super::tests::errors(quote!(ttl = "1h"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("missing `key` argument"),
            "{errors:?}"
        );
    }

    /// An expression without `key =` is the key the user meant: one error that says so.
    #[test]
    fn a_bare_expression_is_taken_for_the_key() {
        let expected = "expected one of `key`, `ttl`, `lease`, `payload`, `wait`, `name`, `store`, `transact`, `steps`, `on_failure`, `missing_key`, `crate`, `detach`";
        assert_eq!(
            errors(quote!(id)),
            [format!(
                "unknown argument `id`; did you mean `key = id`? {expected}"
            )]
        );
        assert_eq!(
            errors(quote!(req.order_id, ttl = "1h")),
            [format!(
                "unknown argument `req.order_id`; did you mean `key = req.order_id`? {expected}"
            )]
        );
        // With a `key`, it is only unknown.
        assert_eq!(
            errors(quote!(key = id, order)),
            [format!("unknown argument `order`; {expected}")]
        );
    }

    #[test]
    fn a_colon_for_an_equals_sign_is_suggested_the_equals_sign() {
        assert_eq!(
            errors(quote!(key: id)),
            ["expected `=` after `key`, not `:`; did you mean `key = id`?"]
        );
        assert_eq!(
            errors(quote!(key = id, ttl: "1h")),
            [r#"expected `=` after `ttl`, not `:`; did you mean `ttl = "1h"`?"#]
        );
    }

    #[test]
    fn a_duration_without_quotes_is_suggested_with_them() {
        for (given, suggestion) in [
            (quote!(3600), "3600s"),
            (quote!(24h), "24h"),
            (quote!(90m), "90m"),
        ] {
            assert_eq!(
                errors(quote!(key = id, ttl = #given)),
                [format!(
                    "`ttl` must be a string literal like \"24h\", checked at compile time; did you mean {suggestion:?}?"
                )],
                "{given}"
            );
        }
        assert_eq!(
            errors(quote!(key = id, ttl = TTL)),
            [
                "`ttl` must be a string literal like \"24h\", checked at compile time; variables and constants are not accepted"
            ]
        );
    }

    #[test]
    fn what_borrows_from_the_caller() {
        for ty in [
            quote!(&Order),
            quote!(&mut Vec<u8>),
            quote!(Cow<'_, str>),
            quote!(Vec<&str>),
            quote!(Pin<&mut Self>),
            quote!(Box<dyn Fn(&str) + 'a>),
            quote!(Arc<dyn Fn(&'a str) -> usize>),
            quote!(fn() -> &'a str),
            quote!(&'static mut &'a u8),
        ] {
            assert!(super::borrows(&syn::parse2(ty.clone()).unwrap()), "{ty}");
        }
        for ty in [
            quote!(&'static str),
            quote!(fn(&str) -> String),
            quote!(Box<dyn Fn(&str) -> usize + Send + Sync>),
            quote!(Box<dyn for<'a> Fn(&'a str) -> &'a str + Send>),
            quote!(for<'a> fn(&'a u8) -> &'a u8),
            quote!(Option<fn(&u8)>),
            quote!(Arc<dyn Fn(Cow<'_, str>) + 'static>),
            quote!(Vec<u8>),
        ] {
            assert!(!super::borrows(&syn::parse2(ty.clone()).unwrap()), "{ty}");
        }
    }

    /// The messages `check_detach` gives `item` with `detach`.
    fn detach_errors(item: proc_macro2::TokenStream) -> Vec<String> {
        let mut diag = Diagnostics::default();
        let args = Args::parse(quote!(key = id, detach), &mut diag).unwrap();
        super::check_detach(&args, &syn::parse2(item).unwrap(), &mut diag);
        diag.finish()
            .err()
            .map(|e| e.into_iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn detach_refuses_a_borrow_the_body_uses_however_self_is_written() {
        for receiver in [
            quote!(&self),
            quote!(self: &Self),
            quote!(self: Pin<&mut Self>),
        ] {
            let errors = detach_errors(quote! {
                async fn f(#receiver, id: u64) -> Result<u64, Error> { Ok(self.fee + id) }
            });
            assert_eq!(errors.len(), 1, "{receiver}: {errors:?}");
            let receiver = crate::diag::code(&receiver);
            assert!(
                errors[0].contains(&format!("`{receiver}` is a borrow")),
                "{errors:?}"
            );
        }
        let errors = detach_errors(quote! {
            async fn f(id: u64, cb: Box<dyn Fn(&str) -> usize + 'a>) -> Result<u64, Error> { Ok(cb("x")) }
        });
        assert_eq!(
            errors,
            [
                "`detach` runs the body on a task of its own, so the body must be `Send + 'static` and cannot borrow from its caller: the parameter `cb` borrows (`Box<dyn Fn(&str) -> usize + 'a>`) and the body uses it; take it by value (owned, or in an `Arc`), or remove `detach`"
            ]
        );
        let errors = detach_errors(quote! {
            async fn f(id: u64, order: &Order) -> Result<String, Error> { Ok(format!("{order:?}")) }
        });
        assert_eq!(errors.len(), 1, "{errors:?}");
    }

    #[test]
    fn detach_accepts_static_callbacks_and_borrows_the_body_leaves_alone() {
        for item in [
            quote! { async fn f(id: u64, cb: fn(&str) -> String) -> Result<String, Error> { Ok(cb("x")) } },
            quote! {
                async fn f(id: u64, cb: Box<dyn Fn(&str) -> usize + Send + Sync>) -> Result<usize, Error> {
                    Ok(cb("x"))
                }
            },
            quote! { async fn f(&self, id: u64) -> Result<u64, Error> { Ok(id) } },
            quote! { async fn f(self: Pin<&mut Self>, id: u64) -> Result<u64, Error> { Ok(id) } },
            quote! { async fn f(req: &Request, id: u64) -> Result<u64, Error> { Ok(id) } },
        ] {
            assert_eq!(detach_errors(item.clone()), Vec::<String>::new(), "{item}");
        }
    }

    #[test]
    fn every_duplicate_is_reported() {
        for argument in [
            quote!(ttl = "1h"),
            quote!(lease = "1m"),
            quote!(payload = id),
            quote!(wait = "1s"),
            quote!(name = "n"),
            quote!(store = idem),
            quote!(transact = tx),
            quote!(steps = s),
            quote!(on_failure = "restart"),
            quote!(missing_key = "allow"),
            quote!(crate = "idem"),
        ] {
            // `on_failure` needs `steps`: with it, the duplicate is the only error.
            let steps = argument
                .to_string()
                .starts_with("on_failure")
                .then(|| quote!(steps = s,));
            let errors = errors(quote!(key = id, #steps #argument, #argument));
            assert_eq!(errors.len(), 1, "{argument}: {errors:?}");
            assert!(errors[0].starts_with("duplicate `"), "{errors:?}");
        }
        assert_eq!(
            errors(quote!(key = a, key = b)),
            ["duplicate `key` argument"]
        );
    }

    /// The messages `check_key` gives `key` on a function with `parameters`.
    fn key_errors(key: proc_macro2::TokenStream, parameters: &[&str]) -> Vec<String> {
        let mut diag = Diagnostics::default();
        let parameters: Vec<_> = parameters
            .iter()
            .map(|name| proc_macro2::Ident::new(name, proc_macro2::Span::call_site()))
            .collect();
        super::check_key(&syn::parse2(key).unwrap(), &parameters, &mut diag);
        diag.finish()
            .err()
            .map(|e| e.into_iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_string_naming_a_parameter_suggests_it() {
        for (key, meant) in [
            (quote!("order_id"), "order_id"),
            (quote!("req.order_id"), "req.order_id"),
            (quote!(("tenant", 7)), "tenant"),
            (quote!((tenant, "req.order_id")), "req.order_id"),
            (quote!("self.id"), "self.id"),
            (quote!(&"order_id"), "order_id"),
        ] {
            let errors = key_errors(key.clone(), &["self", "tenant", "req", "order_id"]);
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(
                errors[0].contains(&format!("did you mean `{meant}`, without the quotes?")),
                "{key}: {errors:?}"
            );
        }
    }

    #[test]
    fn a_key_of_literals_only_is_refused() {
        for key in [
            quote!("seed-v1"),
            quote!(1),
            quote!(-1),
            quote!(("a", 1)),
            quote!([1, 2]),
            quote!(&"order"),
            quote!("order"),
        ] {
            let errors = key_errors(key.clone(), &["order_id"]);
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(errors[0].contains("named constant"), "{key}: {errors:?}");
        }
        let errors = key_errors(quote!(()), &["order_id"]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("`key = ()` serializes to `null`"));
    }

    /// A key computed from literals alone (a cast, arithmetic, an array of copies) is as constant as the
    /// literal: every call would share one record.
    #[test]
    fn a_key_computed_from_literals_only_is_refused() {
        for key in [
            quote!(1 as u64),
            quote!(2 + 2),
            quote!([0_u8; 4]),
            quote!(("a", 1 as u64)),
            quote!(&(-1 * 3)),
        ] {
            let errors = key_errors(key.clone(), &["order_id"]);
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(errors[0].contains("named constant"), "{key}: {errors:?}");
        }
        for key in [
            quote!(order_id as u64),
            quote!(order_id + 1),
            quote!([order_id; 2]),
        ] {
            assert_eq!(
                key_errors(key.clone(), &["order_id"]),
                Vec::<String>::new(),
                "{key}"
            );
        }
    }

    /// A key computed from literals alone through a call, a method, a macro, a block or an `if` is as
    /// constant as the literal: every call would share one record.
    #[test]
    fn a_key_computed_through_calls_macros_and_blocks_is_refused() {
        for key in [
            quote!(String::from("seed")),
            quote!(Some("seed")),
            quote!("seed".to_string()),
            quote!(stringify!(seed)),
            quote!(::core::concat!("a", 1)),
            quote!(format!("seed-{}", 1)),
            quote!({ "x" }),
            quote!(if true { 1 } else { 2 }),
            quote!(match 1 {
                _ => "x",
            }),
            quote!(Key { id: 1 }),
            quote!(vec![1, 2]),
            quote!(("a", Some(1_u64))),
            quote!(&"seed".to_owned()),
            quote!(std::env!("SEED")),
        ] {
            let errors = key_errors(key.clone(), &["order_id"]);
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(errors[0].contains("named constant"), "{key}: {errors:?}");
        }
    }

    /// Each listed form that spells a parameter gets the parameter as its suggestion.
    #[test]
    fn a_key_computed_from_a_string_naming_a_parameter_suggests_it() {
        for (key, meant) in [
            (
                quote!(String::from("order_id")),
                "did you mean `order_id`, without the quotes?",
            ),
            (
                quote!(Some("order_id")),
                "did you mean `order_id`, without the quotes?",
            ),
            (
                quote!("order_id".to_string()),
                "did you mean `order_id`, without the quotes?",
            ),
            (
                quote!(stringify!(order_id)),
                "did you mean `order_id`, without `stringify!`?",
            ),
            (
                quote!({ "order_id" }),
                "did you mean `order_id`, without the quotes?",
            ),
            (
                quote!((tenant, String::from("order_id"))),
                "did you mean `order_id`, without the quotes?",
            ),
        ] {
            let errors = key_errors(key.clone(), &["tenant", "order_id"]);
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(errors[0].contains(meant), "{key}: {errors:?}");
        }
    }

    /// A literal beside the parameter it spells is a tag, not a mistake: `("user", user)`.
    #[test]
    fn a_literal_beside_the_parameter_it_names_is_a_tag() {
        for key in [
            quote!(("user", user)),
            quote!((user, "user")),
            quote!(("req.id", req.id)),
            quote!(["user", user.as_str()]),
            quote!(("user", &user)),
        ] {
            assert_eq!(
                key_errors(key.clone(), &["user", "req"]),
                Vec::<String>::new(),
                "{key}"
            );
        }
    }

    /// A key that names no parameter is refused whatever computes it, unless it is a name alone (a
    /// named constant): a closure, a `const` block, a loop, `cfg!`, a binding, a call without
    /// arguments, a macro the attribute does not know, a computation over a constant.
    #[test]
    fn a_key_naming_no_parameter_is_refused_unless_it_is_a_name_alone() {
        for key in [
            quote!((|| "seed")()),
            quote!(*&"order_id"),
            quote!(const { "seed" }),
            quote!(loop {
                break "seed";
            }),
            quote!(cfg!(unix)),
            quote!({
                let k = "seed";
                k
            }),
            quote!(request_id()),
            quote!(Uuid::new_v4()),
            quote!(my_key!("seed")),
            quote!(String::from(SEED)),
            quote!((1, SEED)),
            quote!(SEED as u64),
            quote!(format!("{seed}")),
            quote!("{order_id}"),
        ] {
            let errors = key_errors(key.clone(), &["self", "order_id", "req"]);
            assert_eq!(errors.len(), 1, "{key}: {errors:?}");
            assert!(errors[0].contains("named constant"), "{key}: {errors:?}");
        }
        for key in [
            quote!(SEED),
            quote!(&SEED),
            quote!(crate::keys::SEED),
            quote!((|| order_id)()),
            quote!(*&order_id),
            quote!({
                let k = order_id;
                k
            }),
            quote!(self.id),
            quote!(format!("{order_id:>8}")),
            quote!(my_key!(req)),
        ] {
            assert_eq!(
                key_errors(key.clone(), &["self", "order_id", "req"]),
                Vec::<String>::new(),
                "{key}"
            );
        }
    }

    /// What may differ between calls is taken at its word: a parameter, through a call, a method, a
    /// block, an `if`, a format string that captures it.
    #[test]
    fn keys_that_may_differ_between_calls_are_accepted() {
        for key in [
            quote!(String::from(order_id)),
            quote!(Some(order_id)),
            quote!(order_id.to_string()),
            quote!({ order_id }),
            quote!(if order_id > 0 { 1 } else { 2 }),
            quote!(header(&req, "x-request-id")),
            quote!(format!("{order_id}")),
            quote!(format!("{}-{}", "a", order_id)),
            quote!(Key { id: order_id }),
        ] {
            assert_eq!(
                key_errors(key.clone(), &["order_id", "req"]),
                Vec::<String>::new(),
                "{key}"
            );
        }
    }

    #[test]
    fn keys_over_parameters_and_constants_are_accepted() {
        for key in [
            quote!(order_id),
            quote!(("refund", order_id)),
            quote!(SEED),
            quote!(req.order_id),
            quote!(format!("{}", order_id)),
        ] {
            assert_eq!(
                key_errors(key.clone(), &["order_id", "req"]),
                Vec::<String>::new(),
                "{key}"
            );
        }
    }

    #[test]
    fn arguments_are_read_through_invisible_groups() {
        use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
        let invisible = |tokens: TokenStream| TokenTree::Group(Group::new(Delimiter::None, tokens));
        let (ttl, name, tx, missing) = (
            invisible(quote!("1h")),
            invisible(quote!("charge-v1")),
            invisible(quote!(tx)),
            invisible(quote!("allow")),
        );
        let key = invisible(quote!((req.tenant, req.order_id)));
        let mut diag = Diagnostics::default();
        let args = Args::parse(
            quote!(key = #key, ttl = #ttl, name = #name, transact = #tx, missing_key = #missing),
            &mut diag,
        )
        .unwrap();
        assert!(diag.finish().is_ok());
        assert_eq!(args.ttl.unwrap().value, Duration::from_hours(1));
        assert_eq!(args.name.unwrap().value(), "charge-v1");
        assert_eq!(args.transact.unwrap(), "tx");
        assert!(matches!(args.key, Some(syn::Expr::Tuple(_))));
    }

    #[test]
    fn steps_binds_an_identifier() {
        let mut diag = Diagnostics::default();
        let args = Args::parse(quote!(key = id, steps = s), &mut diag).unwrap();
        assert!(diag.finish().is_ok());
        assert_eq!(args.steps.unwrap(), "s");
        assert!(args.on_failure.is_none());
        for value in [quote!(3), quote!("s"), quote!(self.s), quote!(s.clone())] {
            assert_eq!(
                errors(quote!(key = id, steps = #value)),
                [
                    "`steps` must be an identifier to bind the steps to in the body, like `steps = s`"
                ],
                "{value}"
            );
        }
        assert_eq!(
            errors(quote!(key = id, steps)),
            ["`steps` needs a value: `steps = s`"]
        );
    }

    /// The message is on the second of the two, and says which came first.
    #[test]
    fn steps_and_transact_bind_different_names() {
        assert_eq!(
            errors(quote!(key = id, transact = tx, steps = tx)),
            [
                "`steps = tx` binds the same name as `transact = tx`; give each a name of its own, like `steps = s, transact = tx`"
            ]
        );
        assert_eq!(
            errors(quote!(key = id, steps = s, transact = s)),
            [
                "`transact = s` binds the same name as `steps = s`; give each a name of its own, like `steps = s, transact = tx`"
            ]
        );
        assert_eq!(
            errors(quote!(key = id, steps = s, transact = tx)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn bindings_do_not_hide_parameters() {
        let errors = |args: proc_macro2::TokenStream| {
            let mut diag = Diagnostics::default();
            let args = Args::parse(args, &mut diag).unwrap();
            let parameters = ["self", "order", "tx"]
                .map(|name| proc_macro2::Ident::new(name, proc_macro2::Span::call_site()));
            super::check_bindings(&args, &parameters, &mut diag);
            diag.finish()
                .err()
                .map(|e| e.into_iter().map(|e| e.to_string()).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(
            errors(quote!(key = order, steps = order)),
            [
                "`steps = order` would hide the parameter `order` from the body; bind the steps to a name of its own, like `steps = s`"
            ]
        );
        assert_eq!(
            errors(quote!(key = order, transact = tx, steps = s)),
            [
                "`transact = tx` would hide the parameter `tx` from the body; bind the transaction to a name of its own, like `transact = tx`"
            ]
        );
        assert_eq!(
            errors(quote!(key = order, transact = batch, steps = s)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn on_failure_values() {
        for (given, restart) in [("resume", false), ("restart", true)] {
            let mut diag = Diagnostics::default();
            let args =
                Args::parse(quote!(key = id, steps = s, on_failure = #given), &mut diag).unwrap();
            assert!(diag.finish().is_ok());
            assert_eq!(args.on_failure.unwrap().restart, restart, "{given}");
        }
        assert_eq!(
            errors(quote!(key = id, steps = s, on_failure = "restrat")),
            [
                r#"invalid `on_failure` "restrat": did you mean "restart"? expected "resume" (the default) or "restart""#
            ]
        );
        assert_eq!(
            errors(quote!(key = id, steps = s, on_failure = "retry")),
            [r#"invalid `on_failure` "retry": expected "resume" (the default) or "restart""#]
        );
        assert_eq!(
            errors(quote!(key = id, steps = s, on_failure = restart)),
            [
                r#"`on_failure` must be a string literal; expected "resume" (the default) or "restart""#
            ]
        );
    }

    #[test]
    fn on_failure_needs_steps() {
        let errors = errors(quote!(key = id, on_failure = "restart"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("`on_failure` says whether a retry after a failure resumes or restarts the finished steps, so it needs `steps`"),
            "{errors:?}"
        );
    }

    #[test]
    fn missing_key_values() {
        assert_eq!(
            errors(quote!(key = id, missing_key = "alow")),
            [
                r#"invalid `missing_key` "alow": did you mean "allow"? expected "reject", "allow" or "skip""#
            ]
        );
        assert_eq!(
            errors(quote!(key = id, missing_key = "ignore")),
            [r#"invalid `missing_key` "ignore": expected "reject", "allow" or "skip""#]
        );
    }
}
