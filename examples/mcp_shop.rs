//! A shop served as an MCP server: `create_order`, `charge_card`, `ship_order`,
//! `refund_charge` and `refund_order` are safe to call twice, even across a crash of the
//! server, and `get_order` reads.
//!
//! ```sh
//! cargo run --example mcp_shop --features mcp,sqlite -- --stdio --db /tmp/shop.db
//! cargo run --example mcp_shop --features mcp,sqlite -- --http 127.0.0.1:8080 --db /tmp/shop.db
//! cargo run --example mcp_shop --features mcp,sqlite -- --stdio --db /tmp/shop.db --tenant acme
//! ```
//!
//! Keys live in the SQLite file given by `--db`. Every side effect (an order placed, a card
//! charged) is appended to a ledger, `<db>.ledger.jsonl` unless `--ledger` says otherwise,
//! one JSON object a line and synced before the tool returns: the stand-in for the
//! outside world, which the end-to-end test (`tests/mcp/test_e2e.py`) counts. The tools
//! and the ledger are `support/shop.rs`, shared with `http_shop`.
//!
//! `MCP_SHOP_CHARGE_DELAY_MS` makes `charge_card` sleep that long *after* charging, so a
//! test can kill the server between the effect and the stored result.
//!
//! `refund_order` waits for a person's approval (`approval = "required"`): a client that
//! declares elicitation is asked (docs/mcp.md, "Approval through elicitation"), any other
//! gets a tool error naming the operation to approve (`tool-contracts approve KEY --store
//! sqlite:<db>`), and the retry runs it once.
//!
//! `create_order` and `charge_card` take MCP tasks (`task = "optional"`): a client that
//! declares the tasks extension gets a task whose id is the call's key, and polls
//! `tasks/get` for the result (docs/mcp.md, "Tasks").

#[path = "support/shop.rs"]
mod shop;

use std::path::PathBuf;

enum Mode {
    Stdio,
    Http(std::net::SocketAddr),
}

struct Options {
    mode: Mode,
    db: PathBuf,
    ledger: Option<PathBuf>,
    tenant: Option<String>,
}

const USAGE: &str =
    "usage: mcp_shop (--stdio | --http <addr>) --db <path> [--ledger <path>] [--tenant <name>]";

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let (mut mode, mut db, mut ledger, mut tenant) = (None, None, None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--stdio" => mode = Some(Mode::Stdio),
            "--http" => {
                let addr = args
                    .next()
                    .ok_or("--http needs an address, e.g. 127.0.0.1:8080")?;
                let addr = addr
                    .parse()
                    .map_err(|e| format!("--http {addr}: not a socket address ({e})"))?;
                mode = Some(Mode::Http(addr));
            }
            "--db" => db = Some(PathBuf::from(args.next().ok_or("--db needs a path")?)),
            "--ledger" => ledger = Some(PathBuf::from(args.next().ok_or("--ledger needs a path")?)),
            "--tenant" => tenant = Some(args.next().ok_or("--tenant needs a name")?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(Options {
        mode: mode.ok_or_else(|| format!("say --stdio or --http <addr>\n{USAGE}"))?,
        db: db.ok_or_else(|| format!("say --db <path>\n{USAGE}"))?,
        ledger,
        tenant,
    })
}

#[tokio::main]
async fn main() {
    if let Err(message) = run().await {
        eprintln!("mcp_shop: {message}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let options = parse_args()?;
    let ledger_path = shop::open(&options.db, options.ledger).await?;
    let registry = tool_contracts::try_registry().map_err(|e| e.to_string())?;
    let server = tool_contracts::mcp::McpServer::new(registry.clone())
        .with_server_info("mcp_shop", env!("CARGO_PKG_VERSION"));
    // The tenant scopes everything this process does: its keys, and which operations its
    // clients may read (another tenant's on the same store read as not found).
    let server = match options.tenant {
        Some(tenant) => server.with_scope(tenant),
        None => server,
    };
    eprintln!(
        "mcp_shop: pid {}, store {}, ledger {}",
        std::process::id(),
        options.db.display(),
        ledger_path.display()
    );
    match options.mode {
        Mode::Stdio => server.serve_stdio().await,
        Mode::Http(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            eprintln!("mcp_shop: listening on http://{bound}/mcp");
            server
                .serve_http_listener(listener, async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await
        }
    }
    .map_err(|e| e.to_string())
}
