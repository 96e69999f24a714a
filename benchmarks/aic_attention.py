"""The presets' attention times against NVIDIA's measured attention kernels of 2025 engines (aiconfigurator's tables).

    python benchmarks/aic_attention.py --aic PATH [--fit] [--kernels 2025] [--markdown FILE]

PATH is a local clone of ai-dynamo/aiconfigurator (nothing of it enters this repo). Its collector times one layer's
attention kernel of each engine on each GPU and files the medians under `aic-core/src/aiconfigurator_core/systems/data/
{gpu}/attention/{framework}/{version}/`: `context_attention_perf.parquet` (a batch of fresh prompts of `isl` tokens,
causal) and `generation_attention_perf.parquet` (a batch of one-token decodes after `step` cached tokens). Every table
on a GPU with a preset here is read for Llama-like heads (head_dim 128, 8-64 query heads, 1-8 K/V heads, 16-bit K/V, no
sliding window), each kernel source as its own table, and each row is set beside the preset's prediction: one layer's
`sim.operators.attention_parts` at its roof plus one kernel's fixed cost. None of these tables is in the simulator's fit.

Rows that beat the datasheet are left out, and said so: decode rows whose K/V is under `L2_BYTES` (the collector
repeats one layer, so a small K/V is read from L2, which a real step's many layers do not), and any row faster than the
GPU's peak (some tables time a kernel the name does not say; such a table is skipped when they are over 5 %).

Printed per table: rows, MAPE, median signed error (positive: the preset is slower) and the share over 15 %, and the
median error in bands of prompt length (context) or of cached tokens (generation). `--fit` also fits the simulator's own
attention terms to each table with the presets' kernel fixed cost: prefill's `attn_eff` and `attn_k_half` (attention
efficiency rising with the keys each query reads, e = attn_eff * k / (k + attn_k_half)) and decode's `attn_mem_eff`.
`--kernels 2025` compares against the `-2025` profiles, which carry those terms fitted on vLLM's table of each GPU
(`sim.hardware.ATTENTION_2025`), so the other engines' tables are held out. Any machine prints the same.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's itlbench when run as a script

from benchmarks.aic_gemms import DATA, GPUS, emit, parser, profile  # noqa: E402
from itlbench.core.presets import PRESETS  # noqa: E402
from itlbench.errors import ConfigError  # noqa: E402
from itlbench.sim.operators import attention_parts  # noqa: E402
from itlbench.sim.profile import Hardware  # noqa: E402
from itlbench.sim.roofline import CostModel  # noqa: E402
from itlbench.sim.shapes import StepShape  # noqa: E402

PHASES = {"context": "context_attention_perf.parquet", "generation": "generation_attention_perf.parquet"}
HEADS, KV_HEADS, HEAD_DIM = (8, 16, 32, 64), (1, 2, 4, 8), 128
L2_BYTES = 256 * 2**20  # above every preset GPU's L2 (A100 40 MiB ... B200 126 MiB) with room
BANDS = {"context": ((128, 512), (513, 2048), (2049, 8192), (8193, 131072)),
         "generation": ((1, 1024), (1025, 8192), (8193, 131072))}
K_HALVES = (0, 25, 50, 100, 150, 200, 300, 400, 500, 600, 800, 1000, 1500, 2000, 3000)
OVER = 0.15
Table = tuple[str, str, str, str, str, pl.DataFrame]  # preset, framework, version, phase, kernel, rows


def _rows(path: Path, phase: str) -> pl.DataFrame:
    df = pl.read_parquet(path)
    keep = ((pl.col("head_dim") == HEAD_DIM) & (pl.col("kv_cache_dtype") == "bfloat16")
            & pl.col("num_heads").is_in(HEADS) & pl.col("num_key_value_heads").is_in(KV_HEADS)
            & (pl.col("num_heads") >= pl.col("num_key_value_heads")))
    if "window_size" in df.columns:
        keep &= pl.col("window_size") == 0
    if "attn_dtype" in df.columns:
        keep &= pl.col("attn_dtype") == "bfloat16"
    df = df.filter(keep).with_columns(
        (pl.col("isl") if phase == "context" else pl.col("isl") + pl.col("step") - 1).alias("length"))
    return df.filter(pl.col("length") >= (128 if phase == "context" else 1))


def tables(aic: Path) -> list[Table]:
    """Every attention table on a GPU with a preset, one per kernel source, sorted."""
    root = aic / DATA
    if not root.is_dir():
        raise ConfigError("--aic", f"{aic} has no {DATA}", "give a clone of ai-dynamo/aiconfigurator")
    found = []
    for phase, name in PHASES.items():
        for path in sorted(root.glob(f"*/attention/*/*/{name}")):
            gpu, _, framework, version = path.relative_to(root).parts[:4]
            if gpu not in GPUS:
                continue
            df = _rows(path, phase)
            for kernel in sorted(df["kernel_source"].unique().to_list()):
                found.append((GPUS[gpu], framework, version, phase, kernel, df.filter(pl.col("kernel_source") == kernel)))
    return found


@functools.cache
def _cm(heads: int, kv_heads: int, hw: Hardware) -> CostModel:
    model = replace(PRESETS["llama-3.1-8b"], num_heads=heads, num_kv_heads=kv_heads, head_dim=HEAD_DIM,
                    hidden_size=heads * HEAD_DIM)
    return CostModel.for_hardware(model, hw, tp=1)


def shape_of(phase: str, batch: int, length: int) -> StepShape:
    return StepShape.of([(length, 0, True)] * batch) if phase == "context" else StepShape.decode(batch, length)


def roofs(hw: Hardware, phase: str, rows: pl.DataFrame) -> np.ndarray:
    """[compute, memory] seconds of each row's attention on `hw` at efficiency 1 and no length ramp."""
    ideal = hw.with_(attn_eff=1.0, attn_k_half=0.0, attn_mem_eff=1.0)
    out = [attention_parts(_cm(int(h), int(kv), ideal), shape_of(phase, int(b), int(n)), ideal)
           for h, kv, b, n in rows.select("num_heads", "num_key_value_heads", "batch_size", "length").iter_rows()]
    return np.array(out).reshape(-1, 2)


def usable(hw: Hardware, phase: str, rows: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """The rows that do not beat the datasheet (see the module's docstring), and how many were dropped."""
    ideal = roofs(hw, phase, rows)
    measured = rows["latency"].to_numpy() / 1e3
    ok = measured >= ideal.max(axis=1)
    if phase == "generation":
        ok &= ideal[:, 1] * hw.mem_bw >= L2_BYTES
    return rows.filter(pl.Series(ok)), int((~ok).sum())


def predicted_s(hw: Hardware, phase: str, rows: pl.DataFrame) -> np.ndarray:
    """One layer's attention of each row on `hw`, as a step charges it: its roof plus one kernel's fixed cost."""
    return np.array([max(attention_parts(_cm(int(h), int(kv), hw), shape_of(phase, int(b), int(n)), hw)) + hw.kernel_s
                     for h, kv, b, n in rows.select("num_heads", "num_key_value_heads", "batch_size", "length").iter_rows()])


def keys_per_query(phase: str, rows: pl.DataFrame) -> np.ndarray:
    n = rows["length"].to_numpy().astype(float)
    return (n + 1) / 2 if phase == "context" else n + 1


def fit(hw: Hardware, phase: str, rows: pl.DataFrame) -> tuple[float, float]:
    """(efficiency, k_half) that fit the rows best (mean relative error) with `hw`'s kernel fixed cost: prefill's
    attn_eff and attn_k_half (least squares in 1 / attn_eff at each k_half of a grid), decode's attn_mem_eff (k_half 0)."""
    measured = rows["latency"].to_numpy() / 1e3
    ideal = roofs(hw, phase, rows)[:, 0 if phase == "context" else 1]
    keys = keys_per_query(phase, rows)
    best = (np.inf, 1.0, 0.0)
    for k_half in K_HALVES if phase == "context" else (0,):
        x = ideal * (keys + k_half) / keys / measured
        y = 1 - hw.kernel_s / measured
        inv = float(x @ y / (x @ x))
        err = float(np.mean(np.abs((hw.kernel_s + inv * x * measured) / measured - 1)))
        if inv > 0 and err < best[0]:
            best = (err, 1 / inv, float(k_half))
    return best[1], best[2]


def compared(hw: Hardware, phase: str, rows: pl.DataFrame) -> pl.DataFrame:
    pred = predicted_s(hw, phase, rows)
    return rows.select("length", (pl.col("latency") / 1e3).alias("measured_s")).with_columns(
        pl.Series("predicted_s", pred)).with_columns((pl.col("predicted_s") / pl.col("measured_s") - 1).alias("err"))


def summary(df: pl.DataFrame) -> str:
    ape = df["err"].abs()
    return (f"{df.height:5d} rows: MAPE {ape.mean():5.1%}, median error {df['err'].median():+6.1%}, "
            f"{(ape > OVER).mean():5.1%} over 15 %")


def bands(df: pl.DataFrame, phase: str) -> str:
    return ", ".join(f"{lo}-{hi} {d['err'].median():+.0%}" for lo, hi in BANDS[phase]
                     if (d := df.filter(pl.col("length").is_between(lo, hi))).height)


def report(found: list[Table], with_fit: bool = False, kernels: str | None = None) -> list[str]:
    lines = []
    for preset, framework, version, phase, kernel, rows in found:
        base = profile(preset, kernels)
        if base is None:
            continue
        hw = base.for_dtype("bfloat16")
        kept, dropped = usable(hw, phase, rows)
        head = f"{hw.name} {framework} {version} {phase} {kernel}"
        if kept.is_empty() or (phase == "context" and dropped > 0.05 * rows.height):
            lines.append(f"{head}: skipped, {dropped} of {rows.height} rows faster than the datasheet allows")
            continue
        df = compared(hw, phase, kept)
        note = f" ({dropped} rows left out: faster than the datasheet or read from L2)" if dropped else ""
        lines.append(f"{head}: {summary(df)}{note}")
        lines.append(f"    median error by {'prompt' if phase == 'context' else 'cached'} tokens: {bands(df, phase)}")
        if with_fit:
            eff, k_half = fit(hw, phase, kept)
            again = compared(hw.with_(**({"attn_eff": eff, "attn_k_half": k_half} if phase == "context"
                                         else {"attn_mem_eff": eff})), phase, kept)
            terms = f"attn_eff {eff:.3f}, attn_k_half {k_half:.0f}" if phase == "context" else f"attn_mem_eff {eff:.3f}"
            lines.append(f"    fitted {terms}: {summary(again).strip()}; by length: {bands(again, phase)}")
    return lines


def main() -> None:
    args = parser(__doc__, "also fit the simulator's attention terms to each table").parse_args()
    emit(args, tables, lambda found: report(found, args.fit, args.kernels))

if __name__ == "__main__":
    main()
