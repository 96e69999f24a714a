"""Was the client the bottleneck? Each client-side delay is judged against the figure it distorts,
so a 13 ms late send does not void a 17 s TTFT while a starved client is still caught:

  send lag (sent − scheduled) vs that request's TTFT: a request is distorted when its lag is at
      least `max_distortion` of its TTFT (and ≥ `min_delay_s`); a TTFT figure (one bucket, one class)
      is affected when more than 1 % of its requests are (for fewer than 100 requests: any);
  event-loop lag vs the ITL being reported: a late wake-up delays the stamps of the chunks it
      reads, so the loop lag's q-quantile is compared with the pooled ITL's q-quantile at the highest
      q both sides' samples support (p99, else p90): distorted when ≥ `max_distortion` of it and at
      least `min_loop_lag_s` (2 ms: below that the sampled lag is timer noise, see the threshold);
  client CPU mean > `cpu_mean_percent` of one core: the client saturated, so every stamp may be late
      (benchmarks/client_fidelity.py: 72 % of a core gave 28 ms ITL errors at p99 while the sampled
      loop lag stayed under 5 ms);
  stalls caused by the client's own pauses (garbage collection, a blocked loop): the stall figures
      and the ITL tail overstate the server's.
Kernel receive stamps (chunks.stamp = "kernel", load/kernel_client.py) are taken when the bytes
arrive, so a late or busy client no longer bends ITL or stalls: loop lag and CPU then count against
TTFT's send side only. What can still bend them is a read that returned several chunks (the client
came late, or the server sent them at once): their stamps' late bound (itl.py, late_bound_ns) is
judged like the loop lag, its quantile against the pooled ITL's — only over the reads the client itself
got to late, where the gaps say who (`late_by`, analysis/read_together.py): chunks a server sent together
are the ITL it delivered (figures.shared_read_by gives both shares). How far the wall clock moved
against the run's clock (client_samples.clock_offset_ns) is recorded as `clock_step_s` but judges
nothing: every read re-checks the offset kernel stamps map through (load/clients/kclock.KernelClock.stamp),
so a step moves none.
Outside the client (analysis/disturbance.py): connections cut, timed out or never made, and first
tokens delivered late after the engine step that made them (a network delay, seen as a TTFT offset),
are named too, also in `disturbances`.
The verdict names the figures affected and those that still stand. A figure with no data cannot
invalidate a run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import polars as pl

from itlbench.analysis.disturbance import disturbance_checks, disturbance_figures
from itlbench.analysis.stats import json_safe, ns_to_s, supported_quantile

# The summary's headline figures, in the order a verdict lists them.
FIGURES: tuple[str, ...] = ("ttft_s", "itl_s", "stalls", "goodput", "throughput", "split")


@dataclass(frozen=True)
class ValidityThresholds:
    max_distortion: float = 0.10  # a client delay counts once it is this fraction of the figure it distorts
    min_delay_s: float = 0.001  # delays below this are scheduling noise whatever the figure
    # The sampled loop lag is a timer's overshoot (an idle loop reads ~0.3 ms here) and a chunk stamp
    # moves only by the lag's spread between two reads; at 100 streams (loop lag of a few ms at most)
    # benchmarks/client_fidelity.py measured ITL error p50 of 0.001 ms. Below this it is not a distortion.
    min_loop_lag_s: float = 0.002
    late_fraction: float = 0.01  # more than this share of a TTFT figure's requests sent late affects it
    cpu_mean_percent: float = 50.0


def pause_figures(pauses: pl.DataFrame | None) -> dict[str, float | int | None]:
    if pauses is None or pauses.is_empty():
        return {"client_pauses": 0, "client_pause_max_s": None, "client_pause_total_s": 0.0}
    d = ns_to_s(pauses["end_ns"] - pauses["start_ns"])
    return {"client_pauses": pauses.height, "client_pause_max_s": float(d.max()),  # type: ignore[arg-type]
            "client_pause_total_s": float(d.sum())}


def _late_sends(ttft: pl.DataFrame, th: ValidityThresholds) -> pl.DataFrame:
    """Per request with a TTFT: was it sent late enough to distort it?"""
    return ttft.filter(pl.col("ttft_s").is_not_null() & pl.col("client_lag_s").is_not_null()).with_columns(
        ((pl.col("client_lag_s") >= th.min_delay_s)
         & (pl.col("client_lag_s") >= th.max_distortion * pl.col("ttft_s"))).alias("late"))


def _late_groups(late: pl.DataFrame, by: str, th: ValidityThresholds) -> list[tuple[str, int, int]]:
    """(group, late requests, requests) for each group whose TTFT figure the late sends distort."""
    if late.is_empty():
        return []
    counts = late.group_by(by).agg(pl.col("late").sum().alias("late"), pl.len().alias("n")).sort(by)
    return [(str(g), int(k), int(n)) for g, k, n in counts.iter_rows()
            if g is not None and k > 0 and k / n > (th.late_fraction if n >= 100 else 0.0)]


def _send_lag_check(ttft: pl.DataFrame, th: ValidityThresholds) -> tuple[list[str], list[str]]:
    late = _late_sends(ttft, th)
    affected, reasons = [], []
    for by, key in (("bucket", "ttft_s"), ("cls", "ttft_by_class_s")):
        for group, k, n in _late_groups(late, by, th):
            affected.append(f"{key}.{group}")
            if by == "bucket":
                reasons.append(f"TTFT {group}: {k} of {n} requests were sent late by at least "
                               f"{th.max_distortion:.0%} of their TTFT: the client sent late")
    return affected, reasons


def _loop_lag_vs_itl(samples: pl.DataFrame, itl: dict[str, object]) -> tuple[str | None, float | None, float | None]:
    """(quantile key, loop lag, pooled ITL) at the highest quantile both support, else (None, None, None)."""
    lags = samples["loop_lag_s"].drop_nulls()
    for key, q in (("p99", 0.99), ("p90", 0.90)):
        lag, gap = supported_quantile(lags, q), itl.get(key)
        if lag is not None and isinstance(gap, float | int):
            return key, lag, float(gap)
    return None, None, None


def _late_bound_vs_itl(bound_at: Callable[[float], float | None],
                       itl: dict[str, object]) -> tuple[str | None, float | None]:
    """(quantile key, late bound of kernel stamps in s) at the highest quantile the gaps support;
    `bound_at(q)` is the supported q-quantile of the kernel-stamped gaps' late bounds (s) or None."""
    for key, q in (("p99", 0.99), ("p90", 0.90)):
        b = bound_at(q)
        if b is not None and isinstance(itl.get(key), float | int):
            return key, b
    return None, None


@dataclass(frozen=True)
class StampCounts:
    """What stamp_figures needs of the gaps, so a large run can give it without holding them:
    gaps, kernel-stamped gaps, those with a late bound > 0, and the late bound's quantiles."""

    gaps: int
    kernel: int
    shared: int
    bound_at: Callable[[float], float | None]
    shared_by: dict[str, float] | None = None  # who made shared reads late, where the gaps say (late_by)


def _shared_by(kernel: pl.DataFrame) -> dict[str, float] | None:
    """Share of kernel-stamped gaps touching a shared read that the client read late / the server sent at once."""
    if kernel.is_empty():
        return None
    shared = kernel["late_bound_ns"].fill_null(0) > 0
    return {who: float((shared & (kernel["late_by"] == who).fill_null(who == "client")).mean())  # type: ignore[arg-type]
            for who in ("client", "server")}


def stamp_figures(gaps: pl.DataFrame | None, samples: pl.DataFrame, itl: dict[str, object]) -> dict[str, object]:
    """How the gaps were stamped, and what can still bend the kernel-stamped ones."""
    if gaps is None or gaps.is_empty() or "stamp" not in gaps.columns:
        return {"kernel_stamped_share": 0.0 if gaps is not None and "stamp" in gaps.columns else None,
                "shared_read_share": None, "shared_read_by": None, "stamp_late_bound_s": None,
                "stamp_late_bound_stat": None, "clock_step_s": None}
    kernel = gaps.filter(pl.col("stamp") == "kernel")
    # read_together.tag_gaps says who made a shared read late: only the client's lateness bends ITL
    tagged = "late_by" in kernel.columns
    late = kernel.filter(pl.col("late_by").fill_null("client") == "client") if tagged else kernel
    bounds = ns_to_s(late["late_bound_ns"]) if late.height else pl.Series([], dtype=pl.Float64)
    return stamp_figures_of(StampCounts(gaps.height, kernel.height, int((kernel["late_bound_ns"] > 0).sum()),
                                        lambda q: supported_quantile(bounds, q),
                                        _shared_by(kernel) if tagged else None), samples, itl)


def stamp_figures_of(c: StampCounts, samples: pl.DataFrame, itl: dict[str, object]) -> dict[str, object]:
    """`stamp_figures` from the gaps' counts (a run with no gaps: `stamp_figures` of an empty table)."""
    if not c.gaps:
        return {"kernel_stamped_share": 0.0, "shared_read_share": None, "shared_read_by": None,
                "stamp_late_bound_s": None, "stamp_late_bound_stat": None, "clock_step_s": None}
    key, bound = _late_bound_vs_itl(c.bound_at, itl)
    offsets = samples["clock_offset_ns"].drop_nulls() if "clock_offset_ns" in samples.columns else pl.Series([])
    step = (int(offsets.max()) - int(offsets.min())) / 1e9 if offsets.len() and c.kernel else None  # type: ignore[arg-type]
    return json_safe({  # type: ignore[return-value]
        "kernel_stamped_share": c.kernel / c.gaps,
        "shared_read_share": c.shared / c.kernel if c.kernel else None,
        "shared_read_by": c.shared_by,
        "stamp_late_bound_s": bound,
        "stamp_late_bound_stat": key,
        "clock_step_s": step,
    })


def figures(ttft: pl.DataFrame, samples: pl.DataFrame, itl: dict[str, object]) -> dict[str, object]:
    lag = ttft["client_lag_s"].drop_nulls()
    cpu = samples["cpu_percent"].drop_nulls()
    key, loop, gap = _loop_lag_vs_itl(samples, itl)
    return json_safe({  # type: ignore[return-value]
        "send_lag_p99_s": supported_quantile(lag, 0.99),
        "send_lag_max_s": lag.max() if lag.len() else None,
        "requests_with_send_lag": lag.len(),
        "loop_lag_p99_s": supported_quantile(samples["loop_lag_s"], 0.99),
        "loop_lag_s": loop,
        "loop_lag_vs_itl_s": gap,
        "loop_lag_stat": key,
        "cpu_mean_percent": cpu.mean() if cpu.len() else None,
        "cpu_max_percent": cpu.max() if cpu.len() else None,
        "client_samples": samples.height,
    })


def _kernel_checks(f: dict[str, object], itl: dict[str, object], th: ValidityThresholds) -> tuple[list[str], list[str]]:
    """What can still bend kernel-stamped gaps: chunks that shared a read."""
    affected: list[str] = []
    reasons: list[str] = []
    bound, stat = f["stamp_late_bound_s"], f["stamp_late_bound_stat"]
    gap = itl.get(stat) if isinstance(stat, str) else None
    if isinstance(bound, float) and isinstance(gap, float | int) and bound >= max(th.min_delay_s,
                                                                                  th.max_distortion * gap):
        affected += ["itl_s", "stalls", "goodput"]
        by = f.get("shared_read_by")
        share = by["client"] if isinstance(by, dict) else f["shared_read_share"]
        who = ("the client read them late; the server had sent them apart" if isinstance(by, dict) else
               "a late client, or a server sending several chunks at once")
        reasons.append(f"{share:.1%} of kernel-stamped gaps touch a chunk read together with later bytes ({who}): "
                       f"their stamps may be up to "
                       f"{bound * 1e3:.1f} ms late at {stat}, ≥ {th.max_distortion:.0%} of the ITL {stat} "
                       f"({gap * 1e3:.1f} ms)")
    return affected, reasons


def check_validity(ttft: pl.DataFrame, samples: pl.DataFrame, itl: dict[str, object],
                   thresholds: ValidityThresholds | None = None, pauses: pl.DataFrame | None = None,
                   client_stalls: int = 0, gaps: pl.DataFrame | None = None,
                   stamps: StampCounts | None = None, requests: pl.DataFrame | None = None,
                   steps: pl.DataFrame | None = None, together: dict[str, object] | None = None) -> dict[str, object]:
    """{valid, reasons, affected, standing, disturbances, figures, thresholds}; `ttft` holds
    ttft.ttft_table rows, `itl` the pooled ITL statistics being reported, `gaps` the gaps behind them
    (itl.gap_table), or `stamps` their counts when a large run does not hold them; `requests` and
    `steps` (the window's) let it name what disturbed the path to the engine; `together`
    (itl.arrived_together) withdraws ITL when the tokens came in together."""
    th = thresholds or ValidityThresholds()
    stamp = stamp_figures_of(stamps, samples, itl) if stamps is not None else stamp_figures(gaps, samples, itl)
    f = {**figures(ttft, samples, itl), **stamp, **pause_figures(pauses),
         "client_caused_stalls": client_stalls, **disturbance_figures(requests, steps)}
    affected, reasons = _send_lag_check(ttft, th)
    if affected:
        affected.append("goodput")
    share = f["kernel_stamped_share"]
    user_stamped = not isinstance(share, float) or share < 1.0 - th.late_fraction
    loop, gap, stat = f["loop_lag_s"], f["loop_lag_vs_itl_s"], f["loop_lag_stat"]
    if (user_stamped and loop is not None and gap is not None
            and loop >= max(th.min_loop_lag_s, th.max_distortion * gap)):
        affected += ["itl_s", "goodput"]
        reasons.append(f"client event-loop lag {stat} {loop * 1e3:.1f} ms ≥ {th.max_distortion:.0%} of the ITL "
                       f"{stat} ({gap * 1e3:.1f} ms): chunk timestamps are late")
    cpu = f["cpu_mean_percent"]
    if cpu is not None and cpu > th.cpu_mean_percent:
        affected += ["ttft_s", "itl_s", "stalls", "goodput"] if user_stamped else ["ttft_s", "goodput"]
        reasons.append(f"client CPU mean {cpu:.1f} % > {th.cpu_mean_percent:.0f} % of one core: the client "
                       + ("saturated and stamps every chunk late" if user_stamped else
                          "saturated and sends late (its kernel receive stamps still hold)"))
    k_affected, k_reasons = _kernel_checks(f, itl, th)
    affected += k_affected
    reasons += k_reasons
    if client_stalls:
        affected += ["stalls", "itl_s.max"]
        reasons.append(f"{client_stalls} stall gaps are the client's own pauses (stalls.by_cause.client): "
                       "the ITL tail overstates the server's")
    ttft_p50 = ttft["ttft_s"].drop_nulls().median() if "ttft_s" in ttft.columns else None
    d_affected, disturbances = disturbance_checks(f, ttft_p50, th.max_distortion, th.late_fraction)  # type: ignore[arg-type]
    if together and together.get("warning"):  # itl.arrived_together: the path delivered no gaps to measure
        d_affected += ["itl_s", "itl_all_s", "itl_per_token_s", "tpot_s", "stalls", "goodput"]
        disturbances = [*disturbances, str(together["warning"])]
    affected += d_affected
    reasons += disturbances
    affected = list(dict.fromkeys(affected))
    touched = {a.split(".")[0] for a in affected} | {"ttft_s" for a in affected if a.startswith("ttft_by_class_s")}
    standing = [name for name in FIGURES if name not in touched]
    return {"valid": not reasons, "reasons": reasons, "affected": affected, "standing": standing,
            "disturbances": disturbances, "figures": f, "thresholds": asdict(th)}
