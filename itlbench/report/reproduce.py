"""The `itlbench run` command line that reproduces a run, rebuilt from its run.json.

Every setting that shapes the load or the engine is written out, defaults included, so the line
still reproduces the run after a default changes.
"""

from __future__ import annotations

import shlex
from dataclasses import fields
from typing import Any

from itlbench.core.engine_config import EngineConfig, flag_of

# run.json config key → flag, for values written as `--flag value`
VALUE_FLAGS = (("workload", "--workload"), ("inject", "--inject"), ("streams", "--streams"), ("rate", "--rate"),
               ("burstiness", "--burstiness"), ("duration_s", "--duration"), ("warmup_s", "--warmup"),
               ("ramp_s", "--ramp"), ("seed", "--seed"), ("inject_max_tokens", "--inject-max-tokens"),
               ("trace", "--trace"), ("time_scale", "--time-scale"), ("slo", "--slo"),
               ("stall_factor", "--stall-factor"), ("stall_floor_s", "--stall-floor"), ("workers", "--workers"),
               ("clock", "--clock"))
ENGINE_FLAGS = (("model", "--model"), ("policy", "--policy"), ("max_num_seqs", "--max-num-seqs"),
                ("kv_blocks", "--kv-blocks"), ("max_model_len", "--max-model-len"), ("device", "--device"))
WRITTEN = {"model", "chunk_budget", "seed", *(k for k, _ in ENGINE_FLAGS)}  # seed: the run's --seed
SKIP_DEFAULT = {"rate": None, "trace": None, "slo": None, "inject": None, "ramp_s": 0.0, "workers": 1,
                "burstiness": 1.0, "time_scale": 1.0, "clock": "auto"}


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def reproduce_command(doc: dict[str, Any]) -> str:
    """`itlbench run …` for this run.json (empty when it has no config)."""
    cfg = doc.get("config") or {}
    if not cfg:
        return ""
    args = ["itlbench", "run"]
    plan = doc.get("plan") or {}
    for key, flag in VALUE_FLAGS:
        value = cfg.get(key)
        if key == "streams" and value is None and cfg.get("rate") is None:
            value = plan.get("streams")  # the default the run resolved
        if value is None or (key in SKIP_DEFAULT and value == SKIP_DEFAULT[key]):
            continue
        args += [flag, _fmt(value)]
    if cfg.get("adaptive_warmup") is False:
        args.append("--no-adaptive-warmup")
    if cfg.get("endpoint"):
        args += ["--endpoint", cfg["endpoint"], "--model", str(cfg.get("model") or "")]
        if cfg.get("api") and cfg["api"] != "completions":
            args += ["--api", cfg["api"]]
        if cfg.get("forced_lengths") is False:
            args.append("--no-forced-lengths")
        if cfg.get("api_key_set"):
            args += ["--api-key", "$ITLBENCH_API_KEY"]
    else:
        eng = cfg.get("engine") or {}
        budget = eng.get("chunk_budget")
        args += ["--chunk-budget", "none" if budget is None else str(budget)]
        for key, flag in ENGINE_FLAGS:
            if eng.get(key) is not None:
                args += [flag, _fmt(eng[key])]
        args += _changed_engine_flags(eng)
    return " ".join(shlex.quote(a) if not a.startswith("$") else a for a in args)


def _changed_engine_flags(eng: dict[str, Any]) -> list[str]:
    """Every other engine setting the run changed from its default (`--engine sim --gpu a100 --tp 2`,
    `--mixed`, ...): without them the line would start another engine than the one measured."""
    out: list[str] = []
    for f in fields(EngineConfig):
        if f.name in WRITTEN or f.name not in eng or eng[f.name] == f.default:
            continue
        value = eng[f.name]
        if isinstance(value, bool):
            out.append(flag_of(f.name) if value else f"--no-{f.name.replace('_', '-')}")
        elif value is None:
            if f.metadata.get("parse") is not None:  # a field that reads 'none' itself
                out += [flag_of(f.name), "none"]
        else:
            out += [flag_of(f.name), _fmt(value)]
    return out
