"""The presets' GEMM times against NVIDIA's own kernel measurements of 2025 engines (aiconfigurator's tables).

    python benchmarks/aic_gemms.py --aic PATH [--min-nk 4096] [--fit] [--kernels 2025] [--markdown FILE]

PATH is a local clone of ai-dynamo/aiconfigurator (nothing of it enters this repo). Its collector times one
Linear layer of each serving engine at a grid of shapes (m rows of 1-32,768, with m and m + 1 on each side of the
tile sizes; n and k of 32-65,536) on each GPU, with the weights spanning more than L2, and files the medians under
`aic-core/src/aiconfigurator_core/systems/data/{gpu}/gemm/{framework}/{version}/gemm_perf.parquet`. Every table on
a GPU with a preset here is read, for the number formats the presets price (bfloat16, fp8, nvfp4), and each shape
with n and k of at least `--min-nk` (a Llama layer's GEMMs are 4,096 wide or more) is set beside the preset's
prediction (`sim.operators.gemm_parts`, blended as a step's GEMMs are, plus one kernel's fixed cost).

The fp8 and nvfp4 rows time the layer as the engine runs it with dynamic activation scales: the collector's
note (collector/trtllm/collect_gemm.py) says the measured fp8 GEMM includes computing the input's scale and
quantizing it, which a checkpoint with static scales (the presets' assumption) does not pay, so their few-row
errors read low. None of these tables is in the simulator's fit: every figure is held out.

Printed per table: rows, MAPE, the median signed error and the share over 15 %, the median error in bands of
rows, and what one row past a tile costs (the median over shapes of time(m + 1) / time(m) at m = 128 ... 4,096,
measured and predicted), the cost the presets' tile and cluster rounding charges. `--fit` also refits each 16-bit
table's two GEMM terms with that rounding off (`gemm_eff`, `gemm_m_half`; Nelder-Mead on every fourth shape) and
prints the MAPE they reach: what the presets' GEMMs would be on that engine's kernels. `--kernels 2025` compares
against the `-2025` profiles instead (`sim.hardware.KERNELS_2025`, fitted so on vLLM's table of each GPU), whose
other engines' tables are then held out.
Computed from the stored presets and the local tables: any machine prints the same.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's itlbench when run as a script

from itlbench.core.presets import PRESETS  # noqa: E402
from itlbench.errors import ConfigError  # noqa: E402
from itlbench.sim.hardware import GPUS as PRESET_PROFILES  # noqa: E402
from itlbench.sim.hardware import KERNELS  # noqa: E402
from itlbench.sim.operators import blend, gemm_parts  # noqa: E402
from itlbench.sim.profile import Hardware  # noqa: E402
from itlbench.sim.roofline import CostModel  # noqa: E402

DATA = Path("aic-core/src/aiconfigurator_core/systems/data")
GPUS = {"a100_sxm": "a100", "h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "l40s": "l40s"}
FORMATS = {"bfloat16": "bfloat16", "fp8": "fp8", "nvfp4": "fp4"}  # the table's gemm_dtype: the preset's dtype
BANDS = ((1, 16), (17, 128), (129, 512), (513, 2048), (2049, 4353), (8192, 32768))
TILE_EDGES = (128, 256, 512, 1024, 2048, 4096)
OVER = 0.15


def tables(aic: Path) -> list[tuple[str, str, str, Path]]:
    """(preset, framework, version, path) of every GEMM table on a GPU with a preset, sorted."""
    root = aic / DATA
    if not root.is_dir():
        raise ConfigError("--aic", f"{aic} has no {DATA}", "give a clone of ai-dynamo/aiconfigurator")
    found = []
    for path in sorted(root.glob("*/gemm/*/*/gemm_perf.parquet")):
        gpu, _, framework, version = path.relative_to(root).parts[:4]
        if gpu in GPUS:
            found.append((GPUS[gpu], framework, version, path))
    return found


def predicted_s(cm: CostModel, hw: Hardware, m: int, n: int, k: int) -> float:
    """One [m, k] x [k, n] weight GEMM on `hw`, as a step charges it."""
    return blend(*gemm_parts(cm, m, k, n, hw), hw) + hw.kernel_s


def profile(preset: str, kernels: str | None = None) -> Hardware | None:
    """The preset, or its `-{kernels}` profile (None where there is none)."""
    return PRESET_PROFILES[preset] if kernels is None else KERNELS.get(f"{preset}-{kernels}")


def compared(path: Path, preset: str, min_nk: int, kernels: str | None = None) -> dict[str, pl.DataFrame]:
    """Per number format the profile prices: m, n, k, measured_s, predicted_s, err."""
    out: dict[str, pl.DataFrame] = {}
    base = profile(preset, kernels)
    if base is None:
        return out
    df = pl.read_parquet(path).filter((pl.col("n") >= min_nk) & (pl.col("k") >= min_nk))
    for fmt, dtype in FORMATS.items():
        rows = df.filter(pl.col("gemm_dtype") == fmt)
        if rows.is_empty():
            continue
        try:
            hw = base.for_dtype(dtype)
        except ConfigError:  # a format this GPU has no rate for in its preset
            continue
        cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], hw, tp=1)  # only its bytes an element are read
        shapes = rows.select("m", "n", "k", "latency").to_numpy()
        pred = [predicted_s(cm, hw, int(m), int(n), int(k)) for m, n, k, _ in shapes]
        out[fmt] = rows.select("m", "n", "k", (pl.col("latency") / 1e3).alias("measured_s")).with_columns(
            pl.Series("predicted_s", pred)).with_columns((pl.col("predicted_s") / pl.col("measured_s") - 1).alias("err"))
    return out


def refit(base: pl.DataFrame, preset: str) -> tuple[float, float, pl.DataFrame]:
    """(gemm_eff, gemm_m_half, the table compared under them) of a compared 16-bit table with no partial-tile
    rounding."""
    import numpy as np

    from itlbench.sim.calibrate import _nelder_mead

    hw0 = PRESET_PROFILES[preset].for_dtype("bfloat16").with_(gemm_tile_rows=0, gemm_cluster_rows=0,
                                                         gemm_slow_rows=(0, 0, 1.0))
    cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], hw0, tp=1)
    shapes = base.select("m", "n", "k", "measured_s").to_numpy()

    def hw_of(x: np.ndarray) -> Hardware:
        return hw0.with_(gemm_eff=float(1 / (1 + np.exp(-x[0]))), gemm_m_half=float(np.exp(x[1])))

    def loss(x: np.ndarray) -> float:
        hw = hw_of(x)
        return float(np.mean([abs(predicted_s(cm, hw, int(m), int(n), int(k)) / t - 1) for m, n, k, t in shapes[::4]]))

    start = np.array([np.log(hw0.gemm_eff / (1 - hw0.gemm_eff)), np.log(max(hw0.gemm_m_half, 1.0))])
    hw = hw_of(_nelder_mead(loss, start, step=0.3, iters=120))
    pred = [predicted_s(cm, hw, int(m), int(n), int(k)) for m, n, k, _ in shapes]
    out = base.with_columns(pl.Series("predicted_s", pred)).with_columns(
        (pl.col("predicted_s") / pl.col("measured_s") - 1).alias("err"))
    return hw.gemm_eff, hw.gemm_m_half, out


def tile_costs(df: pl.DataFrame) -> list[tuple[int, float, float]]:
    """(m, measured, predicted) median time(m + 1) / time(m) over the shapes timed at both."""
    out = []
    for m in TILE_EDGES:
        a, b = df.filter(pl.col("m") == m), df.filter(pl.col("m") == m + 1)
        both = a.join(b, on=["n", "k"], suffix="_next")
        if both.height:
            out.append((m, float((both["measured_s_next"] / both["measured_s"]).median()),
                        float((both["predicted_s_next"] / both["predicted_s"]).median())))
    return out


def summary(df: pl.DataFrame) -> str:
    ape = df["err"].abs()
    return (f"{df.height:6d} shapes: MAPE {ape.mean():5.1%}, median error {df['err'].median():+6.1%}, "
            f"{(ape > OVER).mean():5.1%} over 15 %")


def bands(df: pl.DataFrame) -> str:
    return ", ".join(f"{lo}-{hi} {d['err'].median():+.0%}" for lo, hi in BANDS
                     if (d := df.filter(pl.col("m").is_between(lo, hi))).height)


def report(found: list[tuple[str, str, str, Path]], min_nk: int, with_fit: bool = False,
           kernels: str | None = None) -> list[str]:
    lines = []
    for preset, framework, version, path in found:
        name = preset if kernels is None else f"{preset}-{kernels}"
        for fmt, df in compared(path, preset, min_nk, kernels).items():
            lines.append(f"{name} {framework} {version} {fmt}: {summary(df)}")
            lines.append("    median error by rows: " + bands(df))
            tiles = ", ".join(f"{m}: {meas:.2f} vs {pred:.2f}" for m, meas, pred in tile_costs(df))
            lines.append(f"    one row past a tile, measured vs predicted: {tiles}")
            if with_fit and fmt == "bfloat16":
                eff, m_half, again = refit(df, preset)
                lines.append(f"    refitted, no partial-tile rounding: gemm_eff {eff:.3f}, gemm_m_half {m_half:.1f} rows: "
                             f"{summary(again).strip()}; by rows: {bands(again)}")
    return lines


def parser(doc: str, fit_help: str | None) -> argparse.ArgumentParser:
    """The flags the aiconfigurator scripts share: --aic, --kernels and --markdown (and --fit where one is given)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--aic", type=Path, required=True, help="a local clone of ai-dynamo/aiconfigurator")
    if fit_help:
        ap.add_argument("--fit", action="store_true", help=fit_help)
    ap.add_argument("--kernels", choices=["2025"], help="compare against the presets' -2025 profiles instead")
    ap.add_argument("--markdown", type=Path, help="also write the lines as a markdown code block here")
    return ap


def emit(args: argparse.Namespace, find: Callable[[Path], Any], render: Callable[[Any], list[str]]) -> None:
    """Find the tables under --aic (a path that is no clone: one line naming the flag), print the report's lines, and
    write them to --markdown where asked."""
    try:
        found = find(args.aic)
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    lines = render(found)
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text("```text\n" + "\n".join(lines) + "\n```\n")


def main() -> None:
    ap = parser(__doc__, "also refit each 16-bit table's GEMM terms, rounding off")
    ap.add_argument("--min-nk", type=int, default=4096, help="shapes with n and k of at least this many")
    args = ap.parse_args()
    emit(args, tables, lambda found: report(found, args.min_nk, args.fit, args.kernels))


if __name__ == "__main__":
    main()
