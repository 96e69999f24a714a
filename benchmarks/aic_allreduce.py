"""The presets' all-reduce times against NVIDIA's measured all-reduce tables of 2025 engines (aiconfigurator).

    python benchmarks/aic_allreduce.py --aic PATH [--kernels 2025] [--markdown FILE]

PATH is a local clone of ai-dynamo/aiconfigurator (nothing of it enters this repo). Its collector times one 16-bit
all-reduce on 2, 4 and 8 GPUs of one server over messages of 128 to 536,870,912 elements: NCCL's
(`{gpu}/comm/nccl/{version}/nccl_perf.parquet`, op all_reduce, half) and each engine's own
(`{gpu}/comm/{vllm,trtllm,sglang}/{version}/custom_allreduce_perf.parquet`; replayed in a CUDA graph where the table
has both, as engines run decode steps). Every table on a GPU with a preset here is set beside
`CostModel.allreduce_s` of the same message (two bytes an element): the link's fixed cost (`link_latency_s`: one
custom kernel's on NVLink presets) plus the message at the ring's share of the link, or, from TP4 on an NVSwitch that
reduces, at NVLink SHARP's measured share. None of these tables is in the simulator's fit.

`--kernels 2025` compares against the `-2025` profiles instead, which carry vLLM's table of each GPU (so vLLM's rows
read back its own figures, interpolated between its sizes) and price the other engines' and NCCL's as held out.

Printed per table and degree: the median signed error (positive: the preset is slower) in bands of message size,
and the measured and predicted time of the smallest and largest message. Computed from the stored presets and the
local tables: any machine prints the same.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's itlbench when run as a script

from benchmarks.aic_gemms import DATA, GPUS, emit, parser  # noqa: E402
from itlbench.core.presets import PRESETS  # noqa: E402
from itlbench.errors import ConfigError  # noqa: E402
from itlbench.sim.hardware import GPUS as PRESET_PROFILES  # noqa: E402
from itlbench.sim.hardware import KERNELS  # noqa: E402
from itlbench.sim.profile import Hardware  # noqa: E402
from itlbench.sim.roofline import CostModel  # noqa: E402

BANDS = ((0, 2**16), (2**16 + 1, 2**20), (2**20 + 1, 2**24), (2**24 + 1, 2**30))  # elements
BAND_NAMES = ("<=64K", "64K-1M", "1M-16M", ">16M")


def tables(aic: Path) -> list[tuple[str, str, str, pl.DataFrame]]:
    """(preset, source, version, rows of num_gpus, elements, seconds) of every all-reduce table, sorted."""
    root = aic / DATA
    if not root.is_dir():
        raise ConfigError("--aic", f"{aic} has no {DATA}", "give a clone of ai-dynamo/aiconfigurator")
    found = []
    for path in sorted(root.glob("*/comm/*/*/*.parquet")):
        gpu, _, source, version, name = path.relative_to(root).parts
        if gpu not in GPUS or name not in ("nccl_perf.parquet", "custom_allreduce_perf.parquet"):
            continue
        df = pl.read_parquet(path).filter(pl.col("op_name") == "all_reduce")
        if "nccl_dtype" in df.columns:
            df = df.filter(pl.col("nccl_dtype") == "half")
        kind = next((c for c in ("backend", "implementation") if c in df.columns), None)
        if kind and df[kind].str.contains("graph").any():
            df = df.filter(pl.col(kind).str.contains("graph"))  # decode steps replay graphs
        df = df.group_by("num_gpus", "message_size").agg((pl.col("latency").median() / 1e3).alias("measured_s"))
        if df.height:
            found.append((GPUS[gpu], source, version, df.sort("num_gpus", "message_size")))
    return found


@functools.cache
def _priced(preset: str, tp: int, kernels: str | None) -> tuple[CostModel, Hardware]:
    hw = (PRESET_PROFILES[preset] if kernels is None else KERNELS[f"{preset}-{kernels}"]).for_dtype("bfloat16")
    return CostModel.for_hardware(PRESETS["llama-3.1-8b"], hw, tp=tp), hw


def predicted_s(preset: str, tp: int, elements: int, kernels: str | None = None) -> float:
    """`CostModel.allreduce_s` of a message of `elements` 16-bit values on `tp` GPUs of the preset (or its
    `-{kernels}` profile)."""
    cm, hw = _priced(preset, tp, kernels)
    return cm.allreduce_s(elements / cm.model.hidden_size, hw)  # type: ignore[arg-type]  (rows of hidden-size values)


def report(found: list[tuple[str, str, str, pl.DataFrame]], kernels: str | None = None) -> list[str]:
    lines = []
    for preset, source, version, df in found:
        if kernels is not None and f"{preset}-{kernels}" not in KERNELS:
            continue
        name = preset if kernels is None else f"{preset}-{kernels}"
        for tp in sorted(df["num_gpus"].unique().to_list()):
            rows = df.filter(pl.col("num_gpus") == tp)
            pred = [predicted_s(preset, tp, int(e), kernels) for e in rows["message_size"]]
            rows = rows.with_columns(pl.Series("predicted_s", pred)).with_columns(
                (pl.col("predicted_s") / pl.col("measured_s") - 1).alias("err"))
            bands = ", ".join(f"{name} {d['err'].median():+.0%}" for (lo, hi), name in zip(BANDS, BAND_NAMES, strict=True)
                              if (d := rows.filter(pl.col("message_size").is_between(lo, hi))).height)
            first, last = rows.row(0, named=True), rows.row(-1, named=True)
            lines.append(f"{name} {source} {version} tp{tp}: {bands}; {first['message_size']:,} elements "
                         f"{first['measured_s'] * 1e6:.1f} vs {first['predicted_s'] * 1e6:.1f} us, "
                         f"{last['message_size']:,} {last['measured_s'] * 1e3:.2f} vs {last['predicted_s'] * 1e3:.2f} ms")
    return lines


def main() -> None:
    args = parser(__doc__, None).parse_args()
    emit(args, tables, lambda found: report(found, args.kernels))


if __name__ == "__main__":
    main()
