//! `tool_contracts::http` with a real client: `tests/http/curl.sh` builds
//! `examples/http_shop`, starts it on free loopback ports and asserts every status of the
//! HTTP surface with `curl` (the browser's Post/Redirect/Get flow, a SIGKILL mid-call and
//! a restart, a locked store, tenants). It needs `curl` and `python3` on `PATH`, nothing
//! from a registry, so it always runs. (The router's own unit tests, each status through
//! `tower::ServiceExt::oneshot`, are in `runtime/src/http/tests.rs`.)

#[test]
fn curl_against_http_shop() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/http/curl.sh");
    let status = std::process::Command::new("bash")
        .arg(script)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    assert!(
        status.success(),
        "{script} failed ({status}); its output above says why"
    );
}
