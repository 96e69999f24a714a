"""How `itlbench analyze` scales with a run's size: synthesise run directories of 1M, 10M and 100M
chunk rows and print the analysis's time and peak RSS for each.

    python benchmarks/analysis_scale.py [--rows 1e6,1e7] [--root /tmp/itlb-scale] [--reuse]
                                        [--summary-only] [--exact] [--repeat 1]

A synthetic run has the shape of a real one: `streams` closed-loop streams (1,000 at 100M rows), each
receiving one token per engine step (~40 ms, jittered, 2 % of chunks bundling two tokens), requests
of 100–700 tokens with a TTFT of a few steps between them, an injected 16k-token prompt every 60 s
whose unchunked prefill step (1.2 s) freezes every stream (a stall per stream, cause: prefill), and
rare long decode steps (0.02 % of steps, 5×). Parts are flushed every 2 s of run time, as RunStore
does, through the run directory's own schema (itlbench.rundir.schema), so an hour at 1,000 streams
has the ~1,800 parts per table the live client writes.

Each analysis runs in a fresh child process (`python -m itlbench analyze RUN`, or with `--summary-only`
just `analyze_run`); its peak RSS is the child's own ru_maxrss (os.wait4). `--exact` also computes the
summary with the in-memory reference (itlbench.analysis.summary.summarize over load_tables: every
chunk row in memory) in its own child and prints the largest relative difference of any figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from itlbench.rundir.reader import conform  # noqa: E402
from itlbench.rundir.schema import TABLES, columns_frame  # noqa: E402

MS = 1_000_000
S = 1_000_000_000
T0 = 10_000 * S  # perf_counter-like origin
PART_S = 2.0
INJECT_EVERY_S = 60.0
WARMUP_S = 10.0


@dataclass(frozen=True)
class Shape:
    """Streams and duration that give `rows` chunk rows at ~25 tokens/s per stream."""

    rows: int
    streams: int
    seed: int = 0

    @property
    def duration_s(self) -> float:
        return self.rows / (self.streams * 25.0) * 1.03 + WARMUP_S


def shape_for(rows: int) -> Shape:
    return Shape(rows, 100 if rows <= 1_500_000 else 400 if rows <= 15_000_000 else 1000)


class Writer:
    """Parquet parts per table, numbered as RunStore numbers them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.parts: dict[str, int] = {}

    def write(self, table: str, df: pl.DataFrame) -> None:
        if not df.height:
            return
        n = self.parts.get(table, 0)
        folder = self.root / table
        folder.mkdir(parents=True, exist_ok=True)
        conform(df, TABLES[table]).write_parquet(folder / f"part-{n:05d}.parquet")
        self.parts[table] = n + 1


def _rid(prefix: str, stream: pl.Expr, j: pl.Expr) -> pl.Expr:
    return pl.format(prefix + "{}-{}", stream.cast(pl.Utf8).str.zfill(4), j.cast(pl.Utf8).str.zfill(6))


class Synth:
    """A closed-loop run stepped by a simulated engine clock (vectorised over streams)."""

    def __init__(self, shape: Shape, root: Path) -> None:
        self.shape, self.out = shape, Writer(root)
        self.rng = np.random.default_rng(shape.seed)
        n = shape.streams
        self.j = np.zeros(n, np.int64)
        self.k = np.zeros(n, np.int64)
        self.length = self.rng.integers(100, 700, n)
        self.idle = self.rng.integers(0, 200, n)  # staggered start
        self.sched = np.full(n, T0, np.int64)
        self.first = np.zeros(n, np.int64)
        self.tokens = np.zeros(n, np.int64)
        self.step = 0
        self.t = T0
        self.chunks: list[tuple[np.ndarray, ...]] = []
        self.reqs: list[dict[str, object]] = []
        self.steps: list[dict[str, object]] = []
        self.inj: list[dict[str, object]] = []
        self.inj_chunks: list[tuple[str, int, int]] = []
        self.next_inject = T0 + int(WARMUP_S * S) + 5 * S
        self.chunk_rows = 0
        self.injections = 0

    def _one_step(self) -> None:
        rng, n = self.rng, self.shape.streams
        start = self.t + int(rng.exponential(0.2 * MS))
        prefill = start >= self.next_inject
        if prefill:
            dur = int(1.2 * S + rng.normal(0, 20 * MS))
            self.injections += 1
            sid = f"cmpl-inj-{self.injections:04d}"
            rid = f"inj-{self.injections:04d}"
            self.inj.append({"request_id": rid, "server_request_id": sid, "workload": "injected", "cls": "injected",
                             "injected": True, "prompt_tokens": 16384, "max_tokens": 16, "scheduled_ns": start - MS,
                             "sent_ns": start - MS + 50_000, "status": "ok", "http_status": 200,
                             "first_token_ns": start + dur + MS, "done_ns": start + dur + 17 * 40 * MS})
            self.inj_chunks += [(rid, i, start + dur + MS + i * 40 * MS) for i in range(16)]
            self.next_inject += int(INJECT_EVERY_S * S)
        else:
            dur = int(max(5 * MS, rng.normal(40 * MS, 2 * MS)) * (5 if rng.random() < 2e-4 else 1))
        end = start + dur
        active = np.flatnonzero(self.idle == 0) if not prefill else np.empty(0, np.int64)
        self.steps.append({"step": self.step, "phase": "prefill" if prefill else "decode",
                           "prefill_tokens": 16384 if prefill else 0, "decode_tokens": int(active.size),
                           "num_running": n, "token_budget": None, "start_ns": start, "end_ns": end,
                           "prefill_request_ids": [sid] if prefill else [], "num_preemptions": 0})
        if active.size:
            t = end + rng.exponential(0.3 * MS, active.size).astype(np.int64)
            tok = np.where(rng.random(active.size) < 0.02, 2, 1)
            first = self.k[active] == 0
            self.first[active[first]] = t[first]
            self.chunks.append((active, self.j[active].copy(), self.k[active].copy(), t, tok))
            self.chunk_rows += active.size
            self.tokens[active] += tok
            self.k[active] += 1
            done = active[self.k[active] >= self.length[active]]
            for i, tl in zip(done.tolist(), t[self.k[active] >= self.length[active]].tolist(), strict=True):
                self._finish(i, tl)
        waiting = self.idle > 0
        self.idle[waiting] -= 1
        self.t, self.step = end, self.step + 1

    def _finish(self, i: int, last: int, status: str = "ok") -> None:
        self.reqs.append({"status": status, "stream": i, "j": int(self.j[i]), "prompt_tokens": int(self.rng.integers(200, 3000)),
                          "max_tokens": int(self.length[i]), "scheduled_ns": int(self.sched[i]),
                          "sent_ns": int(self.sched[i]) + 80_000, "first_token_ns": int(self.first[i]),
                          "last_token_ns": last, "done_ns": last + 200_000, "output_tokens": int(self.tokens[i]),
                          "num_chunks": int(self.k[i])})
        self.j[i] += 1
        self.k[i] = 0
        self.tokens[i] = 0
        self.length[i] = self.rng.integers(100, 700)
        self.idle[i] = self.rng.integers(2, 6)
        self.sched[i] = last + 300_000

    def _flush(self) -> None:
        if self.chunks:
            cols = [np.concatenate(c) for c in zip(*self.chunks, strict=True)]
            df = pl.DataFrame({"stream": cols[0], "j": cols[1], "index": cols[2], "t_ns": cols[3], "n_tokens": cols[4]})
            self.out.write("chunks", df.with_columns(
                _rid("s", pl.col("stream"), pl.col("j")).alias("request_id"), pl.lit("user").alias("stamp"),
                pl.col("t_ns").alias("t_read_ns"), pl.lit(1).alias("read_chunks")))
            self.chunks = []
        if self.inj_chunks:
            self.out.write("chunks", pl.DataFrame(self.inj_chunks, schema=["request_id", "index", "t_ns"], orient="row")
                           .with_columns(pl.lit(1).alias("n_tokens"), pl.lit("user").alias("stamp"),
                                         pl.col("t_ns").alias("t_read_ns")))
            self.inj_chunks = []
        if self.reqs or self.inj:
            df = pl.DataFrame(self.reqs) if self.reqs else None
            if df is not None:
                df = df.with_columns(_rid("s", pl.col("stream"), pl.col("j")).alias("request_id"),
                                     pl.format("cmpl-{}", _rid("s", pl.col("stream"), pl.col("j")))
                                     .alias("server_request_id"), pl.lit("chat").alias("workload"),
                                     pl.lit("chat").alias("cls"), pl.lit(False).alias("injected"),
                                     pl.lit(200).alias("http_status")).drop("j")
                self.out.write("requests", df)
            if self.inj:
                self.out.write("requests", columns_frame("requests", {k: [r.get(k) for r in self.inj]
                                                                      for k in TABLES["requests"]}))
            self.reqs, self.inj = [], []
        if self.steps:
            self.out.write("steps", columns_frame("steps", {k: [r.get(k) for r in self.steps] for k in TABLES["steps"]}))
            self.steps = []
        self.out.write("client_samples", pl.DataFrame({
            "t_ns": [self.t], "loop_lag_s": [0.0005], "cpu_percent": [20.0], "in_flight": [self.shape.streams],
            "clock_offset_ns": [0]}))

    def run(self) -> dict[str, object]:
        next_flush = T0 + int(PART_S * S)
        while self.chunk_rows < self.shape.rows:
            self._one_step()
            if self.t >= next_flush:
                self._flush()
                next_flush += int(PART_S * S)
        for i in np.flatnonzero(self.k > 0).tolist():  # cut by the end of the run, as the driver records them
            self._finish(i, int(self.t), "cancelled")
        self._flush()
        return {"chunk_rows": self.chunk_rows, "end_ns": self.t, "parts": self.out.parts}


def synthesise(shape: Shape, root: Path) -> dict[str, object]:
    """Write the run directory `root` (replaced) and its run.json."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    info = Synth(shape, root).run()
    doc = {"itlbench_version": "0.1.0", "created": "2026-01-01T00:00:00+00:00",
           "config": {"workload": "chat", "inject": "16k@60s", "streams": shape.streams, "duration_s":
                      (int(info["end_ns"]) - T0) / S - WARMUP_S, "warmup_s": WARMUP_S, "seed": shape.seed,  # type: ignore[call-overload]
                      "engine": {"model": "synthetic", "chunk_budget": None, "policy": "budget"}},
           "hardware": {"cpu_count": os.cpu_count(), "cuda": None, "torch": None}, "versions": {},
           "stall_factor": 5.0, "stall_floor_s": 0.05, "slo": None,
           "engine": {"served_model_name": "synthetic", "engine": {"model": "synthetic", "chunk_budget": None,
                                                                   "policy": "budget"}},
           "target": {"kind": "bundled"}, "run_start_ns": T0, "measure_start_ns": T0 + int(WARMUP_S * S),
           "end_ns": info["end_ns"], "synthetic": info}
    (root / "run.json").write_text(json.dumps(doc, indent=1))
    return info


CODE = Path(__file__).resolve().parents[1]


def measure(argv: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB, exit code) of one child process."""
    env = {**os.environ, "PYTHONPATH": str(CODE), "MPLBACKEND": "Agg"}
    t = time.perf_counter()
    # cwd too: `python -m` and `-c` put the working directory first on sys.path, before PYTHONPATH
    proc = subprocess.Popen(argv, env=env, cwd=CODE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code:
        print(f"  child failed ({code}): {err[-600:]}", file=sys.stderr)
    return wall, usage.ru_maxrss / 1024, code


SUMMARY_ONLY = ("import json,sys; from itlbench.analysis.summary import analyze_run; "
                "json.dump(analyze_run(sys.argv[1]), open(sys.argv[2], 'w'))")
REFERENCE = ("import json,sys; from itlbench.analysis.summary import _window_from, summarize; from itlbench.analysis.stalls import StallParams; "
             "from itlbench.analysis.goodput import parse_slo; from itlbench.rundir import load_tables; "
             "m = json.load(open(sys.argv[1] + '/run.json')); "
             "json.dump(summarize(load_tables(sys.argv[1]), _window_from(m), parse_slo(m.get('slo')), "
             "StallParams.from_meta(m)), open(sys.argv[2], 'w'))")


def max_rel_diff(a: object, b: object, path: str = "") -> tuple[float, str]:
    """Largest relative difference between two summaries' numbers (inf where they disagree otherwise)."""
    if isinstance(a, dict) and isinstance(b, dict):
        worst = (0.0, "")
        for k in set(a) | set(b):
            worst = max(worst, max_rel_diff(a.get(k), b.get(k), f"{path}.{k}"))
        return worst
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return float("inf"), path
        return max([(0.0, "")] + [max_rel_diff(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))])
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return (0.0, "") if a == b else (float("inf"), path)
    return (abs(a - b) / max(abs(a), abs(b)) if a != b else 0.0), path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1e6,1e7", help="comma-separated chunk-row counts, e.g. 1e6,1e7,1e8")
    p.add_argument("--root", type=Path, default=Path("/tmp/itlb-scale"))
    p.add_argument("--reuse", action="store_true", help="keep run directories already synthesised")
    p.add_argument("--summary-only", action="store_true", help="time analyze_run alone (no report)")
    p.add_argument("--exact", action="store_true", help="compare with the in-memory reference summary")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--code", type=Path, help="itlbench source tree to measure (default: this checkout), "
                   "e.g. an older commit's `git archive` for a before/after table")
    a = p.parse_args()
    global CODE
    CODE = a.code or CODE
    print(f"{'chunk rows':>12} {'streams':>7} {'parts':>6} {'MB':>7} {'time s':>8} {'peak RSS MiB':>13}"
          + ("  reference s  ref RSS MiB  max rel diff" if a.exact else ""))
    for text in a.rows.split(","):
        rows = int(float(text))
        root = a.root / f"run-{rows}"
        if not (a.reuse and (root / "run.json").is_file()):
            t = time.perf_counter()
            synthesise(shape_for(rows), root)
            print(f"  synthesised {root} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        doc = json.loads((root / "run.json").read_text())
        (root / "summary.json").unlink(missing_ok=True)
        size = sum(f.stat().st_size for f in root.rglob("*.parquet")) / 1e6
        out = root / "bench-summary.json"
        argv = ([sys.executable, "-c", SUMMARY_ONLY, str(root), str(out)] if a.summary_only
                else [sys.executable, "-m", "itlbench", "analyze", str(root)])
        for _ in range(a.repeat):
            wall, rss, _code = measure(argv)
            line = (f"{doc['synthetic']['chunk_rows']:>12,} {doc['config']['streams']:>7} "
                    f"{doc['synthetic']['parts'].get('chunks', 0):>6} {size:>7.0f} {wall:>8.1f} {rss:>13.0f}")
            if a.exact:
                ref = root / "bench-reference.json"
                rwall, rrss, _ = measure([sys.executable, "-c", REFERENCE, str(root), str(ref)])
                mine = out if a.summary_only else root / "summary.json"
                diff, where = max_rel_diff(json.loads(mine.read_text()), json.loads(ref.read_text()))
                line += f"  {rwall:>11.1f}  {rrss:>11.0f}  {diff:.2e} {where}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
