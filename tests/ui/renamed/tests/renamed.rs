//! A renamed dependency, with `crate = ".."` and without it: the cases only compile if the generated
//! code never names `idempotent_runtime`.

#[test]
fn renamed() {
    let t = trybuild::TestCases::new();
    t.pass("pass/*.rs");
}
