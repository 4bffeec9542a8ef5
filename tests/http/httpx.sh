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
. "$here/lib.sh"

require python3

venv="${TOOL_CONTRACTS_HTTPX_VENV:-$root/target/httpx-venv}"
venv_from "$here/httpx-requirements.txt" "$venv"

http_shop_binary "${1:-}"

exec "$venv/bin/python" "$here/httpx_e2e.py" "$binary"
