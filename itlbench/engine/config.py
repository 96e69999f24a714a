"""Model and engine configuration: presets, Hugging Face `config.json`, validation.

Torch-free on purpose: the scheduler, block manager and CLI read these without importing torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal

from itlbench.errors import ConfigError
from itlbench.units import parse_tokens

Policy = Literal["budget", "prefill-first"]
POLICIES: tuple[str, ...] = ("budget", "prefill-first")
Runner = Literal["torch", "sim"]
RUNNERS: tuple[str, ...] = ("torch", "sim")
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "sdpa", "flash", "triton")  # itlbench.engine.attention


ROPE_SCALINGS: tuple[str, ...] = ("llama3", "linear")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. "llama3" (Llama-3.1's, stretching 8k training to 128k) divides low
    frequencies by `factor` and blends the middle band; "linear" divides every frequency by `factor`
    and uses no other field."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_SCALINGS:
            raise ConfigError("model.rope_scaling.rope_type", f"unknown {self.rope_type!r}",
                              f"use one of {', '.join(ROPE_SCALINGS)}")
        if self.factor <= 0:
            raise ConfigError("model.rope_scaling.factor", f"must be > 0, got {self.factor}")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a Llama-3-architecture decoder; all the engine needs to build it."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    head_dim: int = 0  # 0: hidden_size // num_heads
    rope_theta: float = 500_000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    bos_token_id: int = 1
    eos_token_id: int = 2
    extra_eos_token_ids: tuple[int, ...] = ()  # instruct models end turns on more than one id
    path: str | None = None  # local Hugging Face directory the shapes came from, if any

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_heads, 1))
        _validate_model(self)

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings included once when tied)."""
        d, h, kv, hd, f = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, self.intermediate_size
        attn = d * (h * hd) + 2 * d * (kv * hd) + (h * hd) * d
        mlp = 3 * d * f
        per_layer = attn + mlp + 2 * d
        embed = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.num_layers * per_layer + embed + head + d

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends generation (unless a request ignores EOS)."""
        return frozenset((self.eos_token_id, *self.extra_eos_token_ids))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V for one token across all layers: 2 · L · h_kv · d_h · b."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _validate_model(cfg: ModelConfig) -> None:
    positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "max_position_embeddings", "head_dim")
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"model.{name}", f"must be > 0, got {getattr(cfg, name)}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError("model.num_kv_heads",
                          f"{cfg.num_kv_heads} does not divide num_heads={cfg.num_heads}",
                          "grouped-query attention needs num_heads % num_kv_heads == 0")
    if cfg.head_dim % 2:
        raise ConfigError("model.head_dim", f"must be even for RoPE, got {cfg.head_dim}")


_LLAMA31_ROPE = RopeScaling()

PRESETS: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig(
        name="llama-3.1-8b", vocab_size=128_256, hidden_size=4096, intermediate_size=14_336,
        num_layers=32, num_heads=32, num_kv_heads=8, max_position_embeddings=131_072,
        rope_scaling=_LLAMA31_ROPE, bos_token_id=128_000, eos_token_id=128_001),
    "llama-3-8b": ModelConfig(
        name="llama-3-8b", vocab_size=128_256, hidden_size=4096, intermediate_size=14_336,
        num_layers=32, num_heads=32, num_kv_heads=8, max_position_embeddings=8192,
        bos_token_id=128_000, eos_token_id=128_001),
    "llama-3.2-1b": ModelConfig(
        name="llama-3.2-1b", vocab_size=128_256, hidden_size=2048, intermediate_size=8192,
        num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=131_072,
        rope_scaling=RopeScaling(factor=32.0), tie_word_embeddings=True,
        bos_token_id=128_000, eos_token_id=128_001),
    # CPU presets: Llama-3 shapes scaled down so a 2-core box shows the phase fight in seconds.
    # cpu-small: 32-stream decode steps of ~10-20 ms and a 16k prefill of a few seconds on 2 cores;
    # narrow heads (4 x 32) keep the quadratic attention term of long prompts in check.
    "cpu-small": ModelConfig(
        name="cpu-small", vocab_size=8192, hidden_size=256, intermediate_size=768,
        num_layers=6, num_heads=4, num_kv_heads=1, head_dim=32, max_position_embeddings=65_536,
        rope_scaling=_LLAMA31_ROPE),
    "cpu-medium": ModelConfig(
        name="cpu-medium", vocab_size=8192, hidden_size=384, intermediate_size=1024,
        num_layers=4, num_heads=6, num_kv_heads=2, max_position_embeddings=65_536,
        rope_scaling=_LLAMA31_ROPE),
    "tiny": ModelConfig(
        name="tiny", vocab_size=512, hidden_size=64, intermediate_size=160,
        num_layers=2, num_heads=4, num_kv_heads=2, max_position_embeddings=4096,
        rope_scaling=RopeScaling(factor=8.0, original_max_position_embeddings=256)),
}

CPU_DEFAULT_PRESET = "cpu-small"
CUDA_DEFAULT_PRESET = "llama-3.2-1b"


def default_preset(device: str = "auto") -> str:
    """The preset a run uses when none is named: a real-size model where a GPU is, a CPU-sized one
    elsewhere (imports torch only to ask)."""
    if device == "cpu":
        return CPU_DEFAULT_PRESET
    try:
        import torch
    except ImportError:
        return CPU_DEFAULT_PRESET
    return CUDA_DEFAULT_PRESET if torch.cuda.is_available() else CPU_DEFAULT_PRESET


def load_model_config(spec: str) -> ModelConfig:
    """A preset name, a local Hugging Face directory holding `config.json`, or such a JSON file."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec).expanduser()
    if path.is_dir():
        return model_config_from_hf_dir(path)
    if path.is_file() and path.suffix == ".json":
        return _model_config_from_json_file(path)
    raise ConfigError("model", f"unknown preset or directory {spec!r}",
                      f"use one of {', '.join(PRESETS)} or a local Hugging Face model directory")


def model_config_from_hf_dir(path: Path) -> ModelConfig:
    """Read a Llama `config.json` in either layout transformers writes (see `hf_config`)."""
    from itlbench.engine.hf_config import read_hf_config

    return read_hf_config(path)


def _model_config_from_json_file(path: Path) -> ModelConfig:
    """A bare `config.json` (shapes only, e.g. for `itlbench roofline`)."""
    from itlbench.engine.hf_config import model_config_from_hf

    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError("model", f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError("model", f"{path} must hold a JSON object")
    return model_config_from_hf(raw, path.parent)


@dataclass
class EngineConfig:
    """Scheduler and cache knobs; the ones a sweep varies."""

    model: str = CPU_DEFAULT_PRESET
    chunk_budget: int | None = 2048  # tokens per step; None = unchunked prefill
    unchunked_prefill_cap: int = 16_384  # unchunked: more whole prompts join a step only up to this
    policy: Policy = "budget"
    mixed: bool = False  # prefill-first only: decodes ride in prefill steps
    max_num_seqs: int = 64
    block_size: int = 16
    kv_blocks: int | None = None  # None: sized from kv_memory_gib
    kv_memory_gib: float | None = None  # None: 4 GiB on CPU; on CUDA gpu_memory_fraction of free memory
    gpu_memory_fraction: float = 0.9  # CUDA, kv_memory_gib None: share of free memory after weights for KV
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
    attention: str = "auto"  # auto | sdpa | flash | triton; the engine records the one it ran
    cuda_graphs: bool = True  # CUDA: replay captured graphs for decode-only steps
    seed: int = 0
    # runner "sim": the same scheduler on a virtual clock driven by the roofline cost model (engine/sim.py)
    runner: Runner = "torch"
    gpu: str | None = None  # sim: a GPU preset or hardware profile JSON (default h100)
    sim_time_scale: float = 1.0  # sim: speed-up of wall time over simulated time (2 = twice as fast)
    sim_disaggregate: bool = False  # sim: prefill and decode on separate pools, K/V sent over a link
    sim_prefill_gpu: str | None = None  # sim, disaggregated: the prefill pool's GPU (default: gpu)
    sim_kv_link_gbps: float = 400.0  # sim, disaggregated: prefill → decode link, gigabits per second
    # Serving layout. engine_process: the engine core in its own process, talking to the HTTP front
    # end over a socket (None: yes when served from the command line, no when embedded in-process).
    # torch_threads: torch's intra-op threads while serving (None: the available cores less one).
    engine_process: bool | None = None
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.chunk_budget is not None and self.chunk_budget <= 0:
            raise ConfigError("chunk_budget", f"must be a positive token count or none, got {self.chunk_budget}",
                              "e.g. --chunk-budget 2048, or --chunk-budget none for unchunked prefill")
        if self.policy not in POLICIES:
            raise ConfigError("policy", f"unknown policy {self.policy!r}", f"use one of {', '.join(POLICIES)}")
        if self.mixed and self.policy != "prefill-first":
            raise ConfigError("mixed", "only applies to --policy prefill-first",
                              "the budget policy always mixes decodes into prefill steps")
        for name in ("max_num_seqs", "block_size", "unchunked_prefill_cap"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, f"must be > 0, got {getattr(self, name)}")
        if self.torch_threads is not None and self.torch_threads <= 0:
            raise ConfigError("torch_threads", f"must be > 0, got {self.torch_threads}",
                              "e.g. --torch-threads 1, or leave it out to use the cores available less one")
        if self.kv_blocks is not None and self.kv_blocks <= 0:
            raise ConfigError("kv_blocks", f"must be > 0, got {self.kv_blocks}")
        if self.kv_memory_gib is not None and self.kv_memory_gib <= 0:
            raise ConfigError("kv_memory_gib", f"must be > 0, got {self.kv_memory_gib}")
        if not 0 < self.gpu_memory_fraction <= 1:
            raise ConfigError("gpu_memory_fraction", f"must be in (0, 1], got {self.gpu_memory_fraction}")
        if self.attention not in ATTENTION_BACKENDS:
            raise ConfigError("attention", f"unknown backend {self.attention!r}",
                              f"use one of {', '.join(ATTENTION_BACKENDS)}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ConfigError("max_model_len", f"must be > 0, got {self.max_model_len}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError("device", f"unknown device {self.device!r}", "use auto, cpu or cuda")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError("dtype", f"unknown dtype {self.dtype!r}", "use auto, float32, bfloat16 or float16")
        self._validate_sim()

    def _validate_sim(self) -> None:
        if self.runner not in RUNNERS:
            raise ConfigError("runner", f"unknown engine {self.runner!r}", f"use one of {', '.join(RUNNERS)}")
        if self.runner != "sim" and self.gpu is not None:
            raise ConfigError("gpu", "only applies to the simulated engine", "add --engine sim")
        if not self.sim_time_scale > 0:
            raise ConfigError("sim_time_scale", f"must be > 0, got {self.sim_time_scale}",
                              "e.g. 4 runs the simulation four times faster than the simulated GPU")
        if self.sim_disaggregate and self.runner != "sim":
            raise ConfigError("sim_disaggregate", "only applies to the simulated engine", "add --engine sim")
        if self.sim_prefill_gpu is not None and not self.sim_disaggregate:
            raise ConfigError("sim_prefill_gpu", "only applies to disaggregated pools", "add --disaggregate")
        if not self.sim_kv_link_gbps > 0:
            raise ConfigError("sim_kv_link_gbps", f"must be > 0, got {self.sim_kv_link_gbps}")

    def with_(self, **changes: object) -> EngineConfig:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        """The whole configuration, so a child process runs exactly the engine the parent records."""
        return json.dumps(self.as_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> EngineConfig:
        """Inverse of `to_json`; unknown keys are an error (a silently dropped setting is a lost one)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("--engine-config", f"not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError("--engine-config", "must be a JSON object of EngineConfig fields")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError("--engine-config", f"unknown field(s) {', '.join(unknown)}",
                              f"known: {', '.join(sorted(known))}")
        return cls(**raw)


def parse_chunk_budget(text: str | int | None) -> int | None:
    """`2048`, `2k` (= 2048: k is 1024 tokens everywhere), or `none`/`off`/`unchunked` for unchunked."""
    if text is None:
        return None
    if isinstance(text, str) and text.strip().lower() in ("none", "off", "unchunked", "inf"):
        return None
    return parse_tokens(text, "--chunk-budget", "give a token count such as 2048 or 8k (k = 1024), or none")
