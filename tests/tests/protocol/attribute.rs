//! What the attribute derives from the code it is written on, through calls on the memory store: the
//! default namespace of methods (the receiver's type is part of it), arguments passed through
//! `macro_rules!`, bodies that start with items, and keys that hold a literal (on both stores).

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::{Error, Idempotency, Status, idempotent};
use idempotent_tests::{Backend, Harness};

trait Gateway {
    async fn charge(&self, idem: &Idempotency, order: u64) -> Result<String, Error>;
}

struct Card;
struct Cash;

impl Gateway for Card {
    #[idempotent(key = order, store = idem)]
    async fn charge(&self, idem: &Idempotency, order: u64) -> Result<String, Error> {
        Ok(format!("card:{order}"))
    }
}

impl Gateway for Cash {
    #[idempotent(key = order, store = idem)]
    async fn charge(&self, idem: &Idempotency, order: u64) -> Result<String, Error> {
        Ok(format!("cash:{order}"))
    }
}

/// Two trait impls in one module: each type has its own records.
#[tokio::test]
async fn methods_of_two_types_in_one_module_do_not_share_records() {
    let h = Harness::new(Backend::Memory).await;
    assert_eq!(Card.charge(&h.idem, 1).await.unwrap(), "card:1");
    assert_eq!(Cash.charge(&h.idem, 1).await.unwrap(), "cash:1");
    assert_eq!(Card.charge(&h.idem, 1).await.unwrap(), "card:1");
    // The namespace is the method's path: the type's name, the trait's and the method's.
    for (namespace, value) in [
        (
            "<protocol::attribute::Card as protocol::attribute::Gateway>::charge",
            "card:1",
        ),
        (
            "<protocol::attribute::Cash as protocol::attribute::Gateway>::charge",
            "cash:1",
        ),
    ] {
        let record = h.record(namespace, &1_u64).await.expect(namespace);
        assert_eq!(record.status, Status::Completed);
        assert_eq!(
            serde_json::from_slice::<String>(record.response.as_deref().unwrap()).unwrap(),
            value
        );
    }
    assert!(
        h.record("protocol::attribute::charge", &1_u64)
            .await
            .is_none()
    );
}

static NOTIFY_RUNS: AtomicUsize = AtomicUsize::new(0);

trait Notifier {
    fn channel(&self) -> &'static str;

    /// A default method: one body, instantiated for every implementor.
    #[idempotent(key = message, store = idem)]
    async fn notify(&self, idem: &Idempotency, message: u64) -> Result<String, Error> {
        NOTIFY_RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("{}:{message}", self.channel()))
    }
}

struct Email;
struct Sms;

impl Notifier for Email {
    fn channel(&self) -> &'static str {
        "email"
    }
}

impl Notifier for Sms {
    fn channel(&self) -> &'static str {
        "sms"
    }
}

/// A default method's implementors each have their own records, however the calls interleave.
#[tokio::test]
async fn a_default_method_has_records_per_implementor() {
    let h = Harness::new(Backend::Memory).await;
    for round in 0..3 {
        assert_eq!(
            Email.notify(&h.idem, 7).await.unwrap(),
            "email:7",
            "{round}"
        );
        assert_eq!(Sms.notify(&h.idem, 7).await.unwrap(), "sms:7", "{round}");
    }
    assert_eq!(NOTIFY_RUNS.load(Ordering::SeqCst), 2);
    for namespace in [
        "<protocol::attribute::Email as protocol::attribute::Notifier>::notify",
        "<protocol::attribute::Sms as protocol::attribute::Notifier>::notify",
    ] {
        assert!(h.record(namespace, &7_u64).await.is_some(), "{namespace}");
    }
}

struct Ledger<T> {
    unit: T,
}

impl<T: ToString> Ledger<T> {
    #[idempotent(key = entry, store = idem)]
    async fn post(&self, idem: &Idempotency, entry: u64) -> Result<String, Error> {
        Ok(format!("{entry} {}", self.unit.to_string()))
    }
}

/// Each instantiation of a generic impl is a type of its own, with its own records.
#[tokio::test]
async fn instantiations_of_a_generic_impl_do_not_share_records() {
    let h = Harness::new(Backend::Memory).await;
    let (eur, count) = (Ledger { unit: "EUR" }, Ledger { unit: 1_u8 });
    assert_eq!(eur.post(&h.idem, 1).await.unwrap(), "1 EUR");
    assert_eq!(count.post(&h.idem, 1).await.unwrap(), "1 1");
    assert_eq!(eur.post(&h.idem, 1).await.unwrap(), "1 EUR");
    assert!(
        h.record("protocol::attribute::Ledger<&str>::post", &1_u64)
            .await
            .is_some()
    );
    assert!(
        h.record("protocol::attribute::Ledger<u8>::post", &1_u64)
            .await
            .is_some()
    );
}

/// `name = ".."` is the namespace as given, for a method too: two types that give the same name share
/// records, by the user's choice.
#[tokio::test]
async fn a_given_name_is_the_namespace_of_a_method() {
    struct Shared;
    impl Shared {
        #[idempotent(key = order, store = idem, name = "protocol::attribute::shared")]
        async fn charge(&self, idem: &Idempotency, order: u64) -> Result<u64, Error> {
            Ok(order * 10)
        }
    }
    let h = Harness::new(Backend::Memory).await;
    assert_eq!(Shared.charge(&h.idem, 2).await.unwrap(), 20);
    assert!(
        h.record("protocol::attribute::shared", &2_u64)
            .await
            .is_some()
    );
}

static RESERVE_RUNS: AtomicUsize = AtomicUsize::new(0);

macro_rules! transactional {
    ($name:ident, $tx:expr) => {
        #[idempotent(key = order, store = idem, transact = $tx)]
        async fn $name(idem: &Idempotency, order: u64) -> Result<usize, Error> {
            RESERVE_RUNS.fetch_add(1, Ordering::SeqCst);
            Ok($tx.len())
        }
    };
}

transactional!(reserve, tx);

/// `transact = $tx` with `$tx:expr`: the name arrives in an invisible group, and binds as written in place.
#[tokio::test]
async fn transact_passed_through_macro_rules_binds_its_name() {
    let h = Harness::new(Backend::Memory).await;
    assert_eq!(reserve(&h.idem, 1).await.unwrap(), 0);
    assert_eq!(reserve(&h.idem, 1).await.unwrap(), 0);
    assert_eq!(RESERVE_RUNS.load(Ordering::SeqCst), 1);
    let record = h
        .record("protocol::attribute::reserve", &1_u64)
        .await
        .unwrap();
    assert_eq!(record.status, Status::Completed);
}

/// A trait of the caller's with a `describe` method for every type, in scope where the attribute
/// expands: the text stored on a FAILED record is still the library's.
mod describe {
    use super::*;

    #[allow(dead_code)]
    trait Describe {
        fn describe(&self) -> String {
            "the caller's describe".to_owned()
        }
        fn idempotency(&self) {}
    }

    impl<T: ?Sized> Describe for T {}

    /// An error without `Display`: its FAILED record names its type.
    #[allow(dead_code)]
    #[derive(Debug)]
    pub(super) enum Opaque {
        Declined,
        Idempotency(Error),
    }

    impl From<Error> for Opaque {
        fn from(e: Error) -> Self {
            Self::Idempotency(e)
        }
    }

    #[idempotent(key = order, store = idem, name = "protocol::attribute::refuse")]
    pub(super) async fn refuse(idem: &Idempotency, order: u64) -> Result<u64, Opaque> {
        let _ = order;
        Err(Opaque::Declined)
    }
}

#[tokio::test]
async fn a_callers_describe_method_does_not_replace_the_failure_text() {
    let h = Harness::new(Backend::Memory).await;
    let err = describe::refuse(&h.idem, 1).await.unwrap_err();
    assert!(matches!(err, describe::Opaque::Declined), "{err:?}");
    let record = h
        .record("protocol::attribute::refuse", &1_u64)
        .await
        .unwrap();
    assert_eq!(record.status, Status::Failed);
    assert_eq!(
        record.error.as_deref(),
        Some("an error of type `protocol::attribute::describe::Opaque`")
    );
}

struct Probe;

impl Probe {
    #[idempotent(key = order, store = idem)]
    async fn method(&self, idem: &Idempotency, order: u64) -> Result<u64, Error> {
        Ok(order)
    }
}

#[idempotent(key = order, store = idem)]
async fn free(this: &Probe, idem: &Idempotency, order: u64) -> Result<u64, Error> {
    let _ = this;
    Ok(order)
}

/// The type's namespace, looked up before the claim, does not make a method's future larger than the
/// same free function's.
#[test]
fn a_methods_future_is_no_larger_than_a_free_functions() {
    let idem = Idempotency::in_memory();
    let method = std::mem::size_of_val(&Probe.method(&idem, 1));
    let free = std::mem::size_of_val(&free(&Probe, &idem, 1));
    assert!(
        method <= free,
        "method {method} bytes, free function {free}"
    );
}

/// A generic trait implemented twice for one type, one impl per message type: two functions, which
/// must not share records even where their keys are equal.
trait Handle<M> {
    async fn handle(&self, idem: &Idempotency, id: u64) -> Result<String, Error>;
}

struct Orders;
struct Refunds;
struct Desk;

impl Handle<Orders> for Desk {
    #[idempotent(key = id, store = idem)]
    async fn handle(&self, idem: &Idempotency, id: u64) -> Result<String, Error> {
        Ok(format!("order:{id}"))
    }
}

impl Handle<Refunds> for Desk {
    #[idempotent(key = id, store = idem)]
    async fn handle(&self, idem: &Idempotency, id: u64) -> Result<String, Error> {
        Ok(format!("refund:{id}"))
    }
}

#[tokio::test]
async fn impls_of_a_generic_trait_for_one_type_do_not_share_records() {
    let h = Harness::new(Backend::Memory).await;
    assert_eq!(
        <Desk as Handle<Orders>>::handle(&Desk, &h.idem, 1)
            .await
            .unwrap(),
        "order:1"
    );
    assert_eq!(
        <Desk as Handle<Refunds>>::handle(&Desk, &h.idem, 1)
            .await
            .unwrap(),
        "refund:1"
    );
    for (namespace, value) in [
        (
            "<protocol::attribute::Desk as protocol::attribute::Handle<protocol::attribute::Orders>>::handle",
            "order:1",
        ),
        (
            "<protocol::attribute::Desk as protocol::attribute::Handle<protocol::attribute::Refunds>>::handle",
            "refund:1",
        ),
    ] {
        let record = h.record(namespace, &1_u64).await.expect(namespace);
        assert_eq!(
            serde_json::from_slice::<String>(record.response.as_deref().unwrap()).unwrap(),
            value
        );
    }
}

/// Two traits' methods and an inherent method of one name on one type: three functions.
trait Capture {
    async fn settle(&self, idem: &Idempotency, id: u64) -> Result<String, Error>;
}

trait Release {
    async fn settle(&self, idem: &Idempotency, id: u64) -> Result<String, Error>;
}

struct Hold;

impl Hold {
    #[idempotent(key = id, store = idem)]
    async fn settle(&self, idem: &Idempotency, id: u64) -> Result<String, Error> {
        Ok(format!("inherent:{id}"))
    }
}

impl Capture for Hold {
    #[idempotent(key = id, store = idem)]
    async fn settle(&self, idem: &Idempotency, id: u64) -> Result<String, Error> {
        Ok(format!("capture:{id}"))
    }
}

impl Release for Hold {
    #[idempotent(key = id, store = idem)]
    async fn settle(&self, idem: &Idempotency, id: u64) -> Result<String, Error> {
        Ok(format!("release:{id}"))
    }
}

#[tokio::test]
async fn methods_of_one_name_on_one_type_do_not_share_records() {
    let h = Harness::new(Backend::Memory).await;
    assert_eq!(Hold.settle(&h.idem, 1).await.unwrap(), "inherent:1");
    assert_eq!(
        Capture::settle(&Hold, &h.idem, 1).await.unwrap(),
        "capture:1"
    );
    assert_eq!(
        Release::settle(&Hold, &h.idem, 1).await.unwrap(),
        "release:1"
    );
    assert!(
        h.record("protocol::attribute::Hold::settle", &1_u64)
            .await
            .is_some()
    );
}

/// A method with a type parameter of its own is one function: its instantiations share records (as a
/// generic free function's do), whatever type the key arrives as.
struct Tagger;

impl Tagger {
    #[idempotent(key = id, store = idem)]
    async fn tag<K: serde::Serialize + Send>(
        &self,
        idem: &Idempotency,
        id: K,
    ) -> Result<String, Error> {
        Ok(std::any::type_name::<K>().to_owned())
    }
}

#[tokio::test]
async fn a_generic_methods_instantiations_share_records() {
    let h = Harness::new(Backend::Memory).await;
    assert_eq!(Tagger.tag(&h.idem, "a").await.unwrap(), "&str");
    assert_eq!(
        Tagger.tag(&h.idem, String::from("a")).await.unwrap(),
        "&str"
    );
    assert!(
        h.record("protocol::attribute::Tagger::tag", "a")
            .await
            .is_some()
    );
}

/// A trait implemented for every closure: two closures written in one function are two types, but
/// `type_name` spells both as `<function>::{{closure}}`, and a name is all a namespace can be (it must
/// be the same in every process). Two closures' calls with equal keys share one record.
trait Job {
    fn label(&self) -> String;

    #[idempotent(key = id, store = idem)]
    async fn run(&self, idem: &Idempotency, id: u64) -> Result<String, Error> {
        Ok(format!("{}:{id}", self.label()))
    }
}

impl<F: Fn() -> String> Job for F {
    fn label(&self) -> String {
        self()
    }
}

#[tokio::test]
#[ignore = "two closures of one function have one type name: give the method `name = \"..\"` per job"]
async fn two_closures_of_one_function_do_not_share_records() {
    let h = Harness::new(Backend::Memory).await;
    let email = || "email".to_owned();
    let sms = || "sms".to_owned();
    assert_eq!(email.run(&h.idem, 1).await.unwrap(), "email:1");
    assert_eq!(sms.run(&h.idem, 1).await.unwrap(), "sms:1");
}

/// A method's future is `Send` (the namespace's lookup holds nothing across an `.await`): it can be
/// spawned, for a trait impl's, a generic trait's impl's and a generic impl's.
#[tokio::test]
async fn method_futures_can_be_spawned() {
    let h = Harness::new(Backend::Memory).await;
    let idem = h.idem.clone();
    let spawned = tokio::spawn(async move {
        let card = Card.charge(&idem, 40).await?;
        let order = <Desk as Handle<Orders>>::handle(&Desk, &idem, 40).await?;
        let post = Ledger { unit: 2_u8 }.post(&idem, 40).await?;
        Ok::<_, Error>((card, order, post))
    });
    assert_eq!(
        spawned.await.unwrap().unwrap(),
        (
            "card:40".to_owned(),
            "order:40".to_owned(),
            "40 2".to_owned()
        )
    );
}

/// A method named by a raw identifier.
struct Raw;

impl Raw {
    #[idempotent(key = id, store = idem)]
    async fn r#match(&self, idem: &Idempotency, id: u64) -> Result<String, Error> {
        Ok(format!("match:{id}"))
    }
}

/// Its namespace is its path in the compiler's spelling of a raw identifier (without `r#`), taken
/// apart as any method's is, not the closure's whole type name with the method's name after it.
#[tokio::test]
async fn a_raw_identifier_methods_namespace_is_its_path() {
    let h = Harness::new(Backend::Memory).await;
    assert_eq!(Raw.r#match(&h.idem, 1).await.unwrap(), "match:1");
    assert_eq!(Raw.r#match(&h.idem, 1).await.unwrap(), "match:1");
    let record = h.record("protocol::attribute::Raw::match", &1_u64).await;
    assert_eq!(record.map(|r| r.status), Some(Status::Completed));
}

static SCALED: AtomicUsize = AtomicUsize::new(0);

/// A body that starts with items: under `clippy::pedantic`, they must not follow a statement the
/// attribute wrote (`items_after_statements`).
#[idempotent(key = order, store = idem)]
async fn scale(idem: &Idempotency, order: u64) -> Result<u64, Error> {
    use std::ops::Mul;
    const FACTOR: u64 = 3;
    SCALED.fetch_add(1, Ordering::SeqCst);
    Ok(order.mul(FACTOR))
}

#[tokio::test]
async fn a_body_may_start_with_items() {
    let h = Harness::new(Backend::Memory).await;
    assert_eq!(scale(&h.idem, 2).await.unwrap(), 6);
    assert_eq!(scale(&h.idem, 2).await.unwrap(), 6);
    assert_eq!(SCALED.load(Ordering::SeqCst), 1);
}

static VISITS: AtomicUsize = AtomicUsize::new(0);

/// A literal beside the parameter it spells is a tag, not the mistake `key = "user"` is.
#[idempotent(key = ("user", user), store = idem)]
async fn visit(idem: &Idempotency, user: String) -> Result<usize, Error> {
    Ok(VISITS.fetch_add(1, Ordering::SeqCst))
}

/// Two users, two records (the body ran twice); the same user again, a replay of its own value.
async fn a_tagged_key_gives_each_value_its_record(backend: Backend) {
    let h = Harness::new(backend).await;
    let ann = visit(&h.idem, "ann".into()).await.unwrap();
    let bob = visit(&h.idem, "bob".into()).await.unwrap();
    assert_ne!(ann, bob);
    assert_eq!(visit(&h.idem, "ann".into()).await.unwrap(), ann);
    assert_eq!(visit(&h.idem, "bob".into()).await.unwrap(), bob);
    for (user, value) in [("ann", ann), ("bob", bob)] {
        let record = h
            .record("protocol::attribute::visit", &("user", user))
            .await
            .expect(user);
        assert_eq!(record.status, Status::Completed);
        assert_eq!(
            serde_json::from_slice::<usize>(record.response.as_deref().unwrap()).unwrap(),
            value
        );
    }
}

#[tokio::test]
async fn a_tagged_key_gives_each_value_its_record_in_memory() {
    a_tagged_key_gives_each_value_its_record(Backend::Memory).await;
}

#[tokio::test]
async fn a_tagged_key_gives_each_value_its_record_on_dynamodb() {
    a_tagged_key_gives_each_value_its_record(Backend::DynamoDb).await;
}

static COMPUTED: AtomicUsize = AtomicUsize::new(0);

/// Keyed by a conversion over a parameter (a form a key of literals alone is refused in).
#[idempotent(key = u128::from(order), store = idem)]
async fn by_conversion(idem: &Idempotency, order: u64) -> Result<(u64, usize), Error> {
    Ok((order, COMPUTED.fetch_add(1, Ordering::SeqCst)))
}

/// Keyed by a constructor over a parameter (a form a key of literals alone is refused in).
#[idempotent(key = Some(order), store = idem)]
async fn by_constructor(idem: &Idempotency, order: u64) -> Result<(u64, usize), Error> {
    Ok((order, COMPUTED.fetch_add(1, Ordering::SeqCst)))
}

/// Keyed by a method over a parameter (a form a key of literals alone is refused in).
#[idempotent(key = order.to_string(), store = idem)]
async fn by_method(idem: &Idempotency, order: u64) -> Result<(u64, usize), Error> {
    Ok((order, COMPUTED.fetch_add(1, Ordering::SeqCst)))
}

/// Keyed by a block over a parameter (a form a key of literals alone is refused in).
#[idempotent(key = { order }, store = idem)]
async fn by_block(idem: &Idempotency, order: u64) -> Result<(u64, usize), Error> {
    Ok((order, COMPUTED.fetch_add(1, Ordering::SeqCst)))
}

/// Keyed by an `if` over a parameter (a form a key of literals alone is refused in).
#[idempotent(key = if order > 1 { order } else { 0 }, store = idem)]
async fn by_if(idem: &Idempotency, order: u64) -> Result<(u64, usize), Error> {
    Ok((order, COMPUTED.fetch_add(1, Ordering::SeqCst)))
}

/// Keyed by a macro over a parameter (a form a key of literals alone is refused in).
#[idempotent(key = format!("{order}"), store = idem)]
async fn by_format(idem: &Idempotency, order: u64) -> Result<(u64, usize), Error> {
    Ok((order, COMPUTED.fetch_add(1, Ordering::SeqCst)))
}

/// The forms refused over literals alone (a call, a constructor, a method, a block, an `if`, a macro)
/// compile over a parameter, and each order gets its own record: order 2 never gets order 1's result.
async fn keys_computed_from_a_parameter_give_each_call_its_record(backend: Backend) {
    let h = Harness::new(backend).await;
    let idem = &h.idem;
    for (function, results) in [
        (
            "by_conversion",
            [
                by_conversion(idem, 1).await,
                by_conversion(idem, 2).await,
                by_conversion(idem, 1).await,
            ],
        ),
        (
            "by_constructor",
            [
                by_constructor(idem, 1).await,
                by_constructor(idem, 2).await,
                by_constructor(idem, 1).await,
            ],
        ),
        (
            "by_method",
            [
                by_method(idem, 1).await,
                by_method(idem, 2).await,
                by_method(idem, 1).await,
            ],
        ),
        (
            "by_block",
            [
                by_block(idem, 1).await,
                by_block(idem, 2).await,
                by_block(idem, 1).await,
            ],
        ),
        (
            "by_if",
            [
                by_if(idem, 1).await,
                by_if(idem, 2).await,
                by_if(idem, 1).await,
            ],
        ),
        (
            "by_format",
            [
                by_format(idem, 1).await,
                by_format(idem, 2).await,
                by_format(idem, 1).await,
            ],
        ),
    ] {
        let [first, second, again] = results.map(Result::unwrap);
        assert_eq!((first.0, second.0), (1, 2), "{function}");
        assert_ne!(
            first.1, second.1,
            "{function}: the body ran once for two orders"
        );
        assert_eq!(again, first, "{function}: order 1 again is a replay");
    }
}

#[tokio::test]
async fn keys_computed_from_a_parameter_give_each_call_its_record_in_memory() {
    keys_computed_from_a_parameter_give_each_call_its_record(Backend::Memory).await;
}

#[tokio::test]
async fn keys_computed_from_a_parameter_give_each_call_its_record_on_dynamodb() {
    keys_computed_from_a_parameter_give_each_call_its_record(Backend::DynamoDb).await;
}
