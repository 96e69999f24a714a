"""The simulator beside every published GPU measurement it is checked against.

    python benchmarks/sim_vs_published.py [--refit | --kernels 2025] [--markdown FILE]

For each figure in itlbench/sim/published.py (Sarathi-Serve's Yi-34B TP2 batches on A100 PCIe, Vidur's
Llama-3-8B GEMM profiles on A100, TensorRT-LLM's Llama-2 first-token latencies and static batches on
A100, H100 and L40S, and TensorRT-LLM 1.0's offline throughputs of Llama-3.1-8B, -3.3-70B and -3.1-405B on
H100/H200 in FP8 and on B200 in NVFP4)
prints the measured time, the simulator's prediction with the stored fitted parameters (the presets'
`FIT` and the engines' `ENGINE_PARAMS`), the signed error, and whether the figure is in the fit set or
held out; then MAPE, median, worst and mean signed error per set: fit, held out, all, held out by source and
held out by preset and number format (what `itlbench roofline` prints beside each GPU), and by preset, format
and degree of tensor parallelism (what a run at that degree prints). `--refit` first fits the parameters again on the
fit set (Nelder-Mead, 3 rounds on one core) and prints them beside the stored ones; the table then
uses the refitted ones (about 5 min). `--kernels 2025` predicts every figure on the `-2025` profile of its GPU
where it has one (vLLM's kernels as NVIDIA measured them in 2025, the rest the preset's): an engine-level check of those
profiles, of which the 2025 engines' figures (TensorRT-LLM 1.0 and 0.20, vLLM's latency tests) are the relevant rows;
nothing is fitted on them. `--markdown FILE` also writes the table as markdown, between the marker
comments when FILE already has them (docs/perf/sim-vs-published.md keeps its prose).
Computed, not measured: every machine prints the same figures.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from itlbench.sim.accuracy import OVER, Accuracy, number_format
from itlbench.sim.published import default_params, errors, fit
from itlbench.sim.published_offline import KERNELS_2025_FLAG

BEGIN, END = "<!-- sim-vs-published table: begin -->", "<!-- sim-vs-published table: end -->"


SOURCES = ("sarathi", "vidur", "vidur layer", "trtllm ttft", "trtllm batch", "trtllm v0.5 batch", "trtllm1 offline",
           "trtllm0.20 offline", "vllm latency")


def _source(key: str) -> str:
    return max((s for s in SOURCES if key.startswith(s + " ")), key=len)


def summary(rows: list) -> str:
    return Accuracy.of([e for *_, e in rows]).line()


def _ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:,.1f}" if ms >= 10 else f"{ms:.3f}"


def table(rows: list) -> list[str]:
    lines = ["| figure | source | measured ms | simulated ms | error | set |", "|---|---|---:|---:|---:|---|"]
    for f, pred, err in rows:
        lines.append(f"| {f.what} | `{f.repo}` `{f.path}` | {_ms(f.measured_s)} | {_ms(pred)} | {err:+.1%} | "
                     f"{'fit' if f.fit else 'held out'} |")
    return lines


def over_bound(rows: list) -> list[str]:
    """The figures more than OVER off, worst first: what stands between the simulator and issue 29's bound."""
    worst = sorted((r for r in rows if abs(r[2]) > OVER), key=lambda r: -abs(r[2]))
    return [f"{f.key} {err:+.1%} ({'fit' if f.fit else 'held out'})" for f, _, err in worst]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", action="store_true", help="fit the parameters again on the fit set first")
    ap.add_argument("--kernels", choices=("2025",), help="predict on each GPU's -2025 profile where it has one")
    ap.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    args = ap.parse_args()
    if args.refit and args.kernels:
        ap.error("--kernels 2025 checks the -2025 profiles as they are; --refit fits the presets: take one of them")
    params = default_params() | ({KERNELS_2025_FLAG: 1.0} if args.kernels else {})
    if args.refit:
        fitted = fit(params)
        print(f"{'parameter':22s} {'stored':>12s} {'refitted':>12s}")
        for k, v in params.items():
            print(f"{k:22s} {v:12.4g} {fitted[k]:12.4g}")
        params = fitted
    rows = errors(params)
    for f, pred, err in rows:
        print(f"{f.key:36s} {_ms(f.measured_s):>10s} {_ms(pred):>10s} {err:+7.1%}  {'fit' if f.fit else 'held out'}")
    sets = {"fit": [r for r in rows if r[0].fit], "held out": [r for r in rows if not r[0].fit], "all": rows}
    for source in SOURCES:  # held out, by source: kernel-level figures are many and easier than engine runs
        held = [r for r in sets["held out"] if _source(r[0].key) == source]
        sets[f"held out: {source}"] = held
    for gpu, fmt in sorted({(r[0].gpu, number_format(r[0].dtype)) for r in sets["held out"]}):
        sets[f"held out: {gpu} {fmt}"] = [r for r in sets["held out"]  # what `itlbench roofline` shows per preset
                                          if (r[0].gpu, number_format(r[0].dtype)) == (gpu, fmt)]
    for gpu, fmt, tp in sorted({(r[0].gpu, number_format(r[0].dtype), r[0].tp) for r in sets["held out"]}):
        sets[f"held out: {gpu} {fmt} tp{tp}"] = [r for r in sets["held out"]  # and at a run's degree of TP
                                                 if (r[0].gpu, number_format(r[0].dtype), r[0].tp) == (gpu, fmt, tp)]
    for name, rs in sets.items():
        print(f"{name:29s} {summary(rs)}")
    over = over_bound(rows)
    print(f"over {OVER:.0%}: {len(over)} figures" + "".join(f"\n  {line}" for line in over))
    if args.markdown:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        head = ["| | |", "|---|---|", f"| date | {datetime.now(UTC):%Y-%m-%d} |", f"| commit | `{commit}` |",
                f"| machine | {platform.machine()}, Python {platform.python_version()} (computed: any machine "
                "prints the same) |", f"| command | `python benchmarks/sim_vs_published.py{' --refit' * args.refit}"
                f"{' --kernels ' + args.kernels if args.kernels else ''}"
                f" --markdown {args.markdown}` |", ""]
        sums = ["| set | summary |", "|---|---|", *(f"| {k} | {summary(v)} |" for k, v in sets.items())]
        over_md = [f"Over {OVER:.0%}: {len(over)} figures.", "", *(f"- {line}" for line in over)]
        block = "\n".join([BEGIN, "", *head, *sums, "", *over_md, "", *table(rows), "", END])
        old = args.markdown.read_text() if args.markdown.is_file() else ""
        if BEGIN in old and END in old:  # a page with prose around the table: replace the table only
            block = old[:old.index(BEGIN)] + block + old[old.index(END) + len(END):]
        args.markdown.write_text(block.rstrip("\n") + "\n")
        print(f"wrote {args.markdown}", file=sys.stderr)


if __name__ == "__main__":
    main()
