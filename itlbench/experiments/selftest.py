"""`itlbench selftest`: how faithfully this machine's client stamps streams, against a known truth.

A paced OpenAI-style server in its own process sends every stream one chunk per tick and logs each
send with `perf_counter_ns`, the client's clock on this host. The client drives N closed-loop streams
with each stream reader; per (N, reader) the errors against that log are
ITL error = client gap − server gap (consecutive chunks of one stream) and
TTFT error = client first token − server first send. The answer is the largest stream count whose ITL
error stays within `bound_ms` at p99 for each reader: above it, this client bends the tails it reports,
and a run's report can cite that figure.

User-space stamps (the aiohttp reader, the kernel reader's own read times) are late by however long
the client waited for a CPU once the bytes were in: on a shared machine that wait, not the reader,
makes their tail. So each row also says how long the client's loop thread sat runnable without a CPU
(`cpu_wait_ms_per_s`, Linux schedstat) and the 1-minute load when it began: a user-stamp row is this
machine's figure at that load, comparable with another only at a like wait. `benchmarks/client_fidelity.py` is the long form (CPU per chunk,
Locust, peers' clients) built on the same comparison.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from itlbench.errors import ConfigError
from itlbench.load.driver import drive
from itlbench.load.target import STREAM_READERS, Target
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, spawn
from itlbench.testing.plans import fixed_streams


@dataclass(frozen=True)
class SelftestConfig:
    streams: tuple[int, ...] = (10, 50, 100, 200)
    readers: tuple[str, ...] = ("kernel", "aiohttp")
    duration_s: float = 4.0
    # per request, and the paced server's wait before the first token (its prefill): the long study's
    # shape (benchmarks/client_fidelity.py), so the two measure the same thing. The streams run in step,
    # so every request ends on the same tick, and a user-space reader stamps the last chunks of the later
    # streams behind the earlier ones' completions (~0.2 ms each): shorter requests put more of those
    # gaps above p99; with no first-token wait, first tokens meet the client still sending the others
    tokens: int = 100
    first_delay_s: float = 0.05
    tick_s: float = 0.02
    bound_ms: float = 1.0

    def __post_init__(self) -> None:
        if not self.streams or min(self.streams) < 1:
            raise ConfigError("--streams", f"needs positive stream counts, got {self.streams}", "e.g. 10,50,100")
        bad = [r for r in self.readers if r not in STREAM_READERS or r == "auto"]
        if bad or not self.readers:
            raise ConfigError("--readers", f"unknown reader(s) {bad}", "use kernel and/or aiohttp")
        for flag, value, example in (("--duration", self.duration_s, "4s"), ("--bound-ms", self.bound_ms, "1.0"),
                                     ("tick_s", self.tick_s, "0.02")):  # the tick has no flag: a caller's value
            if not value > 0:
                raise ConfigError(flag, f"must be > 0, got {value:g}", f"e.g. {flag} {example}")
        if self.tokens < 2:
            raise ConfigError("--tokens", f"needs at least 2 tokens per request (for a gap), got {self.tokens}",
                              "e.g. --tokens 100")
        if self.first_delay_s < 0:
            raise ConfigError("--first-delay", f"must be ≥ 0, got {self.first_delay_s:g} s", "e.g. --first-delay 50ms")


@dataclass
class Errors:
    """Percentiles of one error distribution, milliseconds."""

    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None

    @classmethod
    def of(cls, ns: np.ndarray) -> Errors:
        if ns.size == 0:
            return cls(None, None, None)
        a = np.abs(ns) / 1e6
        return cls(float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.max()))


@dataclass
class Fidelity:
    """The client's stamps against the server's sends, per request (same count, same order)."""

    itl_ns: np.ndarray
    ttft_ns: np.ndarray
    compared: int


def compare(client: dict[str, list[int]], server: dict[str, list[int]]) -> Fidelity:
    itl, ttft, compared = [], [], 0
    for rid, c in client.items():
        s = server.get(rid)
        if not c or not s:
            continue
        n = min(len(c), len(s))
        cl, sv = np.asarray(c[:n], dtype=np.int64), np.asarray(s[:n], dtype=np.int64)
        ttft.append(cl[0] - sv[0])
        itl.append(np.diff(cl) - np.diff(sv))
        compared += n
    return Fidelity(np.concatenate(itl) if itl else np.zeros(0, np.int64), np.asarray(ttft, np.int64), compared)


def server_log(base_url: str) -> dict:
    """The paced server's send log: {"sends": {server request id: [perf_counter_ns, ...]}}."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_log", timeout=60) as r:
        return json.loads(r.read())


@dataclass
class SelftestRow:
    streams: int
    reader: str
    chunks: int
    itl: Errors
    ttft: Errors
    holds: bool  # ITL error p99 within the bound
    cpu_wait_ms_per_s: float | None = None  # the loop thread's run-queue wait per second of the drive (Linux)
    load1: float | None = None  # 1-minute load average when the point began


@dataclass
class SelftestResult:
    config: SelftestConfig
    rows: list[SelftestRow] = field(default_factory=list)

    def max_streams_within(self) -> dict[str, int | None]:
        """Per reader, the largest stream count whose ITL p99 error held (and every smaller count too)."""
        best: dict[str, int | None] = {}
        for reader in self.config.readers:
            best[reader] = None
            for row in sorted((r for r in self.rows if r.reader == reader), key=lambda r: r.streams):
                if not row.holds:
                    break
                best[reader] = row.streams
        return best

    def to_json(self) -> dict:
        return {"config": asdict(self.config), "rows": [asdict(r) for r in self.rows],
                "max_streams_within_bound": self.max_streams_within()}


async def _drive(cfg: SelftestConfig, streams: int, url: str, run_dir: Path, reader: str) -> None:
    store = RunStore(run_dir)
    target = Target(url, "paced", timeout_s=None, stream_reader=reader)
    try:
        await drive(fixed_streams(streams, cfg.tokens), target, store, duration_s=cfg.duration_s, warmup_s=0.0,
                    drain_timeout_s=0.0)
    finally:
        store.close()


def run_delay_ns() -> int | None:
    """This thread's time runnable but waiting for a CPU so far (schedstat's second field), None off Linux."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def measure(cfg: SelftestConfig, streams: int, reader: str) -> SelftestRow:
    proc, url = spawn(PacedConfig(tick_s=cfg.tick_s, first_delay_s=cfg.first_delay_s))
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wait0, t0 = run_delay_ns(), time.perf_counter_ns()
            asyncio.run(_drive(cfg, streams, url, Path(tmp), reader))  # the loop runs on this thread
            wait1, t1 = run_delay_ns(), time.perf_counter_ns()
            log = server_log(url)
            req = read_table(tmp, "requests").select("request_id", "server_request_id")
            chunks = read_table(tmp, "chunks").sort("request_id", "index")
    finally:
        proc.kill()
        proc.wait()
    to_client = dict(zip(req["server_request_id"].to_list(), req["request_id"].to_list(), strict=True))
    server = {to_client[sid]: ts for sid, ts in log["sends"].items() if sid in to_client}
    by_req = chunks.group_by("request_id", maintain_order=True).agg("t_ns")
    fid = compare(dict(zip(by_req["request_id"].to_list(), by_req["t_ns"].to_list(), strict=True)), server)
    itl = Errors.of(fid.itl_ns)
    wait = (wait1 - wait0) / 1e6 / ((t1 - t0) / 1e9) if wait0 is not None and wait1 is not None else None
    return SelftestRow(streams, reader, chunks.height, itl, Errors.of(fid.ttft_ns),
                       itl.p99_ms is not None and itl.p99_ms <= cfg.bound_ms, wait, load1)


def run_selftest(cfg: SelftestConfig, on_row: Callable[[SelftestRow], None] | None = None) -> SelftestResult:
    result = SelftestResult(cfg)
    for reader in cfg.readers:
        for n in sorted(cfg.streams):
            row = measure(cfg, n, reader)
            result.rows.append(row)
            if on_row is not None:
                on_row(row)
    return result
