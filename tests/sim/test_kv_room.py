"""The simulated engine's K/V room against one full-length request: a refusal names the flag that set the room."""

from __future__ import annotations

import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError
from itlbench.sim.runner import offline_engine


@pytest.mark.parametrize(("gib", "holds", "fixes"), [
    (1e-9, "holds 0 tokens", ("--kv-memory-gib 16 or more",)),
    (1.0, "holds 8,192 tokens", ("--kv-memory-gib 16 or more", "--max-model-len 8192 or less")),
])
def test_a_kv_memory_gib_too_small_for_one_request_is_refused_naming_it(gib: float, holds: str,
                                                                        fixes: tuple[str, ...]) -> None:
    # was: "--max-model-len: 131072 tokens of KV cache do not fit ... (use --max-model-len 0 or less)", blaming the
    # flag not given and proposing a context of no tokens
    with pytest.raises(ConfigError) as err:
        offline_engine(EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", kv_memory_gib=gib))
    assert err.value.field == "kv_memory_gib" and holds in err.value.problem and "131,072" in err.value.problem
    for fix in fixes:
        assert fix in (err.value.fix or ""), err.value.fix
    if len(fixes) == 1:
        assert "--max-model-len" not in (err.value.fix or "")
