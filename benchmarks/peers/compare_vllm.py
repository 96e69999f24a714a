"""The bundled engine against vLLM-CPU on one exported model, one seeded workload and injection, at
several chunk budgets; writes each run's directory and a markdown table of their summaries.

Both engines serve the directory `itlbench export-model` wrote (same shape, weights and tokenizer),
with at most 64 running sequences; vLLM gets `--max-num-batched-tokens B` (or unchunked prefill),
the bundled engine `--chunk-budget B`. vLLM-CPU runs its model on one core (its worker's OpenMP
thread is bound to core 0) and keeps the other for its API server and the client, so the bundled
engine is given one torch thread too (OMP_NUM_THREADS=1). Each run gets a fresh prompt salt, so the
repeats against one long-lived vLLM server measure prefill, not its prefix cache.

    python -m benchmarks.peers.compare_vllm ~/peers/models/cpu-small --out ~/peers/runs/compare \\
        --keep reports/vllm-cpu/runs
    python -m benchmarks.peers.compare_vllm --render ~/peers/runs/compare  # print the table only

`--client-nice -10` gives each client (not the engines: vLLM and the bundled server run in sessions of
their own) ten times the CPU weight, so that the client's loop is not starved of a CPU by the engine
it measures (see benchmarks/peers/scrape_effect.py). Take it under the bench lock
(`flock /tmp/itlbench-bench.lock ...`); each row records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.scrape_effect import with_cpu_weight  # noqa: E402
from benchmarks.peers.vllm_server import VllmConfig, VllmServer  # noqa: E402
from itlbench.rundir.reader import read_summary  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOAD = ["--workload", "chat", "--streams", "8", "--inject", "4k@10s", "--duration", "30", "--seed", "7"]
MAX_NUM_SEQS = 64


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _itlbench(args: list[str], out: Path, env: dict[str, str] | None = None, nice: int | None = None) -> dict[str, Any]:
    cmd = with_cpu_weight([sys.executable, "-m", "itlbench", "run", *args, *LOAD, "--out", str(out),
                           "--no-live"], nice)
    before = loadavg()
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          check=False)
    rec = {"dir": str(out), "rc": proc.returncode, "loadavg_before": before, "loadavg_after": loadavg(),
           "client_nice": nice,
           "command": ("OMP_NUM_THREADS=1 " if env else "") + "itlbench " + " ".join(cmd[cmd.index("run"):])}
    if proc.returncode:
        rec["stderr_tail"] = proc.stderr[-2000:]
    (out.parent / f"{out.name}.meta.json").write_text(json.dumps(rec, indent=1))
    return rec


def measure(model_dir: Path, out: Path, budgets: list[str], repeats: int, nice: int | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for budget in budgets:
        size = None if budget == "none" else int(budget)
        cfg = VllmConfig(model_dir=model_dir, chunk_budget=size, max_num_seqs=MAX_NUM_SEQS,
                         log_path=out / f"vllm-b{budget}.log")
        with VllmServer(cfg) as srv:
            print(f"vLLM b{budget} up in {srv.startup_s:.0f} s; load {loadavg()}", flush=True)
            for i in range(repeats):
                rec = _itlbench(["--endpoint", srv.base_url, "--model", srv.model], out / f"vllm-b{budget}-{i}",
                                nice=nice)
                print(json.dumps(rec), flush=True)
        for i in range(repeats):
            rec = _itlbench(["--model", str(model_dir), "--chunk-budget", budget, "--max-num-seqs",
                             str(MAX_NUM_SEQS)], out / f"bundled-b{budget}-{i}", env={"OMP_NUM_THREADS": "1"},
                            nice=nice)
            print(json.dumps(rec), flush=True)


def _g(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        d = (d or {}).get(k)  # type: ignore[assignment]
    return d


def _f(v: Any, scale: float = 1.0, digits: int = 2) -> str:
    return "—" if v is None else f"{v * scale:,.{digits}f}"


def _row(name: str, run_dir: Path) -> str:
    s = read_summary(run_dir)
    meta = json.loads((run_dir.parent / f"{run_dir.name}.meta.json").read_text())
    engine, budget, rep = name.split("-")
    inj = (_g(s, "cache", "injected") or [{}])[0]
    ttft = inj.get("ttft_s") or _g(s, "ttft_by_class_s", "injected", "max")
    cached = inj.get("cached_tokens")
    split = s.get("split") or {}
    frac = split.get("prefill_frac")
    src = str(split.get("source") or "").split(" ")[0]
    stalls = s.get("stalls") or {}
    cells = [engine, budget.removeprefix("b"), rep, _f(ttft), "—" if cached is None else f"{cached:,}",
             _f(_g(s, "itl_s", "p50"), 1e3, 1), _f(_g(s, "itl_s", "p99"), 1e3, 1),
             _f(_g(s, "itl_s", "max"), 1e3, 0), f"{stalls.get('count', 0)}", _f(stalls.get("worst_s")),
             "—" if frac is None else f"{frac:.1%} ({src})", _f(_g(s, "throughput", "output_tokens_per_s"), 1, 0),
             "yes" if s.get("valid") else "no", meta["loadavg_before"].split()[0]]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| engine | budget | run | injected TTFT (s) | injected cached tokens | ITL p50 (ms) | ITL p99 (ms) "
          "| ITL max (ms) | stall gaps | worst stall (s) | prefill share (source) | output tok/s | valid "
          "| load avg |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|")


def render(out: Path) -> str:
    names = sorted(p.name for p in out.iterdir() if p.is_dir() and (p / "summary.json").is_file())
    order = {"256": 0, "2048": 1, "none": 2}
    names.sort(key=lambda n: (order.get(n.split("-")[1].removeprefix("b"), 9), n.split("-")[0], n))
    return HEADER + "\n" + "\n".join(_row(n, out / n) for n in names) + "\n"


def keep_summaries(out: Path, dest: Path) -> None:
    """Copy each run's run.json and summary.json (not its parquet tables) next to the report."""
    for run in sorted(p for p in out.iterdir() if p.is_dir() and (p / "summary.json").is_file()):
        target = dest / run.name
        target.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "summary.json"):
            shutil.copy(run / name, target / name)
        shutil.copy(out / f"{run.name}.meta.json", dest / f"{run.name}.meta.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path, nargs="?")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budgets", default="256,2048,none")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--render", type=Path, help="only print the table of the runs in this directory")
    ap.add_argument("--keep", type=Path, help="copy every run's run.json and summary.json here")
    ap.add_argument("--client-nice", type=int, help="autogroup nice of each client (e.g. -10; root only); "
                    "both engines run in sessions of their own at the default weight")
    args = ap.parse_args()
    if args.render is None:
        if args.model_dir is None or args.out is None:
            ap.error("give MODEL_DIR and --out (or --render DIR)")
        measure(args.model_dir, args.out, args.budgets.split(","), args.repeats, args.client_nice)
    print(render(args.render or args.out))
    if args.keep:
        keep_summaries(args.render or args.out, args.keep)


if __name__ == "__main__":
    main()
