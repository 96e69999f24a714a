"""Chunk-level figures of a run of any size, request by request, in bounded memory.

The chunks table is the only one that grows with a run's length times its streams (an hour at 1,000
streams is ~90M rows); every other table has a row per request, step or sample. So the summary reads
the other tables whole and the chunks one partition of whole requests at a time (analysis/partitions.py):
each partition's gaps, stalls, TPOT and per-request ITL are computed by the same in-memory functions
`summarize` uses, and merged:

  exact by construction   counts, sums, max, bundling, throughput, stalls (a stall needs only its own
                          stream's median), per-request rows (TPOT, goodput's own p99 and max);
  exact out of core       pooled percentiles (ITL steady, all, per token; kernel stamps' late bound):
                          pass 1 keeps a bucket histogram, pass 2 replays each partition's gap values
                          (kept in a temporary file) to select the samples at the wanted ranks
                          (analysis/pooled.py);
  for the report          per-request spans of steady gaps, the steady gaps still open at the window's
                          end, every D-th steady gap as a background sample (at most SAMPLE_POINTS),
                          output tokens per second, and the pooled ITL's quantiles for a CDF.

Memory is one partition (≤ ROWS_PER_PARTITION chunk rows) plus the per-request and per-stall rows.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from itlbench.analysis import itl, reasoning
from itlbench.analysis.crosscheck import WorstGap, gap_frame_worst
from itlbench.analysis.goodput import request_itl
from itlbench.analysis.partitions import by_partition, chunk_rows, partitions
from itlbench.analysis.pooled import Pooled, Selection
from itlbench.analysis.stalls import StallParams, find_stalls
from itlbench.analysis.stats import QUANTILES, min_samples
from itlbench.analysis.window import RunWindow

SAMPLE_POINTS = 100_000  # background gaps kept for the report's gap panel
CDF_POINTS = 400  # quantile levels of the report's CDF
_GAP_COLUMNS = ("gap_s", "injected", "n_tokens", "late_s")


def cdf_levels(n: int = CDF_POINTS) -> np.ndarray:
    """Quantile levels evenly spaced on the logit scale the CDF is drawn on (0.1 % … 99.999 %)."""
    z = np.linspace(math.log(0.001 / 0.999), math.log(0.99999 / 0.00001), n)
    return 1.0 / (1.0 + np.exp(-z))


@dataclass
class ChunkFigures:
    """Everything the summary and the report need from the chunks, merged over partitions."""

    itl: Pooled = field(default_factory=Pooled)  # steady gaps
    injected: Pooled = field(default_factory=Pooled)  # injected requests' gaps (itl_all = both)
    per_token: Pooled = field(default_factory=Pooled)  # steady gap / k, weight k
    late: Pooled = field(default_factory=Pooled)  # kernel-stamped steady gaps' late bound (s)
    reasoning_itl: Pooled = field(default_factory=Pooled)  # steady gaps of requests that reasoned, by phase
    answer_itl: Pooled = field(default_factory=Pooled)
    steady_gaps: int = 0
    zero_gaps: int = 0  # steady gaps of 0 s (itl.arrived_together)
    kernel: int = 0
    shared: int = 0
    chunks: int = 0  # the window's requests' chunks (bundling)
    bundled: int = 0
    tokens: int = 0
    out_tokens: int = 0  # every chunk that arrived in the window (throughput)
    worst_gap: WorstGap | None = None
    stalls: pl.DataFrame | None = None  # find_stalls rows, its order
    request_itl: pl.DataFrame | None = None
    handoff: pl.DataFrame | None = None  # per request that reasoned: the gap into its answer (reasoning.handoff_rows)
    tpot: pl.DataFrame | None = None
    spans: pl.DataFrame | None = None  # per request with gaps in the window: request_id, injected, lo_ns, hi_ns,
    # gaps, mean_s, max_s, median_s
    sample: pl.DataFrame | None = None  # background: t_prev_ns, t_ns, gap_s, request_id (every D-th steady gap)
    token_bins: np.ndarray = field(default_factory=lambda: np.zeros(0))
    quantiles: dict[str, dict[str, float | None]] = field(default_factory=dict)
    cdf: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (np.zeros(0), np.zeros(0)))
    partitions: int = 1

    def all_gaps(self) -> Pooled:
        out = Pooled()
        out.merge(self.itl)
        out.merge(self.injected)
        return out


@dataclass(frozen=True)
class Context:
    window: RunWindow
    all_requests: pl.DataFrame
    window_ids: pl.DataFrame  # request_id of the requests scheduled in the window
    requests: pl.DataFrame  # those requests
    params: StallParams
    every: int  # background sample: every this many steady gaps


def _gap_values(gaps: pl.DataFrame) -> pl.DataFrame:
    """What pass 2 replays: each windowed gap, whether it is injected, its tokens, its late bound, and
    its phase (`reasoning.gap_phase`) as 1 reasoning, 2 answer, 0 a request that did not reason."""
    return gaps.select("gap_s", "injected", "n_tokens",
                       pl.when((pl.col("stamp") == "kernel") & ~pl.col("injected"))
                       .then(pl.col("late_bound_ns").cast(pl.Float64) / 1e9).alias("late_s"),
                       pl.col("phase").replace_strict(_PHASE_CODES, default=0, return_dtype=pl.Int8).alias("phase"))


_PHASE_CODES = {"reasoning": 1, "answer": 2}


def _tpot_rows(chunks: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """itl.tpot_table without its sort (a sum, a min and a max per request need no order)."""
    tags = requests.select("request_id", "cls", pl.col("injected").fill_null(False))
    return (chunks.group_by("request_id")
            .agg(pl.col("n_tokens").fill_null(1).clip(lower_bound=1).sum().alias("tokens"),
                 (pl.col("t_ns").max() - pl.col("t_ns").min()).alias("span_ns"))
            .join(tags, on="request_id", how="left")
            .with_columns(pl.col("injected").fill_null(False))
            .filter(pl.col("tokens") >= 2)
            .with_columns((pl.col("span_ns").cast(pl.Float64) / 1e9 / (pl.col("tokens") - 1)).alias("tpot_s"))
            .select("request_id", "cls", "injected", "tokens", "tpot_s"))


def _spans(gaps: pl.DataFrame) -> pl.DataFrame:
    return gaps.group_by("request_id").agg(
        pl.col("injected").first(),
        pl.col("t_prev_ns").min().alias("lo_ns"), pl.col("t_ns").max().alias("hi_ns"),
        pl.len().alias("gaps"), pl.col("gap_s").mean().alias("mean_s"), pl.col("gap_s").max().alias("max_s"),
        pl.col("gap_s").median().alias("median_s"))


def _one(chunks: pl.DataFrame, ctx: Context, acc: ChunkFigures, parts: dict[str, list[pl.DataFrame]],
         values_path: Path | None) -> pl.DataFrame:
    """Pass 1 over one partition of whole requests; returns the gap values pass 2 replays."""
    lo, hi = ctx.window.measure_start_ns, ctx.window.end_ns
    every = itl.gap_table(chunks, ctx.all_requests)
    gaps = every.filter((pl.col("t_ns") >= lo) & (pl.col("t_ns") < hi))
    gaps = reasoning.gap_phase(gaps, ctx.all_requests)
    steady = itl.steady(gaps)
    values = _gap_values(gaps)
    _pass(values, acc.itl, acc.injected, acc.per_token, acc.late)
    _phase_pass(values, acc.reasoning_itl, acc.answer_itl)
    parts["handoff"].append(reasoning.handoff_rows(gaps))
    kernel = steady.filter(pl.col("stamp") == "kernel")
    acc.steady_gaps += steady.height
    acc.zero_gaps += int((steady["gap_s"] <= 0).sum()) if steady.height else 0
    acc.kernel += kernel.height
    acc.shared += int((kernel["late_bound_ns"] > 0).sum())
    opened = itl.steady(itl.open_gap_table(chunks, ctx.all_requests, lo, hi))  # streams that froze or were cut
    parts["stalls"].append(find_stalls(itl.with_open(steady, opened), ctx.params))
    own = every.join(ctx.window_ids, on="request_id", how="semi")  # goodput: a request's every gap, the drain's too
    parts["request_itl"].append(request_itl(own))
    parts["spans"].append(_spans(gaps))
    parts["sample"].append(steady.gather_every(ctx.every).select("request_id", "t_prev_ns", "t_ns", "gap_s"))
    mine = chunks.join(ctx.window_ids, on="request_id", how="semi")
    parts["tpot"].append(_tpot_rows(mine, ctx.requests))
    acc.chunks += mine.height
    acc.bundled += mine.filter(pl.col("n_tokens") > 1).height
    acc.tokens += int(mine["n_tokens"].fill_null(1).sum()) if mine.height else 0
    worst = gap_frame_worst(every.join(ctx.window_ids, on="request_id", how="semi"))  # crosscheck.worst_gap
    if worst is not None:
        acc.worst_gap = worst.longer(acc.worst_gap)
    arrived = chunks.filter((pl.col("t_ns") >= lo) & (pl.col("t_ns") < hi))
    acc.out_tokens += int(arrived["n_tokens"].fill_null(1).sum()) if arrived.height else 0
    nbins = max(1, math.ceil(ctx.window.seconds))
    if arrived.height:
        at = ((arrived["t_ns"] - lo) // 1_000_000_000).to_numpy()
        acc.token_bins = acc.token_bins + np.bincount(at, weights=arrived["n_tokens"].fill_null(1).to_numpy(),
                                                      minlength=nbins)[:nbins]
    if values_path is not None:
        values.write_ipc(values_path)
    return values


def _pass(values: pl.DataFrame, steady: Pooled | Selection, injected: Pooled | Selection | None,
          per_token: Pooled | Selection, late: Pooled | Selection) -> None:
    """Feed one partition's gap values to the four pooled figures (pass 1 histograms or pass 2 selections);
    with `injected` None, the steady slot takes every gap (pass 2 of itl_all_s)."""
    inj = values["injected"].to_numpy()
    gap = values["gap_s"].to_numpy()
    if injected is None:
        steady.add(gap)
        return
    steady.add(gap[~inj])
    injected.add(gap[inj])
    tok = values["n_tokens"].to_numpy()[~inj]
    per_token.add(values.filter(~pl.col("injected")).select(pl.col("gap_s") / pl.col("n_tokens"))
                  .to_series().to_numpy(), tok)
    late.add(values["late_s"].drop_nulls().to_numpy())


def _phase_pass(values: pl.DataFrame, reasoning_slot: Pooled | Selection, answer_slot: Pooled | Selection) -> None:
    """Feed the steady gaps of requests that reasoned to their phase's pooled figure."""
    steady = ~values["injected"].to_numpy()
    phase = values["phase"].to_numpy()
    gap = values["gap_s"].to_numpy()
    reasoning_slot.add(gap[steady & (phase == _PHASE_CODES["reasoning"])])
    answer_slot.add(gap[steady & (phase == _PHASE_CODES["answer"])])


_ITL_QS = tuple(QUANTILES.values())
_LATE_QS = (0.99, 0.90)


def _select(acc: ChunkFigures, replay: list[pl.DataFrame | Path]) -> None:
    """Pass 2: the exact pooled percentiles, by replaying every partition's gap values."""
    all_gaps = acc.all_gaps()
    sels = {"itl_s": acc.itl.selection(_ITL_QS), "itl_all_s": all_gaps.selection(_ITL_QS),
            "itl_per_token_s": acc.per_token.selection(_ITL_QS),
            "late_bound_s": acc.late.selection(_LATE_QS),
            "itl_reasoning_s": acc.reasoning_itl.selection(_ITL_QS), "itl_answer_s": acc.answer_itl.selection(_ITL_QS)}
    for item in replay:
        values = pl.read_ipc(item) if isinstance(item, Path) else item
        _pass(values, sels["itl_s"], _Nowhere(), sels["itl_per_token_s"], sels["late_bound_s"])
        _pass(values, sels["itl_all_s"], None, _Nowhere(), _Nowhere())
        _phase_pass(values, sels["itl_reasoning_s"], sels["itl_answer_s"])
    pooled = {"itl_s": acc.itl, "itl_all_s": all_gaps, "itl_per_token_s": acc.per_token, "late_bound_s": acc.late,
              "itl_reasoning_s": acc.reasoning_itl, "itl_answer_s": acc.answer_itl}
    for name, sel in sels.items():
        n = pooled[name].count
        acc.quantiles[name] = {k: (sel.quantile(q) if n >= min_samples(q) else None)
                               for k, q in QUANTILES.items()} if name != "late_bound_s" else \
            {str(q): (sel.quantile(q) if n >= min_samples(q) else None) for q in _LATE_QS}
    levels = cdf_levels()
    if acc.itl.count >= 2:
        acc.cdf = (np.array(acc.itl.approx_quantiles([float(q) for q in levels])), levels)


class _Nowhere:
    """A pooled slot that discards what it is fed (pass 2 of the figures it does not select)."""

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        return None


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [f for f in frames if f.width]
    return pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()


def chunk_figures(run_dir: str | Path, window: RunWindow, all_requests: pl.DataFrame, requests: pl.DataFrame,
                  params: StallParams, count: int | None = None) -> ChunkFigures:
    """Every chunk-level figure of the run in `run_dir`, partition by partition (`count` forces the
    number of partitions; default: from the run's size)."""
    rows = chunk_rows(run_dir)
    ctx = Context(window, all_requests, requests.select("request_id"), requests, params,
                  max(1, math.ceil(rows / SAMPLE_POINTS)))
    acc = ChunkFigures(token_bins=np.zeros(max(1, math.ceil(window.seconds))))
    parts: dict[str, list[pl.DataFrame]] = {k: [] for k in ("stalls", "request_itl", "spans", "sample", "tpot",
                                                            "handoff")}
    with partitions(run_dir, count) as pieces:
        acc.partitions = len(pieces)
        keep = Path(tempfile.mkdtemp(prefix="itlbench-gaps-")) if len(pieces) > 1 else None
        try:
            replay: list[pl.DataFrame | Path] = []
            n = len(pieces)
            split = [by_partition(f, n) for f in (all_requests, ctx.window_ids, requests)]
            for i, piece in enumerate(pieces):
                path = keep / f"gaps-{i:04d}.ipc" if keep is not None else None
                mine = Context(window, split[0][i], split[1][i], split[2][i], params, ctx.every)
                chunks = piece.read()
                piece.release()
                values = _one(chunks, mine, acc, parts, path)
                del chunks
                replay.append(path if path is not None else values)
            _select(acc, replay)
        finally:
            if keep is not None:
                shutil.rmtree(keep, ignore_errors=True)
    stalls = _concat(parts["stalls"])
    acc.stalls = stalls.sort("t_prev_ns", "request_id") if stalls.height else parts["stalls"][0]
    acc.request_itl, acc.tpot = _concat(parts["request_itl"]), _concat(parts["tpot"]).sort("request_id")
    acc.handoff = _concat(parts["handoff"])
    acc.spans, acc.sample = (_concat(parts[k]) for k in ("spans", "sample"))
    return acc
