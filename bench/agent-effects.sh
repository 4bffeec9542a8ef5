#!/usr/bin/env bash
# Issue item 6: agent-effects 0.2.0 against tool-contracts, same workload.
# Usage: bench/agent-effects.sh [--quick]
# PostgreSQL rows need TOOL_CONTRACTS_POSTGRES_URL (defaults below for this machine).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export TOOL_CONTRACTS_POSTGRES_URL="${TOOL_CONTRACTS_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/agent-effects/target}"
cd "$here/agent-effects"
cargo run --release --quiet -- "$@"
