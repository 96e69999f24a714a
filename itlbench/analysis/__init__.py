"""Analysis of a run's records: TTFT by prompt bucket, ITL views, stalls and their attribution,
prefill:decode split, goodput and run validity. `summarize` / `analyze_run` are the entry points."""

from itlbench.analysis.goodput import ClassSlo, SloSet, parse_slo
from itlbench.analysis.stalls import StallParams
from itlbench.analysis.summary import analyze_run, summarize
from itlbench.analysis.validity import ValidityThresholds
from itlbench.analysis.window import RunWindow

__all__ = [
    "ClassSlo",
    "RunWindow",
    "SloSet",
    "StallParams",
    "ValidityThresholds",
    "analyze_run",
    "parse_slo",
    "summarize",
]
