//! trybuild goldens: one compile-fail case per rule the attribute macros enforce
//! (`tests/ui/*.rs`, named for the rule), and one pass case per supported
//! signature shape (`tests/ui/pass/*.rs`). Regenerate with
//! `TRYBUILD=overwrite cargo test -p tool-contracts-tests --test compiletest`
//! and read every `.stderr`: each error must sit on the token to change.
//!
//! The goldens are recorded for one feature set: rustc shortens type paths (`String` vs
//! `std::string::String`) depending on which crates are in the build, so another feature
//! set prints other (equally correct) messages. That set is fixed by this package's
//! manifest (`tests/Cargo.toml`: the facade with every store and `mcp`), which is what
//! trybuild builds the cases against, whatever features the `cargo test` run enables.
//! (Paths here are relative to `tests/`, this package's manifest directory.)

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("ui/pass/*.rs");
}
