"""Whether the torch engine's K/V pool fits where it is allocated, asked before any of it is.

--kv-blocks 1e12, or a --block-size so large that the pool's floor of one full-length request is terabytes, ended
in mmap's "Cannot allocate memory" (or CUDA's out-of-memory) traceback in the server's log. Refused here in one line
naming the flag that sized the pool and the most that fits. The default's own size is never refused: on CUDA it is a
share of the memory free after the weights, on CPU 4 GiB mapped lazily (pages cost only what requests fill).
Torch-free.
"""

from __future__ import annotations

import math

from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError

GIB = 1 << 30


def kv_room(config: EngineConfig, device: str, free_bytes: int | None, weight_bytes: int) -> tuple[int, str]:
    """The bytes the pool may take and how to say so. On CUDA (`free_bytes`) the device memory free after the
    weights, the pool being allocated whole. On CPU a size given by hand gets the memory available now (swap
    included); the default's floor of one full-length request, mapped lazily, need only fit the machine beside
    the weights (a 128k-context model's 8 GiB floor must not be refused on a box with 6 GiB free)."""
    if free_bytes is not None:
        return free_bytes, f"the {free_bytes / GIB:.1f} GiB free on {device} after the weights"
    import psutil

    swap = psutil.swap_memory()
    if config.kv_blocks is not None or config.kv_memory_gib is not None:
        room = psutil.virtual_memory().available + swap.free
        return room, f"the {room / GIB:.1f} GiB of memory available"
    room = max(psutil.virtual_memory().total + swap.total - weight_bytes, 0)
    return room, f"this machine's {room / GIB:.1f} GiB of memory beside the weights"


def check_kv_pool(config: EngineConfig, max_model_len: int, pool_tokens: int, bytes_per_token: int, room_bytes: int,
                  room: str) -> None:
    """Refuse a pool of `pool_tokens` (its scratch block included) that `room_bytes` cannot hold."""
    need = pool_tokens * bytes_per_token
    if need <= room_bytes:
        return
    most_tokens = max(room_bytes // bytes_per_token - config.block_size, 0)  # less the scratch block
    raise _refusal(config, max_model_len, need, f"is more than {room}", most_tokens, bytes_per_token)


def pool_failed(config: EngineConfig, max_model_len: int, need: int, device: str, exc: BaseException) -> ConfigError:
    """The one-line error for a pool the check let through whose allocation failed all the same (strict overcommit,
    a fragmented device)."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return _refusal(config, max_model_len, need, f"could not be allocated on {device} ({reason})", None, 0)


def _refusal(config: EngineConfig, max_model_len: int, need: int, verdict: str, most_tokens: int | None,
             bytes_per_token: int) -> ConfigError:
    """The error naming the flag that sized the pool: --kv-blocks or --kv-memory-gib where given, else the
    --block-size or --max-model-len that set its floor of one full-length request."""
    pool = f"a K/V pool of {need / GIB:,.1f} GiB"
    if config.kv_blocks is not None:
        most = "use fewer" if most_tokens is None else f"use --kv-blocks {most_tokens // config.block_size} or less"
        return ConfigError("kv_blocks", f"{pool} ({config.kv_blocks:,} blocks of {config.block_size} tokens) "
                           f"{verdict}", f"{most}, or leave it out to size it from memory")
    if config.kv_memory_gib is not None:
        most = "use less" if most_tokens is None else \
            f"use --kv-memory-gib {math.floor(most_tokens * bytes_per_token / GIB * 10) / 10:g} or less"
        return ConfigError("kv_memory_gib", f"{pool} {verdict}", f"{most}, or leave it out")
    if config.block_size > max_model_len:
        return ConfigError("block_size", f"{pool} (blocks of {config.block_size:,} tokens, more than the "
                           f"{max_model_len:,}-token context) {verdict}", "e.g. --block-size 16, the default")
    most = "use a smaller --max-model-len" if most_tokens is None else f"use --max-model-len {most_tokens} or less"
    return ConfigError("max_model_len", f"{pool} (one {max_model_len:,}-token request) {verdict}",
                       f"{most}, or give --kv-memory-gib to size the pool")
