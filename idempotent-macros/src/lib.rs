//! The `#[idempotent]` attribute. Use it through the `idempotent-runtime` crate, which re-exports it and
//! holds the runtime the generated code calls; its documentation is on `idempotent_runtime::idempotent`.

mod args;
mod diag;
mod expand;
mod item;

use proc_macro::TokenStream;

/// Runs an `async fn` at most once per key.
///
/// The first call with a key claims it, runs the body and stores its `Ok` value. Later calls with the same
/// key get the stored value back without running the body, for as long as the record lives (`ttl`). A call
/// that arrives while the first is still running gets `Error::InProgress` (or waits for the result, with
/// `wait`). An `Err` is returned to its caller unchanged and not stored: the next call runs the body again.
///
/// ```
/// use idempotent_runtime::{Error, Idempotency, idempotent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Receipt {
///     charge_id: String,
/// }
///
/// #[idempotent(key = (tenant, order_id), ttl = "24h")]
/// async fn charge(tenant: u32, order_id: &str, cents: u64) -> Result<Receipt, Error> {
///     Ok(Receipt { charge_id: format!("ch_{tenant}_{order_id}_{cents}") })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// Idempotency::in_memory().install(); // or Idempotency::dynamodb(client, "idempotency")
/// let first = charge(7, "order-1", 500).await?;
/// let again = charge(7, "order-1", 500).await?; // the stored receipt: the body did not run again
/// assert_eq!(first.charge_id, again.charge_id);
/// # Ok(())
/// # }
/// ```
///
/// # Arguments
///
/// `key` is required, the others are optional, each at most once, in any order.
///
/// Durations are string literals checked at compile time: one or more groups of a whole number and a unit,
/// `ms`, `s`, `m`, `h` or `d`, without spaces, like `"250ms"`, `"30s"`, `"15m"`, `"24h"`, `"7d"` or
/// `"1h30m"`. Nothing else is accepted: not a number without a unit, a fraction, a space, a unit spelled
/// out (`"24hours"`, `"1 day"`), nor weeks, months or years; the compile error then gives the same
/// duration as it is written here (`"90"`: did you mean `"90s"`? `"24hours"`: `"24h"`; `"1.5h"`:
/// `"1h30m"`). The longest is 100 years (`"36500d"`), the runtime's `MAX_DURATION`.
///
/// ## `key = <expr>`
///
/// What makes two calls the same call: any `serde::Serialize` expression over the parameters, `self` and
/// parameters bound by patterns included; a tuple for a composite key. It is evaluated on every call,
/// before the body, by reference (see [Limitations](#limitations)), and hashed together with the namespace
/// (`name`) into the record's key, so the store never sees the key's values. A key that is `None`, or a
/// tuple key with a `None` part, is missing, and the call is rejected unless `missing_key` says otherwise.
///
/// A key that may be the same for every call is refused at compile time, since every call would then
/// share one record: any key that names no parameter of the function (nor `self`), however it is
/// computed, unless it is a name alone. That covers keys made of literals only (`key = "seed"`,
/// `key = (1, 2)`) or computed from literals: an operator or a cast (`key = 1 as u64`), a call or
/// constructor (`String::from("seed")`, `(|| "seed")()`), a method of a literal (`"seed".to_string()`),
/// any macro (`stringify!(order_id)`, `cfg!(unix)`, `format!("seed-{}", 1)`), a block, binding, loop,
/// `const` block, `if` or `match` (`{ let k = "seed"; k }`, `loop { break "seed" }`), and a call that
/// reads per-call state without a parameter (`request_id()`: pass what it reads as a parameter). A
/// string that spells a parameter, as the key or a part of it, is refused with the parameter as the
/// suggestion (`key = "order_id"`, `key = (tenant, "req.order_id")`: did you mean `req.order_id`?), and
/// so is `key = ()` (which serializes to `null`, a missing key). A name alone is taken at its word (the
/// attribute cannot tell a parameter from a constant): for an operation that is to run once for all
/// calls, say so with a named constant, `const SEED: &str = "seed-v1";` and `key = SEED`. A literal
/// beside a parameter (`key = ("refund", order_id)`) is an ordinary key, also when it spells the
/// parameter beside it (`key = ("user", user)`, a tag).
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// struct Request {
///     tenant: u32,
///     order_id: String,
/// }
///
/// #[idempotent(key = (req.tenant, req.order_id))]
/// async fn submit(req: Request) -> Result<String, Error> {
///     Ok(req.order_id) // the key only borrowed `req.order_id`
/// }
/// ```
///
/// ## `ttl = "<duration>"`
///
/// How long a completed result is replayed; after that the key counts as new. Must be longer than zero.
/// Default: the handle's
/// (`Builder::default_ttl`), 24 hours unless changed.
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// #[idempotent(key = order_id, ttl = "7d")]
/// async fn ship(order_id: u64) -> Result<u64, Error> {
///     Ok(order_id)
/// }
/// ```
///
/// ## `lease = "<duration>"`
///
/// How long a running call's claim keeps other callers out after its worker's last heartbeat: the bound on
/// how long a crashed worker holds up its key, after which another call takes the key over. Heartbeats
/// extend the lease while the body runs (unless the handle turns them off with `Builder::heartbeat`), so it
/// need not cover the body's running time. Must be longer than zero. Default: the handle's
/// (`Builder::default_lease`), 60 seconds unless changed.
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// #[idempotent(key = job_id, lease = "5m")]
/// async fn render(job_id: u64) -> Result<Vec<u8>, Error> {
///     Ok(Vec::new())
/// }
/// ```
///
/// ## `payload = <expr>`
///
/// A `Serialize` expression, usually the whole request, whose fingerprint is stored with the record: a
/// call with the same key but another payload gets `Error::PayloadMismatch` instead of the other request's
/// result. Evaluated by reference, like `key`. Default: none, the payload is not checked.
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// #[derive(serde::Serialize)]
/// struct Transfer {
///     id: String,
///     cents: u64,
/// }
///
/// #[idempotent(key = req.id, payload = &req)]
/// async fn transfer(req: Transfer) -> Result<u64, Error> {
///     Ok(req.cents)
/// }
/// ```
///
/// ## `wait = "<duration>"`
///
/// How long a duplicate that finds the key still running waits for the result (polling the store) before
/// giving up with `Error::InProgress`. If the running call fails meanwhile, the waiting call runs the body
/// itself. Default: `"0s"`, fail at once.
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// #[idempotent(key = report_id, wait = "5s")]
/// async fn report(report_id: u64) -> Result<String, Error> {
///     Ok(format!("report {report_id}"))
/// }
/// ```
///
/// ## `name = "<namespace>"`
///
/// The namespace of the function's keys: two calls share a record only when they have the same
/// namespace and equal keys. Default:
///
/// - for a method (a function that takes `self`, or whose signature names `Self`): its path as the
///   compiler spells it (`std::any::type_name`), with the type it is called on and, in a trait impl or
///   a trait's default method, the trait: `"shop::billing::Card::charge"` in an inherent impl,
///   `"<shop::billing::Card as shop::billing::Gateway>::charge"` in a trait impl. Each has its own
///   records: `Card` and `Cash` implementing `Gateway::charge` in one module, each implementor of a
///   trait's default method, each instantiation of a generic impl (`"shop::Ledger<u8>::post"`), the
///   impls of a generic trait for one type (`<Desk as Handle<Order>>` and `<Desk as Handle<Refund>>`),
///   and an inherent method and traits' methods of one name on one type. The method's own type
///   parameters are not part of it: its instantiations share records, as a generic function's do.
/// - for any other function: `module_path!()` and the function's name, like `"shop::billing::charge"`.
///
/// The default changes when the function or its type is renamed or moved (its stored results are then
/// no longer found), and the standard library does not promise `type_name`'s spelling across compiler
/// versions. Give a stable name to keep results across such changes, where the default cannot tell two
/// functions apart (see [Limitations](#limitations)), and a new one when the output type changes
/// incompatibly (a stored result that no longer deserializes is `Error::Deserialize`). A given name is
/// used as it is, on a method too: two functions given the same `name` share records whenever their
/// keys are equal, which is for the user to want.
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// #[idempotent(key = order_id, name = "charge-v2")]
/// async fn charge(order_id: u64) -> Result<u64, Error> {
///     Ok(order_id)
/// }
/// ```
///
/// ## `store = <expr>`
///
/// The handle to use, as an expression over the parameters such as `self.idem`: an `Idempotency`, or
/// anything that dereferences to one (a reference, `Box`, `Rc`, `Arc`, a `static` `LazyLock`). Default: the handle installed with `Idempotency::install`; a
/// call made when none is installed returns `Error::NotInstalled` without running the body.
///
/// ```
/// # use idempotent_runtime::{Error, Idempotency, idempotent};
/// struct Payments {
///     idem: Idempotency,
/// }
///
/// impl Payments {
///     #[idempotent(key = order_id, store = self.idem, name = "payments::charge")]
///     async fn charge(&self, order_id: u64) -> Result<u64, Error> {
///         Ok(order_id)
///     }
/// }
/// ```
///
/// ## `transact = <ident>`
///
/// Binds the given name in the body to an `idempotent_runtime::Transaction`. DynamoDB writes staged on it
/// (the SDK's own `Put`, `Update`, `Delete` and `ConditionCheck` values) are sent in one
/// `TransactWriteItems` with the record's completion, so the business writes and the stored result commit
/// together or not at all; when the body returns `Err`, nothing staged is written. Needs the runtime's
/// `dynamodb` feature (on by default). Default: none.
///
/// ```no_run
/// use idempotent_runtime::aws_sdk_dynamodb::error::BuildError;
/// use idempotent_runtime::aws_sdk_dynamodb::types::{AttributeValue, Update};
/// use idempotent_runtime::{Error, idempotent};
///
/// #[derive(Debug)]
/// enum ShopError {
///     Idempotency(Error),
///     Request(BuildError),
/// }
/// # impl From<Error> for ShopError {
/// #     fn from(e: Error) -> Self { ShopError::Idempotency(e) }
/// # }
/// # impl From<BuildError> for ShopError {
/// #     fn from(e: BuildError) -> Self { ShopError::Request(e) }
/// # }
///
/// #[idempotent(key = order_id, transact = tx)]
/// async fn reserve(order_id: String, sku: String, qty: u32) -> Result<String, ShopError> {
///     tx.update(
///         Update::builder()
///             .table_name("inventory")
///             .key("sku", AttributeValue::S(sku))
///             .update_expression("SET available = available - :q")
///             .condition_expression("available >= :q")
///             .expression_attribute_values(":q", AttributeValue::N(qty.to_string()))
///             .build()?,
///     );
///     Ok(order_id)
/// }
/// ```
///
/// ## `steps = <ident>`
///
/// Binds the given name in the body to the call's `idempotent_runtime::Steps` (owned), as
/// `Operation::steps` does: a body of several effects runs each through `s.run("<name>", || ..)`, and
/// each step's `Ok` value is stored in the record (one fenced `UpdateItem`) before the body goes on. A
/// call that takes the key over after a crash or a lapsed lease, or retries it after the body returned
/// `Err`, gets the finished steps' values back without running them and goes on from the first
/// unfinished one: what a crash runs again is at most the step that was running. `s.key("<name>")` is
/// a key for a downstream API's own idempotency (a payment gateway's `Idempotency-Key`), the same in
/// every run of the operation, so that not even that step's effect happens twice when the downstream
/// honours it. Once the record expires, the key is a new operation and its steps run again. Works with
/// `transact` (a second name: the staged writes still commit with the completion) and `detach`.
/// Default: none, the body runs whole on every claim.
///
/// ```
/// use idempotent_runtime::{Error, idempotent};
///
/// # async fn reserve_stock(order_id: u64) -> Result<u32, Error> { Ok(17) }
/// # async fn charge_card(order_id: u64, idempotency_key: &str) -> Result<String, Error> { Ok("ch_1".into()) }
/// # async fn send_confirmation(order_id: u64, charge: &str) -> Result<(), Error> { Ok(()) }
/// #[idempotent(key = order_id, steps = s)]
/// async fn checkout(order_id: u64) -> Result<(u32, String), Error> {
///     let hold = s.run("reserve", || reserve_stock(order_id)).await?;
///     let key = s.key("charge"); // the same in every run of this checkout
///     let charge = s.run("charge", || charge_card(order_id, &key)).await?;
///     s.run("email", || send_confirmation(order_id, &charge)).await?;
///     Ok((hold, charge))
/// }
/// ```
///
/// ## `on_failure = "resume" | "restart"`
///
/// With `steps`: what the next call does after the body returned `Err`.
///
/// - `"resume"` (the default): it goes on from the step that failed; the finished steps are not run again
///   and keep their downstream keys.
/// - `"restart"`: it starts over from the first step, with new downstream keys
///   (`Operation::restart_steps_after_failure`), for bodies whose failure undoes what their finished steps
///   did (a refund after a declined shipment).
///
/// A crash or a lapsed lease resumes either way. Without `steps`, a compile error.
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// # async fn hold_seat(trip: u64) -> Result<u32, Error> { Ok(3) }
/// # async fn issue_ticket(trip: u64, seat: u32) -> Result<String, Error> { Ok("t".into()) }
/// #[idempotent(key = trip, steps = s, on_failure = "restart")]
/// async fn book(trip: u64) -> Result<String, Error> {
///     let seat = s.run("hold", || hold_seat(trip)).await?;
///     s.run("ticket", || issue_ticket(trip, seat)).await // its failure releases the seat
/// }
/// ```
///
/// ## `missing_key = "reject" | "allow" | "skip"`
///
/// What a call without a key means. A key is missing when it serializes to `null` (an `Option` that is
/// `None`), or when it is a tuple or array with a `null` element at its top level (`key = (tenant,
/// order_id)` with no `order_id`); a `null` deeper inside the key is a value, and so are `""`, `0`,
/// `false`, `[]` and `{}`. Keyless calls must not share one record, where the second would get the first
/// one's result:
///
/// - `"reject"` (the default): the call returns `Error::MissingKey` before anything is sent; the body does
///   not run and no record is written.
/// - `"allow"`: `null` is a deliberate value, hashed like any other, so every call with that key shares
///   one record.
/// - `"skip"`: the body runs without idempotency (no store call, no record, no replay), and a warning
///   naming the namespace is logged with `tracing`. Not with `transact`, whose staged writes only commit
///   with a record.
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// #[idempotent(key = request_id, missing_key = "skip")]
/// async fn notify(request_id: Option<String>, message: String) -> Result<usize, Error> {
///     Ok(message.len()) // sent once per request id; without one, on every call
/// }
/// ```
///
/// ## `crate = "<path>"`
///
/// Where the runtime is, when it is not `::idempotent_runtime`; see
/// [Renaming the crate](#renaming-the-crate).
///
/// # Equivalent code
///
/// The attribute keeps the signature as written and replaces the body. A function such as
///
/// ```
/// # use idempotent_runtime::{Error, idempotent};
/// # #[derive(serde::Serialize)]
/// # struct Charge { order_id: String, cents: u64 }
/// #[idempotent(key = req.order_id, ttl = "1h", payload = &req)]
/// async fn charge(req: Charge) -> Result<u64, Error> {
///     Ok(req.cents)
/// }
/// ```
///
/// behaves as this function written with the runtime's public API (`Idempotency::operation` runs the same
/// state machine around a closure):
///
/// ```
/// # use std::time::Duration;
/// # use idempotent_runtime::{Error, Idempotency};
/// # #[derive(serde::Serialize)]
/// # struct Charge { order_id: String, cents: u64 }
/// async fn charge(req: Charge) -> Result<u64, Error> {
///     // `name`, or the function's path (for a method: the path `type_name` gives it, its type and
///     // trait included, computed on the first call on each type and kept).
///     const NAMESPACE: &str = concat!(module_path!(), "::charge");
///     // `store`, or the installed handle.
///     let idem = Idempotency::installed().ok_or_else(|| Error::NotInstalled {
///         namespace: NAMESPACE.to_owned(),
///     })?;
///     idem.operation(NAMESPACE, &req.order_id) // `key`, borrowed and hashed now
///         .ttl(Duration::from_secs(3600)) // durations were parsed at compile time
///         .payload(&req) // `payload`, borrowed and fingerprinted now
///         .run(|_| async move {
///             // The body, unchanged: claim first; run only if the claim is ours; then store the
///             // `Ok` value (complete) or mark the key FAILED and hand the `Err` back.
///             Ok(req.cents)
///         })
///         .await
/// }
/// ```
///
/// The differences are in the details: the generated code checks the return type where it is written, so
/// a type error points at `-> ...`; it computes the handle, key and fingerprint before the claim and
/// reports a failure among them (no handle installed, a key that does not serialize or is missing) through
/// `E` without running the body; it needs no `E: Display` (a FAILED record stores the error's `Display` text when it
/// has one, and its type name otherwise); and its locals are prefixed `__idempotent_`, so they never
/// collide with the body's (a parameter whose name starts with `__idempotent` is a compile error).
///
/// # Requirements
///
/// - An `async fn` with a body: a free function, or a method in an inherent impl or a trait impl (native
///   `async fn` in traits); generic, with lifetimes, `where` clauses, `impl Trait` parameters and any
///   visibility. Not a `const fn`.
/// - The return type is `Result<T, E>`, or an alias of it such as `std::result::Result<T, MyError>` or a
///   crate's own `Result<T>`, never `impl Trait`, with `T: Serialize + DeserializeOwned` (the stored
///   value, as JSON) and `E: From<idempotent_runtime::Error>` (so the caller can be told "in progress",
///   "payload mismatch", a store failure, and so on). `Box<dyn std::error::Error + Send + Sync>` and `anyhow::Error` qualify.
/// - `E: Send`. An `Err` is held while the record is marked FAILED, then returned unchanged, so an error
///   type that is not `Send` would make the function's future not `Send` either (it could not be spawned,
///   nor served by axum), reported far from its cause; it is refused on the return type instead. An
///   error type that is or holds a type parameter (the function's own, its impl's, or `Self`'s, as
///   `Self::Error`) is not checked: the future is `Send` when the instantiation's `E` is. The attribute
///   sees the function only, so an impl's type parameter is recognised by its spelling: `Self`, or one
///   capital letter and digits (`E`, `T2`), as type parameters are usually named. The common alias
///   `Result<T, Box<dyn std::error::Error>>` is not `Send`: use `Box<dyn std::error::Error + Send + Sync>`.
/// - `key` and `payload` implement `serde::Serialize`; `store` is an `Idempotency` or a pointer to one.
/// - Without `store`, a handle installed with `Idempotency::install` before the first call.
/// - With `transact`, the runtime's `dynamodb` feature.
/// - With `steps`, each step's value `Serialize + DeserializeOwned`, as the `Ok` value is.
/// - `steps` and `transact` bind names of their own: neither a parameter's (the body would lose it) nor
///   each other's.
///
/// # Renaming the crate
///
/// The generated code names the runtime as `::idempotent_runtime`, or by the name the crate's Cargo.toml
/// gives the dependency (`idem = { package = "idempotent-runtime", version = "0.1" }`: `::idem`), which
/// the attribute reads there. When the runtime is reached through a crate that re-exports it, or to name
/// it by another path, say where it is with `crate`:
///
/// ```
/// # extern crate idempotent_runtime as idem;
/// use idem::{Error, idempotent};
///
/// #[idempotent(key = order_id, crate = "idem")]
/// async fn charge(order_id: u64) -> Result<u64, Error> {
///     Ok(order_id)
/// }
/// ```
///
/// The value is a path as Rust code spells it, with `_` where Cargo.toml has `-`: `"idem"`, `"::idem"` or
/// `"my_platform::idempotent_runtime"`.
///
/// # Limitations
///
/// - **Above other attributes that rewrite the function.** Attributes expand from the top down: one
///   written above `#[idempotent]` that turns the `async fn` into a plain `fn`, as `#[tokio::test]` and
///   `#[tokio::main]` do, leaves nothing for it to wrap (a compile error names that attribute). Write
///   `#[idempotent]` first, or put it on an `async fn` of its own that the test calls.
///
/// - **Not inside `#[async_trait]`.** `#[async_trait]` sits on the impl block, so it expands before the
///   `#[idempotent]` on a method in that block, and it has already turned the method into a plain `fn`
///   returning `Pin<Box<dyn Future>>` when `#[idempotent]` sees it; that is a compile error ("cannot be
///   used inside `#[async_trait]`"). The other order cannot be written. Use a native `async fn` in the trait
///   (Rust 1.75 and later), or put `#[idempotent]` on an inherent `async fn` and call it from the
///   `#[async_trait]` method:
///
///   ```
///   # use async_trait::async_trait;
///   # use idempotent_runtime::{Error, Idempotency, idempotent};
///   # #[async_trait]
///   # trait Gateway {
///   #     async fn charge(&self, order_id: u64) -> Result<u64, Error>;
///   # }
///   struct Card {
///       idem: Idempotency,
///   }
///
///   impl Card {
///       #[idempotent(key = order_id, store = self.idem)]
///       async fn charge_once(&self, order_id: u64) -> Result<u64, Error> {
///           Ok(order_id)
///       }
///   }
///
///   #[async_trait]
///   impl Gateway for Card {
///       async fn charge(&self, order_id: u64) -> Result<u64, Error> {
///           self.charge_once(order_id).await
///       }
///   }
///   ```
///
/// - **What the default namespace cannot tell apart.** The attribute sees only its function, not what
///   encloses it. Functions of one name share the default namespace, and so would share records whenever
///   their keys are equal, when they are: `fn`s nested in different functions of one module (both are
///   `module_path!()::name`); an associated function without `self` and without `Self` in its signature
///   and a free function, or such associated functions of several types, in one module. Give each its
///   own `name = ".."`. A method's namespace names its type as `type_name` spells it, and some types are
///   spelled alike: two closures of one function (a trait implemented for every `Fn`, called on two
///   closures, has one namespace for both), and two types of one name declared in different blocks of
///   one function. Give such methods a `name` of their own or put what tells them apart into the key.
///   Likewise, every instantiation of a generic function shares one namespace: put the type into the key
///   when the instantiations must not share results.
/// - **Keys and payloads are borrowed one level deep.** The `key` and `payload` expressions are evaluated
///   by reference: a place (`req.order_id`) is borrowed, and so is each element of a tuple or array
///   (`(req.tenant, req.order_id)` borrows both fields), so the body can still move them. Any other
///   expression is evaluated as written before the body: one that moves a non-`Copy` value, such as a
///   struct literal `Key { id: req.id }`, a call `make_key(req)` or a nested tuple
///   `(req.tenant, (req.a, req.b))`, moves it out of the body's reach; borrow explicitly
///   (`&req.id`, `make_key(&req)`).
/// - **Durations are literals.** `ttl`, `lease` and `wait` are checked at compile time, so they cannot
///   come from variables or constants; set run-time defaults on the handle (`Builder::default_ttl`,
///   `Builder::default_lease`) and leave the arguments out.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    entry(args.into(), item.into()).into()
}

fn entry(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let mut diag = diag::Diagnostics::default();
    let args = args::Args::parse(args, &mut diag)
        .map_err(|e| diag.push(e))
        .ok()
        .map(|mut args| {
            if args.krate.is_none() {
                args.renamed = args::renamed_runtime();
            }
            args
        });
    let function = match syn::parse2::<syn::ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(e) => {
            diag.push(syn::Error::new(
                e.span(),
                "#[idempotent] goes on an `async fn` with a body",
            ));
            let error = diag.finish().expect_err("an error was just recorded");
            return expand::original(item, &error);
        }
    };
    item::check(&function, &mut diag);
    if let Some(key) = args.as_ref().and_then(|args| args.key.as_ref()) {
        args::check_key(key, &item::parameters(&function), &mut diag);
    }
    if let Some(args) = &args {
        args::check_detach(args, &function, &mut diag);
        args::check_bindings(args, &item::parameters(&function), &mut diag);
    }
    match (diag.finish(), args) {
        (Ok(()), Some(args)) => expand::expand(&args, function),
        (Err(error), _) => expand::original(function, &error),
        (Ok(()), None) => unreachable!("a failed parse is recorded in `diag`"),
    }
}
