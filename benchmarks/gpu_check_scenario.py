"""The GPU check's sections that run itlbench itself rather than an engine in this process (`gpu_check.py` runs
each; neither imports torch):
- scenario: `itlbench run`, 32 chat streams, one 32k injection, unchunked vs budget 2048.
- sim: the simulator's preset for the GPU on every step measured by the other sections, and `itlbench calibrate`
  on the scenario's step logs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.gpu_check_setup import Setup

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- the source documents' scenario


def section_scenario(s: Setup, out_dir: Path) -> dict:
    if s.dry_run:
        model, extra = "tiny", ["--streams", "4", "--inject", "512", "--duration", "4", "--warmup", "1",
                                "--device", "cpu", "--max-model-len", "2048"]
    else:
        model, extra = "llama-3.1-8b", ["--streams", "32", "--inject", "32k", "--duration", "16", "--warmup", "4",
                                        "--device", "cuda", "--max-model-len", str(s.max_model_len), "--drain-timeout", "15"]
    rows = []
    for budget in ("none", "2048"):
        run_dir = out_dir / f"scenario-{budget}"
        cmd = [sys.executable, "-m", "itlbench", "run", "--model", model, "--workload", "chat",
               "--chunk-budget", budget, "--out", str(run_dir), "--no-live", "--seed", "1", *extra]
        print("$ " + " ".join(cmd), flush=True)
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=80 if not s.dry_run else 240)
        except subprocess.TimeoutExpired as exc:
            rows.append({"chunk_budget": budget, "error": f"timed out after {exc.timeout} s"})
            print(rows[-1]["error"])
            continue
        wall = time.perf_counter() - t
        row: dict = {"chunk_budget": budget, "wall_s": wall, "exit_code": proc.returncode, "run_dir": str(run_dir)}
        summary_path = run_dir / "summary.json"
        if proc.returncode != 0 or not summary_path.is_file():
            row["error"] = (proc.stderr or proc.stdout)[-1500:]
            print(row["error"])
        else:
            row.update(scenario_figures(json.loads(summary_path.read_text())))
            row.update(served_engine(run_dir))
            print(f"budget {budget:>5}: ITL p50 {_ms(row['itl_p50_s'])}, p99 {_ms(row['itl_p99_s'])}, worst gap "
                  f"{_ms(row['itl_max_s'])}; stall worst {_ms(row['stall_worst_s'])} over {row['stall_gaps']} gaps; "
                  f"injected TTFT {_ms(row['injected_ttft_s'])}; {row['output_tokens_per_s'] or 0:.0f} tok/s; "
                  f"valid {row['valid']} ({wall:.0f} s); attention {row.get('attention')}, blocks of "
                  f"{row.get('block_size')}, CUDA graphs on {row.get('decode_steps_with_graph', 0):.0%} of decode steps")
        rows.append(row)
    return {"rows": rows}


def served_engine(run_dir: Path) -> dict:
    """What the server ran (from run.json and the step log): backend, block size, graph use."""
    out: dict = {}
    try:
        engine = json.loads((run_dir / "run.json").read_text())["engine"]["engine"]
        out.update(attention=engine.get("attention"), block_size=engine.get("block_size"))
        import polars as pl

        steps = pl.read_parquet(run_dir / "steps" / "*.parquet")
        decode = steps.filter(pl.col("phase") == "decode")
        if decode.height and "cuda_graph" in decode.columns:
            out["decode_steps_with_graph"] = float(decode["cuda_graph"].mean())
        longest = steps.sort("start_ns").with_columns(((pl.col("end_ns") - pl.col("start_ns")) / 1e9).alias("s"))
        out["longest_step"] = longest.sort("s").tail(1).select("phase", "prefill_tokens", "decode_tokens", "s").to_dicts()
    except Exception as exc:  # noqa: BLE001 - the figures above stand without these
        out["served_engine_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


def scenario_figures(summary: dict) -> dict:
    def get(*path: str) -> object:
        node: object = summary
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    injected = get("crosscheck", "engine", "injected") or []
    first = injected[0] if injected and isinstance(injected[0], dict) else {}
    return {"itl_p50_s": get("itl_s", "p50"), "itl_p99_s": get("itl_s", "p99"), "itl_max_s": get("itl_s", "max"),
            "stall_worst_s": get("stalls", "worst_s"), "stall_gaps": get("stalls", "count"),
            "injected_ttft_s": first.get("client_ttft_s", first.get("ttft_s")),
            "output_tokens_per_s": get("throughput", "output_tokens_per_s"), "valid": get("valid"),
            "engine_check": get("crosscheck", "engine")}


# ----------------------------------------------------------------- the simulator on the same shapes

SIM_PRESETS = (  # substring of the device name -> preset; None: a part whose roofs no preset has
    ("H200", "h200"), ("H100 PCIe", None), ("H100 NVL", None), ("H100", "h100"), ("A100 80GB PCIe", "a100-pcie"),
    ("A100-SXM4-80GB", "a100"), ("L40S", "l40s"), ("B200", "b200"))


def sim_preset(device: str) -> str | None:
    """The simulator's preset for a device name torch reports (None where no preset has its roofs)."""
    return next((preset for key, preset in SIM_PRESETS if key in device), None)


def _section_json(out_dir: Path, name: str) -> dict:
    path = out_dir / f"{name}.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}


def sim_rows(s: Setup, hw, decode: dict, prefill: dict, hw_2025=None) -> list[dict]:  # noqa: ANN001 - sim Hardware
    """Each measured step beside the cost model's time for the same shape on `hw` (bf16, TP1), and on its `-2025`
    profile (`sim_2025_s`) where there is one."""
    from itlbench.sim.roofline import CostModel, StepShape

    def timed(profile, shape: StepShape, graphs: bool) -> float:  # noqa: ANN001
        return CostModel.for_hardware(s.model, profile, cuda_graphs=graphs).time(shape, profile).total_s

    cases = [("decode", r, f"batch {r['batch']} at {r['context']}", StepShape.decode(r["batch"], r["context"]),
              r["step_ms"] / 1e3) for r in decode.get("rows", []) if "step_ms" in r]
    cases += [("prefill", r, f"{r['tokens']} tokens", StepShape.prefill(r["tokens"]), r["seconds"])
              for r in prefill.get("rows", []) if "seconds" in r]
    rows = []
    for kind, r, label, shape, measured in cases:
        graphs = kind == "decode" and bool(r["graph_ran"])
        row = {"kind": kind, "attention": r["attention"], "cuda_graphs": kind == "decode" and r["cuda_graphs"],
               "graph_ran": graphs, "shape": label, "measured_s": measured, "sim_s": timed(hw, shape, graphs)}
        row["error"] = row["sim_s"] / measured - 1.0
        if hw_2025 is not None:
            row["sim_2025_s"] = timed(hw_2025, shape, graphs)
            row["error_2025"] = row["sim_2025_s"] / measured - 1.0
        rows.append(row)
    return rows


def calibrate_on(run_dirs: list[str], preset: str, out_dir: Path) -> dict:
    """`itlbench calibrate` on the scenario's step logs, relative to the preset's roofs."""
    if not run_dirs:
        return {"error": "no scenario run to calibrate on"}
    cmd = [sys.executable, "-m", "itlbench", "calibrate", *run_dirs, "--base", preset, "--out",
           str(out_dir / "calibrated.json"), "--json"]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    return json.loads(proc.stdout)


def section_sim(s: Setup, out_dir: Path) -> dict:
    from itlbench.sim.hardware import GPUS, KERNELS

    env, scenario = _section_json(out_dir, "env"), _section_json(out_dir, "scenario")
    device = env.get("device", "unknown")
    preset = sim_preset(device) or ("h100" if s.dry_run else None)  # the dry run checks the logic on CPU figures
    if preset is None:
        return {"device": device, "error": f"the simulator has no preset for {device}"}
    hw = GPUS[preset].for_dtype("bfloat16")
    hw_2025 = KERNELS[f"{preset}-2025"].for_dtype("bfloat16") if f"{preset}-2025" in KERNELS else None
    rows = sim_rows(s, hw, _section_json(out_dir, "decode"), _section_json(out_dir, "prefill"), hw_2025)
    for r in rows:
        also = f", {preset}-2025 {r['sim_2025_s'] * 1e3:8.2f} ms ({r['error_2025']:+.1%})" if "sim_2025_s" in r else ""
        print(f"sim {r['kind']:<7} {r['attention']:<6} graphs ran={'yes' if r['graph_ran'] else 'no '} {r['shape']:>18}: "
              f"measured {r['measured_s'] * 1e3:8.2f} ms, {preset} preset {r['sim_s'] * 1e3:8.2f} ms ({r['error']:+.1%})"
              + also)
    copy = env.get("measured_bandwidth")
    share = copy / hw.mem_bw if copy else None
    if share:
        print(f"copy bandwidth {copy / 1e12:.2f} TB/s: {share:.1%} of the {preset} preset's {hw.mem_bw / 1e12:.2f} TB/s "
              f"(the preset streams weights at {hw.mem_eff:.1%})")
    runs = [r["run_dir"] for r in scenario.get("rows", []) if "run_dir" in r and "error" not in r]
    calibration = calibrate_on(runs, preset, out_dir)
    if "error" in calibration:
        print("calibration: " + calibration["error"][:300])
    else:
        held = ", ".join(f"{phase} {v['mape']:.1%} over {v['steps']} steps" for phase, v in calibration["held_out"].items())
        print(f"calibration on the scenario's steps: held-out error {held}; profile {calibration['profile_path']}")
    return {"device": device, "preset": preset, "rows": rows, "copy_bandwidth_share": share,
            "preset_mem_eff": hw.mem_eff, "calibration": calibration}
