//! trybuild goldens: one compile-fail case per rule the attribute macros enforce
//! (`tests/ui/*.rs`, named for the rule), and one pass case per supported
//! signature shape (`tests/ui/pass/*.rs`). Regenerate with
//! `TRYBUILD=overwrite cargo test --all-features --test compiletest`
//! and read every `.stderr`: each error must sit on the token to change.
//!
//! The goldens are recorded for the README's test command (`--all-features`): rustc
//! shortens type paths (`String` vs `std::string::String`) depending on which crates are
//! in the build, so another feature set prints other (equally correct) messages.

#[test]
#[cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "redis",
        feature = "postgres",
        feature = "mcp"
    )),
    ignore = "the goldens are recorded with --all-features (the README's test command)"
)]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
