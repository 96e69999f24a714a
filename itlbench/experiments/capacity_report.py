"""The `itlbench capacity` report: the answer, the search's points in the order run, and the curve."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np

from itlbench.analysis.goodput import ClassSlo, parse_slo
from itlbench.experiments.capacity import CapacityPlan, CapacityResult, SearchPoint
from itlbench.experiments.capacity_answer import answer_line
from itlbench.experiments.capacity_offered import mean_of, point_offered
from itlbench.report.document import Callout, Document, Section, Table, Written, write_document
from itlbench.report.figure_spec import FigureSpec
from itlbench.report.slos import slo_text
from itlbench.report.style import fmt_s, new_figure, seconds_yaxis, tidy

MET, MISSED, NOT_JUDGED = "#2a9d4b", "#c0392b", "#999999"


def _share(v: float | None) -> str:
    return "—" if v is None else f"{v:.1%}"


def _met_cell(pt: SearchPoint) -> str:
    """yes / NO, or why the point has no verdict the search used (cut short, or nothing in its window)."""
    if pt.interrupted:
        return "cut short"
    if pt.empty:
        return "measured nothing"
    if pt.not_judged:
        return "not judged"
    return "yes" if pt.met else "NO"


def _what_missed(pt: SearchPoint) -> str:
    """The point's misses (three at most), or which checks went unjudged and why, in a few words."""
    misses = sorted({m for r in pt.counted for m in r.misses})
    if pt.not_judged:
        return pt.not_judged_note
    return "; ".join(misses[:3]) + (" …" if len(misses) > 3 else "")


def points_table(result: CapacityResult) -> Table:
    rate = result.plan.axis == "rate"  # an open-loop search: what each point offered beside its nominal rate
    rows = []
    for i, pt in enumerate(result.points, 1):
        f = [r.figures for r in pt.counted]
        again = len(pt.runs) - len(pt.counted)
        runs = f"{len(pt.counted)}" + (f" (+{again} disturbed, run again)" if again else "")
        offered = [] if not rate else ["—" if (o := point_offered(pt)) is None else f"{o:.2f}"]
        rows.append([str(i), result.plan.fmt(pt.load), *offered, pt.phase, runs, _met_cell(pt),
                     _mean_and_worst([x["itl_p99_s"] for x in f]), _mean_and_worst([x["worst_gap_s"] for x in f]),
                     _mean_and_worst([x["ttft_p90_s"] for x in f]), _share(mean_of([x["stalled_share"] for x in f])),
                     _share(mean_of([x["victims_share"] for x in f])),
                     "—" if mean_of([x["achieved_rps"] for x in f]) is None
                     else f"{mean_of([x['achieved_rps'] for x in f]):.2f}",
                     _what_missed(pt)])
    offered_col = "offered sessions/s" if result.unit == "sessions/s" else "offered req/s"
    return Table(["#", result.plan.axis, *([offered_col] if rate else []), "phase", "runs", "met", "ITL p99",
                  "worst gap", "TTFT p90", "stalled", "requests stalled", "achieved req/s", "what missed"], rows,
                 "Every point of the search in the order it ran (figures: mean over the point's runs, the "
                 "highest run's after it where runs differ, since a point meets only when every run does; a run that missed while the client's own validity checks "
                 "failed is run again and left out; not judged: a point whose ITL the runs' validity checks "
                 "withdrew as never measured (tokens arrived together), shown as —, which neither meets nor "
                 "misses; stalled: stalled time as a share of the steady streams' "
                 "streaming time; requests stalled: the share of the streamed requests that stalled at least once"
                 + (f"; rate is the nominal --rate{_sessions_note(result)}, offered the arrivals each run's window "
                    "held over its length" if rate else "") + ")", align_right_from=1)


def _sessions_note(result: CapacityResult) -> str:
    """Where --rate counted agent sessions: what arrives, and that achieved req/s counts their turns."""
    if result.unit != "sessions/s":
        return ""
    return (" in sessions/s (agent sessions: each runs its turns closed-loop once it arrives, and achieved req/s "
            "counts those turns)")


def _mean_and_worst(values: list[float | None]) -> str:
    """`38.6 ms (max 41.6 ms)`: the mean alone could read under a target one run missed."""
    present = [v for v in values if v is not None]
    mean = mean_of(present)
    if len(present) < 2 or fmt_s(max(present)) == fmt_s(mean):
        return fmt_s(mean)
    return f"{fmt_s(mean)} (max {fmt_s(max(present))})"


PANELS = ((("itl_p99_s", "o", "ITL p99"), ("worst_gap_s", "s", "worst gap")), (("ttft_p90_s", "^", "TTFT p90"),))
ITL_SERIES = {"p99": "ITL p99", "max": "worst gap"}  # the figure an ITL target is judged on, as the curve names it


def judged_itl_targets(plan: CapacityPlan) -> list[tuple[str, float, bool]]:
    """The ITL targets the search judged each run's pooled gaps against, as compare.slo_checks reads them: every
    one of the default class (p99, max); (stat, seconds, whether it is the default)."""
    slos = parse_slo(plan.slo)
    default = slos.default.itl_targets == ClassSlo().itl_targets
    return [(stat, target, default) for stat, target in slos.default.itl_targets.items() if target is not None]


def curve_figure(result: CapacityResult) -> FigureSpec:
    axis = result.plan.axis
    itls = judged_itl_targets(result.plan)
    budget = result.plan.budget.worst_s
    marks = []
    for stat, _, _ in itls:
        marks.append(f"the {ITL_SERIES.get(stat, 'ITL ' + stat)} target the runs were judged against")
    if budget is not None:
        marks.append("the stall budget's worst gap")
    spec = FigureSpec("capacity_curve", "The search's curve",
                      f"Each point the search ran, by {axis}: above, ITL p99 (circles) and the worst gap (squares); "
                      "below, TTFT p90 (triangles); each the mean over the point's runs, green where the point met "
                      "every target, red where it missed, grey where its ITL could not be measured (not judged: "
                      "no ITL drawn), with a bar from its lowest run to its highest where it ran more than once (a "
                      "point meets only when every run does). The dashed line is the answer"
                      + (f"; the dotted line{' is' if len(marks) == 1 else 's are'} {' and '.join(marks)}" if marks else "")
                      + ". The TTFT targets are judged per prompt bucket on each bucket's p99 (or its slowest "
                      "request), not on the pooled p90 drawn, so they are listed above and not drawn.")
    pts = sorted((p for p in result.points if p.runs), key=lambda p: p.load)
    if not pts:
        spec.note = "No point finished."
        return spec
    fig = new_figure(5.4)
    gaps_ax, ttft_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    for ax, series in zip((gaps_ax, ttft_ax), PANELS, strict=True):
        drawn: list[float] = []
        for key, marker, name in series:
            ys = [mean_of([r.figures[key] for r in p.counted]) for p in pts]
            ax.plot([p.load for p in pts], [np.nan if y is None else y for y in ys], color="#999999", linewidth=0.8)
            for p, y in zip(pts, ys, strict=True):
                if y is None:
                    continue
                colour = MET if p.met else NOT_JUDGED if p.not_judged else MISSED
                runs = [v for r in p.counted if (v := r.figures.get(key)) is not None]
                if len(runs) > 1 and min(runs) < max(runs):
                    ax.vlines(p.load, min(runs), max(runs), color=colour, linewidth=1.4, zorder=2)
                ax.scatter([p.load], [y], marker=marker, color=colour, zorder=3, s=28)
                drawn += runs
            ax.plot([], [], marker, color="#555555", linestyle="none", label=name)
        for stat, value, default in itls if ax is gaps_ax else ():
            ax.axhline(value, color="#333333", linestyle=":" if stat == "p99" else "-.", linewidth=1.0,
                       label=f"SLO {ITL_SERIES.get(stat, 'ITL ' + stat)} {fmt_s(value)}" + (" (default)" if default else ""))
            drawn.append(value)
        if ax is gaps_ax and budget is not None:
            ax.axhline(budget, color=MISSED, linestyle=":", linewidth=0.8,
                       label=f"stall budget (worst gap) {fmt_s(budget)}")
            drawn.append(budget)
        if result.max_load is not None:
            ax.axvline(result.max_load, color=MET, linestyle="--", linewidth=1.0, label="capacity")
        seconds_yaxis(ax, drawn)
        ax.legend(fontsize=8, frameon=False)
        tidy(ax)
    ttft_ax.set_xlabel({"rate": f"nominal rate ({result.unit})", "streams": "steady streams",
                        "time-scale": "--time-scale (× the trace's recorded speed)"}[axis])
    spec.figure = fig
    return spec


def rerun_lines(result: CapacityResult) -> list[str]:
    """Which runs were run again, and the validity reason that put each one's miss in doubt."""
    again = [(pt, r) for pt in result.points for r in pt.runs if r.rerun]
    return [f"{result.plan.axis} {result.plan.fmt(pt.load)}, {r.run_dir.name}: missed ({'; '.join(r.misses)}); "
            f"its validity checks said: {'; '.join(r.disturbed)}; run again." for pt, r in again]


def not_judged_lines(result: CapacityResult) -> list[str]:
    """Which runs' checks went unjudged, and the validity reasons in full that withdrew their figures."""
    return [f"{result.plan.axis} {result.plan.fmt(pt.load)}, {r.run_dir.name}: not judged on "
            f"{', '.join(r.not_judged)}; its validity checks said: {'; '.join(r.unmeasured)}."
            for pt in result.points for r in pt.runs if r.not_judged]


def recorded_sim_check(result: CapacityResult) -> dict[str, Any] | None:
    """The simulated preset's error bar as the search's runs recorded it (harness/virtual_run.py); None when the
    engine was not simulated."""
    for run in (r for p in result.points for r in p.runs):
        with contextlib.suppress(OSError, ValueError):
            check = json.loads((run.run_dir / "run.json").read_text()).get("sim_check")
            if isinstance(check, dict):
                return check
    return None


def sim_callouts(result: CapacityResult) -> list[Callout]:
    """A simulated answer says how far to trust the simulator there, warned as a run's report is."""
    check = recorded_sim_check(result)
    if check is None:
        return []
    from itlbench.sim.accuracy import check_is_loose, check_line  # simulated searches only

    return [Callout("warn" if check_is_loose(check) else "info", f"How far to trust the simulator: {check_line(check)}.")]


def judged_slos(result: CapacityResult) -> str:
    """The SLOs the search judged its runs against, every target spelled out (as the runs' summaries recorded them)."""
    for run in (r for pt in result.points for r in pt.runs):
        with contextlib.suppress(OSError, ValueError):
            text = slo_text(json.loads((run.run_dir / "summary.json").read_text()))
            if text:
                return text
    return f"--slo {result.plan.slo}" if result.plan.slo else "the defaults"


def write_capacity_report(result: CapacityResult, out_dir: Path, command: str, target: str) -> Written:
    p = result.plan
    line = answer_line(result)
    targets = [f"SLOs: {judged_slos(result)}", f"stall budget: {p.budget.spec or 'none'}",
               "resolution: one stream" if p.axis == "streams" else f"resolution {p.resolution:.0%}",
               f"{p.repeat} run{'' if p.repeat == 1 else 's'} per point near the boundary"]
    doc = Document(f"Capacity by {p.axis}: {target}",
                   f"{len(result.points)} points · written {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
                   [Callout("info" if result.exit_code == 0 and result.not_judged_at is None else "warn", line),
                    *sim_callouts(result)],
                   [Section("Answer").add(line, "; ".join(targets) + ".",
                                          "The search doubled the load until a point missed, then bisected "
                                          "between the highest point met and the lowest missed; points near the "
                                          "boundary run several times and meet only when every run meets, and "
                                          "the answer itself is re-run before it is reported."
                                          + (f" The rate is the nominal --rate{_sessions_note(result)}, which "
                                             "scales one seeded Poisson "
                                             "arrival sequence; what a run offered is the arrivals its window held "
                                             "over the window's length, which in a short window can sit well "
                                             "below the nominal rate." if p.axis == "rate" else "")),
                    Section("The search").add(points_table(result), curve_figure(result),
                                              *rerun_lines(result), *not_judged_lines(result))], command)
    return write_document(doc, out_dir)
