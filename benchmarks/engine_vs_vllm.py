"""The bundled engine and vLLM-CPU side by side: same model, same workload, one run, one box.

    python benchmarks/engine_vs_vllm.py [--model-dir DIR] [--duration 30] [--layouts default,thread:2]

Both engines serve the same exported Hugging Face directory (`itlbench export-model cpu-small DIR`:
same shape, weights and tokenizer) and are driven by `itlbench run` with
`--workload chat --streams 8 --inject 4k@10s --duration 30 --seed 7`, one server at a time:

- at budget 2048: ITL p50 / p99 and output tokens/s from the run's summary; the median decode
  step from the step log (the bundled engine only; vLLM does not publish steps), next to the
  engine-only step at the same batch and per-sequence context measured in this process afterwards;
  the TTFT of a 4096-token prompt (max_tokens 1, median of 3) on the idle server before the load;
- at budgets 256 and 2048: the injection stall, the longest gap between two tokens of any other
  stream while the injected prompt waited for its first token (client records, for both engines).

Rows are printed as figures and as ratios to vLLM-CPU from the same run. vLLM comes from the peer
venv (benchmarks/peers/README.md); without it the vLLM rows are skipped with the reason, and the
bundled rows still print. `--layouts` adds rows for other bundled serving layouts: `thread:N` (engine
thread in the HTTP process, N torch threads) or `proc:N` (engine process, N torch threads).
Figures are from a shared machine unless it was idle: check the `uptime` lines the script prints.
On two cores vLLM's engine busy-polls a core; a client on the same box can then be starved for
seconds (the run's validity check says so and its ITL figures bunch): `--client-nice -5` gives the
client's thread priority for both engines alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.*` when run as a script

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from itlbench.core.engine_config import EngineConfig  # noqa: E402
from itlbench.harness.bundled_server import BundledServer  # noqa: E402
from itlbench.harness.orchestrate import run_load_test  # noqa: E402
from itlbench.harness.run_config import RunConfig  # noqa: E402
from itlbench.system.malloc import reexec_with_malloc_tunables  # noqa: E402

DEFAULT_MODEL_DIR = (Path.home() / "peers/models/cpu-small")
PREFILL_PROBE_TOKENS = 4096


@dataclass
class Row:
    name: str
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    output_tok_s: float | None = None
    decode_step_ms: float | None = None
    decode_batch: float | None = None
    decode_context: float | None = None
    engine_only_step_ms: float | None = None
    prefill_4k_s: float | None = None
    stall_s: dict[int, float | None] = field(default_factory=dict)
    client_valid: dict[int, bool] = field(default_factory=dict)  # the run's own validity verdict
    step_parts_ms: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    run_dirs: list[str] = field(default_factory=list)
    skipped: str | None = None


def uptime() -> str:
    try:
        return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


def ensure_model(model_dir: Path, preset: str) -> Path:
    if (model_dir / "config.json").is_file():
        return model_dir
    from itlbench.export.hf import export_model

    print(f"exporting {preset} to {model_dir}", flush=True)
    export_model(preset, model_dir)
    return model_dir


def prefill_probe(base_url: str, model: str, vocab: int, repeats: int = 3) -> float:
    """Median seconds for a PREFILL_PROBE_TOKENS prompt with max_tokens 1 on an idle server; fresh
    random tokens each time so no prefix cache helps."""
    rng = np.random.default_rng(1234)
    times = []
    for _ in range(repeats):
        body = {"model": model, "prompt": rng.integers(3, vocab, PREFILL_PROBE_TOKENS).tolist(), "max_tokens": 1,
                "temperature": 0}
        req = urllib.request.Request(f"{base_url}/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310 - loopback
            resp.read()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def injection_stall(run_dir: Path) -> float | None:
    """The longest gap any other stream saw between two of its tokens while an injected prompt waited
    for its first token (sent → first token), from the client's own records, so it means the same
    for an engine that publishes no step log."""
    from itlbench.rundir.reader import read_table

    reqs, chunks = read_table(run_dir, "requests"), read_table(run_dir, "chunks")
    inj = reqs.filter(pl.col("injected") & pl.col("first_token_ns").is_not_null())
    if inj.is_empty():
        return None
    others = set(reqs.filter(~pl.col("injected"))["request_id"].to_list())
    gaps = (chunks.filter(pl.col("request_id").is_in(others)).sort("request_id", "t_ns")
            .with_columns(prev=pl.col("t_ns").shift(1).over("request_id")).drop_nulls("prev"))
    worst = None
    for sent, first in inj.select("sent_ns", "first_token_ns").iter_rows():
        hit = gaps.filter((pl.col("prev") < first) & (pl.col("t_ns") > sent))
        if not hit.is_empty():
            gap = float((hit["t_ns"] - hit["prev"]).max()) / 1e9
            worst = gap if worst is None else max(worst, gap)
    return worst


def decode_steps(run_dir: Path) -> pl.DataFrame | None:
    """Decode steps inside the measured window, from the run's step log (None without one)."""
    from itlbench.rundir.reader import read_run_doc, read_table

    steps = read_table(run_dir, "steps")
    if steps is None or steps.is_empty():
        return None
    doc = read_run_doc(run_dir)
    lo, hi = doc.get("measure_start_ns"), doc.get("end_ns")
    steps = steps.filter(pl.col("phase") == "decode")
    if lo is not None and hi is not None:
        steps = steps.filter((pl.col("start_ns") >= lo) & (pl.col("end_ns") <= hi))
    return steps


def workload(args: argparse.Namespace, base_url: str, model: str, out: Path) -> tuple[Path, dict[str, Any]]:
    """One `itlbench run` against the server; with --client-nice the load client's thread runs at that
    niceness (servers keep theirs: they were started before)."""
    cfg = RunConfig(workload=args.workload, inject=args.inject, streams=args.streams, duration_s=args.duration,
                    seed=args.seed, endpoint=base_url, model=model, out=out, live=False)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if args.client_nice is not None:
        os.setpriority(os.PRIO_PROCESS, 0, args.client_nice)  # Linux: this thread, which runs the client loop
    try:
        return run_load_test(cfg)
    finally:
        if args.client_nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, before)


def fill_from_run(row: Row, run_dir: Path, summary: dict[str, Any], budget: int) -> None:
    row.run_dirs.append(str(run_dir))
    row.stall_s[budget] = injection_stall(run_dir)
    row.client_valid[budget] = bool(summary.get("valid"))
    row.errors += summary["requests"]["error"]
    if budget != 2048:
        return
    row.itl_p50_ms = summary["itl_s"]["p50"] * 1e3
    row.itl_p99_ms = summary["itl_s"]["p99"] * 1e3
    row.output_tok_s = summary["throughput"]["output_tokens_per_s"]
    steps = decode_steps(run_dir)
    if steps is None or steps.is_empty():
        return
    dur = (steps["end_ns"] - steps["start_ns"]) / 1e6
    row.decode_step_ms = float(dur.median())
    row.decode_batch = float(steps["num_decode_reqs"].median())
    if "decode_context_tokens" in steps.columns:
        row.decode_context = float((steps["decode_context_tokens"] / steps["num_decode_reqs"]).median())
    for part in ("schedule_ns", "prepare_ns", "forward_ns", "sample_ns", "output_ns", "handoff_ns"):
        if part in steps.columns:
            row.step_parts_ms[part.removesuffix("_ns")] = float(steps[part].median()) / 1e6


def bundled_layout(spec: str) -> tuple[str, bool | None, int | None]:
    if spec == "default":
        return "bundled (default layout)", None, None
    kind, _, threads = spec.partition(":")
    if kind not in ("proc", "thread") or not threads.isdigit():
        raise SystemExit(f"--layouts: {spec!r} is not default, proc:N or thread:N")
    where = "engine process" if kind == "proc" else "engine thread in the HTTP process"
    return f"bundled ({where}, {threads} torch thread{'s' if threads != '1' else ''})", kind == "proc", int(threads)


def run_bundled(args: argparse.Namespace, spec: str, model_dir: Path, work: Path) -> tuple[Row, int]:
    name, proc, threads = bundled_layout(spec)
    row, served_threads = Row(name), 1
    budgets = args.budgets if spec == args.layouts[0] else [2048]
    for budget in budgets:
        cfg = EngineConfig(model=str(model_dir), chunk_budget=budget, seed=args.seed, engine_process=proc,
                           torch_threads=threads)
        tag = f"{spec.replace(':', '')}-b{budget}"
        with BundledServer(cfg, work / f"{tag}.log") as srv:
            model = str(srv.engine_info.get("served_model_name") or cfg.model)
            served_threads = int(srv.engine_info.get("serving", {}).get("torch_threads") or 1)
            if budget == 2048:
                row.prefill_4k_s = prefill_probe(srv.base_url, model, int(srv.engine_info["model"]["vocab_size"]))
            run_dir, summary = workload(args, srv.base_url, model, work / tag)
        fill_from_run(row, run_dir, summary, budget)
        print(f"  {name} budget {budget}: done ({uptime()})", flush=True)
    return row, served_threads


def run_vllm(args: argparse.Namespace, model_dir: Path, work: Path) -> Row:
    row = Row("vLLM-CPU")
    try:
        from benchmarks.peers.vllm_server import VllmConfig, VllmServer, default_venv, vllm_executable
    except ImportError as exc:
        row.skipped = f"the peer helper benchmarks/peers/vllm_server.py is missing ({exc})"
        return row
    venv = default_venv()
    if vllm_executable(venv) is None:
        row.skipped = f"no vLLM in {venv} (install: benchmarks/peers/install_vllm.sh {venv})"
        return row
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    for budget in args.budgets:
        cfg = VllmConfig(model_dir=model_dir, chunk_budget=budget, log_path=work / f"vllm-b{budget}.log")
        with VllmServer(cfg) as srv:
            if budget == 2048:
                row.prefill_4k_s = prefill_probe(srv.base_url, srv.model, vocab)
            run_dir, summary = workload(args, srv.base_url, srv.model, work / f"vllm-b{budget}")
        fill_from_run(row, run_dir, summary, budget)
        print(f"  vLLM-CPU budget {budget}: done ({uptime()})", flush=True)
    return row


def engine_only_step(model_dir: Path, batch: int, context: int, threads: int) -> float:
    """The engine's median decode step at `batch` sequences of `context` tokens, in this process."""
    import torch

    from benchmarks.engine_cpu import bench_decode, decode_engine

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        engine = decode_engine(str(model_dir), context, batch, 20)
        rng = np.random.default_rng(0)
        bench_decode(engine, batch, context, 5, rng)  # warm-up
        return bench_decode(engine, batch, context, 20, rng)[0] * 1e3
    finally:
        torch.set_num_threads(before)


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def print_table(rows: list[Row], vllm: Row, budgets: list[int]) -> None:
    print("\n| | ITL p50 ms | ITL p99 ms | output tok/s | decode step ms (median) | engine-only step ms | "
          "served / engine-only | 4k prefill, idle s | " + " | ".join(f"stall @{b} s" for b in budgets)
          + " | runs valid | errors |")
    print("|---|" + "---:|" * (9 + len(budgets)))
    for r in [vllm, *rows]:
        if r.skipped:
            print(f"| {r.name} | skipped: {r.skipped} |")
            continue
        stalls = " | ".join(fmt(r.stall_s.get(b), ".2f") for b in budgets)
        step = fmt(r.decode_step_ms, ".1f")
        if r.decode_batch is not None:
            step += f" ({r.decode_batch:g} seqs, {fmt(r.decode_context, '.0f')} ctx)"
        print(f"| {r.name} | {fmt(r.itl_p50_ms, '.1f')} | {fmt(r.itl_p99_ms, '.1f')} | {fmt(r.output_tok_s, '.0f')} | "
              f"{step} | {fmt(r.engine_only_step_ms, '.1f')} | {ratio(r.decode_step_ms, r.engine_only_step_ms)} | "
              f"{fmt(r.prefill_4k_s, '.2f')} | {stalls} | "
              f"{', '.join(f'@{b} ' + ('yes' if v else 'no') for b, v in r.client_valid.items())} | {r.errors} |")
    print("\n(runs valid: the run's own verdict on the client, e.g. no client pauses over 0.25 s; a 'no' run's "
          "ITL figures include the client's stalls: see its summary.json validity reasons)")
    if vllm.skipped:
        return
    print("\nRatios to vLLM-CPU, same run (ITL and step: lower is better; tokens/s: higher is better):\n")
    print("| | ITL p50 | ITL p99 | output tok/s | 4k prefill | " + " | ".join(f"stall @{b}" for b in budgets) + " |")
    print("|---|" + "---:|" * (4 + len(budgets)))
    for r in rows:
        stalls = " | ".join(ratio(r.stall_s.get(b), vllm.stall_s.get(b)) for b in budgets)
        print(f"| {r.name} | {ratio(r.itl_p50_ms, vllm.itl_p50_ms)} | {ratio(r.itl_p99_ms, vllm.itl_p99_ms)} | "
              f"{ratio(r.output_tok_s, vllm.output_tok_s)} | {ratio(r.prefill_4k_s, vllm.prefill_4k_s)} | {stalls} |")


def main() -> None:
    reexec_with_malloc_tunables()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="exported model (written if absent)")
    ap.add_argument("--preset", default="cpu-small", help="what to export when --model-dir is absent")
    ap.add_argument("--workload", default="chat")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--inject", default="4k@10s")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--budgets", default="256,2048", help="budgets for the injection stall (2048 is the main run)")
    ap.add_argument("--layouts", default="default", help="bundled rows: default, proc:N, thread:N (comma list)")
    ap.add_argument("--no-vllm", action="store_true", help="bundled rows only")
    ap.add_argument("--client-nice", type=int, default=None,
                    help="niceness of the load client during runs (e.g. -5, needs privilege): on a box where "
                         "vLLM's busy-polling engine starves a co-located client, keeps the client's timestamps valid")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep run directories and logs here")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = ap.parse_args()
    args.budgets = sorted({int(b) for b in args.budgets.split(",")} | {2048})
    args.layouts = args.layouts.split(",")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="engine-vs-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_model(args.model_dir, args.preset)
    print(f"model {model_dir}; workload {args.workload}, {args.streams} streams, inject {args.inject}, "
          f"{args.duration:g} s, seed {args.seed}; runs in {work}")
    print(f"start: {uptime()} on {os.cpu_count()} CPUs; client niceness "
          f"{args.client_nice if args.client_nice is not None else 'unchanged'}", flush=True)
    vllm = Row("vLLM-CPU", skipped="--no-vllm") if args.no_vllm else run_vllm(args, model_dir, work)
    if vllm.skipped:
        print(f"vLLM-CPU: skipped — {vllm.skipped}", flush=True)
    rows: list[Row] = []
    for spec in args.layouts:
        row, threads = run_bundled(args, spec, model_dir, work)
        rows.append(row)
        if row.decode_batch and row.decode_context:
            row.engine_only_step_ms = engine_only_step(model_dir, round(row.decode_batch), round(row.decode_context),
                                                       threads)
    print(f"end: {uptime()}")
    print_table(rows, vllm, args.budgets)
    for r in rows:
        if r.step_parts_ms:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in r.step_parts_ms.items())
            print(f"\n{r.name}: median decode step parts (ms): {parts}")
    if args.json:
        args.json.write_text(json.dumps([vars(r) for r in [vllm, *rows]], indent=1, default=str))


if __name__ == "__main__":
    main()
