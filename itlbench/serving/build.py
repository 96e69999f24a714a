"""Build the engine a config asks for: the torch runner or the simulator under one `Engine`, or
simulated prefill and decode pools (`DisaggEngine`, the same `SteppedEngine` surface).

This is the one place that knows every runner; the engine core takes whichever it is given.
The torch runner is imported only when asked for, so the simulator runs where torch is not installed.
"""

from __future__ import annotations

from itlbench.core.engine import Engine, SteppedEngine, resolve_max_model_len
from itlbench.core.engine_config import EngineConfig
from itlbench.core.hf_config import require_engine_family
from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import load_model_config
from itlbench.errors import ConfigError
from itlbench.serving.fault_hook import inject_engine_fault  # a test hook: a no-op unless its variable is set

TORCH_EXTRA = "install the bundled engine with `pip install 'itlbench[engine]'` (brings torch)"
ENGINE_EXTRA = TORCH_EXTRA + ", or use --engine sim"


def create_engine(config: EngineConfig, model_config: ModelConfig | None = None,
                  attention_backend: str | None = None) -> SteppedEngine:
    return inject_engine_fault(_build(config, model_config, attention_backend))


def _build(config: EngineConfig, model_config: ModelConfig | None, attention_backend: str | None) -> SteppedEngine:
    model_config = model_config or load_model_config(config.model)
    if config.engine == "sim":
        if config.disaggregate:
            from itlbench.sim.disagg import DisaggEngine, KvLink

            return DisaggEngine(config, model_config, link=KvLink(config.kv_link_gbps * 1e9 / 8),
                                prefill_gpu=config.prefill_gpu)
        from itlbench.sim.runner import SimRunner

        return Engine(config, model_config, SimRunner(config, model_config, resolve_max_model_len(config, model_config)))
    require_torch_engine()
    from itlbench.engine.runner import ModelRunner

    runner = ModelRunner(config, model_config, resolve_max_model_len(config, model_config), attention_backend)
    return Engine(config, model_config, runner)


def torch_engine_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def require_engine_for(config: EngineConfig, sim_alternative: bool = True) -> None:
    """Refuse up front, in one line, a config whose engine is not installed (the simulator always is) or cannot
    compute the model (the bundled engine computes Llama only; the simulator prices Mistral and Qwen too)."""
    if config.engine != "sim":
        require_engine_family(load_model_config(config.model))
        require_torch_engine(sim_alternative)


def require_torch_engine(sim_alternative: bool = True) -> None:
    """The bundled torch engine needs the `engine` extra; say so in one line instead of an ImportError. A command
    without --engine (export-model, phases) is not offered the simulator, and the line names torch, not --engine."""
    if not torch_engine_available():
        raise ConfigError("engine" if sim_alternative else "torch",
                          "the bundled torch engine needs PyTorch, which is not installed",
                          ENGINE_EXTRA if sim_alternative else TORCH_EXTRA)
