"""Issue item 7: the same tool behind Powertools for AWS Lambda (Python)'s idempotency
utility, with its Redis persistence layer, on the local Redis.

The tool: create_order(order) where order = {"user_id", "cart": {"id", "items"}, "note"},
keyed by `[user_id, cart.id]` (event_key_jmespath), returning a small dict. First calls use
a fresh user_id each; replays repeat the keys just made. One process; concurrency 1 is one
thread, like a Lambda invocation; concurrency 16 and 64 are that many threads sharing the
persistence layer (a Python service answering concurrent calls; the GIL is released while a
thread waits on Redis). Prints calls per second.

Run through bench/powertools.sh (it makes the virtual environment with pinned versions).
"""

import itertools
import os
import sys
import threading
import time
import warnings

# Outside Lambda there is no remaining-time context; the utility warns once per call site.
warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
# CachePersistenceLayer is still an alias of the deprecated RedisCachePersistenceLayer in 3.x.
warnings.filterwarnings("ignore", category=DeprecationWarning)

import redis
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

URL = os.environ.get("TOOL_CONTRACTS_REDIS_URL", "redis://127.0.0.1:6379")
QUICK = "--quick" in sys.argv or os.environ.get("TOOL_CONTRACTS_BENCH_QUICK") == "1"
WINDOW = 1.5 if QUICK else 5.0
PREFIX = "tcbench-pt"

client = redis.Redis.from_url(URL)
persistence = CachePersistenceLayer(client=client)
config = IdempotencyConfig(event_key_jmespath="[user_id, cart.id]", raise_on_no_idempotency_key=True)
runs = 0
runs_lock = threading.Lock()


@idempotent_function(
    data_keyword_argument="order",
    config=config,
    persistence_store=persistence,
    key_prefix=PREFIX,
)
def create_order(order: dict) -> dict:
    global runs
    with runs_lock:
        runs += 1
    return {"order_id": order["user_id"] * 10 + 1, "cart_id": order["cart"]["id"], "total_cents": 4999}


def call(user_id: int) -> dict:
    return create_order(order={"user_id": user_id, "cart": {"id": "c-42", "items": ["book"]}, "note": "gift"})


def clean() -> None:
    for key in client.scan_iter(match=PREFIX + "*", count=1000):
        client.unlink(key)


def rate(threads: int, next_id) -> float:
    """Calls per second of `threads` threads, each calling `call(next_id())` for WINDOW."""
    counts = [0] * threads
    errors = []
    deadline = time.perf_counter() + WINDOW

    def worker(i: int) -> None:
        try:
            while time.perf_counter() < deadline:
                call(next_id())
                counts[i] += 1
        except Exception as e:  # a thread's exception would otherwise vanish
            errors.append(e)

    start = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {threads} threads failed, first: {errors[0]!r}")
    return sum(counts) / (time.perf_counter() - start)


def main() -> None:
    clean()
    load = open("/proc/loadavg").read().split()[:3]
    print(f"== powertools (aws-lambda-powertools idempotency, Redis layer) == load {' '.join(load)}")
    base = 0
    for threads in (1, 16, 64):
        # First calls: ids nobody used yet (itertools.count is atomic under the GIL).
        fresh = itertools.count(base)
        runs_before = runs
        first = rate(threads, lambda: next(fresh))
        made = next(fresh) - base  # ids taken (every taken id was called)
        assert runs - runs_before == made, ("each fresh id runs once", runs - runs_before, made)
        made_ids = range(base, base + made)
        replays = itertools.cycle(made_ids)
        lock = threading.Lock()

        def replay_id() -> int:
            with lock:
                return next(replays)

        runs_after_first = runs
        replay = rate(threads, replay_id)
        assert runs == runs_after_first, "a replay ran the body"
        print(f"powertools RedisCachePersistenceLayer, conc {threads}: first call {first:9.0f} /s, replay {replay:9.0f} /s")
        base += made + 1
    clean()


if __name__ == "__main__":
    main()
