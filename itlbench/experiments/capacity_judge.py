"""One capacity-search run against the SLOs and the stall budget: met, missed, or not judged.

A check is judged on the summary figure it rests on (`itl_s`, `stalls`, `ttft_s`, `requests`). Where the run's
validity checks withdrew a figure because it was never measured, not merely bent (`arrived_together`: the
tokens came in bursts, most gaps 0 ms, so ITL p99 reads 0 ms and passes any target), the checks resting on it
are *not judged*, met or not: the run cannot meet, since the SLO on ITL was never tried, and it does not miss
either. vLLM-CPU's API server, starved on a 2-core box, sent its tokens so; the search had called that load met.
The figures withdrawn so are recorded as None (the run's summary keeps what it read).

A miss the validity checks put in doubt the other way (the client paused or read late, so ITL and stalls may be
its doing) is `disturbed`: capacity.measure_point runs it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.analysis.goodput import parse_slo
from itlbench.errors import ConfigError
from itlbench.report.data import load_run
from itlbench.units import parse_duration_s

# the figures a run cannot measure when its tokens arrived together, and the search's figures read from each
UNMEASURED_FIGURES = {"itl_s": ("itl_p50_s", "itl_p99_s", "worst_gap_s"), "stalls": ("stalled_share", "victims_share")}


@dataclass(frozen=True)
class StallBudget:
    """How much freezing a point may show: the worst gap (s), stalled share of stream time, stalled streams."""

    worst_s: float | None = None
    stalled: float | None = None
    victims: float | None = None
    spec: str = ""

    def as_dict(self) -> dict[str, float | str | None]:
        return {"worst_s": self.worst_s, "stalled": self.stalled, "victims": self.victims, "spec": self.spec}


def _share(item: str, text: str) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise ConfigError("--stall-budget", f"{item!r}: {text!r} is not a share", "write it as 1% or 0.01")
    return value


def parse_stall_budget(spec: str | None) -> StallBudget:
    """'worst=1s,stalled=1%,victims=10%' (any subset) → StallBudget; bad items name --stall-budget."""
    if not spec:
        return StallBudget()
    out: dict[str, float] = {}
    for item in (i.strip() for i in spec.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("worst", "stalled", "victims"):
            raise ConfigError("--stall-budget", f"{item!r} is not worst=DUR, stalled=SHARE or victims=SHARE",
                              "e.g. --stall-budget worst=1s,stalled=1%,victims=10%")
        out[key] = parse_duration_s(value.strip(), "--stall-budget") if key == "worst" else _share(item, value.strip())
    return StallBudget(out.get("worst"), out.get("stalled"), out.get("victims"), spec)


@dataclass
class RunJudgement:
    """One run at one load: its headline figures, whether it met, and what it missed.

    `disturbed` holds the run's validity reasons when every miss is on a figure they affect; `rerun`
    is set once another run has taken its place in the point's verdict. `not_judged` names the checks whose
    figure the validity checks withdrew as unmeasured, `unmeasured` why (the run cannot meet)."""

    run_dir: Path
    figures: dict[str, float | None]
    misses: list[str]
    disturbed: list[str] = field(default_factory=list)
    rerun: bool = False
    interrupted: bool = False  # Ctrl-C or SIGTERM cut the run short: kept, never counted
    seed: int | None = None  # the seed it ran, where the search varies it (the simulator)
    queueing: str | None = None  # what held the requests that waited for the engine (report/queueing.py)
    rate_unit: str | None = None  # what --rate counted, as its summary's `offered.unit` says (req/s, sessions/s)
    not_judged: list[str] = field(default_factory=list)  # checks on a figure never measured ("ITL p99")
    unmeasured: list[str] = field(default_factory=list)  # the validity reasons that withdrew it

    @property
    def met(self) -> bool:
        return not self.misses and not self.not_judged

    @property
    def empty(self) -> bool:
        """No request in its window (and none failed): it measured nothing at all."""
        return self.figures.get("requests") == 0 and not self.figures.get("failed_requests")


def unmeasured(summary: dict[str, Any]) -> tuple[list[str], set[str]]:
    """(the reasons, the figures) the run's validity checks withdrew as never measured: tokens that arrived
    together leave ITL and stalls with nothing to time. ([], set()) for a run that measured them."""
    warning = (summary.get("arrived_together") or {}).get("warning")
    if not warning or summary.get("valid", True):
        return [], set()
    affected = (summary.get("validity") or {}).get("affected")
    figures = {f for f in UNMEASURED_FIGURES if affected is None or f in affected}
    return ([str(warning)], figures) if figures else ([], set())


def _figures(run: Any) -> dict[str, float | None]:
    """The search's figures of a run: ITL, the worst gap, TTFT p90, the stall shares, throughput, the window."""
    from itlbench.report.slo_checks import worst_gap_s

    s = run.summary
    itl, stalls = s.get("itl_s") or {}, s.get("stalls") or {}
    spans = run.chunks.spans if run.chunks.spans is not None else pl.DataFrame(
        schema={"injected": pl.Boolean, "gaps": pl.Int64, "mean_s": pl.Float64})
    steady = spans.filter(~pl.col("injected"))  # per request: its gaps in the window and their mean
    stream_s = float((steady["gaps"] * steady["mean_s"]).sum()) if steady.height else 0.0
    streamed = spans.height  # requests that streamed; the stall analysis counts victims so
    requests = s.get("requests") or {}
    ttft_all = (s.get("ttft_s") or {}).get("all") or {}
    return {
        "itl_p50_s": itl.get("p50"), "itl_p99_s": itl.get("p99"), "worst_gap_s": worst_gap_s(s),
        "ttft_p90_s": ttft_all.get("p90") if ttft_all.get("p90") is not None else ttft_all.get("max"),
        "stalled_share": (stalls.get("stalled_s") or 0.0) / stream_s if stream_s else None,
        "victims_share": (stalls.get("victims") or 0) / streamed if streamed else None,
        "achieved_rps": (s.get("throughput") or {}).get("requests_per_s"),
        "output_tokens_per_s": (s.get("throughput") or {}).get("output_tokens_per_s"),
        "failed_requests": float((requests.get("error") or 0) + (requests.get("timeout") or 0)),
        "requests": float(requests.get("total") or 0), "window_s": run.window.seconds,
        **{k: (s.get("offered") or {}).get(k) for k in ("offered_rps", "arrivals", "expected_arrivals", "count_noise")}}


def _budget_checks(figures: dict[str, float | None], budget: StallBudget) -> list[tuple[str, str, str, bool]]:
    """The stall budget's checks, as (what missed, name, figure, ok); a figure not present is not a miss."""
    from itlbench.report.style import fmt_s

    out = []
    worst, share, victims = figures["worst_gap_s"], figures["stalled_share"], figures["victims_share"]
    if budget.worst_s is not None:
        out.append((f"worst gap {fmt_s(worst)} > {fmt_s(budget.worst_s)}", "worst gap (stall budget)", "itl_s",
                    worst is None or worst <= budget.worst_s))
    if budget.stalled is not None:
        out.append((f"stalled {(share or 0):.1%} of stream time > {budget.stalled:.1%}", "stalled share (stall budget)",
                    "stalls", share is None or share <= budget.stalled))
    if budget.victims is not None:
        out.append((f"{(victims or 0):.0%} of requests stalled > {budget.victims:.0%}", "requests stalled (stall "
                    "budget)", "stalls", victims is None or victims <= budget.victims))
    return out


def judge_run(run_dir: Path, slo: str | None, budget: StallBudget) -> RunJudgement:
    """A finished run against the SLOs and the stall budget (the compare verdict's checks, plus stalls)."""
    from itlbench.report.queueing import queueing_sentence
    from itlbench.report.slo_checks import slo_checks
    from itlbench.report.style import fmt_s

    run = load_run(run_dir)
    s = run.summary
    figures = _figures(run)
    checks = [(f"{c.what} {fmt_s(c.value_s)} > {fmt_s(c.target_s)}", c.what, c.figure, c.ok)
              for c in slo_checks(run, parse_slo(slo))]  # (what missed, name, the summary figure, ok)
    if figures["failed_requests"]:
        checks.insert(0, (f"{figures['failed_requests']:.0f} requests failed", "requests", "requests", False))
    if not figures["requests"]:
        checks.insert(0, ("no request finished", "requests", "requests", False))
    checks += _budget_checks(figures, budget)
    why, withdrawn = unmeasured(s)
    missed = [(what, fig) for what, _, fig, ok in checks if not ok and fig not in withdrawn]
    for fig in withdrawn:
        figures.update(dict.fromkeys(UNMEASURED_FIGURES[fig]))
    doubted = [r for r in _doubted(s, [fig for _, fig in missed]) if r not in why]
    return RunJudgement(run_dir, figures, [what for what, _ in missed], doubted,
                        queueing=queueing_sentence(s), rate_unit=(s.get("offered") or {}).get("unit"),
                        not_judged=[name for _, name, fig, _ in checks if fig in withdrawn], unmeasured=why)


def _doubted(summary: dict[str, Any], missed_figures: list[str]) -> list[str]:
    """The run's validity reasons where every missed figure is one they affect; else []."""
    validity = summary.get("validity") or {}
    affected = set(validity.get("affected") or [])
    if summary.get("valid", True) or not missed_figures or not set(missed_figures) <= affected:
        return []
    return list(validity.get("reasons") or ["the run's validity checks failed"])
