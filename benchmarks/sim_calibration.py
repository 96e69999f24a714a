"""How well the simulator predicts real engine steps it was not fitted to.

    python benchmarks/sim_calibration.py [--model cpu-small] [--duration 30] [--keep DIR]

Records two real runs of the bundled engine on this machine, different in workload and chunk budget
(A: chat, budget 512, a 4k injection; B: code, budget 2048, an 8k injection), calibrates the roofline
model on A (`itlbench calibrate`) and prints the mean absolute percentage error of its step-duration
predictions on every step of B's measured window (warm-up and drain excluded, as calibrate does), by
phase; then the same the other way round. For scale it also
prints the error of the uncalibrated model (this CPU's measured roofs at 100 % efficiency, no
overhead) and a noise floor: the error of predicting each step by the median of the same-shape
steps of its own run, which no model of step shapes can beat. Served runs share the machine with
their client (and, on a shared box, with everything else), so figures vary between runs: compare
the rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS = {
    "A": ["--workload", "chat", "--streams", "8", "--chunk-budget", "512", "--inject", "4k"],
    "B": ["--workload", "code", "--streams", "8", "--chunk-budget", "2048", "--inject", "8k"],
}


def record(name: str, model: str, duration: float, out: Path, threads: int) -> Path:
    run_dir = out / name
    cmd = [sys.executable, "-m", "itlbench", "run", *RUNS[name], "--model", model, "--device", "cpu",
           "--duration", str(duration), "--warmup", "3", "--seed", "1", "--no-live", "--out", str(run_dir)]
    print(f"recording {name}: {' '.join(RUNS[name])}", flush=True)
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}  # the engine server inherits it
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return run_dir


def noise_floor(run_dir: Path) -> tuple[float, float, int]:
    """MAPE and median APE of predicting each step by the median of its own run's steps of the same
    shape (phase, requests, prefill tokens to 64, context to 1,000): what no model of shapes can beat."""
    import polars as pl

    from itlbench.sim.calibrate import read_run_steps

    s = read_run_steps(run_dir).steps.with_columns(t=pl.col("end_ns") - pl.col("start_ns"))
    key = [pl.col("phase"), pl.col("num_decode_reqs"), pl.col("num_prefill_reqs"), pl.col("prefill_tokens") // 64,
           pl.col("context_tokens") // 1000]
    s = s.with_columns(med=pl.col("t").median().over(key), n=pl.len().over(key)).filter(pl.col("n") >= 5)
    ape = (s["t"] / s["med"] - 1).abs()
    return float(ape.mean()), float(ape.median()), s.height


def show(title: str, errors: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"  {'phase':<8} {'steps':>6} {'median step':>12} {'MAPE':>7} {'median APE':>11}")
    for phase, e in errors.items():
        print(f"  {phase:<8} {e['steps']:>6} {e['median_s'] * 1e3:>9.1f} ms {e['mape']:>7.1%} {e['median_ape']:>11.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu-small")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds of each run")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    ap.add_argument("--reuse", action="store_true", help="reuse runs already in --keep")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the engine (1: steadier steps when the server shares 2 cores)")
    args = ap.parse_args()

    from itlbench.sim.calibrate import calibrate, evaluate
    from itlbench.sim.roofline import measure_cpu

    out = args.keep or Path(tempfile.mkdtemp(prefix="sim-calibration-"))
    runs = {}
    for name in RUNS:
        existing = out / name
        runs[name] = existing if args.reuse and (existing / "run.json").is_file() else \
            record(name, args.model, args.duration, out, args.threads)
    roofs = measure_cpu()
    print(f"this CPU, measured: {roofs.peak_flops / 1e9:.0f} GFLOP/s fp32 matmul, {roofs.mem_bw / 1e9:.1f} GB/s read")
    for fit_on, predict_on in (("A", "B"), ("B", "A")):
        cal = calibrate([runs[fit_on]], base=roofs, name=f"cpu-{fit_on}")
        p = cal.profile
        print(f"\ncalibrated on {fit_on}: GEMM {p.gemm_eff:.1%}, attention {p.attn_eff:.1%}, bandwidth "
              f"{p.mem_eff:.1%}, {p.step_overhead_s * 1e3:.2f} ms/step + {p.seq_overhead_s * 1e3:.3f} ms/sequence")
        show(f"held-out steps of {fit_on}", cal.errors)
        show(f"every step of {predict_on} (other workload, other chunk budget)", evaluate(p, [runs[predict_on]]))
    show("uncalibrated (measured roofs, 100 % efficiency, no overhead) on B", evaluate(roofs, [runs["B"]]))
    print("\nnoise floor (each step predicted by the median of same-shape steps of its own run):")
    for name, run in runs.items():
        m, md, n = noise_floor(run)
        print(f"  {name}: MAPE {m:.1%}, median APE {md:.1%} over {n} steps")
    print(f"\nrun directories: {out}")


if __name__ == "__main__":
    main()
