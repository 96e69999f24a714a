"""`ModelConfig`: the shapes of a Llama-3-architecture decoder, and its RoPE scaling.

Mistral, Qwen2 and Qwen3 are dense decoders of the same shape (RMSNorm, RoPE, grouped-query attention,
SwiGLU) and cost the same per step but for tiny extras: Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm.
The record carries their `family` so that the simulator and roofline can price them while the bundled
engine, which computes Llama only, refuses them.

Torch-free on purpose: the scheduler, block manager, simulator and CLI read these without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from itlbench.errors import ConfigError

ROPE_SCALINGS: tuple[str, ...] = ("llama3", "linear")
# config.json model_types of dense Llama-shaped decoders: the bundled engine computes the first only
FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3")


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
            raise ConfigError("model.rope_scaling.factor", f"must be > 0, got {self.factor}",
                              "set the RoPE factor > 0 in the model's config.json")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a Llama-3-architecture decoder; all the engine needs to build it (a `family` other than
    llama: all the simulator needs to price it)."""

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
    family: str = "llama"  # config.json model_type, one of FAMILIES
    sliding_window: int | None = None  # tokens a layer attends over when some layers slide; None: full context
    # (config.json key, problem, fix) of what the bundled engine would compute wrong (a YaRN RoPE, a bias, a
    # quantized checkpoint): none changes a step's shapes, so the simulator and roofline price the model anyway
    engine_refusal: tuple[str, str, str] | None = None

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_heads, 1))
        _validate_model(self)

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 adds a bias to the q, k and v projections (not o, not the MLP)."""
        return self.family == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Qwen3 RMS-normalises each head's q and k (one head_dim weight each, shared by the heads)."""
        return self.family == "qwen3"

    @property
    def vector_params(self) -> int:
        """The one-dimensional parameters: the norms' weights, and Qwen2's q/k/v biases or Qwen3's q/k norms."""
        d, hd = self.hidden_size, self.head_dim
        per_layer = 2 * d
        if self.qkv_bias:
            per_layer += (self.num_heads + 2 * self.num_kv_heads) * hd
        if self.qk_norm:
            per_layer += 2 * hd
        return self.num_layers * per_layer + d

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings included once when tied), transformers' count of the same model."""
        d, h, kv, hd, f = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, self.intermediate_size
        attn = d * (h * hd) + 2 * d * (kv * hd) + (h * hd) * d
        mlp = 3 * d * f
        embed = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.num_layers * (attn + mlp) + self.vector_params + embed + head

    def check_window(self, context: int, fix: str) -> None:
        """Refuse a context longer than a sliding window: every cost here attends over the whole context."""
        if self.sliding_window is not None and self.sliding_window < context:
            raise ConfigError("config.json sliding_window", f"{self.sliding_window} is shorter than the "
                              f"{context}-token context asked for, and the cost model prices attention over the "
                              "whole context, not a window", fix)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends generation (unless a request ignores EOS)."""
        return frozenset((self.eos_token_id, *self.extra_eos_token_ids))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V for one token across all layers: 2 · L · h_kv · d_h · b."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


# config.json's names (transformers' LlamaConfig) where a ModelConfig field's differs
_HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads"}


def _validate_model(cfg: ModelConfig) -> None:
    positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "max_position_embeddings", "head_dim")
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"model.{name}", f"must be > 0, got {getattr(cfg, name)}",
                              f"set {_HF_KEYS.get(name, name)} > 0 in the model's config.json")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError("model.num_kv_heads",
                          f"{cfg.num_kv_heads} does not divide num_heads={cfg.num_heads}",
                          "grouped-query attention needs num_heads % num_kv_heads == 0")
    if cfg.family not in FAMILIES:
        raise ConfigError("model.family", f"unknown {cfg.family!r}", f"use one of {', '.join(FAMILIES)}")
    if cfg.sliding_window is not None and cfg.sliding_window <= 0:
        raise ConfigError("model.sliding_window", f"must be > 0 or null, got {cfg.sliding_window}",
                          "set sliding_window > 0, or null for full attention, in the model's config.json")
    if cfg.head_dim % 2:
        raise ConfigError("model.head_dim", f"must be even for RoPE, got {cfg.head_dim}",
                          "set an even head_dim in the model's config.json")
