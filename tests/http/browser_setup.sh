#!/usr/bin/env bash
# Setup of the browser test (tests/http/browser.sh): Debian's headless Chromium and its
# chromedriver, and a pinned selenium in a virtual environment under the target directory.
#
# - `chromium` and `chromium-driver` from Debian's packages, installed with apt-get when
#   /usr/bin/chromium or /usr/bin/chromedriver is missing (needs root, as on the dev
#   machines and in CI; the apt lists are refreshed here, so .ci/run needs no apt step).
# - tests/http/browser-requirements.txt into $TOOL_CONTRACTS_BROWSER_VENV, by default
#   ${CARGO_TARGET_DIR:-target}/browser-venv (re-installed when the requirements change).
#
# Exits non-zero, saying what is missing, when either cannot be done.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

chromium=/usr/bin/chromium
driver=/usr/bin/chromedriver
if [ ! -x "$chromium" ] || [ ! -x "$driver" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "tests/http/browser_setup.sh: $chromium or $driver is missing and this is not root: run" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends chromium chromium-driver" >&2
    exit 1
  fi
  command -v apt-get >/dev/null 2>&1 || {
    echo "tests/http/browser_setup.sh: $chromium or $driver is missing and there is no apt-get: install Chromium and its chromedriver at those paths" >&2
    exit 1
  }
  echo "== installing chromium and chromium-driver from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends chromium chromium-driver
fi
for binary in "$chromium" "$driver"; do
  [ -x "$binary" ] || { echo "tests/http/browser_setup.sh: $binary is still missing after apt-get" >&2; exit 1; }
done

require python3
venv="${TOOL_CONTRACTS_BROWSER_VENV:-$target/browser-venv}"
venv_from "$here/browser-requirements.txt" "$venv"
echo "== browser: $("$chromium" --version 2>/dev/null), $("$driver" --version | cut -d' ' -f1-2), selenium $("$venv/bin/python" -c 'import selenium; print(selenium.__version__)')"
