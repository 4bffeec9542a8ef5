#!/usr/bin/env bash
# Every figure of BENCHMARKS.md in one run: the seven bench binaries (--quick), agent-effects,
# Powertools, then runs 2 and 3 of the CPU-bound benches; each command's start and end are
# stamped in OUT/meta.txt and its output kept in OUT/*.log.
# Usage: bench/run_all.sh [OUT]   (default OUT: target/bench-run)
# Needs the local Redis and PostgreSQL (URLs below unless set), redis-server and redis-cli 7+
# (the cluster rows), python3 with venv (Powertools). Build first (not timed):
#   cargo bench -p tool-contracts-benches --no-run
#   (cd bench/agent-effects && cargo build --release)   # with the same CARGO_TARGET_DIR
set -u
here="$(cd "$(dirname "$0")" && pwd)"
# OUT is resolved from the caller's directory, before moving to the repository root.
out="${1:-$here/../target/bench-run}"
mkdir -p "$out" || exit 1
out="$(cd "$out" && pwd)"
cd "$here/.." || exit 1
export TOOL_CONTRACTS_REDIS_URL="${TOOL_CONTRACTS_REDIS_URL:-redis://127.0.0.1:6379}"
export TOOL_CONTRACTS_POSTGRES_URL="${TOOL_CONTRACTS_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
meta="$out/meta.txt"
failed=0
echo "sources $(git rev-parse --short HEAD 2>/dev/null) ($(git status --short 2>/dev/null | wc -l) files changed)" > "$meta"
step() {
    local name="$1"; shift
    local s; s=$(date +%s)
    echo "$name start $(date -u +%T)" >> "$meta"
    "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name end $(date -u +%T) took $(( $(date +%s) - s )) s (exit $rc)" >> "$meta"
    [ "$rc" -eq 0 ] || failed=1
}
step main cargo bench -p tool-contracts-benches -- --quick
step agent-effects bench/agent-effects.sh --quick
step powertools bench/powertools.sh --quick
for r in 2 3; do
    for b in dedup_path key_derivation memory_scale; do
        step "run$r-$b" cargo bench -p tool-contracts-benches --bench "$b" -- --quick
    done
done
echo "done $(date -u +%T)" >> "$meta"
# Every step runs whatever an earlier one did; the exit status says whether all succeeded.
exit "$failed"
