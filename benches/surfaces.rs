//! Issue item "The surfaces": calls per second through the MCP and HTTP surfaces against a
//! bare server doing the same work without deduplication, same client, same run.
//!
//! - **MCP**: `tools/call` of `create_order` over streamable HTTP, to `McpServer` (its own
//!   `serve_http_listener`) and to a bare rmcp server (a hand-written `ServerHandler` whose
//!   `call_tool` decodes the arguments, runs the tool's body and answers
//!   `CallToolResult::structured`) behind rmcp's `StreamableHttpService` with the same
//!   settings as `McpServer`'s (session mode, rmcp's `LocalSessionManager`, the same body
//!   limit and `Origin` list).
//! - **HTTP tools**: `POST /tools/create_order` to `HttpTools::into_router` with
//!   `Prefer: return=representation` (the result in the answer: what an API client sends,
//!   one round trip), and the same call answered `303` then followed with
//!   `GET /operations/{key}` (what `curl -L` or a browser does), against a bare axum handler
//!   (`Json<Args>` in, `Json<Order>` out) at the same path.
//! - **`IdempotencyLayer`**: `POST /orders` with an `Idempotency-Key`, the same bare
//!   handler behind the layer, against the handler without it.
//!
//! Every server keeps its records in a `MemoryStore` of its own. A *first call* has a fresh
//! `user_id` (and, for the layer, a fresh key); a *replay* repeats a key completed in the
//! first-call window. The bare servers run the body every time (they have nothing to
//! replay), so "first call" and "replay" are the same request for them.
//!
//! The client is the same for every server: hyper's HTTP/1.1 connection (one keep-alive
//! connection per client task), the JSON body formatted per request, the whole answer
//! read (for MCP, the event stream of the `tools/call` POST up to its end). Each MCP client
//! task opens its own session (`initialize`, `notifications/initialized`, protocol
//! 2025-06-18) before the window and closes it after. Servers and clients run in this one
//! process on 127.0.0.1 (ephemeral ports), on one tokio multi-thread runtime with two
//! workers: **client and servers share the machine's two cores**, so a ratio compares the
//! whole round trip, client work included.
//!
//! Bare and ours alternate within a row: bare, first calls, bare, then fifteen rounds of
//! (replays, bare) in windows of a sixth of the row's (0.25 s with `--quick`), then the
//! extra replay form and bare. Each of ours is against the mean of the bare windows either
//! side; the replay's figure is the median of its fifteen rounds (each printed), so a
//! drift of the machine between windows moves a few rounds, not the row.
//! Concurrency 1 and 16 (or the comma list in `TOOL_CONTRACTS_BENCH_CONCURRENCY`).
//! Run: `cargo bench -p tool-contracts-benches --bench surfaces` (add `-- --quick`).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "common/tool.rs"]
mod tool;

#[allow(dead_code)]
#[path = "common/surfaces.rs"]
mod surfaces;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use surfaces::{check, start_servers, Call, Client};

// ------------------------------------------------------------------ measuring

/// Which users a window's calls are for: fresh ones from `base`, or the `made` users from
/// `base` over and over.
#[derive(Clone, Copy)]
enum Users {
    Fresh { base: u64 },
    Replay { base: u64, made: u64 },
}

/// `concurrency` clients of `addr` (each its own connection, MCP session opened first)
/// making `call`s for `users` until `window` has passed. Returns (calls, calls per second).
async fn measure(
    addr: SocketAddr,
    call: Call,
    concurrency: usize,
    window: Duration,
    users: Users,
) -> (u64, f64) {
    let mut clients = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let mut client = Client::connect(addr).await;
        if call == Call::Mcp {
            client.initialize().await;
        }
        clients.push(client);
    }
    let next = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                let mut n = 0u64;
                while began.elapsed() < window {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let user = match users {
                        Users::Fresh { base } => base + i,
                        Users::Replay { base, made } => base + i % made,
                    };
                    let answer = client.call(call, user).await;
                    assert_eq!(answer.status, StatusCode::OK, "{call:?}: {answer:?}");
                    n += 1;
                }
                let elapsed = began.elapsed();
                client.close().await;
                (n, elapsed)
            })
        })
        .collect();
    let (mut total, mut elapsed) = (0, Duration::ZERO);
    for task in tasks {
        // Up to each client's last answer, not the closing of its session.
        let (n, until) = task.await.expect("client task");
        total += n;
        elapsed = elapsed.max(until);
    }
    (total, common::per_sec(total, elapsed))
}

fn row(name: &str, rate: f64, bare: f64) {
    println!(
        "{name:<58} {rate:>8.0} /s  bare {bare:>8.0} /s  x{:.2}",
        rate / bare
    );
}

/// Replay windows of ours, each between two bare windows (bare, ours, bare, ours, ...,
/// bare): a ratio per round against the mean of the bare windows either side, so the
/// machine's drift over the row (the bare baseline moved by up to 36% between windows a
/// few seconds apart) enters each ratio only as much as it moves within three windows.
/// Fifteen short rounds rather than three long ones (less time): with three, one slow
/// window on either side moved the median (the 09:22 report's layer rounds 0.59-0.75x at
/// concurrency 1 beside bare windows alternating 24k and 32k/s); adjacent short windows
/// also see more nearly the same machine.
const REPLAY_ROUNDS: usize = 15;

/// A replay round's windows (ours and its bare), as a fraction of the row's window:
/// [`REPLAY_ROUNDS`] rounds of two such windows (5 windows' time) take less than three
/// rounds of full windows did (6), which pays for the extra windows' connections and MCP
/// sessions, so `--quick` stays within its time.
fn round_window(window: Duration) -> Duration {
    window / 6
}

/// The median of `values` (an odd count: the middle one).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One surface at one concurrency: bare, our first calls, bare, then [`REPLAY_ROUNDS`]
/// rounds of our replays each followed by bare (windows of [`round_window`]), then the extra replay form (if any) and
/// bare. The first calls and the extra form are against the mean of the bare windows
/// either side; the replays by round (each against its two neighbours), reported as the
/// median round with every round's figure.
#[allow(clippy::too_many_arguments)]
async fn surface(
    label: &str,
    ours: SocketAddr,
    bare: SocketAddr,
    calls: (Call, Call),
    extra: Option<(&str, Call)>,
    concurrency: usize,
    window: Duration,
    base: u64,
) {
    let (ours_call, bare_call) = calls;
    // The bare server alone for `length`: its calls per second.
    let bare_window = |length: Duration| async move {
        measure(bare, bare_call, concurrency, length, Users::Fresh { base })
            .await
            .1
    };
    let mut bares = vec![bare_window(window).await];
    let (made, first) = measure(ours, ours_call, concurrency, window, Users::Fresh { base }).await;
    bares.push(bare_window(window).await);
    let first_bare = (bares[0] + bares[1]) / 2.0;
    let replays = Users::Replay {
        base,
        made: made.max(1),
    };
    let short = round_window(window);
    let mut rounds = Vec::with_capacity(REPLAY_ROUNDS);
    for _ in 0..REPLAY_ROUNDS {
        let (_, replay) = measure(ours, ours_call, concurrency, short, replays).await;
        let before = bares.last().copied().unwrap_or(f64::NAN);
        let after = bare_window(short).await;
        bares.push(after);
        rounds.push((replay, (before + after) / 2.0));
    }
    let extra = match extra {
        Some((name, call)) => {
            let rate = measure(ours, call, concurrency, window, replays).await.1;
            let before = bares.last().copied().unwrap_or(f64::NAN);
            let after = bare_window(window).await;
            bares.push(after);
            Some((name, rate, (before + after) / 2.0))
        }
        None => None,
    };
    let bare_list: Vec<String> = bares.iter().map(|b| format!("{b:.0}")).collect();
    println!(
        "{label}, conc {concurrency}: bare windows {} /s",
        bare_list.join(", ")
    );
    let ratios: Vec<f64> = rounds.iter().map(|(ours, bare)| ours / bare).collect();
    let round_list: Vec<String> = rounds
        .iter()
        .map(|(ours, bare)| format!("{ours:.0}/{bare:.0} = x{:.2}", ours / bare))
        .collect();
    let replay_mean = rounds.iter().map(|r| r.0).sum::<f64>() / rounds.len() as f64;
    let bare_mean = rounds.iter().map(|r| r.1).sum::<f64>() / rounds.len() as f64;
    println!(
        "{:<58} {replay_mean:>8.0} /s  bare {bare_mean:>8.0} /s  median round x{:.2} (rounds: {})",
        format!("  {label} replay, conc {concurrency}"),
        median(&ratios),
        round_list.join("; ")
    );
    if let Some((name, rate, bare)) = extra {
        row(
            &format!("  {label} replay {name}, conc {concurrency}"),
            rate,
            bare,
        );
    }
    row(
        &format!("  {label} first call, conc {concurrency}"),
        first,
        first_bare,
    );
}

fn main() {
    let mode = common::Mode::detect();
    common::print_machine("surfaces");
    let rt = common::multi_thread_runtime();
    let window = mode.window();
    rt.block_on(async {
        let servers = start_servers().await;
        check(servers).await;
        println!(
            "client: hyper HTTP/1.1, one keep-alive connection per client task; servers in this process; client and servers share one 2-worker tokio runtime"
        );
        for (i, c) in common::concurrencies(&[1, 16]).into_iter().enumerate() {
            let base = (i as u64 + 1) * 1_000_000_000;
            surface(
                "MCP tools/call (McpServer vs bare rmcp)",
                servers.mcp_ours,
                servers.mcp_bare,
                (Call::Mcp, Call::Mcp),
                None,
                c,
                window,
                base,
            )
            .await;
            surface(
                "HTTP POST /tools (HttpTools vs bare axum)",
                servers.tools,
                servers.bare,
                (Call::ToolsRepresentation, Call::ToolsRepresentation),
                Some(("303 + GET /operations", Call::ToolsFollow)),
                c,
                window,
                base,
            )
            .await;
            surface(
                "IdempotencyLayer POST /orders (vs bare axum)",
                servers.layer,
                servers.bare,
                (Call::Orders, Call::Orders),
                None,
                c,
                window,
                base,
            )
            .await;
        }
    });
}
