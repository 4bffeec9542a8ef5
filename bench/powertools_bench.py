"""Issue item 7: the same tool behind Powertools for AWS Lambda (Python)'s idempotency
utility, with its Redis persistence layer, on the local Redis.

The tool: create_order(order) where order = {"user_id", "cart": {"id", "items"}, "note"},
keyed by `[user_id, cart.id]` (event_key_jmespath), returning a small dict. First calls use
a fresh user_id each; replays repeat the keys just made. One process, one thread
(concurrency 1), like a Lambda invocation. Prints calls per second.

Run through bench/powertools.sh (it makes the virtual environment with pinned versions).
"""

import os
import sys
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


@idempotent_function(
    data_keyword_argument="order",
    config=config,
    persistence_store=persistence,
    key_prefix=PREFIX,
)
def create_order(order: dict) -> dict:
    global runs
    runs += 1
    return {"order_id": order["user_id"] * 10 + 1, "cart_id": order["cart"]["id"], "total_cents": 4999}


def call(user_id: int) -> dict:
    return create_order(order={"user_id": user_id, "cart": {"id": "c-42", "items": ["book"]}, "note": "gift"})


def clean() -> None:
    for key in client.scan_iter(match=PREFIX + "*", count=1000):
        client.unlink(key)


def main() -> None:
    clean()
    load = open("/proc/loadavg").read().split()[:3]
    print(f"== powertools (aws-lambda-powertools idempotency, Redis layer) == load {' '.join(load)}")
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < WINDOW:
        call(n)
        n += 1
    first = n / (time.perf_counter() - start)
    made = n
    assert runs == made, (runs, made)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < WINDOW:
        call(n % made)
        n += 1
    replay = n / (time.perf_counter() - start)
    assert runs == made, "a replay ran the body"
    print(f"powertools RedisCachePersistenceLayer, conc 1: first call {first:9.0f} /s, replay {replay:9.0f} /s")
    clean()


if __name__ == "__main__":
    main()
