"""Which torch device and dtype an engine config resolves to (`auto` settings made concrete)."""

from __future__ import annotations

import torch

from itlbench.errors import ConfigError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
