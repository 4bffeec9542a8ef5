"""Python httpx against examples/http_shop on a SQLite file (run by tests/http/httpx.sh):

1. 50 concurrent requests of ONE intent to `POST /tools/create_order`: one execution in the
   ledger, every other answer a replay (303 to the same operation) or 409.
2. 50 concurrent requests with ONE `Idempotency-Key` to `POST /payments`, a plain axum
   handler behind `IdempotencyLayer`: one payment in the ledger, every other answer the
   replayed 201 (`Idempotent-Replayed: true`, the same body) or 409 with `Retry-After`.
3. The server SIGKILLed while a `charge_card` call (a tool with `verify`) and a payment are
   mid-handler, restarted on the same SQLite file: the charge's retry is reconciled
   (`Tool-Contracts-Outcome: reconciled`), the payment's retry is the unknown outcome (500,
   problem type OutcomeUnknown); neither is run again (one charge, one payment).

The crash windows are the shop's environment knobs (examples/support/shop.rs), each a
sleep after the effect and before the result is stored: SHOP_ORDER_DELAY_MS,
SHOP_PAYMENT_DELAY_MS, MCP_SHOP_CHARGE_DELAY_MS.

Usage: httpx_e2e.py path/to/http_shop. Exits non-zero on the first failure, printing the
server's log.
"""

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import httpx

BINARY = sys.argv[1]
WORK = tempfile.mkdtemp(prefix="httpx-shop.")
DB = os.path.join(WORK, "shop.db")
CONCURRENT = 50
# The payments route's and charge_card's lease (examples/http_shop.rs, support/shop.rs).
LEASE_S = 2.0
PROBLEM_TYPE = "https://docs.rs/tool-contracts/latest/tool_contracts/http/enum.ProblemType.html#variant."

servers = []
passed = 0


def fail(message):
    print(f"FAILED: {message}", file=sys.stderr)
    for _, log in servers:
        print(f"--- server log ({log})", file=sys.stderr)
        with open(log) as f:
            print(f.read(), file=sys.stderr)
    print(f"{passed} passed, 1 failed")
    cleanup()
    sys.exit(1)


def ok(message):
    global passed
    passed += 1
    print(f"ok: {message}", flush=True)


def check(condition, message):
    if not condition:
        fail(message)


def cleanup():
    for proc, _ in servers:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shutil.rmtree(WORK, ignore_errors=True)


def start(name, **env):
    """Starts http_shop on a free port; returns (process, base URL)."""
    log = os.path.join(WORK, f"{name}.log")
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [BINARY, "--addr", "127.0.0.1:0", "--db", DB],
            stderr=err,
            stdout=subprocess.DEVNULL,
            env={**os.environ, **env},
        )
    servers.append((proc, log))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(log) as f:
            found = re.search(r"listening on (http://[0-9.:]+)", f.read())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            fail(f"{name} exited at start ({proc.returncode})")
        time.sleep(0.05)
    fail(f"{name} did not say where it listens")


def effects(base, kind, **match):
    """How many effects of `kind` the ledger holds (with the given members)."""
    entries = httpx.get(f"{base}/ledger", timeout=10).json()
    return sum(
        1
        for e in entries
        if e["effect"] == kind and all(e.get(k) == v for k, v in match.items())
    )


def is_problem(response, status, variant):
    if response.status_code != status:
        return False
    if response.headers.get("content-type") != "application/problem+json":
        return False
    doc = response.json()
    return doc.get("type") == PROBLEM_TYPE + variant and doc.get("status") == status


async def concurrently(base, make):
    """Sends CONCURRENT requests at once (one connection each); returns the responses."""
    limits = httpx.Limits(max_connections=CONCURRENT * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        return await asyncio.gather(*(make(client) for _ in range(CONCURRENT)))


ORDER = {
    "user_id": 7,
    "cart": {"id": "cart-httpx", "items": [{"sku": "coffee-beans", "qty": 2, "unit_cents": 1250}]},
    "note": "fifty clicks",
}


def one_intent_to_a_tool(base):
    responses = asyncio.run(
        concurrently(base, lambda c: c.post("/tools/create_order", json=ORDER))
    )
    statuses = sorted({r.status_code for r in responses})
    check(set(statuses) <= {303, 409}, f"create_order answers {statuses}, expected 303 or 409")
    redirects = [r for r in responses if r.status_code == 303]
    check(redirects, "no create_order request was answered with 303")
    for r in responses:
        if r.status_code == 409:
            check(is_problem(r, 409, "InProgress") and r.headers.get("retry-after"), f"a 409 without its problem or Retry-After: {r.text}")
    outcomes = [r.headers.get("tool-contracts-outcome") for r in redirects]
    check(outcomes.count("executed") == 1, f"outcomes {outcomes}: expected exactly one executed")
    check(set(outcomes) <= {"executed", "replayed"}, f"outcomes {set(outcomes)}")
    locations = {r.headers["location"] for r in redirects}
    check(len(locations) == 1, f"the redirects go to {locations}, expected one operation")
    check(effects(base, "order", cart_id="cart-httpx") == 1, "expected one order in the ledger")
    ok(f"{CONCURRENT} concurrent create_order of one intent: one order, "
       f"{outcomes.count('replayed')} replayed, {len(responses) - len(redirects)} in progress (409)")
    return locations.pop()


def one_key_to_a_plain_handler(base):
    key = str(uuid.uuid4())
    payment = {"amount_cents": 4200, "reference": "inv-httpx"}
    responses = asyncio.run(
        concurrently(
            base,
            lambda c: c.post("/payments", json=payment, headers={"Idempotency-Key": key}),
        )
    )
    statuses = sorted({r.status_code for r in responses})
    check(set(statuses) <= {201, 409}, f"/payments answers {statuses}, expected 201 or 409")
    created = [r for r in responses if r.status_code == 201]
    first = [r for r in created if r.headers.get("idempotent-replayed") is None]
    check(len(first) == 1, f"{len(first)} first executions answered, expected one")
    for r in created:
        check(r.content == first[0].content, "a replay differs from the first response")
        check(r.headers.get("location") == first[0].headers.get("location"), "a replay's Location differs")
    for r in responses:
        if r.status_code == 409:
            check(is_problem(r, 409, "InProgress") and r.headers.get("retry-after"), f"a 409 without its problem or Retry-After: {r.text}")
    check(effects(base, "payment", reference="inv-httpx") == 1, "expected one payment in the ledger")
    late = httpx.post(f"{base}/payments", json=payment, headers={"Idempotency-Key": key}, timeout=10)
    check(late.status_code == 201 and late.headers.get("idempotent-replayed") == "true", f"a late retry: {late.status_code} {late.headers}")
    check(late.content == first[0].content, "the late replay differs from the first response")
    reused = httpx.post(f"{base}/payments", json={**payment, "amount_cents": 1}, headers={"Idempotency-Key": key}, timeout=10)
    check(is_problem(reused, 422, "KeyReused") and reused.json()["params"] == ["body"], f"the key with another body: {reused.status_code} {reused.text}")
    missing = httpx.post(f"{base}/payments", json=payment, timeout=10)
    check(is_problem(missing, 400, "InvalidArguments"), f"no key: {missing.status_code} {missing.text}")
    check(effects(base, "payment", reference="inv-httpx") == 1, "still one payment")
    ok(f"{CONCURRENT} concurrent /payments with one Idempotency-Key: one payment, "
       f"{len(created) - 1} replayed, {len(responses) - len(created)} in progress (409); "
       "then a replay, 422 for another body, 400 without a key")


async def doomed(base, charge, payment_key):
    """Starts a charge and a payment; both die with the server."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        results = await asyncio.gather(
            client.post("/tools/charge_card", json=charge),
            client.post("/payments", json={"amount_cents": 999, "reference": "inv-killed"}, headers={"Idempotency-Key": payment_key}),
            return_exceptions=True,
        )
    return results


def killed_mid_request(proc, base):
    charge = {"order_id": 1, "amount_cents": 2500, "card_token": "tok_visa"}
    payment_key = str(uuid.uuid4())
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(r=asyncio.run(doomed(base, charge, payment_key))))
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if effects(base, "charge", order_id=1) == 1 and effects(base, "payment", reference="inv-killed") == 1:
            break
        time.sleep(0.02)
    else:
        fail("the charge and the payment did not both start")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = time.monotonic()
    thread.join()
    check(all(isinstance(r, Exception) for r in outcome["r"]), f"a request finished before the kill: {outcome['r']}")
    ok("the server SIGKILLed with a charge and a payment mid-handler")

    proc, base = start("restarted")
    # The dead server's leases run out (2 s); before that the payment is 409.
    time.sleep(max(0.0, LEASE_S + 0.5 - (time.monotonic() - killed_at)))
    retry = httpx.post(f"{base}/tools/charge_card", json=charge, timeout=30)
    check(retry.status_code == 303, f"the charge's retry: {retry.status_code} {retry.text}")
    check(retry.headers.get("tool-contracts-outcome") == "reconciled", f"the charge's retry is {retry.headers.get('tool-contracts-outcome')}, expected reconciled")
    check(effects(base, "charge", order_id=1) == 1, "the charge was repeated")
    ok("the charge's retry after the restart is reconciled by verify: one charge")

    for attempt in range(2):
        retry = httpx.post(f"{base}/payments", json={"amount_cents": 999, "reference": "inv-killed"}, headers={"Idempotency-Key": payment_key}, timeout=30)
        check(is_problem(retry, 500, "OutcomeUnknown"), f"the payment's retry {attempt + 1}: {retry.status_code} {retry.text}")
    check(retry.json().get("idempotency_key") == payment_key, "the problem names the key")
    check(effects(base, "payment", reference="inv-killed") == 1, "the payment was repeated")
    ok("the payment's retries after the restart are the unknown outcome (500): one payment")
    return proc


def main():
    try:
        proc, base = start(
            "shop",
            SHOP_ORDER_DELAY_MS="300",
            SHOP_PAYMENT_DELAY_MS="1500",
            MCP_SHOP_CHARGE_DELAY_MS="1500",
        )
        one_intent_to_a_tool(base)
        one_key_to_a_plain_handler(base)
        proc = killed_mid_request(proc, base)
        print(f"{passed} passed, 0 failed")
    except SystemExit:
        raise
    except Exception as e:  # an exception is a failure, with the server's log
        fail(f"{type(e).__name__}: {e}")
    cleanup()


main()
