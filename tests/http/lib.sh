# What the HTTP test scripts (tests/http/curl.sh, httpx.sh, browser.sh, browser_setup.sh)
# share, sourced by each after `set -euo pipefail` (never run on its own): where the
# workspace and its target directory are, a pinned Python venv, and examples/http_shop.
#
# Sets `root` (the workspace), `target` (the cargo target directory, absolute) and `script`
# (the sourcing script's name in messages, e.g. tests/http/curl.sh).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
script="tests/http/$(basename "$0")"

# require TOOL...: exits, naming the script and the tool, when a tool is not on PATH.
require() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$script: $tool is not on PATH" >&2; exit 1; }
  done
}

# venv_from REQUIREMENTS_FILE VENV_DIR: makes the virtual environment VENV_DIR with python3
# when it has no python, and installs the pinned REQUIREMENTS_FILE into it when that file
# differs from the copy stamped into the venv by the last install (so a changed pin is
# installed again, and an unchanged one costs nothing).
venv_from() {
  local requirements="$1" venv="$2"
  if [ ! -x "$venv/bin/python" ]; then
    echo "== creating $venv"
    python3 -m venv "$venv"
  fi
  local stamp="$venv/.tool-contracts-requirements"
  if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
    echo "== installing $(grep -v '^#' "$requirements" | tr '\n' ' ')"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
  fi
}

# build_http_shop: builds examples/http_shop (features http and sqlite) and prints the path
# of its executable, as cargo reports it (nothing when cargo reports none).
build_http_shop() {
  (cd "$root" && cargo build -p tool-contracts --example http_shop --features http,sqlite --message-format=json-render-diagnostics \
    | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "http_shop" and msg.get("executable"):
        print(msg["executable"])
')
}

# http_shop_binary [PATH]: sets `binary` to PATH, or builds examples/http_shop when no PATH
# is given (the scripts' optional argument); exits when the result is not an executable.
http_shop_binary() {
  binary="${1:-}"
  if [ -z "$binary" ]; then
    echo "== building examples/http_shop"
    binary="$(build_http_shop)"
  fi
  if [ -z "$binary" ] || [ ! -x "$binary" ]; then
    echo "$script: no http_shop executable (got '$binary')" >&2
    exit 1
  fi
}
