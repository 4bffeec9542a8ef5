#!/usr/bin/env bash
# Runs every fuzz target for DURATION seconds each (default 60); exits non-zero on the
# first crash, leak, timeout or out-of-memory (the reproducer is in fuzz/artifacts/<target>/).
#
#   fuzz/run.sh 60
#
# Needs a nightly toolchain (libFuzzer's sanitizer flags); installs cargo-fuzz if missing.
# The seed corpus in fuzz/corpus/<target>/ is read, never written: new inputs go to a
# temporary directory, so a run leaves the committed corpus unchanged.
set -euo pipefail

duration="${1:-60}"
case "$duration" in
  ''|*[!0-9]*) echo "usage: $0 SECONDS" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

targets=(canonical_key decode_args)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for target in "${targets[@]}"; do
  echo "=== fuzz target ${target}: ${duration}s ==="
  mkdir -p "$work/$target" "artifacts/$target"
  log="$work/$target.log"
  status=0
  # The first corpus directory receives new inputs; the seed directory is only read.
  cargo +nightly fuzz run "$target" "$work/$target" "corpus/$target" -- \
    -max_total_time="$duration" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    >"$log" 2>&1 || status=$?
  # The last status line (executions, exec/s, coverage) and the final stats.
  grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -n 1 || true
  grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|Done [0-9]+ runs)' "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzz target ${target} FAILED (exit ${status}); reproducer in fuzz/artifacts/${target}/" >&2
    exit "$status"
  fi
  # The figure docs/guarantees.md renders (tests/figures.py): executions, from libFuzzer's
  # own final stats.
  execs="$(grep -E '^stat::number_of_executed_units:' "$log" | tail -n 1 | tr -dc '0-9')"
  if [ -n "$execs" ]; then
    printf '{"test":"fuzz","figure":"%s","line":"fuzz[%s]: %s executions in %ss, no crash, leak or timeout","values":{"executions":%s,"seconds":%s}}' \
      "$target" "$target" "$execs" "$duration" "$execs" "$duration" \
      | python3 "$here/../tests/figures.py" record --run "$(date +%s)000-fuzz-$$" \
      || echo "figures: could not record the ${target} executions" >&2
  else
    echo "figures: no executions count in the ${target} log" >&2
  fi
done
echo "all fuzz targets ran ${duration}s each without a crash"
