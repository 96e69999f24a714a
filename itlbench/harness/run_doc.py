"""What run.json records of a run, served or simulated: its configuration, the machine, the versions
that shape a measurement, and the load it was given."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import platform
import secrets
import sys
from typing import Any

from itlbench.harness.connect import Connection
from itlbench.harness.run_config import RunConfig
from itlbench.system import nvidia
from itlbench.workloads.build import LoadSpec

VERSIONED = ("itlbench", "torch", "aiohttp", "polars", "numpy", "prometheus-client", "uvloop")


def hardware() -> dict[str, Any]:
    import os

    import psutil

    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "cpu_count": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                            "processor": platform.processor()}
    info["torch"], info["cuda"] = _torch_and_cuda()
    return info


def _torch_and_cuda() -> tuple[str | None, str | None]:
    """torch's version and the host's first CUDA device; torch is imported only where a driver says a device
    may be (or where it already is): elsewhere its version comes from its metadata."""
    if "torch" not in sys.modules:
        if importlib.util.find_spec("torch") is None:
            return None, None
        if not nvidia.driver_present():
            try:
                return importlib.metadata.version("torch"), None
            except importlib.metadata.PackageNotFoundError:  # importable, yet no metadata (a source tree)
                pass
    try:
        import torch
    except ImportError:
        return None, None
    return torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def versions() -> dict[str, str | None]:
    """Installed versions of what shapes a measurement (client stack and analysis)."""
    out: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out

def load_spec(cfg: RunConfig, conn: Connection) -> LoadSpec:
    """The run's load. Unless `--reuse-prompts`, a fresh salt makes every prompt new to the server."""
    return LoadSpec(
        workload=cfg.workload, streams=cfg.streams, rate=cfg.rate, burstiness=cfg.burstiness,
        duration_s=cfg.duration_s, inject=cfg.inject, inject_max_tokens=cfg.inject_max_tokens,
        seed=cfg.seed, max_model_len=conn.max_model_len, trace_path=cfg.trace, trace_time_scale=cfg.time_scale,
        token_ids=conn.vocab_size is not None, vocab_size=conn.vocab_size or 0,
        tokens_per_word=conn.tokens_per_word, prompt_salt=None if cfg.reuse_prompts else secrets.token_hex(4))

def config_doc(cfg: RunConfig) -> dict[str, Any]:
    doc = {k: v for k, v in vars(cfg).items() if k not in ("engine", "api_key")}
    doc["engine"] = cfg.engine.as_dict() if cfg.endpoint is None else None
    doc["api_key_set"] = bool(cfg.api_key)
    doc["limits"] = vars(cfg.limits)
    return json.loads(json.dumps(doc, default=str))
