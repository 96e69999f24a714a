"""One row per run of a comparison: the figures its table, verdict and answer read (`make_rows`).

Kept apart from `compare` (the document) and `compare_pick` (the ranking) so both import it one way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from itlbench.report.compare_ci import repeat_groups, run_labels
from itlbench.report.data import RunData
from itlbench.report.slo_checks import worst_gap_s


def measured(run: RunData) -> bool:
    """Whether any request fell in the run's measured window (a run aborted in its warm-up has none)."""
    return bool((run.summary.get("requests") or {}).get("total"))


@dataclass
class Row:
    """One run's figures for the comparison table."""

    run: RunData
    label: str
    worst_s: float | None
    p50_s: float | None
    p99_s: float | None
    p999_s: float | None
    injected_ttft_s: float | None
    ttft_p99_s: float | None
    out_tps: float | None
    stalls: int
    stalled_s: float | None
    goodput: float | None
    valid: bool | None
    group: str = ""  # the setting (repeats of one sweep point share it); label adds which run
    stall_events: int = 0  # stalls that began together (one cause, many streams); `stalls` counts each gap
    worst_not_client_s: float | None = None  # itl_s.max_not_client: None where the summary predates it

    def rank_s(self) -> float | None:
        """What ranks the smoothest setting: the worst gap the client's own pauses did not make (a 333 ms pause named
        the setting whose client paused least), else the worst gap (a summary written before that figure)."""
        return self.worst_not_client_s if self.worst_not_client_s is not None else self.worst_s

    def paused(self) -> bool:
        """Whether the client's own pause made the run's worst gap, so its rank figure is shorter."""
        return self.worst_s is not None and self.worst_not_client_s is not None and self.worst_not_client_s < self.worst_s

    def stalls_text(self) -> str:
        """Events first, as the brief line counts them, then the gaps they hold (one per stream stalled)."""
        return f"{self.stall_events:,} ({self.stalls:,} gaps)" if self.stalls else "0"


def _or_max(stats: dict[str, Any], key: str) -> float | None:
    """A percentile, or where too few samples withheld it, the worst sample (one injected prompt: its TTFT)."""
    if not stats.get("count"):
        return None
    value = stats.get(key)
    return value if value is not None else stats.get("max")


def make_rows(runs: list[RunData]) -> list[Row]:
    rows = []
    labels = run_labels(runs)
    for run, label, group in zip(runs, labels, repeat_groups(runs, labels), strict=True):
        s = run.summary
        itl, stalls = s.get("itl_s") or {}, s.get("stalls") or {}
        inj = (s.get("ttft_by_class_s") or {}).get("injected") or {}
        every = (s.get("ttft_s") or {}).get("all") or {}
        rows.append(Row(run, label, worst_gap_s(s), itl.get("p50"), itl.get("p99"), itl.get("p999"),
                        _or_max(inj, "p50"), _or_max(every, "p99"), (s.get("throughput") or {}).get("output_tokens_per_s"),
                        int(stalls.get("count") or 0), stalls.get("stalled_s"),
                        (s.get("goodput") or {}).get("requests_per_s"), s.get("valid") if measured(run) else None,
                        group, int(stalls.get("events") or 0), itl.get("max_not_client")))
    return rows
