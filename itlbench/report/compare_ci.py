"""Repeated runs of one setting: each headline figure's mean with a 95 % interval, and which differences are real.

How: the runs of a setting are resampled with replacement 10,000 times (fixed seed, so a report is
reproducible); each resample's mean gives the bootstrap distribution, whose 2.5 and 97.5 percentiles are
the interval (`ci95`). With few runs that interval can be no wider than the runs' own range, so it is
optimistic; a difference between two settings is therefore called `significant` only when all of:
each setting has at least 3 runs, the two intervals do not overlap, the means are more than 5 standard
errors apart (Welch's, from the runs' variances) and at least 5 % apart. Simulated identical settings
(3 runs each, normal noise) pass all three about 1 % of the time per figure; a 10× difference with
3 runs each always does. Anything else is `within noise`, and the verdict then names no winner.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from itlbench.report.style import RUN_COLORS

if TYPE_CHECKING:
    from itlbench.report.data import RunData

RESAMPLES = 10_000
MIN_RUNS = 3
MIN_SEPARATION_SE = 5.0
MIN_RELATIVE = 0.05
METHOD = ("bootstrap over runs: 10,000 resamples of each setting's runs (with replacement, seed 0), 95 % "
          "percentile interval of the resampled means; significant = ≥ 3 runs each, disjoint intervals, means "
          "> 5 Welch standard errors and ≥ 5 % apart")

# (Row attribute, name in compare.json, what a reader calls it, True when higher is better)
FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("worst_s", "worst_gap_s", "worst gap", False),
    ("p50_s", "itl_p50_s", "ITL p50", False),
    ("p99_s", "itl_p99_s", "ITL p99", False),
    ("p999_s", "itl_p999_s", "ITL p99.9", False),
    ("injected_ttft_s", "injected_ttft_s", "injected TTFT", False),
    ("ttft_p99_s", "ttft_p99_s", "TTFT p99", False),
    ("out_tps", "output_tokens_per_s", "output tok/s", True),
    ("stalled_s", "stalled_s", "stalled time", False),
    ("goodput", "goodput_rps", "goodput", True),
    ("worst_not_client_s", "worst_gap_not_client_s", "worst gap not counting the client's own pauses", False),
)
# What ranks a setting's smoothness (Row.rank_s, over repeats): the worst gap the client's own pauses did not make
# where every run has that figure, else the worst gap (a run analysed before it existed).
RANKED_BY = {"worst_not_client_s": "worst_gap_not_client_s", "worst_s": "worst_gap_s"}


@dataclass(frozen=True)
class Interval:
    """A figure over a setting's runs: mean, 95 % bootstrap interval, run count, and the runs' std."""

    mean: float
    lo: float
    hi: float
    n: int
    sd: float

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n}


def bootstrap_ci(values: Sequence[float], resamples: int = RESAMPLES, seed: int = 0) -> Interval | None:
    """The mean and its 95 % percentile-bootstrap interval over `values` (None when there are none)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return None
    sd = float(x.std(ddof=1)) if x.size > 1 else 0.0
    if x.size == 1:
        return Interval(float(x[0]), float(x[0]), float(x[0]), 1, 0.0)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return Interval(float(x.mean()), float(lo), float(hi), int(x.size), sd)


@dataclass(frozen=True)
class Difference:
    """Setting b against setting a on one figure."""

    a: str
    b: str
    figure: str
    delta: float  # mean(b) - mean(a)
    significant: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "figure": self.figure, "difference": self.delta,
                "verdict": "significant" if self.significant else "within noise", "why": self.reason}


def judge(a: Interval, b: Interval) -> tuple[bool, str]:
    """Whether b's figure differs from a's beyond the noise, and in a few words why (not)."""
    if min(a.n, b.n) < MIN_RUNS:
        return False, f"too few runs ({min(a.n, b.n)}; --repeat {MIN_RUNS} or more for a verdict)"
    if a.hi >= b.lo and b.hi >= a.lo:
        return False, "the 95 % intervals overlap"
    delta = b.mean - a.mean
    se = math.sqrt(a.sd ** 2 / a.n + b.sd ** 2 / b.n)
    if se > 0 and abs(delta) <= MIN_SEPARATION_SE * se:
        return False, f"only {abs(delta) / se:.1f} standard errors apart"
    scale = max(abs(a.mean), abs(b.mean))
    if scale > 0 and abs(delta) < MIN_RELATIVE * scale:
        return False, f"less than {MIN_RELATIVE:.0%} apart"
    return True, "disjoint intervals" + (f", {abs(delta) / se:.0f} standard errors apart" if se > 0 else "")


def difference(a_label: str, a: Interval, b_label: str, b: Interval, figure: str) -> Difference:
    significant, why = judge(a, b)
    return Difference(a_label, b_label, figure, b.mean - a.mean, significant, why)


def fmt_interval(iv: Interval | None, fmt: Any) -> str:
    if iv is None:
        return "—"
    if iv.n == 1:
        return fmt(iv.mean)
    return f"{fmt(iv.mean)} [{fmt(iv.lo)}, {fmt(iv.hi)}]"


def _fmt_figure(attr: str) -> Any:
    from itlbench.report.style import fmt_s

    if attr in ("out_tps",):
        return lambda v: f"{v:,.0f}"
    if attr == "goodput":
        return lambda v: f"{v:.2f}"
    return fmt_s


def grouped(rows: Sequence[Any]) -> dict[str, list[Any]]:
    """Rows by setting (a compare Row's `group`), in first-seen order."""
    out: dict[str, list[Any]] = {}
    for r in rows:
        out.setdefault(r.group or r.label, []).append(r)
    return out


def repeated(rows: Sequence[Any]) -> bool:
    return any(len(g) > 1 for g in grouped(rows).values())


def group_intervals(rows: Sequence[Any]) -> dict[str, dict[str, Interval | None]]:
    """Per setting, per headline figure (compare.json's name): the mean and 95 % interval over its runs."""
    return {label: {key: bootstrap_ci([getattr(r, attr) for r in group if getattr(r, attr) is not None])
                    for attr, key, _, _ in FIGURES}
            for label, group in grouped(rows).items()}


def all_differences(rows: Sequence[Any]) -> list[Difference]:
    """Every pair of settings on every figure both have."""
    ivs = group_intervals(rows)
    labels = list(ivs)
    out = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            for _, key, _, _ in FIGURES:
                x, y = ivs[a][key], ivs[b][key]
                if x is not None and y is not None:
                    out.append(difference(a, x, b, y, key))
    return out


def ci_json(rows: Sequence[Any]) -> dict[str, dict[str, dict[str, float | int] | None]]:
    return {label: {k: (iv.as_dict() if iv is not None else None) for k, iv in figs.items()}
            for label, figs in group_intervals(rows).items()}


def _iv(attr: str, iv: Interval | None) -> str:
    return fmt_interval(iv, _fmt_figure(attr))


def rank_attr(group: Sequence[Any]) -> str:
    """The Row figure that ranks a setting's runs, as `Row.rank_s` ranks one run: the worst gap not counting the
    client's own pauses where every run has it (runs of one setting rank on one figure), else the worst gap."""
    return "worst_not_client_s" if all(r.worst_not_client_s is not None for r in group) else "worst_s"


def rank_intervals(rows: Sequence[Any]) -> dict[str, tuple[Interval, Interval | None]]:
    """Per setting with a worst gap, in first-seen order: the interval that ranks it, and its worst gap's interval
    where the client's own pauses made the two differ (None where they did not)."""
    ivs = group_intervals(rows)
    out = {}
    for label, group in grouped(rows).items():
        rank, raw = ivs[label][RANKED_BY[rank_attr(group)]], ivs[label]["worst_gap_s"]
        if rank is not None:
            out[label] = (rank, raw if raw is not None and rank.mean < raw.mean else None)
    return out


def _gap(ranked: tuple[Interval, Interval | None]) -> str:
    """'45 ms [40 ms, 50 ms]', or where the client's own pauses made a worst gap, both figures."""
    rank, raw = ranked
    if raw is None:
        return _iv("worst_s", rank)
    return f"{_iv('worst_s', rank)} not counting the client's own pauses, {_iv('worst_s', raw)} with them"


def lead(rows: Sequence[Any], best: str, other: str) -> tuple[bool, str]:
    """Whether setting `best` is smoother than `other` beyond the noise, on the figure that ranks them, and why."""
    ranked = rank_intervals(rows)
    return judge(ranked[other][0], ranked[best][0])


def noise_verdict(rows: Sequence[Any]) -> list[str]:
    """The smoothest-setting sentence for repeated runs: a winner only where the difference beats the noise. Ranked
    by the mean worst gap not counting the client's own pauses, as one run is (`rank_attr`)."""
    ivs, ranked = group_intervals(rows), rank_intervals(rows)
    order = sorted(ranked, key=lambda lab: ranked[lab][0].mean)
    if len(order) < 2:
        return []
    best, second = order[0], order[1]
    b, s = ranked[best], ranked[second]
    ok, why = judge(s[0], b[0])  # `lead`'s test, on the intervals already ranked
    if not ok:
        return [f"No setting has significantly smoother streams: {best} (worst gap {_gap(b)}) and "
                f"{second} ({_gap(s)}) are within noise ({why}); means and 95 % intervals over "
                f"{b[0].n} and {s[0].n} runs."]
    text = (f"Smoothest streams: {best} (worst gap {_gap(b)}{',' if b[1] else ''} over {b[0].n} runs), significantly "
            f"below {second} ({_gap(s)}).")
    for attr, key, name, higher in (("injected_ttft_s", "injected_ttft_s", "injected TTFT", False),
                                    ("out_tps", "output_tokens_per_s", "output tok/s", True)):
        mine = ivs[best][key]
        others = [(lab, ivs[lab][key]) for lab in ivs if lab != best and ivs[lab][key] is not None]
        if mine is None or not others:
            continue
        top_label, top = (max if higher else min)(others, key=lambda t: t[1].mean)  # type: ignore[union-attr]
        assert top is not None
        if (top.mean > mine.mean) if higher else (top.mean < mine.mean):
            ok, why = judge(top, mine)
            text += (f" Its {name} {_iv(attr, mine)} against {top_label}'s {_iv(attr, top)}: "
                     + ("significantly worse." if ok else f"within noise ({why})."))
        else:
            text += f" Its {name} {_iv(attr, mine)} is also the best."
    return [text]


def ci_table(rows: Sequence[Any]) -> Any:
    from itlbench.report.document import Table

    ivs = group_intervals(rows)
    shown = FIGURES[:1] + FIGURES[2:3] + FIGURES[4:5] + FIGURES[6:7] + FIGURES[7:8]
    body = [[label, str(max((iv.n for iv in figs.values() if iv is not None), default=0)),
             *[_iv(attr, figs[key]) for attr, key, _, _ in shown]] for label, figs in ivs.items()]
    return Table(["setting", "runs", *[name for _, _, name, _ in shown]], body,
                 f"Mean [95 % interval] over each setting's runs ({METHOD})")


def differences_table(rows: Sequence[Any]) -> Any:
    """Each setting against the first, per figure: the difference of the means and whether it is real."""
    from itlbench.report.document import Table

    diffs = all_differences(rows)
    first = next(iter(grouped(rows)))
    shown = [f for f in FIGURES if f[0] in ("worst_s", "p99_s", "injected_ttft_s", "out_tps", "stalled_s")]
    body = []
    for label in list(grouped(rows))[1:]:
        cells = [f"{label} − {first}"]
        for attr, key, _, _ in shown:
            d = next((d for d in diffs if d.a == first and d.b == label and d.figure == key), None)
            if d is None:
                cells.append("—")
                continue
            sign = "+" if d.delta >= 0 else "−"
            cells.append(f"{sign}{_fmt_figure(attr)(abs(d.delta))} "
                         + ("significant" if d.significant else "within noise"))
        body.append(cells)
    return Table(["difference", *[name for _, _, name, _ in shown]], body,
                 "Each setting's mean minus the first setting's; 'significant' only where the difference beats "
                 "the run-to-run noise (see the method above)")


def swept_settings(runs: list[RunData]) -> set[str]:
    """The run settings a sweep varied on purpose (its load axes, and the seed of a simulator's repeats):
    they may differ between the runs."""
    return {k for r in runs for sweep in [r.doc.get("sweep") or {}]
            for k in [*(sweep.get("settings") or {}), *(sweep.get("varies") or [])]}


def run_model(run: RunData) -> str | None:
    """The model a run served: the bundled engine's preset or path, else the --model it asked for."""
    eng = run.doc.get("engine") or {}
    inner = eng.get("engine") or (eng.get("itlbench") or {}).get("engine") or {}
    model = inner.get("model") if isinstance(inner, dict) else None
    return str(model or (run.doc.get("config") or {}).get("model") or eng.get("served_model_name") or "") or None


def run_backend(run: RunData) -> str:
    """What produced a run's times: 'sim h100' (the cost model), 'torch cpu' (the bundled engine computing), or
    an external server's name."""
    if run.engine.external:
        return run.engine.name
    eng = run.engine_config or {}
    device = str((run.doc.get("engine") or {}).get("device") or eng.get("device") or "")
    if eng.get("engine") == "sim":
        tp = int(eng.get("tp") or 1)
        return f"sim {eng.get('gpu') or device.removeprefix('sim:') or '?'}" + (f" TP{tp}" if tp > 1 else "")
    return "torch" + (f" {device}" if device and device != "auto" else "")


def _mentions(label: str, name: str) -> bool:
    """Whether `name` is a word of `label` (a model 'm' is not in 'vLLM')."""
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", label) is not None


def _identities(runs: list[RunData], labels: list[str]) -> list[str]:
    """Per run, the engine and model where the runs differ in them and its label does not say so already:
    'llama-3.1-8b on sim h100' against 'tiny on torch cpu' (a simulated 8B and a real CPU model are not two
    settings of one server), '' where every run shares both."""
    backends, models = [run_backend(r) for r in runs], [run_model(r) for r in runs]
    show_backend, show_model = len(set(backends)) > 1, len(set(models)) > 1
    out = []
    for lab, backend, model in zip(labels, backends, models, strict=True):
        b = backend if show_backend and backend not in lab else ""
        m = model if show_model and model and not _mentions(lab, model) else ""
        out.append(f"{m} on {b}" if m and b else m or b)
    return out


def _groups(runs: list[RunData]) -> list[str]:
    """Each run's setting: its sweep point's label where a sweep wrote one, else what its engine says.
    Runs of several engines (sweeps of each, compared together) have their sweep labels prefixed by the
    engine's name, so "budget 256" of vLLM and of llama.cpp never pool into one setting; runs that differ in
    engine or model are labelled with both ("budget 2048, tiny on torch cpu")."""
    swept = [(r.doc.get("sweep") or {}).get("label") for r in runs]
    several = len({r.engine.name for r in runs}) > 1
    labels = [r.setting_label() if not lab else f"{r.engine.name}: {lab}" if several else lab
              for r, lab in zip(runs, swept, strict=True)]
    return [f"{lab}, {who}" if who else lab for lab, who in zip(labels, _identities(runs, labels), strict=True)]


def repeat_groups(runs: list[RunData], labels: list[str]) -> list[str]:
    """Runs pool into one setting only as repeats of a sweep point; any other run stands alone."""
    return [g if (r.doc.get("sweep") or {}).get("repeats", 1) > 1 else lab
            for r, g, lab in zip(runs, _groups(runs), labels, strict=True)]


def run_labels(runs: list[RunData]) -> list[str]:
    labels = _groups(runs)
    if len(set(labels)) < len(labels):  # same setting twice (machines, repeats): add which run
        labels = [f"{lab} (#{(r.doc.get('sweep') or {}).get('repeat')})" if (r.doc.get("sweep") or {}).get("repeats", 1) > 1
                  else f"{lab} ({r.name})" for lab, r in zip(labels, runs, strict=True)]
    return labels


def run_styles(labels: list[str], groups: list[str] | None) -> list[tuple[str, str | None]]:
    """(colour, legend label) per run: one colour per setting, named once, where repeats share a setting."""
    if not groups or len(set(groups)) == len(groups):
        return [(RUN_COLORS[i % len(RUN_COLORS)], lab) for i, lab in enumerate(labels)]
    order = list(dict.fromkeys(groups))
    seen: set[str] = set()
    out = []
    for g in groups:
        out.append((RUN_COLORS[order.index(g) % len(RUN_COLORS)], None if g in seen else g))
        seen.add(g)
    return out


def rows_as_dicts(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """compare.json's rows: each run's figures, the worst gap not counting the client's own pauses beside the
    worst gap (the one ranks the smoothest setting; None where the run's summary predates it)."""
    return [{"setting": r.label, "group": r.group, "run_dir": str(r.run.run_dir), "worst_gap_s": r.worst_s,
             "worst_gap_not_client_s": r.worst_not_client_s, "itl_p50_s": r.p50_s, "itl_p99_s": r.p99_s,
             "itl_p999_s": r.p999_s, "injected_ttft_s": r.injected_ttft_s, "output_tokens_per_s": r.out_tps,
             "stalls": r.stalls, "stall_events": r.stall_events, "stalled_s": r.stalled_s,
             "goodput_rps": r.goodput, "valid": r.valid, "engine": r.run.engine.name,
             "figures_from": r.run.engine.source} for r in rows]
