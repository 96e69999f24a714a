"""Run directories as `itlbench run` writes them, around a real CPU engine's step log (for calibration)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import polars as pl

from itlbench.core.engine import Engine
from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import SamplingParams
from itlbench.serving.build import create_engine


def write_run_dir(path: Path, engine: Engine, window: tuple[int, int] | None = None) -> Path:
    """A run directory as `itlbench run` writes it: run.json and the steps table's parquet parts."""
    (path / "steps").mkdir(parents=True)
    rows = [r.to_dict() for r in engine.step_log.since(0)]
    pl.DataFrame(rows).write_parquet(path / "steps" / "part-00000.parquet")
    doc: dict = {"config": {"engine": engine.config.as_dict()},
                 "engine": {"model": dataclasses.asdict(engine.model_config), "device": engine.device,
                            "dtype": engine.dtype}}
    if window:
        doc["measure_start_ns"], doc["end_ns"] = window
    (path / "run.json").write_text(json.dumps(doc, default=str))
    return path


def real_cpu_engine(budget: int, seed: int) -> Engine:
    import torch

    torch.set_num_threads(1)
    engine = create_engine(EngineConfig(model="tiny", chunk_budget=budget, kv_blocks=512, max_model_len=2048, device="cpu"))
    rng = np.random.default_rng(seed)
    for i in range(24):
        engine.add_request(rng.integers(3, 500, int(rng.integers(20, 900))).tolist(),
                           SamplingParams(max_tokens=int(rng.integers(4, 30)), ignore_eos=True), f"r{i}")
        for _ in range(3):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    return engine
