"""How faithfully does the itlbench client timestamp a stream? Measured against a paced server's truth.

A paced OpenAI-style server (separate process, own event loop) sends every stream one chunk per tick,
pauses all streams once (`--pause-ms`, a stall every stream must show), and logs each send with
`perf_counter_ns` — the client's clock on one host. The driver runs N closed-loop streams with each
stream reader; per run this prints the client's error against that log:
ITL error = client gap − server gap (consecutive chunks of one stream), TTFT error = client first
token − server first send. The kernel reader's rows give both of its stamps from the same run: the
kernel receive stamp (`t_ns`) and the user-space time its read returned (`t_read_ns`).
Stalls are found by itlbench's own rule (analysis.stalls) on the client's gaps and on the server's;
"found" counts the server's stall gaps the client also flagged, "false" the client's flags the
server's log does not have.

Client CPU per chunk is measured in a steady window (the middle 80 % of sends after the streams
started) from CPU samples of the client process every 20 ms, the same way for itlbench's readers
and for `vllm bench serve` (run from the peer venv when present) on the same load.

    flock /tmp/itlbench-bench.lock python benchmarks/client_fidelity.py --concurrency 100,500 --duration 6
    python benchmarks/client_fidelity.py --driver locust --workers 2   # Locust too, same streams

With `--driver locust` every concurrency also runs through Locust (master + `--workers` worker
processes) and its rows sit beside the readers' (its CPU per chunk: workers plus master, whole run).

`--telemetry metrics|otel|both` runs the client with live telemetry on (Prometheus on a free loopback
port; OTLP to a receiver in its own process), to compare the client's CPU per chunk with it off.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from itlbench.analysis.stalls import StallParams, find_stalls  # noqa: E402
from itlbench.experiments.selftest import compare as stamp_errors  # noqa: E402
from itlbench.experiments.selftest import server_log  # noqa: E402
from itlbench.load.aio import install_uvloop  # noqa: E402
from itlbench.load.driver import DriveResult, drive  # noqa: E402
from itlbench.load.multiproc import drive_workers  # noqa: E402
from itlbench.load.target import Target  # noqa: E402
from itlbench.rundir.reader import read_table  # noqa: E402
from itlbench.rundir.store import RunStore  # noqa: E402
from itlbench.testing.paced_server import PacedConfig, spawn  # noqa: E402
from itlbench.testing.plans import fixed_streams  # noqa: E402
from itlbench.workloads.plan import LoadPlan  # noqa: E402

VLLM_VENV = Path(os.environ.get("ITLBENCH_VLLM_VENV", "~/peers/vllm-venv")).expanduser()
VLLM_TOKENIZER = Path(os.environ.get("ITLBENCH_VLLM_TOKENIZER", "~/peers/models/cpu-small")).expanduser()


def make_plan(streams: int, tokens: int) -> LoadPlan:
    return fixed_streams(streams, tokens)


async def _run_locust(args: argparse.Namespace, c: int, url: str, run_dir: Path) -> tuple[DriveResult, dict]:
    """The same streams through Locust: master and workers in their own processes."""
    from itlbench.harness.locust_run import drive_locust
    from itlbench.load.locust.job import LocustJob

    store = RunStore(run_dir)
    job = LocustJob.for_plan(Target(url, "paced", timeout_s=None), run_dir, duration_s=args.duration,
                             factory="itlbench.testing.plans:fixed_streams",
                             plan_kwargs={"streams": c, "tokens": args.tokens}, workers=args.workers,
                             drain_timeout_s=0.0)
    doc: dict = {}
    try:
        return await drive_locust(job, store, driver_doc=doc), doc
    finally:
        store.close()


class CpuSampler:
    """CPU seconds (user + system, with children) of one process every `interval_s`, on perf_counter_ns.
    For this very process (`pid` None) `time.process_time` is read instead of /proc, so the sampler
    costs the measured client next to nothing."""

    def __init__(self, pid: int | None, interval_s: float = 0.02) -> None:
        self.proc = psutil.Process(pid) if pid is not None else None
        self.interval_s = interval_s
        self.t: list[int] = []
        self.cpu: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.proc is None:
                self.cpu.append(time.process_time())
            else:
                try:
                    c = self.proc.cpu_times()
                except psutil.Error:
                    return
                self.cpu.append(c.user + c.system + c.children_user + c.children_system)
            self.t.append(time.perf_counter_ns())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def between(self, t0: int, t1: int) -> float:
        t, c = np.asarray(self.t, dtype=np.float64), np.asarray(self.cpu)
        return float(np.interp(t1, t, c) - np.interp(t0, t, c))


def steady_window(sends: dict[str, list[int]], streams: int) -> tuple[int, int, int]:
    """(start, end, sends inside): the middle 80 % of sends of the streams that began once at least
    half of the streams had started (a peer's lone ready-check request falls outside)."""
    starts = sorted(s[0] for s in sends.values() if s)
    if not starts:
        return 0, 0, 0
    begin = starts[min(len(starts) - 1, max(0, streams // 2 - 1))]
    t = np.sort(np.concatenate([np.asarray(s, dtype=np.int64) for s in sends.values() if s]))
    t = t[t >= begin]
    lo, hi = int(np.percentile(t, 10)), int(np.percentile(t, 90))
    return lo, hi, int(((t >= lo) & (t <= hi)).sum())


@dataclass
class Fidelity:
    """Errors of one stamp column against the server's log."""

    itl: np.ndarray
    ttft: np.ndarray
    compared: int
    stall_truth: int = 0
    stall_found: int = 0
    stall_false: int = 0
    stall_err_max_ms: float | None = None


@dataclass
class Row:
    streams: int
    client: str  # kernel | aiohttp | vllm bench serve
    chunks: int = 0
    shared_reads: float = 0.0
    cpu_us_per_chunk: float | None = None
    cpu_percent: float | None = None
    stamps: dict[str, Fidelity] = field(default_factory=dict)
    load: str = ""
    note: str = ""


def _gaps(times: dict[str, list[int]]) -> pl.DataFrame:
    rows = [(rid, i, t[i - 1], t[i]) for rid, t in times.items() for i in range(1, len(t))]
    df = pl.DataFrame(rows, schema={"request_id": pl.Utf8, "index": pl.Int64, "t_prev_ns": pl.Int64,
                                    "t_ns": pl.Int64}, orient="row")
    return df.with_columns(((pl.col("t_ns") - pl.col("t_prev_ns")) / 1e9).alias("gap_s"))


def _stalls(times: dict[str, list[int]]) -> pl.DataFrame:
    return find_stalls(_gaps(times), StallParams()).select("request_id", "index", "gap_s")


def compare(client: dict[str, list[int]], server: dict[str, list[int]]) -> Fidelity:
    """Per request, the client's chunk times against the server's sends (same count, same order)."""
    base = stamp_errors(client, server)
    f = Fidelity(base.itl_ns, base.ttft_ns, base.compared)
    cl_times, sv_times = {}, {}
    for rid, c in client.items():
        s = server.get(rid)
        if c and s:
            n = min(len(c), len(s))
            cl_times[rid], sv_times[rid] = c[:n], s[:n]
    truth, seen = _stalls(sv_times), _stalls(cl_times)
    both = truth.join(seen, on=["request_id", "index"], how="inner", suffix="_client")
    f.stall_truth, f.stall_found = truth.height, both.height
    f.stall_false = seen.join(truth, on=["request_id", "index"], how="anti").height
    if both.height:
        f.stall_err_max_ms = float(((both["gap_s_client"] - both["gap_s"]).abs().max()) * 1e3)
    return f


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"


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


def _spawn_receiver() -> tuple[subprocess.Popen[str], str]:
    """An OTLP/HTTP receiver in its own process, so its CPU is not the client's."""
    proc = subprocess.Popen([sys.executable, "-m", "itlbench.telemetry.otlp_receiver", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def _run_client(args: argparse.Namespace, c: int, url: str, run_dir: Path, reader: str,
                      otlp: str | None = None) -> DriveResult:
    store = RunStore(run_dir)
    target = Target(url, "paced", timeout_s=None, stream_reader=reader)
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


def _paced(args: argparse.Namespace) -> PacedConfig:
    return PacedConfig(tick_s=args.tick_ms / 1e3, first_delay_s=args.first_delay_ms / 1e3,
                       pause_at_s=args.pause_at, pause_s=args.pause_ms / 1e3)


def measure(args: argparse.Namespace, c: int, reader: str) -> Row:
    proc, url = spawn(_paced(args))
    receiver, otlp = _spawn_receiver() if args.telemetry in ("otel", "both") else (None, None)
    row = Row(c, reader, load=_load())
    try:
        with tempfile.TemporaryDirectory() as tmp, CpuSampler(None) as cpu:
            if reader == "locust":
                res, doc = asyncio.run(_run_locust(args, c, url, Path(tmp)))
                locust_cpu_s = res.client.cpu_seconds + float(doc.get("master_cpu_s") or 0.0)
            else:
                res = asyncio.run(_run_client(args, c, url, Path(tmp), reader, otlp))
            log = server_log(url)
            req = read_table(tmp, "requests").select("request_id", "server_request_id")
            chunks = read_table(tmp, "chunks").sort("request_id", "index")
            pauses = read_table(tmp, "client_pauses")
    finally:
        for p in (proc, receiver):
            if p is not None:
                p.kill()
                p.wait()
    to_client = dict(zip(req["server_request_id"].to_list(), req["request_id"].to_list(), strict=True))
    server = {to_client[sid]: ts for sid, ts in log["sends"].items() if sid in to_client}
    by_req = chunks.group_by("request_id", maintain_order=True).agg("t_ns", "t_read_ns", "read_chunks")
    ids = by_req["request_id"].to_list()
    row.stamps[reader if reader in ("kernel", "locust") else "user"] = compare(
        dict(zip(ids, by_req["t_ns"].to_list(), strict=True)), server)
    if reader == "kernel":
        row.stamps["user"] = compare(dict(zip(ids, by_req["t_read_ns"].to_list(), strict=True)), server)
    row.chunks = chunks.height
    row.shared_reads = float((chunks["read_chunks"].fill_null(1) > 1).mean()) if chunks.height else 0.0
    lo, hi, n = steady_window(log["sends"], c)
    if reader == "locust":  # other processes: their whole-run CPU
        row.cpu_us_per_chunk = locust_cpu_s / max(1, chunks.height) * 1e6
    elif n and args.workers == 1:
        row.cpu_us_per_chunk = cpu.between(lo, hi) / n * 1e6
        row.cpu_percent = cpu.between(lo, hi) / ((hi - lo) / 1e9) * 100
    delay = (chunks["t_read_ns"] - chunks["t_ns"]) / 1e6
    longest = (pauses["end_ns"] - pauses["start_ns"]).max() if pauses.height else 0
    row.note = (f"{res.counts['sent']} reqs; read delay p99 {delay.quantile(0.99) or 0:.2f} ms; "
                f"{pauses.height} client pauses, longest {(longest or 0) / 1e6:.0f} ms")
    return row


def vllm_command(args: argparse.Namespace, c: int, url: str) -> list[str] | None:
    exe = VLLM_VENV / "bin" / "vllm"
    if not exe.exists() or not (VLLM_TOKENIZER / "tokenizer.json").exists():
        return None
    rounds = max(1, round(args.duration / (args.tokens * args.tick_ms / 1e3)))
    return [str(exe), "bench", "serve", "--backend", "openai", "--base-url", url.removesuffix("/v1"),
            "--endpoint", "/v1/completions", "--model", "paced", "--tokenizer", str(VLLM_TOKENIZER),
            "--dataset-name", "random", "--random-input-len", "4", "--random-output-len", str(args.tokens),
            "--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(rounds * c),
            "--max-concurrency", str(c), "--request-rate", "inf", "--disable-tqdm", "--seed", "0"]


def measure_vllm(args: argparse.Namespace, c: int) -> Row:
    """`vllm bench serve` on the same load: only its CPU per chunk (its own stamps are not read)."""
    row = Row(c, "vllm bench serve", load=_load())
    proc, url = spawn(_paced(args))
    try:
        cmd = vllm_command(args, c, url)
        if cmd is None:
            row.note = f"skipped: no vLLM peer venv at {VLLM_VENV} (or no tokenizer at {VLLM_TOKENIZER})"
            return row
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": ""}
        with tempfile.TemporaryDirectory() as tmp:
            peer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                                    env=env)
            with CpuSampler(peer.pid) as cpu:
                out, _ = peer.communicate(timeout=900)
        log = server_log(url)
    finally:
        proc.kill()
        proc.wait()
    if peer.returncode != 0:
        row.note = f"vllm bench serve failed ({peer.returncode}): {out.strip().splitlines()[-1:]}"
        return row
    lo, hi, n = steady_window(log["sends"], c)
    row.chunks = sum(len(s) for s in log["sends"].values())
    if n:
        row.cpu_us_per_chunk = cpu.between(lo, hi) / n * 1e6
        row.cpu_percent = cpu.between(lo, hi) / ((hi - lo) / 1e9) * 100
    row.note = "CPU only"
    return row


def _pct(a: np.ndarray) -> str:
    if not a.size:
        return "-"
    ms = a / 1e6
    return f"{np.percentile(ms, 50):.3f}/{np.percentile(ms, 99):.3f}/{np.abs(ms).max():.2f}"


def print_tables(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"\npaced server: 1 chunk / {args.tick_ms:g} ms / stream, {args.tokens} tokens per request, first token "
          f"after {args.first_delay_ms:g} ms + next tick, all streams paused {args.pause_ms:g} ms at "
          f"{args.pause_at:g} s; {args.duration:g} s per run; client processes: {args.workers}; "
          f"live telemetry: {args.telemetry}; "
          f"load = 1/5-min load average at the start of the run (2 CPUs)")
    print("errors in ms, p50/p99/max|err|; ITL err = client gap - server gap; TTFT err = client first - server first")
    print("stalls: server stall gaps / found by the client / false (client-only) / worst duration error ms")
    head = (f"{'streams':>7} {'reader':>8} {'stamps':>12} {'chunks':>8} {'ITL err p50/p99/max':>22} "
            f"{'TTFT err p50/p99/max':>24} {'stalls':>14} {'shared':>7} {'load':>9}  note")
    print(head)
    print("-" * len(head))
    for r in rows:
        for name, f in r.stamps.items():
            label = {"kernel": "kernel", "user": "user space", "locust": "locust"}[name]
            if r.client == "kernel" and name == "user":
                label = "user (same)"
            err = "-" if f.stall_err_max_ms is None else f"{f.stall_err_max_ms:.1f}"
            stalls = f"{f.stall_truth}/{f.stall_found}/{f.stall_false}/{err}"
            print(f"{r.streams:>7} {r.client:>8} {label:>12} {f.compared:>8} {_pct(f.itl):>22} "
                  f"{_pct(f.ttft):>24} {stalls:>14} {r.shared_reads:>7.2%} {r.load:>9}  {r.note}")
    print("\nclient CPU per chunk in the steady window (20 ms samples of the client process); median of the "
          "repeats, each repeat's figure after it")
    head = f"{'streams':>7} {'client':>18} {'CPU %':>6} {'µs/chunk':>9} {'÷ vLLM':>7}  repeats (µs/chunk)   note"
    print(head)
    print("-" * len(head))
    cpu = {}
    for r in rows:
        if r.cpu_us_per_chunk:
            cpu.setdefault((r.streams, r.client), []).append(r)
    for (streams, client), rs in cpu.items():
        us = float(np.median([r.cpu_us_per_chunk for r in rs]))
        pc = float(np.median([r.cpu_percent or 0 for r in rs]))
        peer = cpu.get((streams, "vllm bench serve"))
        ratio = f"{us / float(np.median([p.cpu_us_per_chunk for p in peer])):.2f}" if peer else "-"
        each = " ".join(f"{r.cpu_us_per_chunk:.1f}" for r in rs)
        skipped = next((r.note for r in rows if r.client == client and r.note.startswith("skipped")), "")
        print(f"{streams:>7} {client:>18} {pc:>6.0f} {us:>9.1f} {ratio:>7}  {each:<20} {skipped}")
    for r in rows:
        if r.client == "vllm bench serve" and not r.cpu_us_per_chunk:
            print(f"{r.streams:>7} {r.client:>18}  {r.note}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="100,500")
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--tick-ms", type=float, default=20.0)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--first-delay-ms", type=float, default=50.0)
    p.add_argument("--pause-at", type=float, default=3.0, help="seconds after the server starts; < 0: no pause")
    p.add_argument("--pause-ms", type=float, default=500.0)
    p.add_argument("--readers", default="kernel,aiohttp")
    p.add_argument("--vllm", choices=("auto", "off"), default="auto",
                   help="also run `vllm bench serve` from the peer venv for its CPU per chunk")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--driver", choices=("aiohttp", "locust"), default="aiohttp",
                   help="locust: also run every concurrency through Locust (--workers worker processes)")
    p.add_argument("--repeat", type=int, default=1, help="runs of every client per concurrency, interleaved")
    p.add_argument("--telemetry", choices=("off", "metrics", "otel", "both"), default="off",
                   help="live telemetry in the client (one worker only)")
    args = p.parse_args(argv)
    print(f"uvloop: {install_uvloop()}; CPUs: {os.cpu_count()}; load average at start: {_load()}")
    rows: list[Row] = []
    for c in (int(x) for x in args.concurrency.split(",")):
        for k in range(args.repeat):
            for reader in args.readers.split(",") + (["locust"] if args.driver == "locust" else []):
                rows.append(measure(args, c, reader))
                print(f"  {c} streams, {reader}, repeat {k + 1}: done (load {_load()})", flush=True)
            if args.vllm == "auto":
                rows.append(measure_vllm(args, c))
                print(f"  {c} streams, vllm bench serve, repeat {k + 1}: {rows[-1].note} (load {_load()})",
                      flush=True)
    print_tables(rows, args)
    if shutil.which("uptime"):
        print("\n" + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
