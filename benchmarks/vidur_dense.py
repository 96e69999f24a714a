"""The simulator's GEMM times against every row of Vidur's operator profiles, not a few samples.

    python benchmarks/vidur_dense.py --vidur PATH [--set roof_blend=1.5 ...] [--markdown FILE]

PATH is a local clone of microsoft/vidur (nothing of it enters this repo). Every
`data/profiling/compute/{gpu}/{org}/{model}/mlp.csv` on a GPU with a preset here (a100, h100) and a
gated MLP is read: for each profiled row count (1, 2, 4, 8, then every 8 rows, then every 256) and
tensor-parallel degree, one layer's four GEMMs (attn_pre_proj, attn_post_proj, mlp_up_proj,
mlp_down_proj; median ms, rows profiled twice averaged) summed, beside the preset's prediction
(`sim.operators.gemm_seconds`, fp16, the model's shapes read from the CSV's own columns).

sim/published.py compares seven row counts of four of these profiles (powers of 4) and fits on three
of one (Meta-Llama-3-8B on the A100); every row of that profile chose the 128-row tile and the factor of
the A100's slow rows (993-1,024), and every row of Llama-2-70B's on the H100 Hopper's 256-row cluster
(`FIT_SOURCES`), so both are reported apart from the held-out rest. Neighbouring rows, 8 apart, can differ by a quarter: cuBLAS picks another kernel (the
H100's Llama-2-7B layer takes 0.206 ms at 192 rows, 0.261 ms at 200). So this prints, per profile and
degree, the error over every row and its median in bands of rows: what a step of that many tokens (a
chunk budget, a decode batch) costs in the model against the profile; and how often a layer is more
than 15 % off the median of its neighbours within ±10 % rows, the share of misses no smooth model
could avoid. `--set KEY=VALUE` (repeatable) replaces one of the presets' fitted
parameters (`sim.hardware.FIT`) for the comparison, to try a change before refitting.

Computed from the stored presets and the local profiles: any machine prints the same.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's itlbench when run as a script

from itlbench.core.model_config import ModelConfig  # noqa: E402
from itlbench.errors import ConfigError  # noqa: E402
from itlbench.sim.hardware import FIT, GPUS, Hardware, presets  # noqa: E402
from itlbench.sim.operators import LAYER_GEMMS, gemm_seconds  # noqa: E402
from itlbench.sim.roofline import CostModel  # noqa: E402

OPS = dict(zip(LAYER_GEMMS, ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"), strict=True))
BANDS = ((1, 1), (2, 8), (9, 64), (65, 160), (161, 320), (321, 640), (641, 1280), (1281, 2560), (2561, 10**9))
# The profiles the stored parameters were chosen on: rows 1, 128 and 32,768 of the first are in sim/published.py's
# fit set, and its every row chose the 128-row tile and the slow rows' factor; the second's 1-row TP1 layer is in the
# fit set, and its every row chose Hopper's 256-row cluster. Every other profile is held out.
FIT_SOURCES = ("a100/meta-llama/Meta-Llama-3-8B", "h100/meta-llama/Llama-2-70b-hf")
OVER = 0.15


class ProfileError(Exception):
    """A profile the comparison cannot read (the message names the file and what it lacks)."""


@dataclass(frozen=True)
class Profile:
    gpu: str
    name: str  # org/model as Vidur files it
    model: ModelConfig
    layers: pl.DataFrame  # num_tokens, tp, ms (the four GEMMs summed)

    @property
    def key(self) -> str:
        return f"{self.gpu}/{self.name}"


def read_profile(path: Path, vidur: Path) -> Profile | None:
    """One mlp.csv, or None (with the reason printed) when its MLP is not gated."""
    rel = path.relative_to(vidur / "data" / "profiling" / "compute")
    gpu, name = rel.parts[0], "/".join(rel.parts[1:-1])
    try:
        df = pl.read_csv(path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ProfileError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    need = {"num_tokens", "num_tensor_parallel_workers", "n_head", "n_kv_head", "n_embd", "n_expanded_embd",
            "vocab_size", "use_gated_mlp", *(f"time_stats.{c}.median" for c in OPS.values())}
    missing = sorted(need - set(df.columns))
    if missing:
        raise ProfileError(f"{path}: lacks the columns {', '.join(missing)}")
    if df.height == 0:
        raise ProfileError(f"{path}: holds no profiled rows")
    shape = df.row(0, named=True)
    if not shape["use_gated_mlp"]:
        print(f"skipped {gpu}/{name}: its MLP is not gated (the simulator's layers are Llama's)")
        return None
    model = ModelConfig(name=name, vocab_size=shape["vocab_size"], hidden_size=shape["n_embd"],
                        intermediate_size=shape["n_expanded_embd"], num_layers=1, num_heads=shape["n_head"],
                        num_kv_heads=shape["n_kv_head"], max_position_embeddings=4096)
    ms = pl.sum_horizontal(*(pl.col(f"time_stats.{c}.median") for c in OPS.values()))
    layers = (df.select(pl.col("num_tokens"), pl.col("num_tensor_parallel_workers").alias("tp"), ms.alias("ms"))
              .group_by("num_tokens", "tp").agg(pl.col("ms").mean()).sort("tp", "num_tokens"))
    return Profile(gpu, name, model, layers)


def profiles(vidur: Path) -> list[Profile]:
    root = vidur / "data" / "profiling" / "compute"
    paths = sorted(p for gpu in GPUS if (root / gpu).is_dir() for p in (root / gpu).rglob("mlp.csv"))
    if not paths:
        raise ProfileError(f"--vidur {vidur}: no data/profiling/compute/{{{','.join(sorted(GPUS))}}}/**/mlp.csv "
                           "there; pass a clone of microsoft/vidur")
    return [p for path in paths if (p := read_profile(path, vidur)) is not None]


def errors(profile: Profile, gpus: dict[str, Hardware] = GPUS) -> pl.DataFrame:
    """num_tokens, tp, measured ms, predicted ms, signed relative error: one row per profiled layer."""
    hw = gpus[profile.gpu].with_(dtype="float16")
    out = []
    for tp in profile.layers["tp"].unique().sort():
        cm = CostModel.for_hardware(profile.model, hw, tp=tp)
        part = profile.layers.filter(pl.col("tp") == tp)
        pred = [1e3 * sum(gemm_seconds(cm, op, rows, hw) for op in OPS) for rows in part["num_tokens"]]
        out.append(part.with_columns(pl.Series("pred_ms", pred)))
    return pl.concat(out).with_columns(err=pl.col("pred_ms") / pl.col("ms") - 1)


def band_medians(e: pl.DataFrame) -> list[float | None]:
    """The median signed error of the rows in each of BANDS (None where the profile has none)."""
    out = []
    for lo, hi in BANDS:
        part = e.filter(pl.col("num_tokens").is_between(lo, hi))["err"]
        out.append(float(part.median()) if len(part) else None)  # type: ignore[arg-type]
    return out


def local_scatter(profile: Profile) -> tuple[int, int]:
    """(layers with two or more profiled neighbours within ±10 % rows, those more than 15 % off their median)."""
    seen = off = 0
    for tp in profile.layers["tp"].unique():
        part = profile.layers.filter(pl.col("tp") == tp)
        rows, ms = part["num_tokens"].to_numpy(), part["ms"].to_numpy()
        for r, m in zip(rows, ms, strict=True):
            near = (rows >= 0.9 * r) & (rows <= 1.1 * r) & (rows != r)
            if near.sum() >= 2:
                seen += 1
                off += abs(m / np.median(ms[near]) - 1) > OVER
    return seen, off


def overrides(pairs: list[str]) -> dict[str, float]:
    """`--set KEY=VALUE` pairs as FIT overrides (a one-line error names an unknown key or a bad value)."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in FIT:
            raise ProfileError(f"--set {pair}: {key!r} is not a fitted parameter; use one of {', '.join(FIT)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ProfileError(f"--set {pair}: {value!r} is not a number") from None
    return out


def summary(err: np.ndarray) -> str:
    a = np.abs(err)
    return (f"{len(a)} layers: MAPE {a.mean():.1%}, median {np.median(a):.1%}, signed median {np.median(err):+.1%}, "
            f"{(a > OVER).mean():.0%} over 15 %")


def _band_label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}"


def rows_table(results: list[tuple[Profile, pl.DataFrame]]) -> list[list[str]]:
    out = []
    for profile, e in results:
        for tp in e["tp"].unique().sort():
            part = e.filter(pl.col("tp") == tp)
            cells = ["" if m is None else f"{m:+.0%}" for m in band_medians(part)]
            a = np.abs(part["err"].to_numpy())
            fit = "fit source" if profile.key in FIT_SOURCES else "held out"
            out.append([profile.key, str(tp), fit, f"{a.mean():.1%}", f"{(a > OVER).mean():.0%}", *cells])
    return out


HEADER = ["profile", "TP", "set", "MAPE", "over 15 %", *(_band_label(lo, hi) for lo, hi in BANDS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vidur", type=Path, required=True, help="a local clone of microsoft/vidur")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="replace a fitted parameter of the presets for this comparison (repeatable)")
    ap.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    args = ap.parse_args()
    try:
        changed = overrides(args.set)
        gpus = presets({**FIT, **changed}) if changed else GPUS
        read = profiles(args.vidur)
        results = [(p, errors(p, gpus)) for p in read]
    except ConfigError as exc:  # a --set value the presets refuse (a negative tile, an efficiency of 0)
        print(f"error: --set {exc}", file=sys.stderr)
        return 2
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = rows_table(results)
    widths = [max(len(r[i]) for r in [HEADER, *table]) for i in range(len(HEADER))]
    for r in [HEADER, *table]:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    print("(cells: median signed error of the layers in that band of rows; + is slower than the profile)")
    if changed:
        print("with " + ", ".join(f"{k}={v:g}" for k, v in changed.items()) + " (stored: "
              + ", ".join(f"{k}={FIT[k]:g}" for k in changed) + ")")
    held = [e for p, e in results if p.key not in FIT_SOURCES]
    for label, frames in (("held out", held), ("all", [e for _, e in results])):
        if frames:
            print(f"{label:9s} {summary(pl.concat(frames)['err'].to_numpy())}")
    for gpu in sorted({p.gpu for p, _ in results}):
        frames = [e for p, e in results if p.gpu == gpu and p.key not in FIT_SOURCES]
        if frames:
            held_gpu = pl.concat(frames)
            print(f"{gpu} held out: {summary(held_gpu['err'].to_numpy())}")
            cells = band_medians(held_gpu)
            print(f"{gpu} held out, median by rows: " + "  ".join(
                f"{_band_label(lo, hi)} {m:+.0%}" for (lo, hi), m in zip(BANDS, cells, strict=True) if m is not None))
    seen, off = map(sum, zip(*(local_scatter(p) for p in read), strict=True))
    print(f"local scatter: {off} of {seen} layers ({off / max(seen, 1):.1%}) are more than 15 % off the median of "
          "their neighbours within ±10 % rows")
    if args.markdown:
        lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(r) + " |" for r in table]
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
