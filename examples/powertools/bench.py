"""The Powertools side of BENCHMARKS.md: the same workloads as `examples/src/bin/bench.rs`, with
Powertools for AWS Lambda (Python)'s `@idempotent_function` and `DynamoDBPersistenceLayer`, against the
same DynamoDB Local.

Run it through `scripts/bench-powertools` (which makes the virtual environment) or `scripts/bench`.

The function mirrors ours: key = (tenant, order_id), the whole request validated as the payload, a
response of about 100 bytes. Powertools' table differs in shape (partition key `id`), so it gets its own
table, `bench-powertools`. Concurrency is threads, since boto3 is synchronous; one boto3 client is shared
(it is thread-safe) with a connection pool as large as the concurrency. Requests are counted with
botocore's `before-send` event (once per HTTP attempt, retries included), CPU with
getrusage(RUSAGE_SELF) (user + system, every thread), exactly like the Rust bench.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import sys
import threading
import time
import warnings

import boto3
from botocore.config import Config
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

# Outside Lambda there is no remaining time to register; Powertools warns once per call about it.
warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")

TABLE = "bench-powertools"
WORKLOADS = ["first", "duplicate", "mix", "fail-retry"]


class Declined(Exception):
    """The body's failure in the fail-retry workload."""


def make_client(endpoint: str, concurrency: int):
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=Config(
            max_pool_connections=max(10, concurrency),
            # Like the Rust SDK's default: standard mode, 3 attempts.
            retries={"mode": "standard", "max_attempts": 3},
        ),
    )


def ensure_table(client) -> None:
    try:
        client.create_table(
            TableName=TABLE,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        client.get_waiter("table_exists").wait(TableName=TABLE)
        client.update_time_to_live(
            TableName=TABLE,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiration"},
        )
    except client.exceptions.ResourceInUseException:
        pass


class Counter:
    """Counts HTTP requests (botocore `before-send` fires once per attempt)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def __call__(self, **_kwargs) -> None:
        with self._lock:
            self.value += 1

    def take(self) -> int:
        with self._lock:
            value, self.value = self.value, 0
        return value


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build_charge(client):
    persistence = DynamoDBPersistenceLayer(table_name=TABLE, boto3_client=client)
    config = IdempotencyConfig(
        event_key_jmespath="[tenant, order_id]",
        payload_validation_jmespath="@",
        expires_after_seconds=24 * 3600,
    )
    body_runs = itertools.count()

    @idempotent_function(data_keyword_argument="req", config=config, persistence_store=persistence)
    def charge(req: dict, fail: bool = False) -> dict:
        next(body_runs)
        if fail:
            raise Declined("declined by the gateway")
        return {
            "charge_id": f"ch_{req['tenant']}_{req['order_id']}",
            "amount_cents": req["amount_cents"],
            "currency": req["currency"],
            "status": "succeeded",
        }

    return charge


def request(order_id: str) -> dict:
    return {"tenant": 7, "order_id": order_id, "amount_cents": 4200, "currency": "EUR"}


def seed_id(prefix: str, j: int) -> str:
    return f"{prefix}-seed-{j}"


def op(workload: str, prefix: str, i: int, seed_keys: int):
    """(order_id, duplicate?, fail_first?) of call i, as in the Rust bench."""
    if workload == "first":
        return f"{prefix}-{i}", False, False
    if workload == "duplicate":
        return seed_id(prefix, i % seed_keys), True, False
    if workload == "mix":
        if i % 2 == 0:
            return seed_id(prefix, (i // 2) % seed_keys), True, False
        return f"{prefix}-{i}", False, False
    if workload == "fail-retry":
        return f"{prefix}-{i}", False, i % 10 == 0
    raise ValueError(workload)


def call(charge, order_id: str, fail_first: bool) -> None:
    req = request(order_id)
    try:
        charge(req=req, fail=fail_first)
    except Declined:
        if not fail_first:
            raise
        charge(req=req, fail=False)


def drive(charge, concurrency: int, calls: int, make, record: bool):
    """Runs `calls` calls from `concurrency` threads; returns latencies (s) and errors."""
    index = itertools.count()
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        mine: list[float] = []
        my_errors: list[str] = []
        while True:
            i = next(index)
            if i >= calls:
                break
            order_id, _dup, fail_first = make(i)
            start = time.perf_counter()
            try:
                call(charge, order_id, fail_first)
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                my_errors.append(f"{type(e).__name__}: {e}")
            if record:
                mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)
            errors.extend(my_errors)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors


def percentile_ms(sorted_latencies: list[float], p: float) -> float:
    if not sorted_latencies:
        return float("nan")
    return sorted_latencies[round((len(sorted_latencies) - 1) * p)] * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=os.environ.get("IDEMPOTENT_DYNAMODB_ENDPOINT"))
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--workload", default=",".join(WORKLOADS))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--seed-keys", type=int, default=500)
    parser.add_argument("--json", help="append one JSON line per cell to this file")
    args = parser.parse_args()
    if not args.endpoint:
        print(
            "bench.py: no DynamoDB endpoint: start DynamoDB Local with `scripts/dynamodb-local start` and "
            "pass --endpoint or set IDEMPOTENT_DYNAMODB_ENDPOINT (or run `scripts/bench`)",
            file=sys.stderr,
        )
        return 2
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    workloads = args.workload.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}; expected one of {', '.join(WORKLOADS)}")

    counter = Counter()
    client = make_client(args.endpoint, max(concurrencies))
    client.meta.events.register("before-send.dynamodb", counter)
    ensure_table(client)
    charge = build_charge(client)
    run = f"{os.getpid():x}-{int(time.time() * 1000):x}"

    if args.warmup:
        prefix = f"{run}-warmup"
        _, errors = drive(charge, 8, args.warmup, lambda i: op("first", prefix, i, 1), False)
        if errors:
            print(f"bench.py: {len(errors)} warm-up calls failed, first: {errors[0]}", file=sys.stderr)
            return 1

    cells = []
    for concurrency in concurrencies:
        for workload in workloads:
            prefix = f"{run}-powertools-{workload}-c{concurrency}"
            seed_keys = max(1, min(args.seed_keys, args.calls))
            if workload in ("duplicate", "mix"):
                _, errors = drive(
                    charge, 16, seed_keys, lambda j, p=prefix: (seed_id(p, j), False, False), False
                )
                if errors:
                    print(f"bench.py: {len(errors)} seed calls failed, first: {errors[0]}", file=sys.stderr)
                    return 1
            counter.take()
            cpu0 = cpu_seconds()
            t0 = time.perf_counter()
            latencies, errors = drive(
                charge,
                concurrency,
                args.calls,
                lambda i, w=workload, p=prefix, s=seed_keys: op(w, p, i, s),
                True,
            )
            elapsed = time.perf_counter() - t0
            cpu = cpu_seconds() - cpu0
            requests = counter.take()
            if errors:
                print(
                    f"bench.py: powertools {workload} c={concurrency}: {len(errors)} calls failed, "
                    f"first: {errors[0]}",
                    file=sys.stderr,
                )
            latencies.sort()
            cell = {
                "kind": "cell",
                "implementation": "powertools",
                "workload": workload,
                "concurrency": concurrency,
                "calls": args.calls,
                "errors": len(errors),
                "seconds": elapsed,
                "calls_per_s": args.calls / elapsed,
                "p50_ms": percentile_ms(latencies, 0.50),
                "p99_ms": percentile_ms(latencies, 0.99),
                "requests_per_call": requests / args.calls,
                "cpu_us_per_call": cpu * 1e6 / args.calls,
            }
            cells.append(cell)
            if args.json:
                with open(args.json, "a", encoding="utf-8") as f:
                    f.write(json.dumps(cell) + "\n")

    print("| implementation | workload | concurrency | calls | calls/s | p50 ms | p99 ms | requests/call | CPU µs/call | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        print(
            f"| {c['implementation']} | {c['workload']} | {c['concurrency']} | {c['calls']} | "
            f"{c['calls_per_s']:.0f} | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} | "
            f"{c['requests_per_call']:.2f} | {c['cpu_us_per_call']:.0f} | {c['errors']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
