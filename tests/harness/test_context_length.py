"""The context length an external server reports in /v1/models: vLLM's `max_model_len`, llama.cpp's
`meta.n_ctx` (one slot's context), never llama.cpp's `meta.n_ctx_train` (the model's own)."""

from __future__ import annotations

from itlbench.harness.connect import entry_max_len


def test_vllm_reports_max_model_len() -> None:
    assert entry_max_len({"id": "m", "owned_by": "vllm", "max_model_len": 16384}) == 16384


def test_llamacpp_reports_the_slot_context_in_meta() -> None:
    entry = {"id": "m", "owned_by": "llamacpp", "meta": {"n_ctx": 8192, "n_ctx_train": 65536, "n_vocab": 8192}}
    assert entry_max_len(entry) == 8192


def test_no_or_bad_context_gives_none() -> None:
    assert entry_max_len({"id": "m"}) is None
    assert entry_max_len({"id": "m", "meta": "n_ctx"}) is None
    assert entry_max_len({"id": "m", "meta": {"n_ctx": -1}}) is None
    assert entry_max_len({"id": "m", "max_model_len": True, "meta": {"n_ctx": 4096}}) == 4096
