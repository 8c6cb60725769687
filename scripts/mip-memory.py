#!/usr/bin/env python3
"""Measures the relay's memory under big MIP models (not part of CI; it takes minutes).

Starts the real release binary `toolrelay`, generates MODELS models of 60,000 variables each
(about 7.5 MB of PuLP JSON) in fresh scopes through `POST /api/tools/generate_mip_problem`,
WORKERS at a time, and prints the process's resident memory (VmRSS) before, every 10 models,
and after. The ticket budget (256 MB by default) should bound what the models leave behind.

    cargo build --release --bin toolrelay
    scripts/mip-memory.py [--binary target/release/toolrelay] [--models 130] [--workers 2]

Only the standard library; talks to 127.0.0.1 only.
"""

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

MODEL = """
import pulp
prob = pulp.LpProblem("big_{n}", pulp.LpMinimize)
xs = [pulp.LpVariable(f"x{{i}}", 0, 1, cat="Integer") for i in range(60000)]
prob += pulp.lpSum(xs)
prob += pulp.lpSum(xs[:100]) >= 10, "first"
prob += pulp.lpSum(xs[-100:]) >= 5, "last"
prob += xs[0] + xs[1] <= 1, "pair"
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def post(base, path, body, timeout=120):
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default=os.environ.get("CARGO_TARGET_DIR", "target") + "/release/toolrelay")
    parser.add_argument("--models", type=int, default=130)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ,
        LISTEN_ADDR=f"127.0.0.1:{port}",
        GRPC_LISTEN_ADDR=f"127.0.0.1:{free_port()}",
        RATE_LIMIT_REQUEST_PER_CODE="100000",
        MIP_MAX_CONCURRENT=str(args.workers),
        RUST_LOG="warn",
    )
    relay = subprocess.Popen([args.binary], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or relay.poll() is not None:
                    sys.exit("the relay did not start")
                time.sleep(0.1)
        print(f"{'models':>6} {'RSS MB':>8} {'s':>6}")
        before = rss_mb(relay.pid)
        print(f"{0:>6} {before:>8.1f} {0:>6.0f}")
        started = time.monotonic()
        done = 0

        def one(n):
            status, body = post(
                base,
                f"/api/tools/generate_mip_problem?scope=memory-{n}-{time.time_ns()}",
                {"problemDefinitionCode": MODEL.format(n=n)},
            )
            if status != 200:
                raise RuntimeError(f"model {n}: {status} {body}")
            return body["result"]["summary"]

        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            for summary in pool.map(one, range(args.models)):
                done += 1
                if done % 10 == 0 or done == args.models:
                    print(f"{done:>6} {rss_mb(relay.pid):>8.1f} {time.monotonic() - started:>6.0f}", flush=True)
        after = rss_mb(relay.pid)
        # What stays once nothing runs: allocators give memory back after a while.
        time.sleep(10)
        idle = rss_mb(relay.pid)
        print(f"summary of each model: {summary}")
        print(f"RSS before {before:.1f} MB, after {args.models} models {after:.1f} MB, 10 s later {idle:.1f} MB")
    finally:
        relay.terminate()
        relay.wait(timeout=30)


if __name__ == "__main__":
    main()
