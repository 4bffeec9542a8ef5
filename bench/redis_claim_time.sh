#!/usr/bin/env bash
# The Redis server's own time for one claim of a completed record (a replay), against the
# replay-like ceiling script of benches/fleet_stores.rs: `INFO commandstats` usec_per_call
# of EVALSHA after `CONFIG RESETSTAT`, 40,000 calls with redis-benchmark -c 8 over 1,000
# completed records of the store's shape, six rounds, the scripts in a rotated order each
# round. Times inside the server do not depend on the client, so they say what the claim
# script costs the server, which bounds the replays per second at concurrency 64 once the
# server is saturated.
# Usage: bench/redis_claim_time.sh [REV...] (default HEAD; each REV's claim script is read
# from runtime/src/store/redis.rs at that commit). Needs git, python3, redis-cli,
# redis-benchmark and a Redis at TOOL_CONTRACTS_REDIS_URL (default redis://127.0.0.1:6379,
# no password) that nothing else sends EVALSHA to while it runs (its command statistics
# are reset and read; a round whose count is off is refused). Its keys live under
# `tcclaimtime:` and are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
url="${TOOL_CONTRACTS_REDIS_URL:-redis://127.0.0.1:6379}"
hostport="${url#*://}"; hostport="${hostport##*@}"; hostport="${hostport%%/*}"
host="${hostport%:*}"; port="${hostport##*:}"
[ "$port" = "$host" ] && port=6379
cli() { redis-cli -h "$host" -p "$port" "$@"; }
calls=40000
cleanup() {
    cli --scan --pattern 'tcclaimtime:*' | xargs -r -n 500 redis-cli -h "$host" -p "$port" UNLINK > /dev/null
}
trap cleanup EXIT
revs=("$@"); [ ${#revs[@]} -eq 0 ] && revs=(HEAD)
# The claim script as `Scripts::new` in runtime/src/store/redis.rs assembles it (CLAIM_REPLAY
# where the commit has it, PRELUDE, CLAIM_PRELUDE, CLAIM): change both together.
claim_script() {
    git show "$1:runtime/src/store/redis.rs" | python3 -c '
import re, sys
s = sys.stdin.read()
def part(n):
    m = re.search(r"const " + n + r": &str = r#\"(.*?)\"#;", s, re.S)
    return m.group(1) if m else ""
print(part("CLAIM_REPLAY") + part("PRELUDE") + part("CLAIM_PRELUDE") + part("CLAIM"))'
}
# The server's time per EVALSHA for `calls` calls of "$@", or exit if the statistics do not
# hold exactly those calls, all answered without an error.
usec() {
    cli CONFIG RESETSTAT > /dev/null
    redis-benchmark -h "$host" -p "$port" -c 8 -n "$calls" -r 1000 -q EVALSHA "$@" > /dev/null 2>&1
    local stat
    stat=$(cli INFO commandstats | tr -d '\r' | grep '^cmdstat_evalsha:')
    local n failed
    n=$(sed 's/.*[:,]calls=\([0-9]*\).*/\1/' <<< "$stat")
    failed=$(sed -n 's/.*failed_calls=\([0-9]*\).*/\1/p' <<< "$stat")
    if [ "$n" != "$calls" ] || [ "${failed:-0}" != 0 ]; then
        echo "EVALSHA statistics show $n calls ($failed failed), not $calls: another client, or a script error" >&2
        exit 1
    fi
    sed 's/.*usec_per_call=\([0-9.]*\).*/\1/' <<< "$stat"
}
fp='cart.id=0123456789abcdef01234567;note=0123456789abcdef01234567;user_id=0123456789abcdef01234567'
args='{"cart":{"id":"c-42","items":["book"]},"note":"gift","user_id":7}'
result='{"cart_id":"c-42","order_id":71,"total_cents":4999}'
redis-benchmark -h "$host" -p "$port" -c 16 -n 20000 -r 1000 -q HSET 'tcclaimtime:r:__rand_int__' \
    ver 1 tok 1 tool create_order result "$result" upd 1796125410422 fp "$fp" st c \
    created 1796125410354 expires 9796211810422 done 1796125410422 args "$args" err 0 \
    worker bench-1-1 > /dev/null 2>&1
# The claim's keys and arguments (the ceiling is given the same, so both parse as much).
keys=(5 'tcclaimtime:r:__rand_int__' 'tcclaimtime:h:__rand_int__' tcclaimtime:pending tcclaimtime:expiry tcclaimtime:token)
argv=(x create_order 0 '' "$fp" "$args" 30000 86400000 bench-1-1 1)
# The replay-like ceiling of benches/fleet_stores.rs (CEIL_REPLAY: the store's commands since
# 02f3aff, an HMGET of the record's fields), and the one before it (an HGETALL).
names=("ceiling (HMGET)" "ceiling before 02f3aff (HGETALL)")
shas=("$(cli SCRIPT LOAD "local t = redis.call('TIME')
local v = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fp', 'worker', 'created', 'expires', 'lease', 'tool', 'ver', 'scope', 'args', 'result', 'err', 'done', 'upd')
return cmsgpack.pack(v)")" "$(cli SCRIPT LOAD "local t = redis.call('TIME')
local flat = redis.call('HGETALL', KEYS[1])
return cmsgpack.pack(flat)")")
for rev in "${revs[@]}"; do
    body=$(claim_script "$rev")
    [ -n "$body" ] || { echo "no claim script at $rev" >&2; exit 1; }
    names+=("claim at $rev")
    shas+=("$(cli SCRIPT LOAD "$body")")
done
for sha in "${shas[@]}"; do
    [[ "$sha" =~ ^[0-9a-f]{40}$ ]] || { echo "SCRIPT LOAD answered $sha" >&2; exit 1; }
done
version=$(cli INFO server | tr -d '\r' | sed -n 's/^redis_version://p')
echo "# $(date -u +%T) Redis $version: us of the server's time per EVALSHA on a completed record"
count=${#shas[@]}
for round in 1 2 3 4 5 6; do
    declare -A took=()
    # Rotated each round, so no script always runs first.
    for k in $(seq 0 $((count - 1))); do
        i=$(( (k + round - 1) % count ))
        took[$i]=$(usec "${shas[$i]}" "${keys[@]}" "${argv[@]}")
    done
    line="round $round:"
    for i in $(seq 0 $((count - 1))); do line+="  ${names[$i]} ${took[$i]}"; done
    echo "$line"
    unset took
done
