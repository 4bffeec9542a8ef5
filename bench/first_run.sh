#!/usr/bin/env bash
# The first-run figures of issue 16, measured on cold target directories:
#   (a) the README's demo, `cargo run --example flaky_network`, at one or more git revisions
#       (each checked out in a temporary `git worktree`, so an old layout can be measured
#       beside the new one: e.g. `bench/first_run.sh demo 92d1fe0 HEAD`);
#   (b) a minimal user crate with one `#[mutating_tool]` on the facade's default features
#       (bench/first-run/tool-contracts-user, a path dependency on THIS checkout, uncommitted
#       changes included) and the same crate written with agent-effects 0.2.0 and its memory
#       store (bench/first-run/agent-effects-user).
# For each: the crates cargo compiled, the dependency count (`cargo tree`, the crate itself
# left out) and the wall seconds of the build.
#
# Cold means a fresh CARGO_TARGET_DIR under $TMPDIR (default /tmp), removed afterwards.
# Downloads are NOT counted: `cargo fetch` fills the registry cache (~/.cargo) before the
# clock starts, so the figures are compile time on a machine that already has the sources
# (a new user's first run also downloads, which depends on their network). The machine line
# (cores, load) is printed first: on a busy machine the seconds are not worth quoting.
#
# Usage:
#   bench/first_run.sh                  # demo at HEAD, then the two user crates
#   bench/first_run.sh demo [REV...]    # the demo at each REV (default HEAD)
#   bench/first_run.sh users            # the two user crates only
# Environment: FIRST_RUN_TARGET_DIR=DIR reuses DIR instead of cold ones (a quick check that
# the script works; every result line then says NOT COLD and its seconds mean nothing).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/first-run.XXXXXX")"
reuse="${FIRST_RUN_TARGET_DIR:-}"
worktrees=()
results=()

cleanup() {
  for wt in "${worktrees[@]+"${worktrees[@]}"}"; do
    git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

machine() {
  echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(rustc -V), $(date -u +%FT%TZ)"
  local load
  load="$(cut -d' ' -f1 /proc/loadavg)"
  if awk -v l="$load" 'BEGIN { exit !(l >= 1.5) }'; then
    echo "warning: 1-minute load $load >= 1.5: other work shares the cores, the seconds will be inflated"
  fi
}

# A fresh target directory for one build (or the reused one).
target_for() {
  if [ -n "$reuse" ]; then echo "$reuse"; else echo "$tmp/target-$1"; fi
}

# Times `cargo ARGS...` in DIR with CARGO_TARGET_DIR=TARGET; prints "WALL CPU COMPILED"
# (CPU = user + system seconds of cargo and every rustc it ran: less sensitive than the wall
# clock to other work on the machine, so the figure to compare when the load is not ~0).
timed_cargo() {
  local dir="$1" target="$2" log="$3"
  shift 3
  local times="$log.times" TIMEFORMAT="%R %U %S" status=0
  { time (cd "$dir" && CARGO_TARGET_DIR="$target" CARGO_TERM_COLOR=never cargo "$@" >"$log" 2>&1) ; } 2>"$times" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "first_run: \`cargo $*\` failed in $dir; its output:" >&2
    cat "$log" >&2
    exit 1
  fi
  awk '{ printf "%.1f %.1f", $1, $2 + $3 }' "$times"
  echo " $(grep -c '^ *Compiling ' "$log" || true)"
}

# Unique packages in `cargo tree -e EDGES` of DIR's package SPEC, SPEC itself left out.
dep_count() {
  local dir="$1" spec="$2" edges="$3"
  (cd "$dir" && cargo tree -q -p "$spec" -e "$edges" --prefix none) \
    | sed -e 's/ (\*)$//' | sort -u | grep -vc "^$spec v" || true
}

result() {
  local line
  line="$(printf '%-48s %6s crates compiled %5s dependencies %8s s wall %8s s CPU' "$1" "$2" "$3" "$4" "$5")"
  [ -n "$reuse" ] && line="$line   NOT COLD (FIRST_RUN_TARGET_DIR)"
  results+=("$line")
  echo "$line"
}

demo() {
  local rev="$1" sha wt target log out secs cpu compiled
  sha="$(git -C "$root" rev-parse --short=12 "$rev^{commit}")"
  wt="$tmp/src-$sha"
  git -C "$root" worktree add --detach --quiet "$wt" "$sha"
  worktrees+=("$wt")
  echo "== demo at $rev ($sha): cargo fetch (not timed)"
  (cd "$wt" && cargo fetch --quiet)
  target="$(target_for "demo-$sha")"
  log="$tmp/demo-$sha.log"
  echo "== demo at $rev ($sha): cargo run --example flaky_network"
  out="$(timed_cargo "$wt" "$target" "$log" run --example flaky_network)"
  read -r secs cpu compiled <<<"$out"
  # What an example builds: the package's dependencies and dev-dependencies.
  result "demo flaky_network @ $sha" "$compiled" \
    "$(dep_count "$wt" tool-contracts normal,build,dev)" "$secs" "$cpu"
  drop "$target"
}

# A cold target dir goes as soon as it is measured (a few GB each; the disk may be small).
drop() {
  [ -z "$reuse" ] && rm -rf "$1"
  return 0
}

user() {
  local name="$1" dir="$here/first-run/$1" target log bin out secs cpu compiled
  echo "== $name: cargo fetch (not timed)"
  (cd "$dir" && cargo fetch --quiet)
  target="$(target_for "$name")"
  log="$tmp/$name.log"
  echo "== $name: cargo build"
  out="$(timed_cargo "$dir" "$target" "$log" build)"
  read -r secs cpu compiled <<<"$out"
  bin="$target/debug/$name"
  # Not timed: the crate must work, or its build time would compare nothing.
  "$bin" | sed "s/^/   $name: /"
  result "$name (default features)" "$compiled" "$(dep_count "$dir" "$name" normal,build)" "$secs" "$cpu"
  drop "$target"
}

machine
mode="${1:-all}"
[ $# -gt 0 ] && shift
case "$mode" in
  all)
    demo HEAD
    user tool-contracts-user
    user agent-effects-user
    ;;
  demo)
    [ $# -eq 0 ] && set -- HEAD
    for rev in "$@"; do demo "$rev"; done
    ;;
  users)
    user tool-contracts-user
    user agent-effects-user
    ;;
  *)
    echo "usage: bench/first_run.sh [demo [REV...] | users]" >&2
    exit 2
    ;;
esac

echo
echo "== first run ($([ -n "$reuse" ] && echo "REUSED target dir $reuse" || echo "cold target dirs"), downloads not counted; debug profile, as \`cargo run\`)"
machine
printf '%s\n' "${results[@]}"
