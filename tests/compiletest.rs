//! trybuild goldens: one compile-fail case per rule the attribute macros enforce
//! (`tests/ui/*.rs`, named for the rule), and one pass case per supported
//! signature shape (`tests/ui/pass/*.rs`). Regenerate with `TRYBUILD=overwrite`
//! and read every `.stderr`: each error must sit on the token to change.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
