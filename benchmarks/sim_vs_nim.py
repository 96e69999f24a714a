"""`itlbench run --engine sim` beside NVIDIA's published serving runs of the issue's own deployment.

    python benchmarks/sim_vs_nim.py [--quick]

NVIDIA's NIM benchmarking guide publishes AIPerf runs of Llama-3.3-70B-Instruct (NIM 1.8.0) on two H100
80 GB in FP8 at TP 2, 5,000 input and 500 output tokens, at a closed-loop concurrency of 1 to 250: mean
TTFT, mean ITL (AIPerf's: a request's time after its first token over its other tokens, averaged over
requests; itlbench's `tpot_s`) and output tokens/s. That is `itlbench run --engine sim --model
llama-3.3-70b --gpu h100 --tp 2 --dtype fp8 --workload fixed:5000:500`, the command issue 29 names, so
each concurrency is run here exactly so (subprocess, `--json`) and set beside the published figure. Nothing
is fitted on these figures: they are held out, a check of the whole simulated server (scheduler, K/V
capacity, step costs) under load, where sim_vs_published.py checks steps and offline runs.

Assumed, since the page does not give the server's settings: TensorRT-LLM's default step budget of 8,192
tokens (`--chunk-budget 8192`) and up to 256 running requests (`--max-num-seqs 256`); the K/V room is the
simulator's own (the H100's memory after the FP8 weights). The first sends of a closed loop all leave at
once in AIPerf and here; with fixed lengths the simulated streams then stay in step, so from 5 streams up
the prompts arrive in waves. TTFT there depends on that phase, which the page does not give: it is run
twice, in step and spread (`--ramp 30s`), and both are printed. `--quick` runs concurrency 1 only.

Source: docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance ("Llama-3.3-70b-instruct Results", Version
1.8.0, 2 x H100 80G, fp8 TP2), read 2026-12-06. Computed, not measured: any machine prints the same.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE = "docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance (NIM 1.8.0, Llama-3.3-70B, 2 x H100, FP8 TP2)"
COMMAND = ["itlbench", "run", "--engine", "sim", "--model", "llama-3.3-70b", "--gpu", "h100", "--tp", "2",
           "--dtype", "fp8", "--chunk-budget", "8192", "--max-num-seqs", "256", "--warmup", "150s",
           "--duration", "600s", "--no-live", "--json"]
RAMP_S = 30  # about one request's time at 25 streams: spreads the first sends over a request's life
OVER = 0.15


@dataclass(frozen=True)
class Published:
    """One row of the page's table: concurrency, mean TTFT ms, mean ITL ms, output tokens/s."""

    isl: int
    osl: int
    concurrency: int
    ttft_ms: float
    itl_ms: float
    tok_s: float


# "5000 Input Tokens / 500 Output Tokens", every row; of "500 Input Tokens / 2000 Output Tokens" the one row read
PUBLISHED = (
    Published(5000, 500, 1, 406.77, 18.58, 51.67), Published(5000, 500, 5, 546.7, 21.83, 218.48),
    Published(5000, 500, 25, 688.69, 38.75, 623.4), Published(5000, 500, 50, 834.51, 59.73, 814.37),
    Published(5000, 500, 100, 7996.25, 92.91, 917.26), Published(5000, 500, 150, 34794.22, 92.86, 920.9),
    Published(5000, 500, 200, 61680.22, 93.06, 920.54), Published(5000, 500, 250, 88605.32, 93.2, 920.12),
    Published(500, 2000, 1, 47.77, 18.91, 52.85),
)
PHASED = (5, 25, 50)  # prompt waves decide TTFT here (below, the queue does)


def simulate(row: Published, ramp_s: float = 0.0) -> dict[str, float]:
    """Mean TTFT and TPOT (ms) and output tokens/s of `itlbench run --engine sim` at this row's shape."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", *COMMAND, "--workload", f"fixed:{row.isl}:{row.osl}", "--streams", str(row.concurrency),
               "--ramp", f"{ramp_s:g}s", "--no-report", "--out", str(Path(tmp) / "run")]  # only the summary is read
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"{' '.join(cmd[2:])} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
        summary = json.loads(done.stdout)["summary"]
    return {"ttft_ms": summary["ttft_s"]["all"]["mean"] * 1e3, "itl_ms": summary["tpot_s"]["mean"] * 1e3,
            "tok_s": summary["throughput"]["output_tokens_per_s"]}


def _err(sim: float, pub: float) -> str:
    e = sim / pub - 1.0
    return f"{e:+.1%}" + (" *" if abs(e) > OVER else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="concurrency 1 only")
    args = ap.parse_args()
    rows = [r for r in PUBLISHED if r.concurrency == 1] if args.quick else list(PUBLISHED)
    print(f"# {SOURCE}\n# simulated: {' '.join(COMMAND)} --workload fixed:ISL:OSL --streams N"
          f"\n# (* over {OVER:.0%}; TTFT at {', '.join(map(str, PHASED))} streams: in step | spread by --ramp {RAMP_S}s)")
    print("| shape | streams | TTFT ms published | simulated | error | ITL ms published | simulated | error "
          "| tok/s published | simulated | error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s = simulate(r)
        ttft_sim, ttft_err = f"{s['ttft_ms']:,.0f}", _err(s["ttft_ms"], r.ttft_ms)
        if r.concurrency in PHASED:
            spread = simulate(r, RAMP_S)
            ttft_sim += f" \\| {spread['ttft_ms']:,.0f}"
            ttft_err += f" \\| {_err(spread['ttft_ms'], r.ttft_ms)}"
        print(f"| {r.isl}/{r.osl} | {r.concurrency} | {r.ttft_ms:,.0f} | {ttft_sim} | {ttft_err} | {r.itl_ms:.2f} | "
              f"{s['itl_ms']:.2f} | {_err(s['itl_ms'], r.itl_ms)} | {r.tok_s:,.0f} | {s['tok_s']:,.0f} | "
              f"{_err(s['tok_s'], r.tok_s)} |", flush=True)


if __name__ == "__main__":
    main()
