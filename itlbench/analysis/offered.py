"""The load an open-loop run offered: the arrivals its schedule put in the measured window, against the nominal rate.

An open-loop run (`--rate`, or a trace replay) sends each request at its scheduled time whatever the server does,
so the load on the server in the window is the arrivals scheduled inside it over the window's length, not the
nominal `--rate`. The two differ by the arrival process's own noise: a Poisson count expecting n arrivals varies
by ±√n (±16 % for 40, ±5 % for 400), and a gamma process of shape b by about ±√(n/b). In a short window the
offered rate can sit well below the nominal (26 arrivals where 4 req/s over 10 s implies 40): a figure measured
there is a figure at the offered rate.

offered (null for a closed-loop run, which has no schedule):
  {nominal_rps (null for a trace replay), arrivals, window_s, offered_rps, expected_arrivals, shortfall
  (1 − offered / nominal; negative when more arrived), count_noise (the count's relative standard deviation
  for that many arrivals expected), completed (arrivals that finished ok), achieved_rps, unit (req/s, or
  sessions/s), line, note (when the offered rate is more than SHORTFALL_NOTE below the nominal: why, and the
  --duration that offers nearer it)}
Arrivals are the request records of the open-loop feed (no stream, not injected) whose `scheduled_ns` (the
schedule's time, not the send's: a client that sent late still counts the arrival where it was due) falls in
[measure start, end). Where sessions arrive at --rate (agent; run.json's plan.sessions), an arrival is a session:
the first turn of each session stream, and the rates are in sessions/s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import polars as pl

from itlbench.analysis.window import RunWindow

SHORTFALL_NOTE = 0.10  # offered more than this far below the nominal rate: the summary and capacity say so
TARGET_NOISE = 0.05  # the count's relative noise the suggested --duration aims at (±5 %: 400 Poisson arrivals)


def open_loop_arrivals(requests: pl.DataFrame, window: RunWindow,
                       first_session_stream: int | None = None) -> pl.DataFrame:
    """The open-loop feed's requests scheduled inside the window (closed-loop streams and injections left out);
    with `first_session_stream`, the first turns of the sessions that arrived at --rate instead."""
    fed = (pl.col("stream").is_null() if first_session_stream is None
           else (pl.col("stream") >= first_session_stream) & (pl.col("turn") == 0))
    return requests.filter(fed & ~pl.col("injected").fill_null(False)
                           & (pl.col("scheduled_ns") >= window.measure_start_ns)
                           & (pl.col("scheduled_ns") < window.end_ns))


def count_noise(expected: float, burstiness: float = 1.0) -> float | None:
    """The relative standard deviation of an arrival count expecting `expected` (Poisson at burstiness 1)."""
    return 1 / math.sqrt(expected * burstiness) if expected > 0 and burstiness > 0 else None


def steady_duration_s(rate: float, burstiness: float = 1.0) -> int:
    """A window long enough for the arrival count to vary by about TARGET_NOISE (400 arrivals, Poisson)."""
    return round_up_s(1 / (TARGET_NOISE ** 2 * rate * burstiness))


def round_up_s(seconds: float) -> int:
    """A --duration to suggest: whole seconds, whole tens above ten."""
    seconds = round(seconds, 6)  # 399.99999… arrivals' worth is 400
    return math.ceil(seconds) if seconds <= 10 else 10 * math.ceil(seconds / 10)


def fmt_rate(v: float) -> str:
    return f"{v:.1f}" if v >= 1 else f"{v:.2g}"


def offered_load(requests: pl.DataFrame, window: RunWindow,
                 plan: Mapping[str, Any] | None) -> dict[str, object] | None:
    """The `offered` section from every request record of the run and run.json's `plan` (None: closed loop)."""
    plan = plan or {}
    rate = plan.get("rate")
    nominal = float(rate) if isinstance(rate, int | float) and rate > 0 else None
    if nominal is None and not plan.get("trace"):
        return None
    sessions = plan.get("sessions")
    first = sessions.get("first_stream") if isinstance(sessions, Mapping) else None
    arrived = open_loop_arrivals(requests, window, first if isinstance(first, int) else None)
    unit = "sessions/s" if isinstance(first, int) else "req/s"
    seconds = window.seconds
    n, ok = arrived.height, arrived.filter(pl.col("status") == "ok").height
    offered = n / seconds if seconds > 0 else None
    out: dict[str, object] = {
        "nominal_rps": nominal, "arrivals": n, "window_s": seconds, "offered_rps": offered,
        "expected_arrivals": None, "shortfall": None, "count_noise": None, "completed": ok,
        "achieved_rps": ok / seconds if seconds > 0 else None, "unit": unit, "line": None, "note": None}
    if offered is None:
        return out
    achieved = (f"; achieved {fmt_rate(ok / seconds)} req/s ({ok} completed)" if unit == "req/s"
                else f"; {ok} first turns answered")
    if nominal is None:
        out["line"] = f"Offered {fmt_rate(offered)} req/s by the trace ({n} arrivals in {seconds:.1f} s){achieved}"
        return out
    burst = plan.get("burstiness")
    b = float(burst) if isinstance(burst, int | float) and burst > 0 else 1.0
    expected = nominal * seconds
    shortfall = 1 - offered / nominal
    out.update(expected_arrivals=expected, shortfall=shortfall, count_noise=count_noise(expected, b),
               line=f"Offered {fmt_rate(offered)} {unit} of the nominal {fmt_rate(nominal)} "
                    f"({n} arrivals in {seconds:.1f} s){achieved}")
    if shortfall > SHORTFALL_NOTE:
        noise = count_noise(expected, b) or 0.0
        seed = f"--seed {plan['seed']}" if isinstance(plan.get("seed"), int) else "the seed"
        out["note"] = (f"{shortfall:.0%} below the nominal rate: {seconds:g} s at {fmt_rate(nominal)} {unit} expects "
                       f"{expected:.0f} arrivals, a count with a standard deviation of ±{noise:.0%}, and {seed}'s "
                       f"arrivals put {n} in the window; every figure here is at the offered rate (a longer "
                       f"--duration offers nearer the nominal: --duration {steady_duration_s(nominal, b)}s for "
                       f"±{TARGET_NOISE:.0%})")
    return out
