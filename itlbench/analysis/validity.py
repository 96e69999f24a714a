"""Was the client the bottleneck? A run flags itself invalid when the load generator itself lagged:
  send lag p99 (sent − scheduled, open-loop requests only: stream is null) > send_lag_p99_s
  event-loop lag p99 (client_samples.loop_lag_s)                          > loop_lag_p99_s
  mean client CPU (client_samples.cpu_percent, 100 = one core)           > cpu_mean_percent
  longest client pause (client_pauses: garbage collection, blocked loop)  > client_pause_max_s
  any stall whose cause is the client's own pause (stalls.by_cause.client)
A figure with no data is reported as null and cannot invalidate the run.
The CPU bound sits well below a full core: benchmarks/client_fidelity.py measured a single-process
client at 72 % of a core (1,000 streams, 45k chunks/s) with ITL errors of 28 ms at p99 while its
sampled loop lag stayed under 5 ms (at 100 streams: 9 %, 2.5 ms), so a busy client distorts
timestamps before its loop lag shows it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import polars as pl

from itlbench.analysis.stats import json_safe, ns_to_s


@dataclass(frozen=True)
class ValidityThresholds:
    send_lag_p99_s: float = 0.010
    loop_lag_p99_s: float = 0.020
    cpu_mean_percent: float = 50.0
    client_pause_max_s: float = 0.250


def _p99(s: pl.Series) -> float | None:
    s = s.drop_nulls()
    return None if s.is_empty() else s.quantile(0.99, interpolation="linear")


def pause_figures(pauses: pl.DataFrame | None) -> dict[str, float | int | None]:
    if pauses is None or pauses.is_empty():
        return {"client_pauses": 0, "client_pause_max_s": None, "client_pause_total_s": 0.0}
    d = ns_to_s(pauses["end_ns"] - pauses["start_ns"])
    return {"client_pauses": pauses.height, "client_pause_max_s": float(d.max()),  # type: ignore[arg-type]
            "client_pause_total_s": float(d.sum())}


def figures(requests: pl.DataFrame, samples: pl.DataFrame) -> dict[str, float | int | None]:
    lag = (
        requests.filter(pl.col("stream").is_null())
        .select(ns_to_s(pl.col("sent_ns") - pl.col("scheduled_ns")).alias("lag"))["lag"]
        .drop_nulls()
    )
    cpu = samples["cpu_percent"].drop_nulls()
    return json_safe(
        {
            "send_lag_p99_s": _p99(lag),
            "send_lag_max_s": lag.max() if lag.len() else None,
            "open_loop_requests": lag.len(),
            "loop_lag_p99_s": _p99(samples["loop_lag_s"]),
            "cpu_mean_percent": cpu.mean() if cpu.len() else None,
            "cpu_max_percent": cpu.max() if cpu.len() else None,
            "client_samples": samples.height,
        }
    )  # type: ignore[return-value]


def _reasons(f: dict[str, float | int | None], th: ValidityThresholds) -> list[str]:
    checks = [
        (
            "send_lag_p99_s",
            th.send_lag_p99_s,
            "open-loop send lag p99 {v:.4f} s > {t:.4f} s: the client sent late",
        ),
        (
            "loop_lag_p99_s",
            th.loop_lag_p99_s,
            "client event-loop lag p99 {v:.4f} s > {t:.4f} s: chunk timestamps are late",
        ),
        (
            "cpu_mean_percent",
            th.cpu_mean_percent,
            "client CPU mean {v:.1f} % > {t:.1f} % of one core: the client saturated",
        ),
        (
            "client_pause_max_s",
            th.client_pause_max_s,
            "the client paused {v:.3f} s > {t:.3f} s (garbage collection or a blocked loop): "
            "gaps overlapping it are the client's, see stalls.by_cause.client",
        ),
    ]
    out = []
    for key, limit, text in checks:
        v = f.get(key)
        if v is not None and v > limit:
            out.append(text.format(v=v, t=limit))
    return out


def check_validity(
    requests: pl.DataFrame, samples: pl.DataFrame, thresholds: ValidityThresholds | None = None,
    pauses: pl.DataFrame | None = None, client_stalls: int = 0,
) -> dict[str, object]:
    """{valid, reasons, figures, thresholds}."""
    th = thresholds or ValidityThresholds()
    f = {**figures(requests, samples), **pause_figures(pauses), "client_caused_stalls": client_stalls}
    reasons = _reasons(f, th)
    if client_stalls:
        reasons.append(f"{client_stalls} stall gaps are the client's own pauses (stalls.by_cause.client): "
                       "the ITL tail overstates the server's")
    return {"valid": not reasons, "reasons": reasons, "figures": f, "thresholds": asdict(th)}
