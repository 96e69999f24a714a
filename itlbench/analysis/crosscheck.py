"""Cross-checks of the client's view against the server's own accounts.

- engine: the worst client gap against the engine steps that ran inside it (how many, how long they
  kept the engine busy, the longest of them), and each injected request's client TTFT against the
  span of the engine steps that prefilled it. A gap can span several steps (a stream that missed a
  step, or a step whose tokens it did not get), so it is checked against the engine's busy time
  inside it, not against one step: what is left over (`worst_gap_unexplained_s`) is what the
  client, the transport or an idle engine added.
- prompt_tokens: the prompt lengths the driver built against `usage.prompt_tokens` the server
  reported (text prompts for external servers are built to a token estimate).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from itlbench.analysis.stats import ns_to_s


@dataclass(frozen=True)
class WorstGap:
    """The longest gap between consecutive chunks of one request, and where it lay."""
    request_id: str
    start_ns: int  # the chunk before the gap
    end_ns: int    # the chunk that ended it

    @property
    def ns(self) -> int:
        return self.end_ns - self.start_ns

    def key(self) -> tuple[int, int, str]:
        """Longest first; of equal gaps the earliest, then the lowest id (one answer whatever the order read)."""
        return (-self.ns, self.start_ns, self.request_id)

    def longer(self, other: WorstGap | None) -> WorstGap:
        return self if other is None or self.key() <= other.key() else other


def gap_frame_worst(gaps: pl.DataFrame) -> WorstGap | None:
    """The worst of a frame with `request_id`, `t_prev_ns`, `t_ns` (one row per gap)."""
    gaps = gaps.drop_nulls(["t_prev_ns", "t_ns"])
    if gaps.is_empty():
        return None
    row = gaps.sort(pl.col("t_prev_ns") - pl.col("t_ns"), "t_prev_ns", "request_id").row(0, named=True)
    return WorstGap(str(row["request_id"]), int(row["t_prev_ns"]), int(row["t_ns"]))


def worst_gap(chunks: pl.DataFrame) -> WorstGap | None:
    """The longest gap between consecutive chunks (index order) of one request."""
    return gap_frame_worst(chunks.sort("request_id", "index").select(
        "request_id", pl.col("t_ns").shift(1).over("request_id").alias("t_prev_ns"), "t_ns"))


def engine_check(requests: pl.DataFrame, chunks: pl.DataFrame | None, steps: pl.DataFrame,
                 worst: WorstGap | None = None) -> dict[str, object]:
    """`worst` stands in for the chunks (None: read off them) when a large run's chunks are not in memory."""
    if steps.is_empty():
        return {"source": "unavailable"}
    durations = steps.select(ns_to_s(pl.col("end_ns") - pl.col("start_ns")).alias("d"))["d"]
    if chunks is not None:
        worst = worst_gap(chunks)
    longest = float(durations.max()) if durations.len() else None
    gap_s = worst.ns / 1e9 if worst is not None else None
    return {
        "source": "engine_steps",
        "longest_step_s": longest,
        "worst_client_gap_s": gap_s,
        "worst_gap_over_longest_step": (gap_s / longest) if gap_s and longest else None,
        **_inside(worst, steps),
        "injected": _injected_prefill(requests, steps),
    }


def _inside(worst: WorstGap | None, steps: pl.DataFrame) -> dict[str, object]:
    """The engine steps that ran inside the worst gap: how many, how long they kept the engine busy
    (clipped to the gap), the longest, and the gap's time the engine's busy time does not cover."""
    if worst is None:
        return {}
    inside = steps.filter((pl.col("end_ns") > worst.start_ns) & (pl.col("start_ns") < worst.end_ns))
    busy_ns = int(inside.select((pl.min_horizontal("end_ns", pl.lit(worst.end_ns))
                                 - pl.max_horizontal("start_ns", pl.lit(worst.start_ns))).sum()).item() or 0)
    longest = inside.select((pl.col("end_ns") - pl.col("start_ns")).max()).item() if inside.height else None
    return {"worst_gap_request_id": worst.request_id, "worst_gap_steps": inside.height,
            "worst_gap_engine_busy_s": busy_ns / 1e9,
            "worst_gap_longest_step_s": longest / 1e9 if longest is not None else None,
            "worst_gap_unexplained_s": max(0, worst.ns - busy_ns) / 1e9}


def engine_check_line(check: dict[str, object]) -> str | None:
    """One line for the terminal and the report: the worst gap against the engine time inside it."""
    if check.get("longest_step_s") is None or check.get("worst_client_gap_s") is None:
        return None
    line = f"worst client gap {check['worst_client_gap_s']:.2f} s"  # type: ignore[str-format]
    if check.get("worst_gap_steps") is not None:
        line += (f" ({check['worst_gap_request_id']}): {check['worst_gap_steps']} engine steps inside it kept the "
                 f"engine busy {check['worst_gap_engine_busy_s']:.2f} s, the longest "
                 f"{(check.get('worst_gap_longest_step_s') or 0.0):.2f} s; "
                 f"{check['worst_gap_unexplained_s']:.2f} s not engine time")
    return line + f"; longest step of the run {check['longest_step_s']:.2f} s"


def _injected_prefill(requests: pl.DataFrame, steps: pl.DataFrame) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    injected = requests.filter(pl.col("injected").fill_null(False) & pl.col("server_request_id").is_not_null())
    for row in injected.iter_rows(named=True):
        mine = steps.filter(pl.col("prefill_request_ids").list.contains(row["server_request_id"]))
        if mine.is_empty() or row["first_token_ns"] is None:
            continue
        span = (mine["end_ns"].max() - mine["start_ns"].min()) / 1e9  # type: ignore[operator]
        ttft = (row["first_token_ns"] - row["scheduled_ns"]) / 1e9
        out.append({"request_id": row["request_id"], "prompt_tokens": row["prompt_tokens"],
                    "prefill_steps": mine.height, "engine_prefill_span_s": span, "client_ttft_s": ttft,
                    "ttft_minus_engine_s": ttft - span})
    return out


def prompt_token_check(requests: pl.DataFrame) -> dict[str, object]:
    both = requests.drop_nulls(["prompt_tokens", "prompt_tokens_reported"])
    if both.is_empty():
        return {"checked": 0}
    diff = both.select((pl.col("prompt_tokens_reported") - pl.col("prompt_tokens")).alias("d"))["d"]
    ratio = both["prompt_tokens_reported"].sum() / max(1, both["prompt_tokens"].sum())
    return {"checked": both.height, "exact": int((diff == 0).sum()), "max_abs_diff": int(diff.abs().max()),
            "reported_over_planned": float(ratio)}


def output_token_check(requests: pl.DataFrame) -> dict[str, object]:
    """Tokens the client counted from chunks against `usage.completion_tokens`, over finished requests.
    A server may send a token without a chunk of its own (llama.cpp holds back a token whose bytes end
    mid-character and sends its text with the next one): `unseen` counts those, which the per-chunk
    figures (ITL, bundling) cannot see and the token totals then take from the server."""
    both = requests.filter(pl.col("status") == "ok").drop_nulls(["output_tokens", "output_tokens_reported"])
    if both.is_empty():
        return {"checked": 0}
    diff = both["output_tokens_reported"] - both["output_tokens"]
    reported = int(both["output_tokens_reported"].sum())
    unseen = int(diff.clip(lower_bound=0).sum())
    return {"checked": both.height, "exact": int((diff == 0).sum()), "counted": int(both["output_tokens"].sum()),
            "reported": reported, "unseen": unseen, "unseen_share": unseen / reported if reported else 0.0,
            "counted_over_reported": int((diff < 0).sum())}
