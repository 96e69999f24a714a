"""What disturbed a run between the client and the engine, as far as the client can see it.

The rest of the validity check asks whether the client bent the figures; this asks whether the path
to the server did (a broken network, a middlebox, a proxy), from two things the client observes:

  transport failures: requests whose connection was cut (`closed`, `truncated`), that timed out
      (`timeout`, `no_headers`) or never connected (`connection`). An HTTP error or a malformed
      stream is the server's own answer and is measured as such (`failures`, goodput); a cut or a
      silence cannot be placed, and the figures cover only what got through: TTFT loses the requests
      cut before their first token, ITL the gaps after a cut, goodput and throughput the requests.
      Judged like late sends: more than `late_fraction` of the requests live in the window (any, under
      100) — live, not only scheduled there: a stream whose request went silent in the warmup and timed
      out after the window is silent through it. Requests the run itself cancelled (the drain, a stop)
      are not disturbances.
  delivery lag of first tokens: with the engine's step log on the client's clock (the bundled engine,
      or an itlbench server on this host), a request's first token is made at the end of the last step
      that prefilled it; the client's stamp of it minus that end is time spent outside the engine: the
      server's send path (about 1-3 ms on loopback) plus the network. It shifts every TTFT, so its
      median is judged against the TTFT median: named when at least `max_distortion` of it and at least
      MIN_DELIVERY_LAG_S.
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis.stats import json_safe, ns_to_s, supported_quantile

TRANSPORT_KINDS: tuple[str, ...] = ("closed", "truncated", "timeout", "no_headers", "connection")
# The bundled engine's own send path on loopback measured 2.7 ms median (3 streams, a loaded 2-core box):
# below this a first token's delivery lag is the server's hand-off, not a disturbance worth naming.
MIN_DELIVERY_LAG_S = 0.010


def live_in(requests: pl.DataFrame, lo_ns: int, hi_ns: int) -> pl.DataFrame:
    """The requests in flight at some time in [lo_ns, hi_ns): scheduled before its end, not done before it."""
    if requests.is_empty():
        return requests
    return requests.filter((pl.col("scheduled_ns") < hi_ns)
                           & (pl.col("done_ns").is_null() | (pl.col("done_ns") >= lo_ns)))


def transport_failures(requests: pl.DataFrame) -> pl.DataFrame:
    """The requests whose connection failed (see the module docstring), with `had_token`."""
    if requests.is_empty() or "error_kind" not in requests.columns:
        return pl.DataFrame({"error_kind": [], "had_token": []}, schema={"error_kind": pl.String,
                                                                         "had_token": pl.Boolean})
    return requests.filter(pl.col("status").is_in(["error", "timeout"])
                           & pl.col("error_kind").is_in(list(TRANSPORT_KINDS))).select(
        "error_kind", pl.col("first_token_ns").is_not_null().alias("had_token"))


def first_token_delivery_lag(requests: pl.DataFrame, steps: pl.DataFrame) -> pl.Series:
    """Seconds from the end of the step that made each request's first token to the client's stamp."""
    if requests.is_empty() or steps.is_empty() or "prefill_request_ids" not in steps.columns:
        return pl.Series("lag_s", [], dtype=pl.Float64)
    made = (steps.select("end_ns", pl.col("prefill_request_ids").alias("server_request_id"))
            .explode("server_request_id").drop_nulls("server_request_id")
            .group_by("server_request_id").agg(pl.col("end_ns").max().alias("made_ns")))
    joined = requests.filter(pl.col("first_token_ns").is_not_null()).join(made, on="server_request_id")
    return ns_to_s(joined["first_token_ns"] - joined["made_ns"]).alias("lag_s")


def disturbance_figures(requests: pl.DataFrame | None, steps: pl.DataFrame | None) -> dict[str, object]:
    """validity.figures' part from this module: failed connections by kind, first-token delivery lag."""
    req = requests if requests is not None else pl.DataFrame()
    cut = transport_failures(req)
    lag = first_token_delivery_lag(req, steps if steps is not None else pl.DataFrame())
    by_kind = dict(sorted(cut.group_by("error_kind").len().iter_rows())) if cut.height else {}
    return json_safe({  # type: ignore[return-value]
        "transport_failures": cut.height,
        "transport_failures_by_kind": by_kind,
        "transport_failures_before_first_token": int((~cut["had_token"]).sum()) if cut.height else 0,
        "requests_judged": req.height,
        "delivery_lag_p50_s": supported_quantile(lag, 0.5),
        "delivery_lag_p90_s": supported_quantile(lag, 0.9),
        "delivery_lag_count": lag.len(),
    })


def disturbance_checks(f: dict[str, object], ttft_p50_s: float | None, max_distortion: float,
                       late_fraction: float) -> tuple[list[str], list[str]]:
    """(affected figure keys, reasons) for what `disturbance_figures` found."""
    affected: list[str] = []
    reasons: list[str] = []
    n, total = int(f["transport_failures"] or 0), int(f["requests_judged"] or 0)  # type: ignore[call-overload]
    if n and total and n / total > (late_fraction if total >= 100 else 0.0):
        kinds = ", ".join(f"{k} {v}" for k, v in (f["transport_failures_by_kind"] or {}).items())  # type: ignore[union-attr]
        before = int(f["transport_failures_before_first_token"] or 0)  # type: ignore[call-overload]
        affected += (["ttft_s"] if before else []) + (["itl_s", "stalls"] if n > before else [])
        affected += ["goodput", "throughput"]
        reasons.append(f"{n} of {total} requests lost their connection ({kinds}): the network or the server "
                       f"cut them or went silent ({before} before a first token); the figures cover only "
                       "what got through")
    lag, p90 = f["delivery_lag_p50_s"], f["delivery_lag_p90_s"]
    if (isinstance(lag, float) and isinstance(ttft_p50_s, float | int)
            and lag >= max(MIN_DELIVERY_LAG_S, max_distortion * ttft_p50_s)):
        affected += ["ttft_s", "goodput"]
        spread = f", p90 {p90 * 1e3:.1f} ms" if isinstance(p90, float) else ""
        reasons.append(f"first tokens reached the client a median {lag * 1e3:.1f} ms{spread} after the engine "
                       f"step that made them, ≥ {max_distortion:.0%} of the TTFT median ({ttft_p50_s * 1e3:.1f} ms): "
                       "that much of every TTFT was spent outside the engine (the network or the server's "
                       "send path)")
    return affected, reasons
