"""Hold the bundled server under load for minutes and watch memory and KV blocks stay flat.

    python benchmarks/soak.py [--minutes 10] [--streams 64] [--model cpu-small] [--interval 30]
    python benchmarks/soak.py --burst 1000        # 1,000 concurrent streams at once, then idle

The soak starts `itlbench serve` (the command line's layout: engine process, torch threads from the
cores) and keeps `--streams` closed-loop clients busy with streaming completions of random prompt
and output lengths; every tenth request hangs up after its first token, so disconnect-aborts run
all along. Every `--interval` seconds it prints the front end's and the engine process's RSS, the
KV blocks in use, running and waiting requests, and finished requests and protocol errors so far.
At the end it waits for the server to go idle: blocks in use must be back to 0. RSS should be flat
after warm-up (`--warmup`): the last column is growth since then.

The KV pool is zeroed memory that the OS maps in as blocks are first written, and the block manager
hands out never-used blocks before evicting cached prefixes, so engine RSS climbs until every block
has been used once, then stays. The soak therefore sizes the pool small (`--kv-memory-gib 0.25`, over
100k tokens for cpu-small) so that happens within the warm-up; anything that grows after it is a leak.

`--burst N` opens N streams at once (every one checked against the protocol, see
itlbench/testing/stream_burst.py) and reports errors, time and blocks in use afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from itlbench.core.engine_config import EngineConfig  # noqa: E402
from itlbench.harness.bundled_server import BundledServer  # noqa: E402
from itlbench.harness.http_json import request_json  # noqa: E402
from itlbench.testing.stream_burst import BurstResult, _one, burst  # noqa: E402


def raise_open_files() -> None:
    """Thousands of sockets on both ends: lift the soft descriptor limit to the hard one (the server
    inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_mib(pid: int | None) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20 if pid else None
    except psutil.Error:
        return None


def engine_state(srv: BundledServer) -> dict:
    info = request_json(f"{srv.base_url}/engine", timeout=30)
    return {"blocks_in_use": info["kv_blocks"] - info["kv_free_blocks"], "running": info["num_running"],
            "waiting": info["num_waiting"], "engine_pid": info.get("serving", {}).get("engine_pid")}


def wait_idle(srv: BundledServer, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = engine_state(srv)
        if (state["running"] == 0 and state["waiting"] == 0) or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


async def soak(srv: BundledServer, model: str, vocab: int, streams: int, seconds: float, interval: float,
               max_prompt: int, max_output: int, seed: int, warmup: float) -> BurstResult:
    result = BurstResult(0)
    stop_at = time.monotonic() + seconds
    url = f"{srv.base_url}/completions"

    async def client(k: int, session: aiohttp.ClientSession) -> None:
        rng = np.random.default_rng(seed * 10_000 + k)
        n = 0
        while time.monotonic() < stop_at:
            body = {"model": model, "prompt": rng.integers(3, vocab, int(rng.integers(16, max_prompt))).tolist(),
                    "max_tokens": int(rng.integers(8, max_output)), "ignore_eos": True, "stream": True,
                    "temperature": 0}
            result.streams += 1
            await _one(session, url, body, result.streams, 1 if n % 10 == 9 else None, result)
            n += 1

    async def monitor() -> None:
        front = srv.process.pid if srv.process else None
        base: tuple[float, float] | None = None
        print("| t s | front end RSS MiB | engine RSS MiB | blocks in use | running | waiting | requests | "
              f"errors | RSS growth since {warmup:g} s MiB |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
        start = time.monotonic()
        while time.monotonic() < stop_at:
            await asyncio.sleep(min(interval, max(0.0, stop_at - time.monotonic())))
            state = await asyncio.to_thread(engine_state, srv)
            fr, en = rss_mib(front), rss_mib(state["engine_pid"])
            now, elapsed = (fr or 0.0, en or 0.0), time.monotonic() - start
            if base is None and elapsed >= warmup:
                base = now
            growth = "warm-up" if base is None else f"{(now[0] - base[0]) + (now[1] - base[1]):+.1f}"
            print(f"| {elapsed:.0f} | {fr or 0:.0f} | {en or 0:.0f} | {state['blocks_in_use']} | "
                  f"{state['running']} | {state['waiting']} | {result.streams} | {len(result.errors)} | "
                  f"{growth} |", flush=True)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(monitor(), *(client(k, session) for k in range(streams)))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu-small")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=120.0, help="seconds before the RSS baseline")
    ap.add_argument("--kv-memory-gib", type=float, default=0.25, help="KV pool (small: fully used in warm-up)")
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--burst", type=int, default=0, help="instead: N concurrent streams at once")
    ap.add_argument("--burst-tokens", type=int, default=8)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", type=Path, default=None)
    args = ap.parse_args()
    raise_open_files()
    cfg = EngineConfig(model=args.model, seed=args.seed, max_num_seqs=args.max_num_seqs, device="cpu",
                       kv_memory_gib=args.kv_memory_gib)
    log = args.log or Path(tempfile.mkstemp(prefix="soak-", suffix=".log")[1])
    with BundledServer(cfg, log) as srv:
        info = srv.engine_info
        model, vocab = str(info["served_model_name"]), int(info["model"]["vocab_size"])
        print(f"server {srv.base_url} ({info['serving']}), {info['kv_blocks']} KV blocks; log {log}", flush=True)
        if args.burst:
            result = asyncio.run(burst(srv.base_url, model, args.burst, args.burst_tokens, 64, vocab,
                                       hang_up_every=10, seed=args.seed))
            kind = f"{args.burst} concurrent streams x {args.burst_tokens} tokens"
        else:
            result = asyncio.run(soak(srv, model, vocab, args.streams, args.minutes * 60, args.interval,
                                      args.max_prompt, args.max_output, args.seed, args.warmup))
            kind = f"soak of {args.minutes:g} min with {args.streams} streams"
        state = wait_idle(srv)
        front, engine = rss_mib(srv.process.pid if srv.process else None), rss_mib(state["engine_pid"])
    print(f"\n{kind}: {result.streams} requests, {result.completed} completed, {result.hung_up} hung up early, "
          f"{result.tokens} tokens, {len(result.errors)} protocol errors in {result.seconds or args.minutes * 60:.1f} s")
    for err in result.errors[:10]:
        print("  " + err)
    print(f"after: {state['blocks_in_use']} KV blocks in use, {state['running']} running, {state['waiting']} waiting; "
          f"RSS front end {front or 0:.0f} MiB, engine {engine or 0:.0f} MiB")
    sys.exit(0 if not result.errors and state["blocks_in_use"] == 0 else 1)


if __name__ == "__main__":
    main()
