"""`ModelRunner`: owns the model, the paged KV cache and the RoPE tables; runs one flat batch."""

from __future__ import annotations

import numpy as np
import torch

from itlbench.engine.attention import select_backend
from itlbench.engine.batch import FlatBatch
from itlbench.engine.config import EngineConfig, ModelConfig
from itlbench.engine.cpu_weights import column_major_projections
from itlbench.engine.instrument import nvtx_range
from itlbench.engine.model.llama import ForwardContext, LlamaForCausalLM
from itlbench.engine.model.loader import load_weights
from itlbench.engine.model.rope import rope_tables
from itlbench.errors import ConfigError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GIB = 1 << 30


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", f"{requested} requested but CUDA is not available", "use --device cpu or auto")
    return torch.device(requested)


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA, fp32 on CPU (CPU bf16 has no native path and runs 5-6x slower)."""
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[requested]


def num_kv_blocks(config: EngineConfig, model: ModelConfig, max_model_len: int, dtype_bytes: int) -> int:
    """Explicit kv_blocks, else what kv_memory_gib holds, capped at what max_num_seqs full-length
    requests could use and never below one full-length request."""
    if config.kv_blocks is not None:
        return config.kv_blocks
    per_request = -(-max_model_len // config.block_size)
    block_bytes = model.kv_bytes_per_token(dtype_bytes) * config.block_size
    fits = int(config.kv_memory_gib * GIB // block_bytes)
    return max(per_request, min(fits, config.max_num_seqs * per_request))


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeroed KV storage. On CPU numpy's calloc maps pages lazily, so a large cache only costs
    the memory that requests actually fill."""
    if device.type == "cpu" and dtype == torch.float32:
        return torch.from_numpy(np.zeros(shape, np.float32))
    return torch.zeros(shape, dtype=dtype, device=device)


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int,
                 attention_backend: str = "auto") -> None:
        self.config, self.model_config, self.max_model_len = config, model_config, max_model_len
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model = LlamaForCausalLM(model_config, self.dtype, self.device).eval()
        load_weights(self.model, model_config, config.seed)
        if self.device.type == "cpu":
            column_major_projections(self.model)
        self.cos, self.sin = rope_tables(model_config, max_model_len, self.dtype, self.device)
        self.backend = select_backend(self.device, attention_backend, config.block_size)
        dtype_bytes = torch.finfo(self.dtype).bits // 8
        self.num_blocks = num_kv_blocks(config, model_config, max_model_len, dtype_bytes)
        shape = (self.num_blocks, config.block_size, model_config.num_kv_heads, model_config.head_dim)
        self.kv_caches = [(_zeros(shape, self.dtype, self.device), _zeros(shape, self.dtype, self.device))
                          for _ in range(model_config.num_layers)]

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @torch.inference_mode()
    def execute(self, batch: FlatBatch, label: str = "step") -> torch.Tensor:
        """Run the batch; logits [len(logits_indices), vocab] for the rows that sample."""
        with nvtx_range(label):
            cos = self.cos[batch.positions].unsqueeze(1)
            sin = self.sin[batch.positions].unsqueeze(1)
            meta = self.backend.prepare(batch)
            ctx = ForwardContext(cos, sin, self.kv_caches, self.backend, meta)
            hidden = self.model(batch.input_ids, ctx)
            return self.model.compute_logits(hidden[batch.logits_indices]).float()
