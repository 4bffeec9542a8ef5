#!/usr/bin/env bash
# Tools over HTTP with a real client: builds examples/http_shop, starts it on free loopback
# ports, and asserts every status of the HTTP surface with curl (200, 202, 303, 400, 401,
# 403, 404, 405, 409, 413, 415, 422, 500, 503), the browser's Post/Redirect/Get flow
# (submit, reload five times, go back and submit again: one order), a server SIGKILLed
# mid-call and restarted (the retry is an unknown outcome, never a second effect), and a
# store that is locked (503, nothing ran).
#
# The OpenAPI document is validated with openapi-spec-validator from PyPI, pinned in
# tests/http/requirements.txt and installed into a virtual environment the script makes
# (target/http-venv, or $TOOL_CONTRACTS_HTTP_VENV), as tests/mcp/run.sh does for the MCP SDK.
#
# Usage: tests/http/curl.sh [path/to/http_shop]   (builds it when no path is given)
# Needs curl and python3 (JSON, the SQLite lock, the venv). Exits non-zero on the first
# failure, printing the server's log; ends with "N passed, 0 failed".
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

require curl python3

venv="${TOOL_CONTRACTS_HTTP_VENV:-$root/target/http-venv}"
venv_from "$here/requirements.txt" "$venv"

http_shop_binary "${1:-}"

work="$(mktemp -d "${TMPDIR:-/tmp}/http-shop.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

passed=0
current_log=""
fail() {
  echo "FAILED: $*" >&2
  if [ -n "$current_log" ] && [ -f "$current_log" ]; then
    echo "--- server log ($current_log)" >&2
    cat "$current_log" >&2
  fi
  if [ -f "$work/headers" ]; then echo "--- last response headers" >&2; cat "$work/headers" >&2; fi
  if [ -f "$work/body" ]; then echo "--- last response body" >&2; head -c 4000 "$work/body" >&2; echo >&2; fi
  echo "$passed passed, 1 failed"
  exit 1
}
ok() { passed=$((passed + 1)); echo "ok: $*"; }

# start NAME DB [ENV=VALUE ...] -- [http_shop args...]: starts a server, sets $base and $pid.
start() {
  local name="$1" db="$2"; shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  current_log="$work/$name.log"
  env ${envs[@]+"${envs[@]}"} "$binary" --addr 127.0.0.1:0 --db "$work/$db" "$@" 2>"$current_log" &
  pid=$!
  pids+=("$pid")
  base=""
  for _ in $(seq 1 100); do
    base="$(grep -o 'listening on http://[0-9.:]*' "$current_log" 2>/dev/null | sed 's/listening on //' || true)"
    [ -n "$base" ] && break
    kill -0 "$pid" 2>/dev/null || fail "$name exited at start"
    sleep 0.1
  done
  [ -n "$base" ] || fail "$name did not say where it listens"
}

# req METHOD PATH [curl args...]: sets $status; headers and body in $work/headers, $work/body.
req() {
  local method="$1" path="$2"; shift 2
  status="$(curl -sS -o "$work/body" -D "$work/headers" -w '%{http_code}' -X "$method" "$@" "$base$path")"
}
# header NAME: the last response's header (case-insensitive), without CR.
header() { grep -i "^$1:" "$work/headers" | head -1 | sed 's/^[^:]*: *//' | tr -d '\r'; }
# jget PATH [FILE]: a member of a JSON document by dotted path (`result.order_id`, `0.sku`).
jget() {
  python3 - "$1" "${2:-$work/body}" <<'PY'
import json, sys
doc = json.load(open(sys.argv[2]))
for part in filter(None, sys.argv[1].split(".")):
    doc = doc[int(part)] if isinstance(doc, list) else (doc or {}).get(part)
print(doc if isinstance(doc, str) else json.dumps(doc))
PY
}
expect() { [ "$status" = "$1" ] || fail "$2: expected $1, got $status"; ok "$1 $2"; }
# problem STATUS TYPE WHAT: a problem+json of that status and type (the variant name).
problem() {
  [ "$status" = "$1" ] || fail "$3: expected $1, got $status"
  [ "$(header content-type)" = "application/problem+json" ] || fail "$3: content-type $(header content-type)"
  local type; type="$(jget type)"
  case "$type" in *"#variant.$2") ;; *) fail "$3: type $type, expected …#variant.$2";; esac
  [ "$(jget status)" = "$1" ] || fail "$3: the document's status is not $1"
  ok "$1 $3 ($2)"
}
# effects KIND [FIELD VALUE]: how many effects of KIND the ledger holds.
effects() {
  curl -sS "$base/ledger" -o "$work/ledger"
  python3 - "$work/ledger" "$@" <<'PY'
import json, sys
entries = json.load(open(sys.argv[1]))
kind, rest = sys.argv[2], sys.argv[3:]
print(sum(1 for e in entries if e["effect"] == kind and (not rest or str(e.get(rest[0])) == rest[1])))
PY
}

form=(-d user_id=7 -d cart.id=cart-1 -d cart.items.0.sku=coffee-beans -d cart.items.0.qty=2 -d cart.items.0.unit_cents=1250 -d "note=ring twice")
order_json='{"user_id":7,"cart":{"id":"cart-1","items":[{"sku":"coffee-beans","qty":2,"unit_cents":1250}]},"note":"ring twice"}'
browser=(-H 'Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8' -H 'Sec-Fetch-Site: same-origin')

echo "== the shop, one tenant (refunds sleep 6 s after the effect)"
start shop shop.db SHOP_REFUND_DELAY_MS=6000 --

req GET / "${browser[@]}"
expect 200 "the order form"
grep -q 'action="tools/create_order"' "$work/body" || fail "the form does not post to create_order"
grep -qi '<script' "$work/body" && fail "the form has a script"
req GET /tools
expect 200 "GET /tools"
python3 -c 'import json,sys; names={t["name"] for t in json.load(open(sys.argv[1]))["tools"]}; assert {"create_order","charge_card","ship_order","refund_charge","get_order"} <= names, names' "$work/body" || fail "GET /tools lists the shop's tools"
req GET /openapi.json
expect 200 "GET /openapi.json"
[ "$(jget openapi)" = "3.1.0" ] || fail "OpenAPI version"
"$venv/bin/python" - "$work/body" <<'PY' || fail "openapi-spec-validator refuses GET /openapi.json"
import sys
from openapi_spec_validator import validate
from openapi_spec_validator.readers import read_from_filename
spec, base_uri = read_from_filename(sys.argv[1])
validate(spec, base_uri=base_uri)
PY
ok "openapi-spec-validator accepts the document"

echo "== the browser: submit, land on the operation page, reload, back and submit again"
req POST /tools/create_order "${browser[@]}" "${form[@]}"
expect 303 "the form's POST redirects"
location="$(header location)"
case "$location" in /operations/????????????????????????????????????????????????????????????????) ;; *) fail "Location $location";; esac
[ "$(header tool-contracts-outcome)" = "executed" ] || fail "the first POST executed"
for i in 1 2 3 4 5; do
  req GET "$location" "${browser[@]}"
  [ "$status" = 200 ] || fail "reload $i of the operation page: $status"
  grep -q 'data-state="completed"' "$work/body" || fail "reload $i: not completed"
done
ok "200 the operation page, reloaded five times"
[ "$(header content-type)" = "text/html; charset=utf-8" ] || fail "the operation page is HTML"
req POST /tools/create_order "${browser[@]}" "${form[@]}"
expect 303 "back and submit again"
[ "$(header location)" = "$location" ] || fail "the resubmission lands on the same operation"
[ "$(header tool-contracts-outcome)" = "replayed" ] || fail "the resubmission is a replay"
[ "$(effects order)" = 1 ] || fail "one order in the ledger after a submission, five reloads and a resubmission"
ok "one order in the ledger"
# curl -L follows the 303 with a GET, as a browser does.
final="$(curl -sS -L -o "$work/body" -w '%{http_code} %{url_effective}' "${form[@]}" "$base/tools/create_order")"
[ "$final" = "200 $base$location" ] || fail "following the redirect: $final"
ok "curl -L ends on the operation with 200"

echo "== JSON: the same intent, the same operation"
req POST /tools/create_order -H 'Content-Type: application/json' --data "$order_json"
expect 303 "the same intent as JSON"
[ "$(header location)" = "$location" ] || fail "JSON and the form make the same key"
req POST /tools/create_order -H 'Content-Type: application/json' -H 'Prefer: return=representation' --data "$order_json"
expect 200 "Prefer: return=representation"
[ "$(header content-location)" = "$location" ] || fail "Content-Location is the operation"
[ "$(jget order_id)" = 1 ] && [ "$(jget total_cents)" = 2500 ] || fail "the representation is the order"
cp "$work/body" "$work/representation"
req GET "$location"
expect 200 "GET the operation as JSON"
[ "$(header content-type)" = "application/json" ] || fail "the operation is JSON by default"
[ "$(jget state)" = completed ] || fail "state completed"
python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["result"]; b=json.load(open(sys.argv[2])); assert a==b, (a,b)' "$work/body" "$work/representation" || fail "the POST's representation and the GET agree"
[ "$(effects order)" = 1 ] || fail "still one order"
ok "still one order"

echo "== the client's Idempotency-Key narrows the intent"
req POST /tools/create_order -H 'Content-Type: application/json' -H 'Idempotency-Key: "click-1"' --data "$order_json"
expect 303 "Idempotency-Key click-1"
keyed="$(header location)"
[ "$keyed" != "$location" ] || fail "another client key is another call"
req POST /tools/create_order -H 'Content-Type: application/json' -H 'Idempotency-Key: click-1' --data "$order_json"
[ "$(header location)" = "$keyed" ] || fail "the same client key (bare or quoted) is the same call"
[ "$(effects order)" = 2 ] || fail "two orders: one per client key"
req GET "$keyed"
expect 200 "the keyed operation, read without the key"
req POST /tools/create_order -H 'Content-Type: application/json' -H "Idempotency-Key: $(printf 'k%.0s' $(seq 1 300))" --data "$order_json"
problem 400 InvalidArguments "a 300-character Idempotency-Key"
[ "$(jget field)" = "Idempotency-Key" ] || fail "the problem names the header"

echo "== what is refused"
req POST /tools/create_order -d user_id=seven -d cart.id=c -d cart.items.0.sku=x -d cart.items.0.qty=1 -d cart.items.0.unit_cents=1 -d note=
problem 400 InvalidArguments "a form value that does not convert"
[ "$(jget field)" = user_id ] || fail "the problem names user_id"
req POST /tools/create_order -H 'Content-Type: application/json' --data '{"user_id": 7,'
problem 400 InvalidArguments "a body that is not JSON"
req POST /tools/create_ordr -H 'Content-Type: application/json' --data '{}'
problem 404 UnknownTool "an unknown tool"
[ "$(jget suggestion)" = create_order ] || fail "the closest tool is suggested"
req GET "/operations/$(printf '0%.0s' $(seq 1 64))"
problem 404 OperationNotFound "a key never used"
req GET /tools/create_order
problem 405 MethodNotAllowed "GET of a tool"
[ "$(header allow)" = POST ] || fail "Allow: POST"
head -c 3145728 /dev/zero | tr '\0' 'a' > "$work/big"
req POST /tools/create_order -H 'Content-Type: application/json' --data-binary "@$work/big"
problem 413 PayloadTooLarge "a 3 MiB body"
req POST /tools/create_order -H 'Content-Type: text/plain' --data 'user_id=7'
problem 415 UnsupportedMediaType "a text/plain body"
[ "$(header accept-post)" = "application/json, application/x-www-form-urlencoded" ] || fail "Accept-Post"
req POST /tools/create_order -H 'Sec-Fetch-Site: cross-site' -H 'Origin: https://evil.example' -d user_id=66 -d cart.id=c -d cart.items.0.sku=x -d cart.items.0.qty=1 -d cart.items.0.unit_cents=1 -d note=
problem 403 CrossOrigin "a cross-site form post"
[ "$(effects order user_id 66)" = 0 ] || fail "the cross-site post placed no order"
req POST /tools/create_order -H 'Content-Type: application/json' --data "${order_json/ring twice/leave at the door}"
problem 422 KeyReused "the same key with another note"
[ "$(jget params)" = '["note"]' ] || fail "the problem names note"
[ "$(jget operation)" = "$location" ] || fail "the problem links the first call's operation"
req POST /tools/create_order -H 'Content-Type: application/json' --data '{"user_id":8,"cart":{"id":"empty","items":[]},"note":""}'
problem 422 ToolFailed "an empty cart (the tool's own error)"

echo "== escaping: the result is user data"
req POST /tools/create_order -d user_id=9 --data-urlencode 'cart.id=<script>alert(1)</script>' -d cart.items.0.sku=x -d cart.items.0.qty=1 -d cart.items.0.unit_cents=1 -d note=
expect 303 "an order whose cart id is markup"
req GET "$(header location)" "${browser[@]}"
expect 200 "its operation page"
grep -q '&lt;script&gt;alert(1)&lt;/script&gt;' "$work/body" || fail "the cart id is escaped"
grep -q '<script>' "$work/body" && fail "the page carries the script"
ok "the page shows the markup as text"

echo "== a refund in flight: 409 for a duplicate, 202 for its operation"
refund='{"charge_id":"ch_1","amount_cents":2500,"reason":"damaged"}'
curl -sS -o "$work/first-refund" -D "$work/first-refund-headers" -H 'Content-Type: application/json' --data "$refund" "$base/tools/refund_charge" &
first_refund=$!
for _ in $(seq 1 50); do [ "$(effects refund charge_id ch_1)" = 1 ] && break; sleep 0.1; done
[ "$(effects refund charge_id ch_1)" = 1 ] || fail "the refund started"
req POST /tools/refund_charge -H 'Content-Type: application/json' --data "$refund"
problem 409 InProgress "a duplicate of a running refund"
retry_after="$(header retry-after)"
[ -n "$retry_after" ] && [ "$retry_after" -ge 1 ] || fail "Retry-After on the 409: '$retry_after'"
refund_op="$(jget operation)"
req GET "$refund_op"
expect 202 "the running refund's operation"
[ "$(jget state)" = in_progress ] || fail "state in_progress"
[ -n "$(header retry-after)" ] || fail "Retry-After on the 202"
wait "$first_refund"
grep -qi "^location: $refund_op" "$work/first-refund-headers" || fail "the first refund redirects to the same operation"
req GET "$refund_op"
expect 200 "the finished refund's operation"
[ "$(effects refund charge_id ch_1)" = 1 ] || fail "one refund"

echo "== a server SIGKILLed mid-refund: the retry is an unknown outcome, never a second refund"
refund2='{"charge_id":"ch_2","amount_cents":900,"reason":"late"}'
curl -sS -o /dev/null -H 'Content-Type: application/json' --data "$refund2" "$base/tools/refund_charge" 2>/dev/null &
doomed=$!
for _ in $(seq 1 50); do [ "$(effects refund charge_id ch_2)" = 1 ] && break; sleep 0.1; done
[ "$(effects refund charge_id ch_2)" = 1 ] || fail "the second refund started"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
wait "$doomed" 2>/dev/null || true
start shop-restarted shop.db --
sleep 2.5 # the dead worker's 2 s lease runs out
req POST /tools/refund_charge -H 'Content-Type: application/json' --data "$refund2"
problem 500 OutcomeUnknown "the retry after the crash"
req GET "$(jget operation)"
expect 500 "the unknown operation"
[ "$(jget state)" = unknown ] || fail "state unknown"
[ "$(effects refund charge_id ch_2)" = 1 ] || fail "the refund was not repeated"
ok "one refund for ch_2"

echo "== a locked store: 503, nothing ran"
python3 - "$work/shop.db" >"$work/lock.out" 2>&1 <<'PY' &
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(9)
PY
locker=$!
pids+=("$locker")
for _ in $(seq 1 50); do grep -q locked "$work/lock.out" && break; sleep 0.1; done
grep -q locked "$work/lock.out" || fail "the store could not be locked: $(cat "$work/lock.out")"
req POST /tools/create_order -H 'Content-Type: application/json' --data '{"user_id":77,"cart":{"id":"c","items":[{"sku":"x","qty":1,"unit_cents":1}]},"note":""}'
problem 503 StoreUnavailable "a call while the store is locked"
[ "$(effects order user_id 77)" = 0 ] || fail "nothing ran while the store was locked"
ok "no order while the store was locked"
kill "$locker" 2>/dev/null || true
wait "$locker" 2>/dev/null || true
kill "$pid"
wait "$pid" 2>/dev/null || true

echo "== approval over HTTP: a refund waits for a person; approved with curl while the agent retries, it runs once"
# refund_order has approval = "required"; its effect sleeps 1.5 s so the agent's retry
# arrives while the approved refund runs. With --tenant-header: decisions keep the scope.
start approval approval.db SHOP_ORDER_REFUND_DELAY_MS=1500 -- --tenant-header
acme=(-H 'X-Tenant: acme' -H 'Content-Type: application/json')
order_refund='{"order_id":1,"amount_cents":2500,"reason":"damaged"}'
req POST /tools/refund_order "${acme[@]}" --data "$order_refund"
expect 202 "a refund that needs approval"
op="$(header location)"
[ "$(jget state)" = awaiting_approval ] || fail "state awaiting_approval"
[ "$(header content-location)" = "$op" ] || fail "Content-Location is the operation"
req POST /tools/refund_order "${acme[@]}" --data "$order_refund"
expect 202 "the agent asks again: the same request"
[ "$(header location)" = "$op" ] || fail "the same operation"
req GET "$op" -H 'X-Tenant: acme' "${browser[@]}"
expect 202 "the operation page, awaiting approval"
grep -q 'id="approve-form"' "$work/body" || fail "the page has the approve form"
grep -q '&quot;reason&quot;: &quot;damaged&quot;' "$work/body" || fail "the page shows the arguments"
[ "$(effects order_refund)" = 0 ] || fail "nothing ran before the approval"
ok "no refund before the approval"
req POST "$op/approve" -H 'X-Tenant: globex' -H 'Content-Type: application/json' --data '{"by":"mallory"}'
problem 404 OperationNotFound "another tenant approving"
req POST "$op/approve" "${acme[@]}" -H 'Sec-Fetch-Site: cross-site' --data '{"by":"mallory"}'
problem 403 CrossOrigin "a cross-site approval"
curl -sS -o "$work/approve-body" -D "$work/approve-headers" "${acme[@]}" --data '{"by":"alice"}' "$base$op/approve" &
approving=$!
for _ in $(seq 1 50); do [ "$(effects order_refund)" = 1 ] && break; sleep 0.1; done
[ "$(effects order_refund)" = 1 ] || fail "the approval started the refund"
req POST /tools/refund_order "${acme[@]}" --data "$order_refund"
expect 303 "the agent's retry while the approved refund runs (waits, then replays)"
[ "$(header location)" = "$op" ] && [ "$(header tool-contracts-outcome)" = replayed ] || fail "the retry replays the approved refund"
wait "$approving"
head -1 "$work/approve-headers" | grep -q ' 200' || fail "approve answered $(head -1 "$work/approve-headers")"
grep -qi '^tool-contracts-outcome: executed' "$work/approve-headers" || fail "the approval ran the refund"
[ "$(jget state "$work/approve-body")" = completed ] || fail "approve answers the completed operation"
[ "$(jget approval.decision.by "$work/approve-body")" = alice ] && [ "$(jget approval.decision.channel "$work/approve-body")" = http ] || fail "decided by alice through http"
ok "200 approve with curl: the refund ran"
req GET "$op" -H 'X-Tenant: acme'
expect 200 "the approved refund's operation"
[ "$(jget result.refund_id)" = "$(jget result.refund_id "$work/approve-body")" ] || fail "the read and the approval agree"
[ "$(effects order_refund)" = 1 ] || fail "one refund after the approval and the retry"
ok "one refund in the ledger"
req POST "$op/deny" "${acme[@]}" --data '{"by":"bob","reason":"too late"}'
problem 409 NoPendingApproval "denying an approved refund"
order_refund2='{"order_id":2,"amount_cents":900,"reason":"changed my mind"}'
req POST /tools/refund_order "${acme[@]}" --data "$order_refund2"
expect 202 "a second refund"
op2="$(header location)"
req POST "$op2/deny" "${acme[@]}" --data '{"by":"bob"}'
problem 400 InvalidArguments "a denial without a reason"
[ "$(jget field)" = reason ] || fail "the problem names reason"
req POST "$op2/deny" -H 'X-Tenant: acme' -H 'X-User: bob' -d 'reason=the goods were kept'
expect 200 "deny with a form, as X-User bob"
[ "$(jget state)" = denied ] && [ "$(jget approval.decision.by)" = bob ] || fail "denied by bob"
for i in 1 2; do
  req POST /tools/refund_order "${acme[@]}" --data "$order_refund2"
  problem 403 Denied "the agent's retry $i of the denied refund"
  [ "$(jget by)" = bob ] && [ "$(jget reason)" = "the goods were kept" ] && [ "$(jget operation)" = "$op2" ] || fail "the denial names who, why and the operation"
done
[ "$(effects order_refund order_id 2)" = 0 ] || fail "the denied refund never ran"
ok "no refund for the denied order"
kill "$pid"
wait "$pid" 2>/dev/null || true

echo "== tenants (--tenant-header): another tenant reads 404"
start tenants tenants.db -- --tenant-header
req POST /tools/create_order -H 'Content-Type: application/json' --data "$order_json"
expect 401 "a call without X-Tenant"
[ -n "$(header www-authenticate)" ] || fail "WWW-Authenticate on the 401"
req POST /tools/create_order -H 'X-Tenant: acme' -H 'Content-Type: application/json' --data "$order_json"
expect 303 "acme's order"
acme="$(header location)"
req GET "$acme" -H 'X-Tenant: acme'
expect 200 "acme reads its operation"
req GET "$acme" -H 'X-Tenant: globex'
problem 404 OperationNotFound "globex reads acme's operation"
req GET "$acme"
expect 401 "a read without X-Tenant"
req POST /tools/create_order -H 'X-Tenant: globex' -H 'Content-Type: application/json' --data "$order_json"
expect 303 "globex's order of the same intent"
[ "$(header location)" != "$acme" ] || fail "another tenant's intent is another key"
kill "$pid"
wait "$pid" 2>/dev/null || true

echo "$passed passed, 0 failed"
