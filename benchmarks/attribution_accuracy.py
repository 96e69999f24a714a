"""Client-only stall attribution against the bundled engine's step log (its ground truth).

Each shape is one real run of the bundled engine; the run is then analysed twice — from the step log
(summary.json's attribution) and from the client's records alone (`itlbench analyze --attribution client`)
— and compared by itlbench.analysis.attribution_check:
  same %    of the stalled seconds the step log attributes to a prefill, the share whose dominant prefilling
            request (longest overlap of its prefill steps with the gap) the client-only analysis names the same
  named %   ... names among the requests it says were prefilling
  false s   stalled seconds the client calls prefill and the step log does not
  inj       stalls naming an injected prompt (must be 0 in runs without an injection)
  step err  inferred step spacing − logged step spacing, |ms| at p50 / p90 / p99 (all matched steps; and the
            steps that carried a prefill), with the share of logged steps matched one to one (coverage)

    flock -x /tmp/itlb-cpu.lock python benchmarks/attribution_accuracy.py --out /tmp/attr   # all shapes
    python benchmarks/attribution_accuracy.py --engine sim --shapes 512:16k:16                # the simulator

`--engine torch` (default) runs the cpu-small preset; `--engine sim` the same scheduler on a virtual clock
(`--gpu cpu`), for boxes where the model is too slow. Shapes are BUDGET:INJECT:STREAMS (budget `none` =
unchunked, inject `-` = none; unchunked runs measure 0.8 s longer per 1k injected tokens, so that the one
long step ends inside the window, STREAMS `8r2` = 8 closed-loop streams plus open-loop arrivals at 2/s: requests
that arrive during a prefill and queue behind it, which closed-loop streams rarely do — they do not finish
while an injection slows them). Prints a markdown table and writes accuracy.json under --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from itlbench.analysis.attribution_check import compare
from itlbench.analysis.stalls import StallParams
from itlbench.analysis.summary import _window_from
from itlbench.core.engine_config import EngineConfig
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.rundir import load_tables

SHAPES = ("512:4k:8", "512:16k:16", "512:32k:32", "none:4k:8", "none:16k:16", "none:32k:32", "512:-:16",
          "none:-:8", "512:16k:8r2", "none:16k:8r2")


def _engine(budget: str, engine: str, gpu: str) -> EngineConfig:
    chunk = None if budget == "none" else int(budget)
    if engine == "sim":
        return EngineConfig(model="cpu-small", engine="sim", gpu=gpu, chunk_budget=chunk, max_num_seqs=64)
    return EngineConfig(model="cpu-small", chunk_budget=chunk, max_num_seqs=64, kv_memory_gib=1.0,
                        unchunked_prefill_cap=65536)


def run_shape(shape: str, out: Path, engine: str, gpu: str, duration_s: float, seed: int) -> dict[str, object]:
    budget, inject, load = shape.split(":")
    streams, _, rate = load.partition("r")
    run_dir = out / shape.replace(":", "_").replace("-", "noinj")
    if not (run_dir / "summary.json").is_file():
        # an unchunked prompt is one step, which must end inside the window for its stall to count
        long_step_s = 0.8 * int(inject.rstrip("k")) if budget == "none" and inject != "-" else 0.0
        cfg = RunConfig(workload="chat", streams=int(streams), rate=float(rate) if rate else None,
                        inject=None if inject == "-" else f"{inject}@2s",
                        duration_s=duration_s + long_step_s, warmup_s=1.0, drain_timeout_s=120.0, seed=seed, out=run_dir,
                        engine=_engine(budget, engine, gpu), live=False)
        run_load_test(cfg)
    meta = json.loads((run_dir / "run.json").read_text())
    result = compare(load_tables(run_dir), _window_from(meta), StallParams.from_meta(meta))
    return {"shape": shape, "budget": budget, "inject": inject, "streams": load, "run_dir": str(run_dir),
            **result}


def _pct(x: object) -> str:
    return "–" if x is None else f"{100 * float(x):.1f}"  # type: ignore[arg-type]


def _ms(d: object, key: str) -> str:
    return f"{d[key]:.2f}" if isinstance(d, dict) and key in d else "–"


def table(rows: list[dict[str, object]]) -> str:
    head = ("| budget | inject | streams | stalled s | prefill s | same % | named % | false s | inj | "
            "step err p50/p90/p99 ms | prefill-step err p50/p90 ms | coverage |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        st = r["steps"] if isinstance(r["steps"], dict) else {}
        a, p = st.get("all"), st.get("prefill")
        lines.append(
            f"| {r['budget']} | {r['inject']} | {r['streams']} | {r['stalled_s']:.2f} | {r['prefill_stalled_s']:.2f} | "
            f"{_pct(r['same_frac'])} | {_pct(r['named_frac'])} | {r['false_prefill_s']:.2f} | "
            f"{r['client_injected_named'] if r['inject'] == '-' else '·'} | "
            f"{_ms(a, 'abs_p50_ms')} / {_ms(a, 'abs_p90_ms')} / {_ms(a, 'abs_p99_ms')} | "
            f"{_ms(p, 'abs_p50_ms')} / {_ms(p, 'abs_p90_ms')} | {_pct(st.get('coverage'))} % |")
    total = sum(float(r["prefill_stalled_s"]) for r in rows)  # type: ignore[arg-type]
    same = sum(float(r["same_s"]) for r in rows)  # type: ignore[arg-type]
    lines.append(f"\nAll shapes: {100 * same / total:.1f} % of {total:.2f} prefill-stalled seconds name the same "
                 "dominant request." if total else "")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/itlbench-attribution"))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--engine", choices=("torch", "sim"), default="torch")
    ap.add_argument("--gpu", default="cpu", help="--engine sim: the simulated hardware")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        t0 = time.time()
        rows.append(run_shape(shape, args.out, args.engine, args.gpu, args.duration, args.seed))
        print(f"{shape}: {time.time() - t0:.0f} s", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
           "machine": f"{platform.machine()}, {platform.processor() or platform.system()}",
           "command": " ".join(sys.argv), "engine": args.engine, "rows": rows}
    (args.out / "accuracy.json").write_text(json.dumps(doc, indent=1, default=str))
    print(table(rows))


if __name__ == "__main__":
    main()
