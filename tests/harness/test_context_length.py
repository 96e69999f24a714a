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


def test_engines_are_named_by_their_metric_prefix_or_owned_by() -> None:
    import polars as pl

    from itlbench.report.engines import detect_engine

    doc = {"engine": {"external": True, "models": ["m"]}, "target": {"kind": "external"}}
    none = pl.DataFrame(schema={"name": pl.Utf8})
    metrics = pl.DataFrame({"name": ["llamacpp:prompt_tokens_total", "llamacpp:n_decode_total"]})
    by_metrics = detect_engine(doc, metrics, pl.DataFrame())
    assert by_metrics.name == "llama.cpp server" and "llamacpp:" in by_metrics.source
    by_owner = detect_engine({**doc, "engine": {**doc["engine"], "owned_by": "llamacpp"}}, none, pl.DataFrame())
    assert by_owner.name == "llama.cpp server" and by_owner.detected_from == "/v1/models owned_by"
    assert detect_engine(doc, none, pl.DataFrame()).name == "unknown OpenAI-compatible server"
