"""How faithfully does the itlbench client timestamp a stream? Measured against a paced server's truth.

A paced OpenAI-style server (separate process, own event loop) sends every stream one chunk per tick
and logs each send with `perf_counter_ns` — the client's clock on one host. The driver runs N
closed-loop streams; per concurrency this prints the client's error against that log:
ITL error = client gap − server gap (consecutive chunks of one stream), TTFT error = client first
token − server first send, plus the client's CPU and event-loop lag.

    python benchmarks/client_fidelity.py --concurrency 1,100,1000 --duration 6

`--telemetry metrics|otel|both` runs the client with live telemetry on (Prometheus on a free loopback
port; OTLP to a receiver in its own process), to compare the client's CPU per chunk with it off.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from itlbench.load.driver import DriveResult, drive, install_uvloop  # noqa: E402
from itlbench.load.multiproc import drive_workers  # noqa: E402
from itlbench.load.target import Target  # noqa: E402
from itlbench.rundir.store import RunStore  # noqa: E402
from itlbench.testing.paced_server import PacedConfig, spawn  # noqa: E402
from itlbench.workloads.plan import LoadPlan, RequestPlan  # noqa: E402


def _stream(k: int, tokens: int):
    i = 0
    while True:
        yield RequestPlan(f"s{k}-{i}", "fidelity", "fidelity", 4, tokens, prompt_token_ids=(1, 2, 3, 4))
        i += 1


def make_plan(streams: int, tokens: int) -> LoadPlan:
    return LoadPlan(streams=[_stream(k, tokens) for k in range(streams)])


def _server_log(base_url: str) -> dict:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_log", timeout=60) as r:
        return json.loads(r.read())


def _telemetry(args: argparse.Namespace, target: Target, otlp: str | None):  # noqa: ANN202
    """Live telemetry as `itlbench run --metrics-port/--otlp-endpoint` builds it, or None (off)."""
    if args.telemetry == "off":
        return None
    from itlbench.telemetry.observer import LiveTelemetry

    tel = LiveTelemetry.start("127.0.0.1:0" if args.telemetry in ("metrics", "both") else None,
                              otlp if args.telemetry in ("otel", "both") else None)
    tel.connect(target, has_steps=False, provider_name="openai",
                run_info={"run_id": "fidelity", "workload": "fidelity", "engine": "external"})
    return tel


async def _run_client(args: argparse.Namespace, c: int, url: str, run_dir: Path,
                      otlp: str | None = None) -> DriveResult:
    store = RunStore(run_dir)
    target = Target(url, "paced", timeout_s=None)
    kw = dict(duration_s=args.duration, warmup_s=0.0, drain_timeout_s=0.0)
    tel = _telemetry(args, target, otlp)
    try:
        if args.workers > 1:
            factory = functools.partial(make_plan, c, args.tokens)
            return await drive_workers(factory, target, store, workers=args.workers, **kw)
        return await drive(make_plan(c, args.tokens), target, store, observer=tel, **kw)
    finally:
        store.close()
        if tel is not None:
            tel.close()


def _spawn_receiver() -> tuple[subprocess.Popen[str], str]:
    """An OTLP/HTTP receiver in its own process, so its CPU is not the client's."""
    proc = subprocess.Popen([sys.executable, "-m", "itlbench.testing.otlp_receiver", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _errors(run_dir: Path, sends: dict[str, list[int]]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(ITL errors ns, TTFT errors ns, chunks compared, chunk-count mismatches)."""
    req = pl.read_parquet(run_dir / "requests" / "*.parquet").select("request_id", "server_request_id")
    chunks = pl.read_parquet(run_dir / "chunks" / "*.parquet").sort("request_id", "index")
    by_req = chunks.group_by("request_id", maintain_order=True).agg(pl.col("t_ns"))
    times = dict(zip(by_req["request_id"].to_list(), by_req["t_ns"].to_list(), strict=True))
    itl, ttft, compared, mismatched = [], [], 0, 0
    for rid, sid in req.iter_rows():
        client, server = times.get(rid), sends.get(sid or "")
        if not client or not server:
            continue
        n = min(len(client), len(server))
        mismatched += len(client) > len(server)
        cl, sv = np.asarray(client[:n], dtype=np.int64), np.asarray(server[:n], dtype=np.int64)
        ttft.append(cl[0] - sv[0])
        itl.append(np.diff(cl) - np.diff(sv))
        compared += n
    return np.concatenate(itl) if itl else np.zeros(0), np.asarray(ttft), compared, mismatched


def _pct(a: np.ndarray) -> str:
    if not a.size:
        return "      -/      -/      -"
    ms = a / 1e6
    return f"{np.percentile(ms, 50):7.3f}/{np.percentile(ms, 99):7.3f}/{ms.max():7.2f}"


def measure(args: argparse.Namespace, c: int) -> dict[str, object]:
    proc, url = spawn(PacedConfig(tick_s=args.tick_ms / 1e3, first_delay_s=args.first_delay_ms / 1e3))
    receiver, otlp = _spawn_receiver() if args.telemetry in ("otel", "both") else (None, None)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            res = asyncio.run(_run_client(args, c, url, Path(tmp), otlp))
            wall = time.perf_counter() - t0
            log = _server_log(url)
            itl, ttft, compared, mismatched = _errors(Path(tmp), log["sends"])
    finally:
        for p in (proc, receiver):
            if p is not None:
                p.kill()
                p.wait()
    return {"c": c, "requests": res.counts["sent"], "chunks": compared, "mismatched": mismatched,
            "chunks_per_s": compared / args.duration, "itl": itl, "ttft": ttft,
            "cpu": res.client.cpu_percent_mean, "cpu_s": res.client.cpu_seconds,
            "lag_p99_ms": res.client.loop_lag_p99_s * 1e3, "server_cpu_s": log["cpu_s"], "wall": wall}


def print_table(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    print(f"\npaced server: 1 chunk / {args.tick_ms:g} ms / stream, {args.tokens} tokens per request, "
          f"first token after {args.first_delay_ms:g} ms + next tick; {args.duration:g} s per run; "
          f"client workers: {args.workers}; live telemetry: {args.telemetry}")
    print("errors in ms, p50/p99/max; ITL err = client gap - server gap, TTFT err = client first - server first")
    head = (f"{'streams':>7} {'reqs':>6} {'chunks':>8} {'chunk/s':>8} {'ITL err p50/p99/max':>24} "
            f"{'TTFT err p50/p99/max':>24} {'cli CPU%':>8} {'cli CPU s':>9} {'us/chunk':>8} {'lag p99':>8} "
            f"{'srv CPU s':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['c']:>7} {r['requests']:>6} {r['chunks']:>8} {r['chunks_per_s']:>8.0f} {_pct(r['itl']):>24} "
              f"{_pct(r['ttft']):>24} {r['cpu']:>8.0f} {r['cpu_s']:>9.1f} "
              f"{1e6 * r['cpu_s'] / max(1, r['chunks']):>8.1f} {r['lag_p99_ms']:>8.1f} "
              f"{r['server_cpu_s']:>9.1f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,100,1000")
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--tick-ms", type=float, default=20.0)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--first-delay-ms", type=float, default=50.0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--telemetry", choices=("off", "metrics", "otel", "both"), default="off",
                   help="live telemetry in the client (one worker only)")
    args = p.parse_args(argv)
    print(f"uvloop: {install_uvloop()}")
    rows = []
    for c in (int(x) for x in args.concurrency.split(",")):
        rows.append(measure(args, c))
        print(f"  {c} streams done in {rows[-1]['wall']:.1f} s", flush=True)
    print_table(rows, args)


if __name__ == "__main__":
    main()
