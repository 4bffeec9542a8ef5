#!/usr/bin/env bash
# Concurrency and crashes with a real client: Python httpx (from PyPI, pinned in
# tests/http/httpx-requirements.txt, installed into a virtual environment this script makes:
# target/httpx-venv, or $TOOL_CONTRACTS_HTTPX_VENV) against examples/http_shop on a SQLite
# file. What is checked is in tests/http/httpx_e2e.py.
#
# Usage: tests/http/httpx.sh [path/to/http_shop]   (builds it when no path is given)
# Needs python3 with venv and pip, and PyPI (or a mirror pip is configured for). Never skips:
# any step that cannot run is a failure (the Rust wrapper is tests/http_e2e.rs).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

command -v python3 >/dev/null 2>&1 || { echo "tests/http/httpx.sh: python3 is not on PATH" >&2; exit 1; }

venv="${TOOL_CONTRACTS_HTTPX_VENV:-$root/target/httpx-venv}"
requirements="$here/httpx-requirements.txt"
if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
fi
stamp="$venv/.tool-contracts-requirements"
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
  echo "== installing $(grep -v '^#' "$requirements" | tr '\n' ' ')"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
fi

binary="${1:-}"
if [ -z "$binary" ]; then
  echo "== building examples/http_shop"
  binary="$(cd "$root" && cargo build -p tool-contracts --example http_shop --features http,sqlite --message-format=json-render-diagnostics \
    | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "http_shop" and msg.get("executable"):
        print(msg["executable"])
')"
fi
if [ -z "$binary" ] || [ ! -x "$binary" ]; then
  echo "tests/http/httpx.sh: no http_shop executable (got '$binary')" >&2
  exit 1
fi

exec "$venv/bin/python" "$here/httpx_e2e.py" "$binary"
