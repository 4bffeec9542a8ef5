#!/usr/bin/env bash
# Issue item 7: Powertools for AWS Lambda (Python) idempotency on the local Redis, side by
# side with tool-contracts' stores on the same Redis, same tool, concurrency 1, 16 and 64.
# Usage: bench/powertools.sh [--quick]
# Needs python3 (with venv), a Redis at TOOL_CONTRACTS_REDIS_URL (default below).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export TOOL_CONTRACTS_REDIS_URL="${TOOL_CONTRACTS_REDIS_URL:-redis://127.0.0.1:6379}"
venv="${POWERTOOLS_VENV:-$here/.venv-powertools}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# Pinned: the idempotency package imports boto3 even when only the Redis layer is used.
"$venv/bin/pip" install --quiet --disable-pip-version-check \
    "aws-lambda-powertools[redis]==3.37.0" "redis==8.1.0" "boto3==1.44.8" "botocore==1.44.8" \
    "jmespath==1.1.0" "typing_extensions==4.16.0"
"$venv/bin/python" "$here/powertools_bench.py" "$@"

# Ours, same Redis, same tool, same concurrencies (the fleet bench's Redis rows).
cd "$here/.."
quick=()
for a in "$@"; do [ "$a" = "--quick" ] && quick=(--quick); done
TOOL_CONTRACTS_POSTGRES_URL= TOOL_CONTRACTS_BENCH_CONCURRENCY=1,16,64 \
    cargo bench --quiet -p tool-contracts-benches --bench fleet_stores -- "${quick[@]}"
