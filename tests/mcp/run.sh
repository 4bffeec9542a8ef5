#!/usr/bin/env bash
# Runs the real-client MCP end-to-end test (tests/mcp/test_e2e.py): creates the Python venv
# if missing (target/mcp-venv, or $TOOL_CONTRACTS_MCP_VENV), installs the pinned SDK, builds
# examples/mcp_shop and the tool-contracts CLI (which approves calls out of band), and runs
# the test against the example over stdio and streamable HTTP.
# Exits non-zero on failure (the test prints the servers' stderr then).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${TOOL_CONTRACTS_MCP_VENV:-$root/target/mcp-venv}"
requirements="$here/requirements.txt"

python="${PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
  done
fi
if [ -z "$python" ]; then
  echo "tests/mcp/run.sh: no python3.11 or python3 on PATH (set PYTHON)" >&2
  exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv with $python"
  "$python" -m venv "$venv"
fi
stamp="$venv/.tool-contracts-requirements"
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
  echo "== installing $(grep -v '^#' "$requirements" | tr '\n' ' ')"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
fi

# The executable cargo reports for target `$1` of the build `cargo build "${@:2}"`.
built() {
  local target="$1"
  shift
  cargo build "$@" --message-format=json-render-diagnostics \
    | "$venv/bin/python" -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == sys.argv[1] and msg.get("executable"):
        print(msg["executable"])
' "$target"
}

cd "$root"
echo "== building examples/mcp_shop"
binary="$(built mcp_shop -p tool-contracts --example mcp_shop --features mcp,sqlite)"
if [ -z "$binary" ] || [ ! -x "$binary" ]; then
  echo "tests/mcp/run.sh: cargo did not report the mcp_shop executable" >&2
  exit 1
fi
# The operator's CLI: approves a call out of band, on the server's SQLite file.
echo "== building the tool-contracts CLI"
cli="$(built tool-contracts -p tool-contracts-cli --bin tool-contracts)"
if [ -z "$cli" ] || [ ! -x "$cli" ]; then
  echo "tests/mcp/run.sh: cargo did not report the tool-contracts executable" >&2
  exit 1
fi

echo "== running tests/mcp/test_e2e.py against $binary"
exec "$venv/bin/python" "$here/test_e2e.py" "$binary" "$cli"
