"""The engine configuration the server test modules share (the `server` fixture is in conftest)."""

import dataclasses

from itlbench.core.engine_config import EngineConfig

TINY_ENGINE = EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=256, max_model_len=1024, seed=0)

# the command line's layout: the engine core in its own process, one torch thread
PROCESS_ENGINE = dataclasses.replace(TINY_ENGINE, engine_process=True, torch_threads=1)
