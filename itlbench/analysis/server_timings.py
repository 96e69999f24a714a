"""The client's TTFT and decode time against a server's own per-request timings (llama.cpp's
`timings` on the final chunk: `prompt_ms`, `predicted_ms`, `predicted_n`) — a clock nobody here wrote.

Both are differences, client minus server, per request:
- `ttft_minus_prompt_ms`: the client's TTFT (send → first chunk) less the server's prompt evaluation.
  Never below zero on an honest path; what remains is queueing for a slot, tokenisation and the
  network. A negative value means one of the two clocks is wrong.
- `decode_minus_server_ms`: the client's first → last chunk less the server's generation time. The
  server's span starts when prompt evaluation ends and the client's when the first chunk lands, so
  near zero (± the network's jitter) when the stream is delivered as generated; far negative when the
  server held chunks back and sent them together.
`tokens_agree`: the share of requests whose counted output tokens equal the server's `predicted_n`.
"""

from __future__ import annotations

from typing import Any

import polars as pl

SOURCE = "server_timings (llama.cpp timings)"
COLUMNS = ("server_prompt_ms", "server_decode_ms", "server_decode_tokens")


def _spread(values: pl.Series) -> dict[str, float | None]:
    if values.len() == 0:
        return {"p50": None, "p99": None, "min": None, "max": None}
    return {"p50": float(values.quantile(0.5, "linear")), "p99": float(values.quantile(0.99, "linear")),
            "min": float(values.min()), "max": float(values.max())}


def server_timings_check(requests: pl.DataFrame) -> dict[str, Any] | None:
    """None where no request carried server timings (every engine but llama.cpp today)."""
    if not set(COLUMNS) <= set(requests.columns):
        return None
    rows = requests.filter((pl.col("status") == "ok") & pl.col("server_prompt_ms").is_not_null()
                           & pl.col("server_decode_ms").is_not_null() & pl.col("first_token_ns").is_not_null())
    if rows.is_empty():
        return None
    d = rows.select(
        ((pl.col("first_token_ns") - pl.col("sent_ns")) / 1e6 - pl.col("server_prompt_ms")).alias("ttft"),
        ((pl.col("last_token_ns") - pl.col("first_token_ns")) / 1e6 - pl.col("server_decode_ms")).alias("decode"),
        (pl.col("server_decode_tokens") == pl.col("output_tokens")).alias("agree"),
    )
    return {
        "source": SOURCE,
        "requests": rows.height,
        "ttft_minus_prompt_ms": _spread(d["ttft"]),
        "ttft_below_server_prompt": int((d["ttft"] < 0).sum()),
        "decode_minus_server_ms": _spread(d["decode"]),
        "tokens_agree": float(d["agree"].fill_null(False).mean()),
    }
