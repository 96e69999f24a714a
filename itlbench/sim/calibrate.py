"""`itlbench calibrate`: fit the roofline model's efficiencies and per-step overhead to real step logs.

Each step of a run's `steps` table carries what its cost depends on (rows, rows that sample, cached
context, causal pairs; see engine/roofline.py). The cost model turns those into GEMM FLOPs, attention
FLOPs and bytes; the fit finds the efficiencies and the overhead that make

    t = max(GEMM / (peak × e_gemm) + attention / (peak × e_attn), bytes / (bandwidth × e_mem))
        + step overhead + sequence overhead × sequences in the step

match the measured durations, minimising the mean absolute percentage error (Nelder–Mead in log
space from a least-squares start). Only the products peak × e matter for prediction; the base
hardware (measured CPU roofs, or a GPU preset) makes the efficiencies readable. Steps are split into
fit and held-out sets so the reported error is a prediction, not a fit residual.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from itlbench.core.model_config import ModelConfig, RopeScaling
from itlbench.core.presets import load_model_config
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.rundir.reader import not_a_run, read_run_doc, read_table
from itlbench.sim.roofline import DTYPE_BYTES, CostModel, Hardware, StepShape

PHASES = ("prefill", "decode", "mixed")
SHAPE_COLUMNS = ("num_sampled", "context_tokens", "attention_pairs")


@dataclass
class StepData:
    """Per-step cost features (FLOPs and bytes under "executed" counting) and measured seconds."""

    gemm_flops: np.ndarray
    attn_flops: np.ndarray
    bytes: np.ndarray
    sequences: np.ndarray
    seconds: np.ndarray
    phase: np.ndarray

    def __len__(self) -> int:
        return len(self.seconds)

    def subset(self, mask: np.ndarray) -> StepData:
        return StepData(self.gemm_flops[mask], self.attn_flops[mask], self.bytes[mask], self.sequences[mask],
                        self.seconds[mask], self.phase[mask])

    @classmethod
    def concat(cls, parts: Sequence[StepData]) -> StepData:
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                     ("gemm_flops", "attn_flops", "bytes", "sequences", "seconds", "phase")))


@dataclass
class RunSteps:
    run_dir: Path
    model: ModelConfig
    dtype: str
    device: str
    steps: pl.DataFrame


def _run_doc(run_dir: Path) -> dict[str, Any]:
    if not (run_dir / "run.json").is_file():
        raise not_a_run(run_dir)  # a path that does not exist, a file, a sweep's directory: each said so
    return read_run_doc(run_dir)


def _object(value: object) -> dict[str, Any]:
    """A run.json member that should be an object; anything else (a hand-edited file) reads as empty."""
    return value if isinstance(value, dict) else {}


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The members of `d` that are fields of the dataclass `cls` (a newer itlbench's run.json may record more);
    a field the dataclass declares a number must be a finite one (a hand-edited file: "six" layers)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        value = d[f.name]
        if f.type in ("int", "float") and not (isinstance(value, int | float) and not isinstance(value, bool)
                                               and math.isfinite(value) and (f.type == "float" or value == int(value))):
            raise ConfigError(f.name, f"is {value!r}, not a number")
        out[f.name] = value
    return out


def _model_from_dict(d: dict[str, Any], run_dir: Path) -> ModelConfig:
    """run.json's record of the model the run served; one line naming the member where it is not one."""
    try:
        rope = d.get("rope_scaling")
        if rope is not None and not isinstance(rope, dict):
            raise ConfigError("rope_scaling", f"is {rope!r}, not an object")
        return ModelConfig(**_known(ModelConfig, d) | {"rope_scaling": RopeScaling(**_known(RopeScaling, rope))
                                                       if rope else None})
    except (ConfigError, TypeError, ValueError) as exc:
        why = f"{exc.field} {exc.problem}" if isinstance(exc, ConfigError) else str(exc).split("__init__() ")[-1]
        raise ConfigError("RUN_DIR", f"{run_dir / 'run.json'}'s engine.model does not describe a model ({why})",
                          "restore run.json from a copy of the run directory, or record the run again") from None


def _window_mark(doc: dict[str, Any], key: str, run_dir: Path) -> int | None:
    """run.json's `measure_start_ns` or `end_ns`: an integer, absent, or one line naming it."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError("RUN_DIR", f"{run_dir / 'run.json'}'s {key} is {value!r}, not an integer (nanoseconds)",
                          "restore run.json from a copy of the run directory, or record the run again")
    return value


def _engine_docs(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(engine configuration, engine info) of a run of itlbench's engine: started by the run, or served by
    `itlbench serve` and reached with --endpoint (run.json nests that server's GET /v1/engine under
    `engine.itlbench`; its steps were followed on the same clock). Empty for other servers."""
    info = _object(doc.get("engine"))
    if info.get("external"):
        served = _object(info.get("itlbench"))
        return _object(served.get("engine")), served
    return _object(_object(doc.get("config")).get("engine")), info


def check_profile_out(out: Path) -> None:
    """`calibrate --out` may replace an earlier profile, never another file: a run's run.json or summary.json
    named there by mistake was overwritten with the profile, the run's record lost."""
    if out.is_dir():
        raise ConfigError("--out", f"{out} is a directory", f"name a file in it, e.g. {out / 'calibrated.json'}")
    if not out.exists():
        return
    try:
        raw = json.loads(out.read_bytes())
        if not isinstance(raw, dict):
            raise ValueError
        Hardware.from_dict(raw, str(out), "--out")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # ConfigError and UnicodeDecodeError: ValueErrors
        raise ConfigError("--out", f"{out} exists and is not a hardware profile: calibrate would replace it",
                          "name a new file, or a profile an earlier `itlbench calibrate` wrote") from None


def read_run_steps(run_dir: str | Path) -> RunSteps:
    """A bundled-engine run's non-empty steps in its measured window, its model and its dtype."""
    run_dir = Path(run_dir)
    doc = _run_doc(run_dir)
    engine_cfg, info = _engine_docs(doc)
    model_name = engine_cfg.get("model")
    if not model_name:
        raise ConfigError("RUN_DIR", f"{run_dir} was not run against itlbench's engine (it has no step log)",
                          "calibrate from runs of `itlbench run` without --endpoint, or with --endpoint at "
                          "`itlbench serve` on the same machine")
    if engine_cfg.get("engine", engine_cfg.get("runner")) == "sim":  # "runner": run.json before 0.2
        raise ConfigError("RUN_DIR", f"{run_dir} is a simulated run", "calibrate from runs of the real engine")
    model = (_model_from_dict(info["model"], run_dir) if isinstance(info.get("model"), dict)
             else load_model_config(model_name))
    dtype = str(info.get("dtype") or "float32")
    steps = read_table(run_dir, "steps").filter(pl.col("prefill_tokens") + pl.col("decode_tokens") > 0)
    # The measured window only: warm-up steps run cold (first allocations, page faults) and drain steps
    # share the machine with the client's end-of-run work; neither is the engine's steady cost.
    if measure_start := _window_mark(doc, "measure_start_ns", run_dir):
        steps = steps.filter(pl.col("start_ns") >= measure_start)
    if end := _window_mark(doc, "end_ns", run_dir):
        steps = steps.filter(pl.col("end_ns") <= end)
    if steps.height == 0:
        raise ConfigError("RUN_DIR", f"{run_dir} has no engine steps", "record a run of the bundled engine")
    if steps["attention_pairs"].null_count() == steps.height:
        raise ConfigError("RUN_DIR", f"{run_dir}'s step log lacks the step shapes (attention_pairs, ...)",
                          "record a new run with this version of itlbench")
    return RunSteps(run_dir, model, dtype, str(info.get("device", engine_cfg.get("device", "?"))), steps)


def step_data(run: RunSteps, tp: int = 1) -> StepData:
    cm = CostModel(run.model, DTYPE_BYTES.get(run.dtype, 4), "executed", tp=tp)
    s = run.steps
    tokens = (s["prefill_tokens"] + s["decode_tokens"]).to_numpy()
    cols = [s[c].fill_null(0).to_numpy() for c in SHAPE_COLUMNS]
    costs = [cm.cost(StepShape(int(t), int(a), int(b), int(c))) for t, a, b, c in zip(tokens, *cols, strict=True)]
    return StepData(
        gemm_flops=np.array([c.gemm_flops for c in costs]), attn_flops=np.array([c.attn_flops for c in costs]),
        bytes=np.array([c.bytes for c in costs]),
        sequences=(s["num_prefill_reqs"] + s["num_decode_reqs"]).to_numpy().astype(float),
        seconds=((s["end_ns"] - s["start_ns"]).to_numpy() / 1e9).astype(float), phase=s["phase"].to_numpy())


# ---------------------------------------------------------------------------------------- the model


def predict(params: np.ndarray, d: StepData) -> np.ndarray:
    """params = seconds per GEMM FLOP, per attention FLOP, per byte, per step and per sequence."""
    x_g, x_a, x_m, c, c_seq = params
    return np.maximum(d.gemm_flops * x_g + d.attn_flops * x_a, d.bytes * x_m) + c + c_seq * d.sequences


def mape(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / actual - 1.0))) if len(actual) else float("nan")


def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5, iters: int = 2000,
                 tol: float = 1e-10) -> np.ndarray:
    """Derivative-free minimisation (the max() makes the objective kinked)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best point
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def _least_squares_start(d: StepData) -> np.ndarray:
    """Relative least squares of t ≈ x_g·G + x_a·A + x_m·B + c + c_seq·S (the sum bounds the max), made
    positive."""
    cols = np.column_stack([d.gemm_flops, d.attn_flops, d.bytes, np.ones(len(d)), d.sequences])
    scale = cols.max(axis=0)
    scale[scale == 0] = 1.0
    w = 1.0 / d.seconds
    sol, *_ = np.linalg.lstsq(cols / scale * w[:, None], d.seconds * w, rcond=None)
    sol = sol / scale
    floor = np.array([1e-18, 1e-18, 1e-15, 1e-6, 1e-7])
    return np.maximum(sol, floor)


def roof_floors(base: Hardware) -> np.ndarray:
    """The least seconds per GEMM FLOP, attention FLOP and byte: the roofs' own. A term the steps hardly
    determine (attention in a decode-heavy run) would otherwise be fitted far above its roof."""
    return np.array([1.0 / base.peak_flops, 1.0 / base.peak_flops, 1.0 / base.mem_bw, 0.0, 0.0])


def fit_params(d: StepData, floors: np.ndarray | None = None) -> np.ndarray:
    """Seconds per GEMM FLOP, attention FLOP, byte, step and sequence, minimising MAPE on `d`, each at
    least its `floors` (no efficiency above 100 % of the roofs)."""
    if len(d) < 8:
        raise ItlbenchError(f"only {len(d)} steps to fit; record a longer run")
    lo = np.zeros(5) if floors is None else np.asarray(floors, float)

    def params(th: np.ndarray) -> np.ndarray:
        return lo + np.exp(th)

    def start(x: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(np.asarray(x, float) - lo, np.maximum(lo, 1e-30) * 1e-3 + 1e-300))

    best: np.ndarray | None = None
    best_err = np.inf
    starts = [start(_least_squares_start(d))]
    for p in (0.25, 0.5, 0.75):  # also start from each term explaining a share of the median step
        t = float(np.median(d.seconds))
        g, a, b = (max(float(np.median(v[v > 0])) if (v > 0).any() else 1.0, 1e-30)
                   for v in (d.gemm_flops, d.attn_flops, d.bytes))
        seqs = max(float(np.median(d.sequences)), 1.0)
        starts.append(start(np.array([t * (1 - p) / g, t * (1 - p) / a, t * (1 - p) / b, t * p / 2, t * p / 2 / seqs])))
    for x0 in starts:
        x = _nelder_mead(lambda th: mape(predict(params(th), d), d.seconds), x0)
        x = _nelder_mead(lambda th: mape(predict(params(th), d), d.seconds), x, step=0.1)
        err = mape(predict(params(x), d), d.seconds)
        if err < best_err:
            best, best_err = x, err
    assert best is not None
    return params(best)


def at_roof(params: np.ndarray, floors: np.ndarray, tolerance: float = 0.02) -> list[str]:
    """The terms the fit put at their roof (within `tolerance`): what the run says of them is only that
    they cost no more, or that the roofs are below what the run reached."""
    names = ("GEMM", "attention", "bandwidth")
    return [n for n, x, f in zip(names, params[:3], floors[:3], strict=True) if f > 0 and x <= f * (1 + tolerance)]


def profile_from_params(params: np.ndarray, base: Hardware, name: str, source: str) -> Hardware:
    x_g, x_a, x_m, c, c_seq = (float(v) for v in params)
    # the fitted formula is the whole-step roofline: the profile says so, whatever the base's cost model
    return base.with_(name=name, label=f"{base.label}, calibrated", gemm_eff=1.0 / (x_g * base.peak_flops),
                      attn_eff=1.0 / (x_a * base.peak_flops), mem_eff=1.0 / (x_m * base.mem_bw),
                      step_overhead_s=c, seq_overhead_s=c_seq, counting="executed", source=source,
                      cost_model="roofline", graph_overhead_s=None, fp8_gemm_eff=0.0, peak_flops_fp8=0.0,
                      gemm_m_half=0.0, attn_mem_eff=0.0, attn_k_half=0.0, kernel_s=0.0,
                      sources={"efficiencies": source})


def params_of(hw: Hardware) -> np.ndarray:
    return np.array([1.0 / (hw.peak_flops * hw.gemm_eff), 1.0 / (hw.peak_flops * hw.attn_eff),
                     1.0 / (hw.mem_bw * hw.mem_eff), hw.step_overhead_s, hw.seq_overhead_s])


# ---------------------------------------------------------------------------------------- runs


@dataclass
class Calibration:
    profile: Hardware
    fit_steps: int
    errors: dict[str, dict[str, float]] = field(default_factory=dict)  # held-out MAPE and counts by phase
    at_roof: list[str] = field(default_factory=list)  # terms fitted at 100 % of their roof

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile.to_dict(), "fit_steps": self.fit_steps, "held_out": self.errors,
                "at_roof": self.at_roof}


def phase_errors(pred: np.ndarray, d: StepData) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for phase in (*PHASES, "all"):
        mask = np.ones(len(d), bool) if phase == "all" else d.phase == phase
        if mask.any():
            ape = np.abs(pred[mask] / d.seconds[mask] - 1.0)
            out[phase] = {"mape": float(ape.mean()), "median_ape": float(np.median(ape)), "steps": int(mask.sum()),
                          "median_s": float(np.median(d.seconds[mask]))}
    return out


def split(n: int, holdout: float, seed: int) -> np.ndarray:
    """True for held-out steps: a seeded random `holdout` share."""
    rng = np.random.default_rng(seed)
    return rng.random(n) < holdout


def base_hardware(runs: Sequence[RunSteps]) -> Hardware:
    """Roofs to express efficiencies against: this CPU measured now for CPU runs, else the H100 preset."""
    from itlbench.sim.roofline import GPUS, measure_cpu

    return measure_cpu() if all(r.device.startswith("cpu") for r in runs) else GPUS["h100"]


def calibrate(run_dirs: Sequence[str | Path], base: Hardware | None = None, holdout: float = 0.25,
              seed: int = 0, name: str = "calibrated", tp: int = 1) -> Calibration:
    if seed < 0:  # numpy's generators take none: it was a ValueError traceback after the runs were read
        raise ConfigError("--seed", f"must be >= 0, got {seed}", "give a whole number >= 0")
    seen = [Path(r).resolve() for r in run_dirs]
    if len(set(seen)) < len(seen):
        twice = next(str(r) for r, k in zip(run_dirs, seen, strict=True) if seen.count(k) > 1)
        raise ConfigError("RUN_DIR", f"{twice} is given twice (its steps would count double)", "give each run once")
    runs = [read_run_steps(r) for r in run_dirs]
    models = {(r.model.name, r.dtype) for r in runs}
    if len(models) > 1:
        raise ConfigError("RUN_DIR", f"runs mix models/dtypes {sorted(models)}", "calibrate one model at a time")
    data = StepData.concat([step_data(r, tp) for r in runs])
    held = split(len(data), holdout, seed)
    base = base or base_hardware(runs)
    floors = roof_floors(base)
    params = fit_params(data.subset(~held), floors)
    runs_txt = ", ".join(str(r.run_dir) for r in runs)
    profile = profile_from_params(params, base.with_(dtype=runs[0].dtype), name,
                                  f"calibrated on {int((~held).sum())} steps of {runs_txt} ({runs[0].model.name}); "
                                  f"roofs: {base.source}")
    test = data.subset(held)
    return Calibration(profile, int((~held).sum()), phase_errors(predict(params, test), test),
                       at_roof(params, floors))


def evaluate(profile: Hardware, run_dirs: Sequence[str | Path]) -> dict[str, dict[str, float]]:
    """Per-phase MAPE of `profile`'s predictions on every step of other runs."""
    seen = [Path(r).resolve() for r in run_dirs]
    if len(set(seen)) < len(seen):
        twice = next(str(r) for r, k in zip(run_dirs, seen, strict=True) if seen.count(k) > 1)
        raise ConfigError("RUN_DIR", f"{twice} is given twice (its steps would count double)", "give each run once")
    runs = [read_run_steps(r) for r in run_dirs]
    data = StepData.concat([step_data(r) for r in runs])
    return phase_errors(predict(params_of(profile), data), data)
