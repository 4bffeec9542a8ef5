//! `tool_contracts::http` with real clients. `tests/http/curl.sh` builds
//! `examples/http_shop`, starts it on free loopback ports and asserts every status of the
//! HTTP surface with `curl` (the browser's Post/Redirect/Get flow, a SIGKILL mid-call and
//! a restart, a locked store, tenants). It needs `curl` and `python3` on `PATH`, nothing
//! from a registry, so it always runs. (The router's own unit tests, each status through
//! `tower::ServiceExt::oneshot`, are in `runtime/src/http/tests.rs` and `layer_tests.rs`.)
//!
//! `tests/http/httpx.sh` runs `tests/http/httpx_e2e.py` with Python httpx (pinned, from
//! PyPI, in a virtual environment the script makes under `target/`): 50 concurrent
//! requests of one intent to a tool and 50 with one `Idempotency-Key` to the plain
//! `POST /payments` behind `IdempotencyLayer` (one effect each), and a server SIGKILLed
//! mid-request and restarted on the same SQLite file (the tool's retry reconciled, the
//! payment's the unknown outcome; never a second effect). It never skips: without python3,
//! venv, pip or PyPI it fails, in CI as anywhere.
//!
//! `tests/http/browser.sh` does the form's Post/Redirect/Get in a real browser: Debian's
//! headless Chromium driven by selenium (pinned, in a venv under `target/`) through Debian's
//! chromedriver, both installed by `tests/http/browser_setup.sh` when missing. It fails
//! under `CI=true` when that setup cannot be done, and otherwise skips with a loud message.
//! It also asks for a refund that needs a person's approval, clicks Approve on the
//! operation page and sees the refund run once (reloads and a resend: one refund);
//! `curl.sh` approves one with `curl` while the agent retries it, and denies another.

#[path = "support/scripts.rs"]
mod scripts;
use scripts::run_script;

#[test]
fn curl_against_http_shop() {
    run_script("http/curl.sh");
}

#[test]
fn httpx_against_http_shop() {
    run_script("http/httpx.sh");
}

/// Submit the order form, reload the result five times, go back and submit again: one
/// order (and a second cart makes a second one). Screenshot: `target/http-browser/`.
#[test]
fn browser_submits_the_order_form_once() {
    run_script("http/browser.sh");
}
