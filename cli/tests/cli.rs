//! The operator CLI against a real SQLite store file.

use std::process::Command;
use std::time::Duration;

use tool_contracts_runtime::store::{ClaimOutcome, ClaimRequest, SqliteStore, Store};

fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tool-contracts"))
        .args(args)
        .output()
        .expect("run the CLI");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn an_operator_lists_reads_and_resolves_an_abandoned_key() {
    let path = std::env::temp_dir().join(format!("tc-cli-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let req = |key| ClaimRequest {
        key,
        tool: "charge_card",
        version: 1,
        scope: Some("tenant-7"),
        fingerprint: "card=ab",
        args: r#"{"card":"4242"}"#,
        lease: Duration::from_millis(50),
        ttl: Duration::from_secs(60),
        worker: "worker-a",
    };
    for key in ["key-happened", "key-did-not", "key-old-flag"] {
        assert!(matches!(
            store.claim(req(key)).await.unwrap(),
            ClaimOutcome::Acquired { .. }
        ));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (ok, out, err) = cli(&["pending", "--store", &url]);
    assert!(ok, "{err}");
    assert!(
        out.contains("key-happened") && out.contains("key-did-not"),
        "{out}"
    );
    assert!(out.contains("abandoned (outcome unknown)"), "{out}");
    assert!(out.contains(r#"{"card":"4242"}"#), "arguments shown: {out}");
    // Ages are written by humantime and cut to seconds ("age 0s", never "age 0s 103ms").
    for line in out.lines() {
        let age = line
            .split("  age ")
            .nth(1)
            .and_then(|rest| rest.split("  args ").next())
            .unwrap_or_else(|| panic!("no age in {line:?}"));
        let parsed = humantime::parse_duration(age).unwrap_or_else(|e| panic!("{age:?}: {e}"));
        assert_eq!(parsed.subsec_nanos(), 0, "{line}");
    }
    // `--older-than` keeps only the keys claimed that long ago.
    let (ok, out, err) = cli(&["pending", "--store", &url, "--older-than", "1h"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "no pending keys older than 1h");
    let (ok, out, err) = cli(&["pending", "--store", &url, "--older-than", "50ms"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");

    let (ok, out, err) = cli(&[
        "resolve",
        "--store",
        &url,
        "key-happened",
        "--result",
        r#"{"charge":"ch_1"}"#,
        "--ttl",
        "2h",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("completed"), "{out}");
    // The old flag and a plain number of seconds still work.
    let (ok, _, err) = cli(&[
        "resolve",
        "--store",
        &url,
        "key-old-flag",
        "--result",
        "1",
        "--ttl-secs",
        "5400",
    ]);
    assert!(ok, "{err}");
    for (key, expires_in) in [
        ("key-happened", "(in 1h 59m "),
        ("key-old-flag", "(in 1h 29m "),
    ] {
        let (ok, out, err) = cli(&["show", "--store", &url, "--scope", "tenant-7", key]);
        assert!(ok, "{err}");
        let expires = out
            .lines()
            .find(|l| l.starts_with("  expires   "))
            .unwrap_or_else(|| panic!("no expiry in {out}"));
        assert!(expires.contains(expires_in), "{key}: {expires}");
        let at = expires["  expires   ".len()..].split(' ').next().unwrap();
        assert!(humantime::parse_rfc3339(at).is_ok(), "RFC 3339: {expires}");
    }
    let (ok, _, err) = cli(&["resolve", "--store", &url, "key-did-not", "--release"]);
    assert!(ok, "{err}");
    let (ok, out, _) = cli(&["pending", "--store", &url]);
    assert!(ok);
    assert!(out.contains("no pending keys"), "{out}");

    let (ok, out, err) = cli(&["history", "--store", &url, "key-happened"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("claimed") && out.contains("resolved") && out.contains("worker-a"),
        "{out}"
    );
    // Each event's time in RFC 3339, not milliseconds since the epoch.
    for event in out.lines().skip(1) {
        let at = event.split_whitespace().next().unwrap();
        assert!(humantime::parse_rfc3339(at).is_ok(), "{event}");
    }

    // A completed key is never overwritten by an operator; bad input is refused clearly.
    let (ok, _, err) = cli(&["resolve", "--store", &url, "key-happened", "--release"]);
    assert!(!ok);
    assert!(err.contains("not pending"), "{err}");
    let (ok, _, err) = cli(&["resolve", "--store", &url, "other", "--result", "{not json"]);
    assert!(!ok);
    assert!(err.contains("not valid JSON"), "{err}");
    let (ok, _, err) = cli(&["pending", "--store", "ftp://x"]);
    assert!(!ok);
    assert!(err.contains("unknown store URL"), "{err}");
    for (ttl, says) in [
        ("2x", "write a duration such as `90s`"),
        ("0", "expires at once"),
        ("99999999999999999999", "more seconds than a duration holds"),
    ] {
        let (ok, _, err) = cli(&[
            "resolve", "--store", &url, "other", "--result", "1", "--ttl", ttl,
        ]);
        assert!(!ok, "--ttl {ttl} accepted");
        assert!(err.contains(says), "--ttl {ttl}: {err}");
    }
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test]
async fn json_output_parses_and_purge_removes_expired_records() {
    use tool_contracts_runtime::store::Completion;
    let path = std::env::temp_dir().join(format!("tc-cli-json-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    // The test purges by hand: no purge in the background meanwhile.
    store.set_purge_interval(None);
    let req = |key, lease| ClaimRequest {
        key,
        tool: "send_mail",
        version: 1,
        scope: None,
        fingerprint: "a1:00",
        args: r#"{"to":"a@example.com"}"#,
        lease,
        ttl: Duration::from_secs(60),
        worker: "worker-j",
    };
    let ClaimOutcome::Acquired { token } = store
        .claim(req("key-expiring", Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    let short = Completion {
        result: "\"sent\"",
        is_error: false,
        ttl: Duration::from_millis(50),
    };
    store.complete("key-expiring", token, short).await.unwrap();
    assert!(matches!(
        store
            .claim(req("key-running", Duration::from_secs(30)))
            .await
            .unwrap(),
        ClaimOutcome::Acquired { .. }
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let lines = |out: &str| -> Vec<serde_json::Value> {
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    };
    let (ok, out, err) = cli(&["pending", "--json", "--store", &url]);
    assert!(ok, "{err}");
    let pending = lines(&out);
    assert_eq!(pending.len(), 1, "{out}");
    assert_eq!(pending[0]["key"], "key-running");
    assert_eq!(pending[0]["tool"], "send_mail");
    assert!(
        pending[0]["state"].as_str().unwrap().starts_with("running"),
        "{out}"
    );
    // Times in RFC 3339 beside the numeric age scripts already read.
    let created = pending[0]["created_at"].as_str().unwrap();
    let created = humantime::parse_rfc3339(created).unwrap();
    let expires = humantime::parse_rfc3339(pending[0]["expires_at"].as_str().unwrap()).unwrap();
    assert!(created < expires, "{out}");
    assert!(pending[0]["age_secs"].is_u64(), "{out}");

    let (ok, out, err) = cli(&["history", "--json", "--store", &url, "key-expiring"]);
    assert!(ok, "{err}");
    let history = lines(&out);
    assert_eq!(history[0]["key"], "key-expiring", "the record first: {out}");
    let events: Vec<&str> = history[1..]
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["claimed", "completed"], "{out}");
    for event in &history[1..] {
        let at = humantime::parse_rfc3339(event["at"].as_str().unwrap()).unwrap();
        let ms = at
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        assert_eq!(event["at_ms"].as_u64().map(u128::from), Some(ms), "{event}");
    }

    let (ok, out, err) = cli(&["purge", "--json", "--store", &url]);
    assert!(ok, "{err}");
    assert_eq!(lines(&out), [serde_json::json!({"purged": 1})]);
    let (ok, out, _) = cli(&["history", "--store", &url, "key-expiring"]);
    assert!(ok);
    assert!(out.contains("no record"), "purged: {out}");
    let (ok, out, err) = cli(&["purge", "--store", &url]);
    assert!(ok, "{err}");
    assert!(out.contains("purged 0 expired records"), "{out}");

    let (ok, out, err) = cli(&[
        "resolve",
        "--json",
        "--store",
        &url,
        "key-running",
        "--release",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        lines(&out),
        [serde_json::json!({"key": "key-running", "resolved": "released"})]
    );
    let (ok, out, err) = cli(&["pending", "--json", "--store", &url]);
    assert!(ok, "{err}");
    assert!(
        out.trim().is_empty(),
        "nothing pending, and no prose in JSON mode: {out}"
    );
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test]
async fn show_prints_an_operation_in_its_scope_and_no_other() {
    use tool_contracts_runtime::store::Completion;
    let path = std::env::temp_dir().join(format!("tc-cli-show-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let req = |key, scope, lease| ClaimRequest {
        key,
        tool: "charge_card",
        version: 2,
        scope,
        fingerprint: "a1:00",
        args: r#"{"card":{"sha256":"5a1e"},"amount":1200}"#,
        lease,
        ttl: Duration::from_secs(60),
        worker: "worker-s",
    };
    let long = Duration::from_secs(30);
    let ClaimOutcome::Acquired { token } = store
        .claim(req("key-charged", Some("tenant-7"), long))
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    let charged = Completion {
        result: r#"{"charge":"ch_1","refunded":null}"#,
        is_error: false,
        ttl: Duration::from_secs(60),
    };
    store.complete("key-charged", token, charged).await.unwrap();
    // Made under a client's key inside the tenant, as the MCP server nests it.
    let client_scope = Some("tenant-7\u{1f}client:k-9");
    store
        .claim(req("key-client", client_scope, long))
        .await
        .unwrap();
    let nested = Some("tenant-7\u{1f}eu");
    let short = Duration::from_millis(50);
    store.claim(req("key-lost", nested, short)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // In its scope: the document, its result and history; never the arguments.
    let show = |args: &[&str]| {
        let mut all = vec!["show", "--store", &url];
        all.extend_from_slice(args);
        cli(&all)
    };
    let (ok, out, err) = show(&["--scope", "tenant-7", "key-charged"]);
    assert!(ok, "{err}");
    for expected in [
        "operation key-charged",
        "charge_card (version 2)",
        "state     completed",
        r#"result    {"charge":"ch_1","refunded":null}"#,
        "claimed",
        "worker-s",
    ] {
        assert!(out.contains(expected), "{expected:?} in {out}");
    }
    assert!(!out.contains("sha256") && !out.contains("1200"), "{out}");
    let (ok, out, err) = show(&["--json", "--scope", "tenant-7", "key-charged"]);
    assert!(ok, "{err}");
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(doc["state"], "completed");
    assert_eq!(doc["version"], 2);
    assert_eq!(
        doc["result"],
        serde_json::json!({"charge": "ch_1", "refunded": null})
    );
    assert_eq!(doc["history"][1]["kind"], "completed");
    assert!(
        doc.get("args").is_none() && !out.contains("sha256"),
        "{out}"
    );

    // The client's call reads in the tenant's scope; a nested scope is given part by part.
    let (ok, out, err) = show(&["--scope", "tenant-7", "key-client"]);
    assert!(ok, "{err}");
    assert!(out.contains("state     in_progress"), "{out}");
    // The lease left, by humantime, to the millisecond: under the 30 s it was taken for.
    let lease = out
        .lines()
        .find_map(|l| l.strip_prefix("  lease     "))
        .and_then(|l| l.strip_suffix(" left, by the store's clock"))
        .unwrap_or_else(|| panic!("no lease line in {out}"));
    let left = humantime::parse_duration(lease).unwrap_or_else(|e| panic!("{lease:?}: {e}"));
    assert!(
        left > Duration::ZERO && left <= long && left.subsec_nanos().is_multiple_of(1_000_000),
        "{lease}"
    );
    let (ok, out, err) = show(&["--scope", "tenant-7", "--scope", "eu", "key-lost"]);
    assert!(ok, "{err}");
    assert!(out.contains("state     unknown"), "{out}");

    // Another scope, no scope, or a key never used: not found, alike.
    for args in [
        &["--scope", "tenant-8", "key-charged"][..],
        &["key-charged"],
        &["--scope", "tenant-7", "key-lost"],
        &["--scope", "tenant-7", "key-never"],
    ] {
        let (ok, out, err) = show(args);
        assert!(!ok, "{args:?}: {out}");
        assert!(err.contains("no operation"), "{args:?}: {err}");
    }
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
