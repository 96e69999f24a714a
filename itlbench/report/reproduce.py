"""The `itlbench run` command line that reproduces a run, rebuilt from its run.json.

Every setting that shapes the load or the engine is written out, defaults included, so the line
still reproduces the run after a default changes.
"""

from __future__ import annotations

import shlex
from typing import Any

# run.json config key → flag, for values written as `--flag value`
VALUE_FLAGS = (("workload", "--workload"), ("inject", "--inject"), ("streams", "--streams"), ("rate", "--rate"),
               ("burstiness", "--burstiness"), ("duration_s", "--duration"), ("warmup_s", "--warmup"),
               ("ramp_s", "--ramp"), ("seed", "--seed"), ("inject_max_tokens", "--inject-max-tokens"),
               ("trace", "--trace"), ("time_scale", "--time-scale"), ("slo", "--slo"),
               ("stall_factor", "--stall-factor"), ("stall_floor_s", "--stall-floor"), ("workers", "--workers"))
ENGINE_FLAGS = (("model", "--model"), ("policy", "--policy"), ("max_num_seqs", "--max-num-seqs"),
                ("kv_blocks", "--kv-blocks"), ("max_model_len", "--max-model-len"), ("device", "--device"))
SKIP_DEFAULT = {"rate": None, "trace": None, "slo": None, "inject": None, "ramp_s": 0.0, "workers": 1,
                "burstiness": 1.0, "time_scale": 1.0}


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
        if eng.get("mixed"):
            args.append("--mixed")
    return " ".join(shlex.quote(a) if not a.startswith("$") else a for a in args)
