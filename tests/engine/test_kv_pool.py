"""The torch engine's K/V pool is refused before any of it is allocated where it cannot fit, naming the flag that
sized it; the default's own size never is (a lazily mapped 4 GiB on CPU, a share of free memory on CUDA)."""

from __future__ import annotations

import psutil
import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS
from itlbench.engine.kv_pool import GIB, check_kv_pool, kv_room, pool_failed
from itlbench.engine.runner import ModelRunner
from itlbench.errors import ConfigError
from itlbench.serving.build import create_engine

TINY = PRESETS["tiny"]
PER_TOKEN = TINY.kv_bytes_per_token(4)  # fp32 on CPU


def _refusal(config: EngineConfig, max_len: int, pool_tokens: int, room_bytes: int) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_kv_pool(config, max_len, pool_tokens, PER_TOKEN, room_bytes, "the 1.0 GiB of memory available")
    return info.value


def test_a_pool_that_fits_its_room_passes() -> None:
    check_kv_pool(EngineConfig(model="tiny", kv_blocks=100), 1024, 101 * 16, PER_TOKEN, 101 * 16 * PER_TOKEN, "")


@pytest.mark.parametrize(("knobs", "max_len", "field", "fix"), [
    ({"kv_blocks": 10**12}, 1024, "kv_blocks", f"use --kv-blocks {GIB // PER_TOKEN // 16 - 1} or less, or leave it "
                                               "out to size it from memory"),
    ({"kv_memory_gib": 3.0}, 1024, "kv_memory_gib", "use --kv-memory-gib 0.9 or less, or leave it out"),
    ({"block_size": 10**8}, 1024, "block_size", "e.g. --block-size 16, the default"),
    ({}, 10**8, "max_model_len", f"use --max-model-len {GIB // PER_TOKEN - 16} or less, or give --kv-memory-gib to "
                                 "size the pool"),
])
def test_a_pool_past_its_room_names_the_flag_that_sized_it_and_what_fits(knobs: dict, max_len: int, field: str,
                                                                          fix: str) -> None:
    """--kv-blocks 1e12 or a huge --block-size ended in mmap's "Cannot allocate memory" traceback."""
    config = EngineConfig(model="tiny", **knobs)
    exc = _refusal(config, max_len, 2 * 10**9, GIB)
    assert exc.field == field and exc.fix == fix
    assert exc.problem.endswith("is more than the 1.0 GiB of memory available"), exc.problem


def test_an_allocation_that_fails_all_the_same_is_one_line_naming_the_flag() -> None:
    exc = pool_failed(EngineConfig(model="tiny", kv_blocks=5000), 1024, 3 * GIB, "cpu",
                      OSError(12, "Cannot allocate memory"))
    assert str(exc) == ("kv_blocks: a K/V pool of 3.0 GiB (5,000 blocks of 16 tokens) could not be allocated on cpu "
                        "([Errno 12] Cannot allocate memory) (use fewer, or leave it out to size it from memory)")


def test_the_room_on_cpu_is_what_is_available_for_a_size_by_hand_and_the_machine_for_the_default_floor() -> None:
    """The default's floor (one full-length request) is mapped lazily: it need not fit what is free right now."""
    by_hand, said = kv_room(EngineConfig(model="tiny", kv_blocks=8), "cpu", None, 0)
    machine = psutil.virtual_memory().total + psutil.swap_memory().total
    assert 0 < by_hand <= machine and said.endswith("GiB of memory available")
    floor, said = kv_room(EngineConfig(model="tiny"), "cpu", None, GIB)
    assert floor == machine - GIB and said.endswith("GiB of memory beside the weights")
    assert kv_room(EngineConfig(model="tiny", kv_blocks=8), "cuda:0", 5 * GIB, GIB) == (
        5 * GIB, "the 5.0 GiB free on cuda:0 after the weights")


def test_the_runner_refuses_before_allocating_and_sizes_the_default_as_before() -> None:
    """A pool of 10^12 blocks of tiny (8 TB) is refused in microseconds; the default engine is built unchanged."""
    with pytest.raises(ConfigError) as info:
        ModelRunner(EngineConfig(model="tiny", device="cpu", kv_blocks=10**12), TINY, 1024)
    assert info.value.field == "kv_blocks" and "is more than the" in info.value.problem
    engine = create_engine(EngineConfig(model="tiny", device="cpu", max_model_len=1024))
    assert engine.block_manager.num_blocks == 64 * 1024 // 16  # capped at max_num_seqs full-length requests


def test_on_cpu_the_models_own_context_is_not_checked_only_one_given_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """A laptop with less memory than llama-3.2-1b's 8 GiB floor still runs its short requests (the pool is mapped
    lazily); a --max-model-len given by hand that the machine cannot hold is refused."""
    import itlbench.engine.runner as runner_module

    monkeypatch.setattr(runner_module, "kv_room", lambda *a: (1, "a 1-byte machine"))
    engine = create_engine(EngineConfig(model="tiny", device="cpu", max_num_seqs=1))
    assert engine.block_manager.num_blocks > 0
    with pytest.raises(ConfigError) as info:
        ModelRunner(EngineConfig(model="tiny", device="cpu", max_num_seqs=1, max_model_len=1024), TINY, 1024)
    assert info.value.field == "max_model_len" and "a 1-byte machine" in info.value.problem
