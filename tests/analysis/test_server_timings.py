"""The client's TTFT and decode time against a server's own timings (llama.cpp's `timings`)."""

from __future__ import annotations

import polars as pl
import pytest

from itlbench.analysis.server_timings import server_timings_check

MS = 1_000_000


def _requests(**over: list) -> pl.DataFrame:
    base = {"status": ["ok", "ok", "error"], "sent_ns": [0, 0, 0], "first_token_ns": [40 * MS, 30 * MS, None],
            "last_token_ns": [540 * MS, 330 * MS, None], "output_tokens": [100, 60, 0],
            "server_prompt_ms": [35.0, 31.0, 1.0], "server_decode_ms": [499.5, 300.0, 1.0],
            "server_decode_tokens": [100, 59, 0]}
    return pl.DataFrame({**base, **over})


def test_differences_are_client_minus_server_per_request() -> None:
    doc = server_timings_check(_requests())
    assert doc is not None and doc["requests"] == 2  # the failed request is left out
    assert doc["ttft_minus_prompt_ms"]["max"] == pytest.approx(5.0)
    assert doc["ttft_minus_prompt_ms"]["min"] == pytest.approx(-1.0)
    assert doc["ttft_below_server_prompt"] == 1  # 30 ms seen, 31 ms claimed: a clock is wrong
    assert (doc["decode_minus_server_ms"]["min"], doc["decode_minus_server_ms"]["max"]) == pytest.approx((0.0, 0.5))
    assert doc["tokens_agree"] == 0.5


def test_absent_without_server_timings() -> None:
    assert server_timings_check(_requests().drop("server_prompt_ms")) is None
    nulls = [None, None, None]
    assert server_timings_check(_requests(server_prompt_ms=nulls, server_decode_ms=nulls)) is None
