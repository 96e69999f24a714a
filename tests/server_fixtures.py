"""The engine configuration the server test modules share (the `server` fixture is in conftest)."""

from itlbench.core.engine_config import EngineConfig

TINY_ENGINE = EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=256, max_model_len=1024, seed=0)
