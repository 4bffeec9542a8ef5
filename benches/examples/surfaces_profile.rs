//! One surface of `benches/surfaces.rs` alone, for `valgrind --tool=callgrind` (instruction
//! counts do not move with the machine's load, unlike times): the servers of the bench in
//! this process, one client, N sequential calls of one kind on a current-thread runtime.
//!
//! `cargo build --release -p tool-contracts-benches --example surfaces_profile` then
//! `valgrind --tool=callgrind target/release/examples/surfaces_profile mcp replay 2000`.
//! Surfaces: `mcp`, `mcp-bare`, `tools` (`Prefer: return=representation`), `tools-follow`
//! (`303` then `GET`), `tools-bare`, `layer`, `layer-bare`; kinds: `first` (fresh users),
//! `replay` (one user completed before, over and over; the bare servers run it each time).
//! Compare two runs' totals (`callgrind_annotate`) divided by N: the instructions one call
//! costs on top of the bare server's. A fourth argument C runs C clients (N calls in all)
//! on a two-worker multi-thread runtime, as the bench's concurrency C does, for `time` or
//! `perf stat` (each client replays its own user).

#[allow(dead_code)]
#[path = "../common/tool.rs"]
mod tool;

#[allow(dead_code)]
#[path = "../common/surfaces.rs"]
mod surfaces;

use hyper::StatusCode;
use surfaces::{start_servers, Call, Client};

fn main() {
    let mut args = std::env::args().skip(1);
    let surface = args.next().unwrap_or_else(|| "mcp".to_owned());
    let kind = args.next().unwrap_or_else(|| "replay".to_owned());
    let n: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(2_000);
    let concurrency: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let rt = if concurrency == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    }
    .expect("runtime");
    rt.block_on(async move {
        let servers = start_servers().await;
        let (addr, call) = match surface.as_str() {
            "mcp" => (servers.mcp_ours, Call::Mcp),
            "mcp-bare" => (servers.mcp_bare, Call::Mcp),
            "tools" => (servers.tools, Call::ToolsRepresentation),
            "tools-follow" => (servers.tools, Call::ToolsFollow),
            "tools-bare" => (servers.bare, Call::ToolsRepresentation),
            "layer" => (servers.layer, Call::Orders),
            "layer-bare" => (servers.bare, Call::Orders),
            other => panic!("unknown surface {other}: mcp, mcp-bare, tools, tools-follow, tools-bare, layer, layer-bare"),
        };
        let clients = concurrency.max(1);
        let mut tasks = Vec::new();
        for c in 0..clients {
            let mut client = Client::connect(addr).await;
            if call == Call::Mcp {
                client.initialize().await;
            }
            let user = 7 + c;
            if call == Call::ToolsFollow {
                // The first call of the key (a follow needs a completed one to replay).
                client.call(Call::ToolsRepresentation, user).await;
            } else {
                client.call(call, user).await;
            }
            let first = kind == "first";
            tasks.push(tokio::spawn(async move {
                for i in 0..n / clients {
                    let user = if first { 1_000 + i * clients + c } else { user };
                    let answer = client.call(call, user).await;
                    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
                }
                client.close().await;
            }));
        }
        for task in tasks {
            task.await.expect("client task");
        }
    });
}
