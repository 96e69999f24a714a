"""How long one full garbage collection stops a serving process, before and after keeping the
collector off its long-lived data (itlbench/heap.py, StepLog's untracked rows).

A full collection scans every tracked object and holds the GIL throughout: in the engine core it
delays the next step, in the front end every token write, so each one is an ITL stall that a load
test would charge to the engine. Each case runs in a fresh interpreter (its own heap):

- front end: the server's modules and a full step-log mirror (200,000 records), held as StepRecord
  objects (as before) or as StepLog rows, with and without the startup heap frozen;
- engine core: a cpu-small engine built, with and without its heap frozen.

    python benchmarks/gc_pause.py [--records 200000] [--out reports/gc-pause]

Prints the median of five full collections per case and writes a bar chart (gc_pause.png).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CASE = r'''
import gc, json, statistics, sys, time
case, records = sys.argv[1], int(sys.argv[2])
held = None
if case.startswith("front"):
    import itlbench.server.main  # noqa: F401  (what a front end imports)
    from itlbench.core.steps import StepLog, StepRecord
    def rec(i):
        return StepRecord(step=i, phase="decode", prefill_tokens=0, decode_tokens=8, num_prefill_reqs=0,
                          num_decode_reqs=8, num_running=8, num_waiting=0, num_preemptions=0, kv_usage=0.25,
                          token_budget=2048, start_ns=i * 1000, end_ns=i * 1000 + 900, forward_ns=700)
    if "frozen" in case:
        gc.collect(); gc.freeze()
    if "objects" in case:
        held = [rec(i) for i in range(records)]
    else:
        held = StepLog(capacity=records)
        for i in range(records):
            held.append(rec(i))
else:
    import torch
    torch.set_num_threads(1)
    from itlbench.core.engine_config import EngineConfig
    from itlbench.core.engine import Engine
    held = create_engine(EngineConfig(model="cpu-small", device="cpu", kv_blocks=256, max_model_len=2048))
    if "frozen" in case:
        gc.collect(); gc.freeze()
gc.collect()
pauses = []
for _ in range(5):
    t = time.perf_counter(); gc.collect(); pauses.append(time.perf_counter() - t)
print(json.dumps({"case": case, "tracked": len(gc.get_objects()), "pause_ms": statistics.median(pauses) * 1e3}))
'''

CASES = {
    "front-objects": "front end, mirror as StepRecord objects",
    "front-rows": "front end, mirror as StepLog rows",
    "front-rows-frozen": "front end, rows + frozen startup heap",
    "engine": "engine core, cpu-small",
    "engine-frozen": "engine core, frozen after startup",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--out", type=Path, default=Path("reports/gc-pause"))
    args = ap.parse_args()
    results = []
    for case in CASES:
        out = subprocess.run([sys.executable, "-c", CASE, case, str(args.records)], capture_output=True, text=True,
                             check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| case | tracked objects | full collection (ms) |\n|---|---:|---:|")
    for r in results:
        print(f"| {CASES[r['case']]} | {r['tracked']:,} | {r['pause_ms']:.1f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gc_pause.json").write_text(json.dumps(results, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    labels = [CASES[r["case"]] for r in results]
    colors = ["#c0504d" if "frozen" not in r["case"] and r["case"] != "front-rows" else "#4f81bd" for r in results]
    pauses = [r["pause_ms"] for r in results]
    bars = ax.barh(labels[::-1], pauses[::-1], color=colors[::-1])
    ax.bar_label(bars, labels=[f"{p:.1f} ms" for p in pauses[::-1]], padding=3, fontsize=8)
    ax.set_xlim(0, max(pauses) * 1.2)
    ax.set_xlabel("one full garbage collection (ms); every stream stalls this long")
    ax.set_title(f"Collector pauses, {args.records:,}-record step-log mirror", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out / "gc_pause.png", dpi=110)
    print(f"figure: {args.out / 'gc_pause.png'}")


if __name__ == "__main__":
    main()
