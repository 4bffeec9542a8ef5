#!/usr/bin/env python3
"""End-to-end test of `tool_contracts::mcp` with a real MCP client: the official Python SDK
(`mcp`, pinned in requirements.txt) against `examples/mcp_shop`, over stdio and over
streamable HTTP (127.0.0.1, a free port).

For each transport:
 1. tools/list: annotations and the idempotency contract under `_meta`;
 2. `create_order` twice with the same arguments (the second is a replay, one effect), then
    with another `note` (an isError result naming `note`); client intent keys, sent as
    `_meta["dev.tool-contracts/idempotencyKey"]` and as `params.idempotencyKey`, and refused
    when invalid; an unknown tool is a JSON-RPC error;
 3. `charge_card` sleeps after charging: the server is killed with SIGKILL in that sleep,
    restarted on the same SQLite file, and the same call retried: the answer is the
    reconciled charge (the tool declares `verify`) or an OutcomeUnknown error (it does not),
    per the contract the server publishes, and the ledger shows exactly one charge;
 4. a long `charge_card` called with a `progress_callback` reports progress at each renewal
    of its lease; 50 concurrent identical calls: one effect, one execution, 49 replays;
 5. an independent client computes the key of calls of every keyed tool from `tools/list`
    alone (the published `keyFields`, `version` and `keySpec`) and the JSON arguments it
    sends, with tests/key_vectors.py's implementation of docs/key-spec.md, and gets the
    key the server reports in `_meta`: nested paths (`cart.id`), an integer beyond 2^53,
    non-ASCII text, a client intent key (the scope `client:<key>`), and `ship_order`, keyed
    on an address whose JSON member names are serde renames (`postalCode`);
 6. Post/Redirect/Get: a result's `resource_link` read with `resources/read`, after a
    SIGKILL and restart too, through `get_operation`, and not found from another tenant;
 7. MCP Tasks (SEP-2663): a task-augmented `create_order` is named by its key, a retry names
    the same task, `tasks/get` is polled to completion with the result inline; a
    task-augmented `charge_card` is killed mid-call (SIGKILL), the restarted server reports
    the task's outcome unknown (reads rerun nothing), the retried call reconciles it through
    `verify`, and the ledger shows one charge.
 8. Approval (`refund_order`, `approval = "required"`), with the client in each protocol era
    (`mode="legacy"`: 2025-11-25 over `initialize`, the server sends `elicitation/create`;
    the default: 2026-07-28, the server answers `input_required` and the SDK retries with
    the answer): a person (the elicitation callback) accepts (the body runs once, a retry
    replays without a question), declines (denied; a retry gets the denial without a
    question) and cancels (still pending, nothing decided); a client without elicitation
    gets a tool error with the operation link, the operator approves with the CLI on the
    same SQLite file, and the retry runs once.

Usage: test_e2e.py <mcp_shop binary> <tool-contracts CLI binary>   (tests/mcp/run.sh builds
them and runs this)
Exits non-zero on any failure, after printing the servers' stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Literal

import anyio
from mcp import Client, StdioServerParameters, types
from mcp.client.extension import advertise
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

# The independent implementation of docs/key-spec.md (standard library only; it also
# generates tests/key_vectors.json, which the Rust implementation is checked against).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import key_vectors  # noqa: E402

CONTRACT = "dev.tool-contracts/idempotency"
CALL = "dev.tool-contracts/call"
CLIENT_KEY = "dev.tool-contracts/idempotencyKey"
# The crash window of charge_card: long enough to kill the server in it, never waited out.
CHARGE_DELAY_MS = "30000"
OVERALL_TIMEOUT_S = 300


class KeyedCallParams(types.CallToolRequestParams):
    """tools/call params with `idempotencyKey`, the MCP idempotency proposal's shape (the SDK
    has no field for it)."""

    idempotency_key: str | None = None


class KeyedCallRequest(types.CallToolRequest):
    params: KeyedCallParams


# The MCP Tasks extension (SEP-2663). The Python SDK 2.3.0 has no support for it beyond
# advertising an extension identifier (`advertise`, which puts it in the client capabilities
# it stamps on every request): the task-augmented `tools/call` and `tasks/get` /
# `tasks/cancel` are sent as raw JSON-RPC through the SDK's own session (`send_request` with
# a generic request model and a plain-dict result), so the SDK still frames, stamps and
# routes them (the `Mcp-Name` header SEP-2663 requires over HTTP included).
TASKS = "io.modelcontextprotocol/tasks"
RAW = TypeAdapter(dict[str, Any])


class TaskParams(types.RequestParams):
    """Params of `tasks/get` and `tasks/cancel`: `{"taskId": ...}`."""

    task_id: str


class GetTaskRequest(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class CancelTaskRequest(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class Failure(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Failure(message)


def call_meta(result: types.CallToolResult) -> dict[str, Any]:
    meta = result.meta or {}
    check(CALL in meta, f"result has no _meta[{CALL!r}]: {result}")
    return meta[CALL]


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


class Ledger:
    """The shop's effects, as the example appends them (one JSON object a line)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def count(self, effect: str, **fields: Any) -> int:
        return sum(
            1
            for e in self.entries()
            if e.get("effect") == effect and all(e.get(k) == v for k, v in fields.items())
        )


class Server:
    """One run of the example server; `logs` keeps every run's stderr for failure reports."""

    def __init__(self, harness: "Harness", env: dict[str, str]) -> None:
        self.harness = harness
        self.env = env
        self.log_path = harness.dir / f"server-{len(harness.logs)}.stderr"
        harness.logs.append(self.log_path)

    def pid(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            match = re.search(r"mcp_shop: pid (\d+)", self.log_path.read_text() if self.log_path.exists() else "")
            if match:
                return int(match.group(1))
            time.sleep(0.05)
        raise Failure(f"the server never printed its pid to {self.log_path}")

    def kill(self) -> None:
        os.kill(self.pid(), signal.SIGKILL)


class Harness:
    """Starts the example over one transport and opens SDK clients to it."""

    name = ""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.dir = directory
        self.db = directory / "shop.db"
        self.ledger = Ledger(Path(str(self.db) + ".ledger.jsonl"))
        self.logs: list[Path] = []

    def server_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "MCP_SHOP_CHARGE_DELAY_MS"}
        env.update(extra)
        return env

    @contextlib.asynccontextmanager
    async def connect(
        self, tenant: str | None = None, tasks: bool = False, client: dict[str, Any] | None = None, **env: str
    ) -> AsyncIterator[tuple[Client, Server]]:
        """A client of a fresh server; `tasks`: the client declares the tasks extension;
        `client`: more keyword arguments of `Client` (`mode`, `elicitation_callback`, …)."""
        raise NotImplementedError
        yield  # pragma: no cover


class StdioHarness(Harness):
    name = "stdio"

    @contextlib.asynccontextmanager
    async def connect(
        self, tenant: str | None = None, tasks: bool = False, client: dict[str, Any] | None = None, **env: str
    ) -> AsyncIterator[tuple[Client, Server]]:
        server = Server(self, self.server_env(env))
        with open(server.log_path, "w") as errlog:
            params = StdioServerParameters(
                command=self.binary, args=["--stdio", "--db", str(self.db), *tenant_args(tenant)], env=server.env
            )
            async with Client(
                stdio_client(params, errlog=errlog), extensions=extensions(tasks), **(client or {})
            ) as session:
                yield session, server


class HttpHarness(Harness):
    name = "http"

    @contextlib.asynccontextmanager
    async def connect(
        self, tenant: str | None = None, tasks: bool = False, client: dict[str, Any] | None = None, **env: str
    ) -> AsyncIterator[tuple[Client, Server]]:
        server = Server(self, self.server_env(env))
        errlog = open(server.log_path, "w")
        process = await anyio.open_process(
            [self.binary, "--http", "127.0.0.1:0", "--db", str(self.db), *tenant_args(tenant)],
            env=server.env,
            stdin=None,
            stdout=errlog,
            stderr=errlog,
        )
        try:
            url = None
            with anyio.fail_after(30):
                while url is None:
                    match = re.search(r"listening on (http://127\.0\.0\.1:\d+/mcp)", server.log_path.read_text())
                    if match:
                        url = match.group(1)
                    elif process.returncode is not None:
                        raise Failure(f"the HTTP server exited with {process.returncode}")
                    else:
                        await anyio.sleep(0.05)
            async with Client(url, extensions=extensions(tasks), **(client or {})) as session:
                yield session, server
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.move_on_after(10):
                await process.wait()
            errlog.close()


def tenant_args(tenant: str | None) -> list[str]:
    return ["--tenant", tenant] if tenant else []


def extensions(tasks: bool) -> list[Any] | None:
    return [advertise(TASKS)] if tasks else None


def order_args(user_id: int, cart_id: str, note: str = "leave at the door") -> dict[str, Any]:
    return {
        "user_id": user_id,
        "cart": {"id": cart_id, "items": [{"sku": "book", "qty": 2, "unit_cents": 1250}]},
        "note": note,
    }


async def tools_are_listed_with_annotations_and_contract(h: Harness) -> None:
    async with h.connect() as (client, _):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        check({"create_order", "charge_card", "ship_order", "get_order"} <= set(tools), f"tools: {sorted(tools)}")
        for tool in tools.values():
            check(tool.input_schema.get("type") == "object", f"{tool.name}: inputSchema {tool.input_schema}")
            check(tool.description, f"{tool.name} has no description")
            if tool.output_schema is not None:
                check(tool.output_schema.get("type") == "object", f"{tool.name}: outputSchema {tool.output_schema}")
        order = tools["create_order"]
        a = order.annotations
        check(
            a is not None and a.read_only_hint is False and a.idempotent_hint is True and a.destructive_hint is False,
            f"create_order annotations: {a}",
        )
        contract = (order.meta or {}).get(CONTRACT)
        check(contract is not None, f"create_order has no _meta[{CONTRACT!r}]: {order.meta}")
        check(contract["kind"] == "mutating", f"contract: {contract}")
        check(sorted(contract["keyFields"]) == ["cart.id", "user_id"], f"keyFields: {contract}")
        check(contract["version"] == 1 and contract["ttlSeconds"] == 86400 and contract["leaseSeconds"] == 30, f"contract: {contract}")
        check(contract["concurrent"] == "wait" and contract["payloadMismatch"] == "reject", f"contract: {contract}")
        check(contract["onUnknown"] == "fail" and contract["keySpec"] == "tool-contracts/key/v1", f"contract: {contract}")
        check(order.output_schema and "order_id" in order.output_schema.get("properties", {}), f"create_order outputSchema: {order.output_schema}")
        charge = tools["charge_card"]
        check(charge.annotations and charge.annotations.open_world_hint is True, f"charge_card annotations: {charge.annotations}")
        charge_contract = (charge.meta or {}).get(CONTRACT, {})
        check(charge_contract.get("keyFields") == ["order_id"] and charge_contract.get("leaseSeconds") == 2, f"charge_card contract: {charge_contract}")
        check("verify" in charge_contract, f"charge_card contract has no `verify`: {charge_contract}")
        # `compensate = path`: a run's compensation can undo a charge, not an order.
        check(charge_contract.get("compensable") is True and contract.get("compensable") is False, f"compensable: {charge_contract} / {contract}")
        get = tools["get_order"]
        check(get.annotations and get.annotations.read_only_hint is True, f"get_order annotations: {get.annotations}")
        check((get.meta or {}).get(CONTRACT) == {"kind": "read_only"}, f"get_order contract: {get.meta}")
        # Option<OrderView> is not an object: published wrapped as {"result": ...}.
        check(get.output_schema and get.output_schema.get("required") == ["result"], f"get_order outputSchema: {get.output_schema}")


async def a_retry_is_replayed_and_a_changed_argument_is_refused(h: Harness) -> None:
    args = order_args(7, f"cart-retry-{h.name}")
    async with h.connect() as (client, _):
        first = await client.call_tool("create_order", args)
        check(not first.is_error, f"first call failed: {text_of(first)}")
        m1 = call_meta(first)
        check(m1["outcome"] == "executed" and not m1["replayed"], f"first call: {m1}")
        check(isinstance(m1["key"], str) and len(m1["key"]) == 64, f"key: {m1}")
        check(json.loads(text_of(first)) == first.structured_content, "text block != structuredContent")
        second = await client.call_tool("create_order", args)
        m2 = call_meta(second)
        check(not second.is_error and m2["outcome"] == "replayed" and m2["replayed"], f"second call: {m2} {text_of(second)}")
        check(m2["key"] == m1["key"], "the retry got another key")
        check(second.structured_content == first.structured_content, "the replay differs from the first result")
        check(h.ledger.count("order", key=m1["key"]) == 1, f"orders placed: {h.ledger.count('order', key=m1['key'])}")

        changed = await client.call_tool("create_order", {**args, "note": "ring twice"})
        check(changed.is_error is True, f"a changed note was not refused: {changed}")
        check("`note`" in text_of(changed), f"the refusal does not name `note`: {text_of(changed)}")
        mc = call_meta(changed)
        check(mc["error"] == "key_reused" and mc["key"] == m1["key"] and mc["outcome"] == "rejected", f"refusal meta: {mc}")
        check(h.ledger.count("order", key=m1["key"]) == 1, "the refused call placed an order")

        # A client intent key makes another key (a narrower scope): one more effect, replayed
        # whether the key comes as _meta or as params.idempotencyKey.
        keyed = await client.call_tool("create_order", args, meta={CLIENT_KEY: f"intent-{h.name}-1"})
        mk = call_meta(keyed)
        check(not keyed.is_error and mk["outcome"] == "executed" and mk["clientKey"] == f"intent-{h.name}-1", f"keyed: {mk}")
        check(mk["key"] != m1["key"], "a client key did not change the key")
        again = await client.session.send_request(
            KeyedCallRequest(
                params=KeyedCallParams(name="create_order", arguments=args, idempotency_key=f"intent-{h.name}-1")
            ),
            types.CallToolResult,
        )
        ma = call_meta(again)
        check(not again.is_error and ma["outcome"] == "replayed" and ma["key"] == mk["key"], f"params.idempotencyKey retry: {ma}")
        check(h.ledger.count("order", key=mk["key"]) == 1, "the client-keyed intent ran twice")

        for bad, why in (("", "empty"), ("x" * 256, "256 characters"), ("a\nb", "a control character")):
            refused = await client.call_tool("create_order", args, meta={CLIENT_KEY: bad})
            check(refused.is_error is True, f"a client key with {why} was accepted")
            check("idempotency key" in text_of(refused), f"unclear refusal: {text_of(refused)}")
            check(call_meta(refused)["error"] == "invalid_arguments", f"refusal meta: {call_meta(refused)}")
        conflicting = await client.session.send_request(
            KeyedCallRequest(
                params=KeyedCallParams(name="create_order", arguments=args, idempotency_key="a", _meta={CLIENT_KEY: "b"})
            ),
            types.CallToolResult,
        )
        check(conflicting.is_error is True and "two different" in text_of(conflicting), f"conflicting keys: {text_of(conflicting)}")

        bad_args = await client.call_tool("create_order", {"user_id": 7, "cart": {"id": ""}, "note": "x"})
        check(bad_args.is_error is True and call_meta(bad_args)["error"] == "invalid_arguments", f"bad arguments: {bad_args}")

        try:
            await client.call_tool("create_ordr", args)
            raise Failure("an unknown tool was not a JSON-RPC error")
        except MCPError as e:
            check(e.code == -32602 and "create_order" in e.error.message, f"unknown tool error: {e.code} {e.error.message}")

        view = await client.call_tool("get_order", {"order_id": first.structured_content["order_id"]})
        check(not view.is_error and view.structured_content["result"]["order"] == first.structured_content, f"get_order: {view}")
        check(call_meta(view)["key"] is None and call_meta(view)["outcome"] == "executed", f"read-only meta: {call_meta(view)}")


async def a_crash_after_the_effect_is_reconciled_or_reported_unknown(h: Harness) -> None:
    order_id = 9000 + len(h.name)
    args = {"order_id": order_id, "amount_cents": 2500, "card_token": "tok_visa"}
    outcome: dict[str, Any] = {}
    done = anyio.Event()

    contract: dict[str, Any] = {}
    problems: list[str] = []
    killed = False
    try:
        async with h.connect(MCP_SHOP_CHARGE_DELAY_MS=CHARGE_DELAY_MS) as (client, server):
            tools = {t.name: t for t in (await client.list_tools()).tools}
            contract = (tools["charge_card"].meta or {}).get(CONTRACT, {})

            async def charge() -> None:
                try:
                    outcome["result"] = await client.call_tool("charge_card", args)
                except Exception as e:  # the connection dies with the server
                    outcome["error"] = e
                finally:
                    done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(charge)
                deadline = time.monotonic() + 30
                while h.ledger.count("charge", order_id=order_id) == 0 and not done.is_set():
                    if time.monotonic() > deadline:
                        problems.append("no charge appeared in the ledger within 30 s")
                        break
                    await anyio.sleep(0.02)
                if done.is_set():
                    problems.append(f"the charge returned before the crash window: {outcome}")
                elif not problems:
                    server.kill()  # SIGKILL: charged, result not stored
                    killed = True
                    with anyio.move_on_after(10):
                        await done.wait()
                tg.cancel_scope.cancel()
    except Exception as e:  # the SDK's transport tears down a dead connection noisily
        if not killed:
            raise
        print(f"     (client teardown after the kill: {type(e).__name__})")
    check(not problems, "; ".join(problems))
    check(killed, "the server was not killed")
    check("result" not in outcome, f"the killed server answered: {outcome}")
    check(h.ledger.count("charge", order_id=order_id) == 1, "not exactly one charge before the retry")

    async with h.connect() as (client, _):
        for attempt in range(2):
            with anyio.fail_after(60):
                retry = await client.call_tool("charge_card", args)
            meta = call_meta(retry)
            print(f"     (retry {attempt}: verify={contract.get('verify')}, isError={retry.is_error}, outcome={meta['outcome']})")
            if contract["verify"]:
                (charged,) = [e for e in h.ledger.entries() if e.get("effect") == "charge" and e["order_id"] == order_id]
                check(not retry.is_error, f"retry {attempt} with verify failed: {text_of(retry)}")
                check(retry.structured_content["charge_id"] == charged["charge_id"], f"not the reconciled charge: {retry.structured_content}")
                check(meta["key"] == charged["key"], f"retry key {meta['key']} != the charge's {charged['key']}")
                # The first retry takes the dead call over and verify finds the charge; the
                # second replays what the first stored.
                expected = "reconciled" if attempt == 0 else "replayed"
                check(meta["outcome"] == expected, f"retry {attempt}: outcome {meta['outcome']}, expected {expected}")
            else:
                check(contract["onUnknown"] == "fail", f"unexpected contract: {contract}")
                check(retry.is_error is True, f"retry {attempt} without verify did not report the unknown outcome: {retry}")
                check(meta["error"] == "outcome_unknown", f"retry {attempt}: {meta}")
                check("unknown" in text_of(retry) and meta["key"] in text_of(retry), f"message: {text_of(retry)}")
        check(h.ledger.count("charge", order_id=order_id) == 1, f"charges after the retries: {h.ledger.count('charge', order_id=order_id)}")


async def a_long_call_reports_progress_while_its_lease_is_renewed(h: Harness) -> None:
    """A `progress_callback` (the SDK then sends `_meta.progressToken`) hears from a long
    call at each renewal of its lease: `charge_card` has a 2 s lease, renewed every 2/3 s,
    and sleeps 1.6 s here after charging. A replay runs nothing and reports no progress."""
    order_id = 9100 + len(h.name)
    args = {"order_id": order_id, "amount_cents": 1200, "card_token": "tok_visa"}
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    replay_seen: list[tuple[float, float | None, str | None]] = []

    async def on_replay_progress(progress: float, total: float | None, message: str | None) -> None:
        replay_seen.append((progress, total, message))

    # Checked once the client is closed: a failure inside it surfaces as its task group's.
    async with h.connect(MCP_SHOP_CHARGE_DELAY_MS="1600") as (client, _):
        with anyio.fail_after(30):
            result = await client.call_tool("charge_card", args, progress_callback=on_progress)
            replay = await client.call_tool("charge_card", args, progress_callback=on_replay_progress)
    check(not result.is_error and call_meta(result)["outcome"] == "executed", f"charge: {result}")
    check(len(seen) >= 1, f"no progress notification during a 1.6 s call with a 2 s lease: {seen}")
    progress = [p for p, _, _ in seen]
    check(progress == sorted(set(progress)), f"progress does not increase: {seen}")
    check(all(m == "still running; lease renewed" and t is None for _, t, m in seen), f"progress: {seen}")
    print(f"     ({len(seen)} progress notifications: {progress})")
    check(call_meta(replay)["outcome"] == "replayed" and not replay_seen, f"replay: {call_meta(replay)}, progress {replay_seen}")
    check(h.ledger.count("charge", order_id=order_id) == 1, "not exactly one charge")


async def fifty_concurrent_calls_make_one_effect(h: Harness) -> None:
    args = order_args(50, f"cart-fifty-{h.name}")
    results: list[types.CallToolResult] = []
    async with h.connect() as (client, _):

        async def one() -> None:
            results.append(await client.call_tool("create_order", args))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(one)
    check(len(results) == 50, f"{len(results)} results")
    failed = [text_of(r) for r in results if r.is_error]
    check(not failed, f"{len(failed)} calls failed: {failed[:3]}")
    metas = [call_meta(r) for r in results]
    keys = {m["key"] for m in metas}
    check(len(keys) == 1, f"{len(keys)} keys")
    executed = sum(1 for m in metas if m["outcome"] == "executed")
    check(executed == 1, f"{executed} executions, {50 - executed} replays")
    check(all(r.structured_content == results[0].structured_content for r in results), "results differ")
    check(h.ledger.count("order", key=keys.pop()) == 1, "not exactly one order placed")


def follow(args: dict[str, Any], path: str) -> Any:
    """The value at a published key field path in the arguments a client sends: object
    members by name, array elements by index (a tuple's `pair.0`)."""
    value: Any = args
    for segment in path.split("."):
        if isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        elif isinstance(value, dict) and segment in value:
            value = value[segment]
        else:
            raise Failure(f"published key field `{path}` is not a path in the arguments sent: stuck at `{segment}` in {args}")
    return value


def predicted_key(tool: types.Tool, args: dict[str, Any], client_key: str | None = None) -> str:
    """The key of a call, computed by the client from the tool's `tools/list` entry and the
    arguments alone: docs/key-spec.md section 1 (document), 2 (fields at the published
    paths) and docs/mcp.md "Client intent keys" (the scope `client:<key>`; this server has
    no scope of its own)."""
    contract = (tool.meta or {}).get(CONTRACT)
    check(contract is not None and contract["kind"] == "mutating", f"{tool.name}: not a keyed tool: {tool.meta}")
    check(contract["keySpec"] == key_vectors.TOOL_KEY_CONTRACT, f"{tool.name}: unknown keySpec {contract['keySpec']}")
    fields = {path: follow(args, path) for path in contract["keyFields"]}
    scope = None if client_key is None else f"client:{client_key}"
    return key_vectors.tool_key(tool.name, contract["version"], scope, fields)


def address(postal_code: str) -> dict[str, Any]:
    return {"line1": "Hauptstraße 5", "postalCode": postal_code, "countryCode": "DE"}


async def an_independent_client_computes_the_server_key_from_tools_list(h: Harness) -> None:
    suffix = h.name
    async with h.connect() as (client, _):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        ship = tools["ship_order"]
        check(
            (ship.meta or {}).get(CONTRACT, {}).get("keyFields") == ["address", "order_id"],
            f"ship_order contract: {ship.meta}",
        )
        # The address's JSON names are the schema's (serde renames), the ones sent below.
        defs = ship.input_schema.get("$defs", {})
        check(
            set(defs.get("Address", {}).get("properties", {})) == {"line1", "postalCode", "countryCode"},
            f"ship_order inputSchema: {ship.input_schema}",
        )
        calls: list[tuple[str, dict[str, Any], str | None]] = [
            ("create_order", order_args(11, f"cart-key-{suffix}"), None),
            # An integer beyond 2^53 - 1 is keyed as its digits; non-ASCII text as UTF-8.
            ("create_order", order_args(2**64 - 1, f"Wagen-Müller-東京-{suffix}"), None),
            ("create_order", order_args(11, f"cart-key-{suffix}"), f"intent-{suffix}-ü"),
            ("charge_card", {"order_id": 4242, "amount_cents": 990, "card_token": "tok_visa"}, None),
            ("ship_order", {"order_id": 4242, "address": address("10115"), "carrier": "DHL"}, None),
            ("ship_order", {"order_id": 4242, "address": address("10117"), "carrier": "DHL"}, None),
            ("ship_order", {"order_id": 4242, "address": address("10115"), "carrier": "DHL"}, "retry-token-1"),
        ]
        seen: dict[str, str] = {}
        for name, args, client_key in calls:
            label = f"{name} {json.dumps(args, ensure_ascii=False)} client key {client_key!r}"
            expected = predicted_key(tools[name], args, client_key)
            meta = {CLIENT_KEY: client_key} if client_key is not None else None
            result = await client.call_tool(name, args, meta=meta)
            check(not result.is_error, f"{label}: {text_of(result)}")
            reported = call_meta(result)["key"]
            check(reported == expected, f"{label}: the server reported key {reported}, the client computed {expected}")
            check(reported not in seen, f"{label}: same key as {seen.get(reported)}")
            seen[reported] = label
        # A client key sent as params.idempotencyKey gives the same key as in _meta.
        name, args, client_key = calls[2]
        again = await client.session.send_request(
            KeyedCallRequest(params=KeyedCallParams(name=name, arguments=args, idempotency_key=client_key)),
            types.CallToolResult,
        )
        check(call_meta(again)["key"] == predicted_key(tools[name], args, client_key), f"params.idempotencyKey: {call_meta(again)}")
        shipped = [e for e in h.ledger.entries() if e.get("effect") == "shipment"]
        check(len(shipped) == 3, f"shipments: {shipped}")


SCENARIOS: list[Callable[[Harness], Any]] = [
    tools_are_listed_with_annotations_and_contract,
    a_retry_is_replayed_and_a_changed_argument_is_refused,
    a_crash_after_the_effect_is_reconciled_or_reported_unknown,
    a_long_call_reports_progress_while_its_lease_is_renewed,
    fifty_concurrent_calls_make_one_effect,
    an_independent_client_computes_the_server_key_from_tools_list,
]


async def read_operation(client: Client, uri: str) -> dict[str, Any]:
    read = await client.read_resource(uri)
    check(len(read.contents) == 1, f"one content item: {read}")
    item = read.contents[0]
    check(item.mime_type == "application/json", f"mime type: {item}")
    return json.loads(item.text)


async def not_found(client: Client, uri: str) -> str:
    try:
        read = await client.read_resource(uri)
    except MCPError as e:
        # MCP's resource-not-found: -32002 up to protocol 2025-11-25, -32602 (invalid
        # params) from 2026-07-28 on (SEP-2164; rmcp maps it by the negotiated version).
        check(e.code in (-32002, -32602), f"not the resource-not-found error: {e.code} {e}")
        return str(e.error.message)
    raise Failure(f"{uri} was readable: {read}")


async def a_result_links_to_its_operation_which_survives_a_restart_in_its_tenant_only(h: Harness) -> None:
    """Post/Redirect/Get: the call's resource_link is read with resources/read (no client key
    resent), again after a SIGKILL and restart, through get_operation, and not at all by a
    server of another tenant on the same store."""
    args = order_args(7700 + len(h.name), f"c-link-{h.name}")
    client_key = f"link-intent-{h.name}"
    killed = False
    try:
        async with h.connect(tenant="acme") as (client, server):
            first = await client.call_tool("create_order", args, meta={CLIENT_KEY: client_key})
            check(not first.is_error, f"the call failed: {text_of(first)}")
            key = call_meta(first)["key"]
            links = [c for c in first.content if c.type == "resource_link"]
            check(len(links) == 1, f"one resource_link: {first.content}")
            uri = str(links[0].uri)
            check(uri == f"tool-contracts://operations/{key}", f"link {uri} for key {key}")
            templates = await client.list_resource_templates()
            check(
                [t.uri_template for t in templates.resource_templates] == ["tool-contracts://operations/{key}"],
                f"templates: {templates}",
            )
            doc = await read_operation(client, uri)
            check(doc["state"] == "completed" and doc["key"] == key, f"operation: {doc}")
            check(doc["result"] == first.structured_content, f"read {doc['result']} != call {first.structured_content}")
            by_tool = await client.call_tool("get_operation", {"key": key})
            check(not by_tool.is_error and by_tool.structured_content == doc, f"get_operation: {by_tool}")
            server.kill()  # SIGKILL; the store is the SQLite file
            killed = True
    except Exception as e:  # the SDK's transport tears down a dead connection noisily
        if not killed:
            raise
        print(f"     (client teardown after the kill: {type(e).__name__})")
    check(killed, "the server was not killed")
    async with h.connect(tenant="acme") as (client, _):
        after = await read_operation(client, uri)
        check(after == doc, f"after the restart: {after} != {doc}")
    async with h.connect(tenant="globex") as (client, _):
        foreign = await not_found(client, uri)
        never = await not_found(client, "tool-contracts://operations/" + "0" * 64)
        check(
            foreign.replace(key, "K") == never.replace("0" * 64, "K"),
            f"a foreign key must read like one never used: {foreign!r} vs {never!r}",
        )
        by_tool = await client.call_tool("get_operation", {"key": key})
        check(by_tool.is_error is True, f"another tenant's get_operation: {by_tool}")
    check(h.ledger.count("order", user_id=args["user_id"]) == 1, "reading placed another order")


SCENARIOS.append(a_result_links_to_its_operation_which_survives_a_restart_in_its_tenant_only)


async def call_as_task(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """A `tools/call` from a client that declares the tasks extension: a `CreateTaskResult`
    (`resultType: "task"`) or a plain result, as a dict (raw JSON-RPC, see `TASKS`)."""
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=tool, arguments=args))
    return await client.session.send_request(request, RAW)


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    return await client.session.send_request(GetTaskRequest(params=TaskParams(task_id=task_id)), RAW)


async def poll_task(client: Client, task_id: str, timeout_s: float = 30) -> dict[str, Any]:
    """`tasks/get` until the task leaves `working`, at the interval the server suggests."""
    with anyio.fail_after(timeout_s):
        while True:
            task = await get_task(client, task_id)
            check(task.get("resultType") == "complete" and task["taskId"] == task_id, f"tasks/get: {task}")
            if task["status"] != "working":
                return task
            await anyio.sleep(min(task.get("pollIntervalMs", 1000), 1000) / 1000)


async def a_task_is_named_by_its_key_and_outlives_a_kill_mid_call(h: Harness) -> None:
    """SEP-2663 tasks tied to idempotency keys: a task-augmented call is named by its key,
    and a retry names the same task; `tasks/get` answers from the store, after a SIGKILL
    mid-call and a restart too, with an unknown outcome that reads never rerun, and the
    retried call reconciles it through `verify`: the ledger shows one effect."""
    args = order_args(8800 + len(h.name), f"c-task-{h.name}")
    async with h.connect(tasks=True) as (client, _):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ("create_order", "charge_card"):
            check((tools[name].meta or {}).get(CONTRACT, {}).get("task") == "optional", f"{name}: {tools[name].meta}")
        first = await call_as_task(client, "create_order", args)
        check(first.get("resultType") == "task", f"not a task: {first}")
        task_id = first["taskId"]
        check(task_id == predicted_key(tools["create_order"], args), f"task id {task_id} is not the call's key")
        check(first["status"] in ("working", "completed") and first["ttlMs"] >= 86_400_000, f"created: {first}")
        retry = await call_as_task(client, "create_order", args)
        check(retry.get("resultType") == "task" and retry["taskId"] == task_id, f"the retry named another task: {retry}")
        done = await poll_task(client, task_id)
        check(done["status"] == "completed" and done["result"]["isError"] is False, f"task: {done}")
        order = done["result"]["structuredContent"]
        check(order["user_id"] == args["user_id"] and order["cart_id"] == args["cart"]["id"], f"result: {order}")
        check(done["result"]["_meta"][CALL]["key"] == task_id, f"result meta: {done['result']['_meta']}")
        check(h.ledger.count("order", key=task_id) == 1, f"orders: {h.ledger.count('order', key=task_id)}")
    # A client without the extension gets the result itself: the task's, replayed.
    async with h.connect() as (client, _):
        plain = await client.call_tool("create_order", args)
        check(call_meta(plain)["outcome"] == "replayed" and plain.structured_content == order, f"plain: {plain}")

    charge_args = {"order_id": 9200 + len(h.name), "amount_cents": 4200, "card_token": "tok_visa"}
    order_id = charge_args["order_id"]
    killed = False
    try:
        async with h.connect(tasks=True, MCP_SHOP_CHARGE_DELAY_MS=CHARGE_DELAY_MS) as (client, server):
            created = await call_as_task(client, "charge_card", charge_args)
            check(created.get("resultType") == "task" and created["status"] == "working", f"charge task: {created}")
            charge_task = created["taskId"]
            with anyio.fail_after(30):
                while h.ledger.count("charge", order_id=order_id) == 0:
                    await anyio.sleep(0.02)
            running = await get_task(client, charge_task)
            check(running["status"] == "working" and running["pollIntervalMs"] == 1000, f"mid-call: {running}")
            server.kill()  # SIGKILL: charged, result not stored
            killed = True
    except Exception as e:  # the SDK's transport tears down a dead connection noisily
        if not killed:
            raise
        print(f"     (client teardown after the kill: {type(e).__name__})")
    check(killed, "the server was not killed")
    async with h.connect(tasks=True) as (client, _):
        # Working until the dead worker's lease (2 s) runs out, then unknown; reading reruns nothing.
        unknown = await poll_task(client, charge_task)
        check(unknown["status"] == "failed", f"after the kill: {unknown}")
        check(unknown["error"]["code"] == -32603 and unknown["error"]["data"]["code"] == "outcome_unknown", f"{unknown}")
        check(unknown["error"]["data"]["verify"] is True and "verify" in unknown["statusMessage"], f"{unknown}")
        check((await get_task(client, charge_task))["status"] == "failed", "a second read changed the task")
        check(h.ledger.count("charge", order_id=order_id) == 1, "a read charged again")
        # The retried call is the same task; its `verify` finds the charge.
        retried = await call_as_task(client, "charge_card", charge_args)
        check(retried.get("resultType") == "task" and retried["taskId"] == charge_task, f"retry: {retried}")
        reconciled = await poll_task(client, charge_task)
        check(reconciled["status"] == "completed" and reconciled["result"]["isError"] is False, f"{reconciled}")
        (charged,) = [e for e in h.ledger.entries() if e.get("effect") == "charge" and e["order_id"] == order_id]
        check(reconciled["result"]["structuredContent"]["charge_id"] == charged["charge_id"], f"{reconciled}")
        try:
            await client.session.send_request(CancelTaskRequest(params=TaskParams(task_id=charge_task)), RAW)
            raise Failure("a finished task was cancelled")
        except MCPError as e:
            check(e.code == -32602 and "already finished" in e.error.message, f"cancel: {e.code} {e.error.message}")
    check(h.ledger.count("charge", order_id=order_id) == 1, f"charges: {h.ledger.count('charge', order_id=order_id)}")


SCENARIOS.append(a_task_is_named_by_its_key_and_outlives_a_kill_mid_call)


# The tool-contracts CLI (argv[2]): the operator approving out of band.
CLI = ""
APPROVAL = "dev.tool-contracts/approval"
# The protocol eras of approval: the client's `mode`, and the version it negotiates.
ERAS = (("legacy", "2025-11-25"), ("auto", "2026-07-28"))


class Human:
    """The person behind the client: the elicitation callback, answering `answer` (with
    `reason` on an accept) and keeping every question asked."""

    def __init__(self) -> None:
        self.answer: Literal["accept", "decline", "cancel"] = "accept"
        self.reason: str | None = None
        self.questions: list[types.ElicitRequestFormParams] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        check(isinstance(params, types.ElicitRequestFormParams), f"not a form: {params}")
        self.questions.append(params)
        content = {"reason": self.reason} if self.answer == "accept" and self.reason else None
        return types.ElicitResult(action=self.answer, content=content)


def link_of(result: types.CallToolResult) -> str:
    links = [str(c.uri) for c in result.content if c.type == "resource_link"]
    check(len(links) == 1, f"one resource_link: {result.content}")
    return links[0]


async def operation_of(client: Client, key: str) -> dict[str, Any]:
    """The operation, read both ways (resources/read and get_operation), which must agree."""
    doc = await read_operation(client, f"tool-contracts://operations/{key}")
    by_tool = await client.call_tool("get_operation", {"key": key})
    check(not by_tool.is_error and by_tool.structured_content == doc, f"get_operation: {by_tool} != {doc}")
    return doc


def refund_args(h: Harness, era: str, n: int) -> dict[str, Any]:
    """Arguments of a refund of its own order per transport, era and case."""
    order = 60_000 + 1_000 * len(h.name) + 100 * [mode for mode, _ in ERAS].index(era) + n
    return {"order_id": order, "amount_cents": 1500 + n}


async def approval_is_asked_through_elicitation(h: Harness) -> None:
    """A client with an elicitation callback, in each protocol era: accept runs the refund
    once and a retry replays without a question; decline denies and a retry gets the denial
    without a question; cancel decides nothing."""
    for mode, version in ERAS:
        human = Human()
        info = types.Implementation(name="e2e-desk", version="1")
        options = {"mode": mode, "elicitation_callback": human, "client_info": info}
        async with h.connect(client=options) as (client, _):
            check(client.protocol_version == version, f"{mode}: negotiated {client.protocol_version}")
            era = f"{mode} ({version})"

            # Accept: the body runs once, the retry replays, one question in all.
            args = refund_args(h, mode, 1)
            human.answer, human.reason = "accept", "the parcel came back"
            first = await client.call_tool("refund_order", args)
            check(not first.is_error, f"{era}: accepted, the call failed: {text_of(first)}")
            meta = call_meta(first)
            key = meta["key"]
            check(meta["outcome"] == "executed", f"{era}: {meta}")
            check(first.structured_content["order_id"] == args["order_id"], f"{era}: {first.structured_content}")
            check(len(human.questions) == 1, f"{era}: questions {len(human.questions)}")
            question = human.questions[0]
            link = f"tool-contracts://operations/{key}"
            for said in ("`refund_order`", f'"order_id":{args["order_id"]}', "one intent per order_id",
                         "A person approves every refund", "runs once", "If you decline", link):
                check(said in question.message, f"{era}: {said!r} not in the question: {question.message}")
            check(set(question.requested_schema["properties"]) == {"reason"}, f"{era}: {question.requested_schema}")
            check(not question.requested_schema.get("required"), f"{era}: {question.requested_schema}")
            check((question.meta or {}).get(APPROVAL, {}).get("key") == key, f"{era}: question _meta {question.meta}")
            check(h.ledger.count("order_refund", order_id=args["order_id"]) == 1, f"{era}: refunds after the accept")
            again = await client.call_tool("refund_order", args)
            check(not again.is_error and call_meta(again)["outcome"] == "replayed", f"{era}: retry {call_meta(again)}")
            check(again.structured_content == first.structured_content, f"{era}: the replay differs")
            check(len(human.questions) == 1, f"{era}: the retry asked again")
            check(h.ledger.count("order_refund", order_id=args["order_id"]) == 1, f"{era}: refunded twice")
            doc = await operation_of(client, key)
            decision = doc.get("approval", {}).get("decision", {})
            check(doc["state"] == "completed" and decision.get("verdict") == "approved", f"{era}: {doc}")
            check(decision.get("by") == "mcp-client:e2e-desk" and decision.get("channel") == "mcp-elicitation", f"{era}: {decision}")
            check(decision.get("reason") == "the parcel came back", f"{era}: {decision}")

            # Decline: denied; the retry gets the denial without a question; nothing ran.
            args = refund_args(h, mode, 2)
            human.answer = "decline"
            denied = await client.call_tool("refund_order", args)
            meta = call_meta(denied)
            check(denied.is_error is True and meta["error"] == "denied", f"{era}: declined: {meta} {text_of(denied)}")
            check("declined in the MCP client" in text_of(denied), f"{era}: {text_of(denied)}")
            check(link_of(denied) == f"tool-contracts://operations/{meta['key']}", f"{era}: {denied.content}")
            check(len(human.questions) == 2, f"{era}: questions {len(human.questions)}")
            again = await client.call_tool("refund_order", args)
            check(again.is_error is True and call_meta(again)["error"] == "denied", f"{era}: retry after decline {call_meta(again)}")
            check(len(human.questions) == 2, f"{era}: the retry of a denied call asked again")
            check((await operation_of(client, meta["key"]))["state"] == "denied", f"{era}: not denied")
            check(h.ledger.count("order_refund", order_id=args["order_id"]) == 0, f"{era}: a declined refund ran")

            # Cancel: nothing decided, still pending, the link says where.
            args = refund_args(h, mode, 3)
            human.answer = "cancel"
            pending = await client.call_tool("refund_order", args)
            meta = call_meta(pending)
            check(pending.is_error is True and meta["error"] == "awaiting_approval", f"{era}: cancelled: {meta}")
            text = text_of(pending)
            check("cancelled" in text and "nothing was decided" in text, f"{era}: {text}")
            check(link_of(pending) == f"tool-contracts://operations/{meta['key']}", f"{era}: {pending.content}")
            doc = await operation_of(client, meta["key"])
            check(doc["state"] == "awaiting_approval" and doc["approval"]["state"] == "pending", f"{era}: {doc}")
            check("decision" not in doc["approval"], f"{era}: a cancel stored a decision: {doc}")
            check(len(human.questions) == 3, f"{era}: questions {len(human.questions)}")
            check(h.ledger.count("order_refund", order_id=args["order_id"]) == 0, f"{era}: a cancelled refund ran")


async def without_elicitation_the_operator_approves_and_the_retry_runs_once(h: Harness) -> None:
    """A client without elicitation gets a tool error naming the operation and how to approve
    it; the operator approves with the CLI on the same SQLite file; the retry runs once."""
    for mode, version in ERAS:
        async with h.connect(client={"mode": mode}) as (client, _):
            check(client.protocol_version == version, f"{mode}: negotiated {client.protocol_version}")
            era = f"{mode} ({version})"
            args = refund_args(h, mode, 4)
            waiting = await client.call_tool("refund_order", args)
            meta = call_meta(waiting)
            key = meta["key"]
            check(waiting.is_error is True and meta["error"] == "awaiting_approval", f"{era}: {meta} {text_of(waiting)}")
            link = f"tool-contracts://operations/{key}"
            check(link_of(waiting) == link and meta.get("operation") == link, f"{era}: {waiting.content} {meta}")
            text = text_of(waiting)
            for said in ("needs a person's approval", f"tool-contracts approve {key}",
                         f"POST /operations/{key}/approve", "retry this same call"):
                check(said in text, f"{era}: {said!r} not in {text}")
            doc = await operation_of(client, key)
            check(doc["state"] == "awaiting_approval", f"{era}: {doc}")
            check(h.ledger.count("order_refund", order_id=args["order_id"]) == 0, f"{era}: ran unapproved")

            approved = await anyio.run_process(
                [CLI, "approve", key, "--store", f"sqlite:{h.db}", "--by", "e2e-operator"], check=False
            )
            check(approved.returncode == 0, f"{era}: the CLI failed: {approved.stderr.decode()}")
            check((await operation_of(client, key))["state"] == "approved", f"{era}: not approved")
            retry = await client.call_tool("refund_order", args)
            check(not retry.is_error and call_meta(retry)["outcome"] == "executed", f"{era}: retry {text_of(retry)}")
            again = await client.call_tool("refund_order", args)
            check(not again.is_error and call_meta(again)["outcome"] == "replayed", f"{era}: {call_meta(again)}")
            check(h.ledger.count("order_refund", order_id=args["order_id"]) == 1, f"{era}: refunds")
            decision = (await operation_of(client, key))["approval"]["decision"]
            check(decision["by"] == "e2e-operator" and decision["channel"] == "cli", f"{era}: {decision}")


SCENARIOS.append(approval_is_asked_through_elicitation)
SCENARIOS.append(without_elicitation_the_operator_approves_and_the_retry_runs_once)


def leaf_messages(e: BaseException) -> list[str]:
    """What failed, out of the exception groups anyio's task groups wrap it in."""
    if isinstance(e, BaseExceptionGroup):
        return [m for inner in e.exceptions for m in leaf_messages(inner)]
    return [f"{type(e).__name__}: {e}" if not isinstance(e, Failure) else str(e)]


async def main(binary: str, cli: str) -> int:
    global CLI
    CLI = cli
    passed, failed = 0, 0
    with tempfile.TemporaryDirectory(prefix="mcp-e2e-") as tmp:
        harnesses = []
        for cls in (StdioHarness, HttpHarness):
            directory = Path(tmp) / cls.name
            directory.mkdir()
            harnesses.append(cls(binary, directory))
        with anyio.fail_after(OVERALL_TIMEOUT_S):
            for h in harnesses:
                for scenario in SCENARIOS:
                    label = f"{h.name}: {scenario.__name__}"
                    started = time.monotonic()
                    try:
                        await scenario(h)
                        passed += 1
                        print(f"ok   {label} ({time.monotonic() - started:.1f}s)", flush=True)
                    except BaseException as e:  # noqa: BLE001 - report every failure, keep going
                        if isinstance(e, (KeyboardInterrupt, SystemExit)):
                            raise
                        failed += 1
                        print(f"FAIL {label}: {'; '.join(leaf_messages(e))}", flush=True)
                        traceback.print_exc()
        if failed:
            for h in harnesses:
                for log in h.logs:
                    print(f"----- {h.name} server stderr: {log.name} -----")
                    print(log.read_text() if log.exists() else "(none)")
    print(f"mcp e2e: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(anyio.run(main, sys.argv[1], sys.argv[2]))
