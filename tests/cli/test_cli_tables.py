"""Every table the command line prints stays whole when piped into an 80-column pipe (no TTY, COLUMNS=80):
no cell or header cut to `…`, no line past 80 columns; and `--json` beside each gives the same figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.report.roofline import _si, _time
from itlbench.report.tables import TextTable, layout, print_table
from tests.support.report_runs import build_run

runner = CliRunner(env={"COLUMNS": "80"})


def _whole(output: str) -> None:
    assert "…" not in output, output
    longest = max(output.splitlines(), key=len)
    assert len(longest) <= 80, f"{len(longest)} columns: {longest!r}"


def _invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_roofline_tables_are_whole_at_80_columns_and_match_the_json() -> None:
    table = _invoke("roofline")
    _whole(table)
    doc = json.loads(_invoke("roofline", "--json"))
    assert [p["case"] for p in doc["phases"]][:3] == ["prefill 2k", "prefill 32k", "decode batch 1 @ 2k"]
    for case in ("prefill 2k", "prefill 32k", "decode batch 1 @ 2k"):
        assert case in table
    for p in doc["phases"]:  # every figure of the step table, as the JSON has it
        for cell in (_si(p["gemm_flops"], "FLOP"), _si(p["bytes"], "B"), _si(p["achievable_flop_per_s"], "FLOP/s"),
                     _time(p["roofline_time_s"]), _time(p["estimated_time_s"]), p["bound"]):
            assert cell in table, cell
    for g in doc["gpus"]:
        assert _time(g["prefill_s"]) in table and f"{g['kv_capacity_tokens']:,}" in table
    assert {g["gpu"] for g in doc["gpus"]} == {"h100", "h200", "a100", "l40s", "rtx4090"}


def test_workloads_table_is_whole_at_80_columns() -> None:
    table = _invoke("workloads")
    _whole(table)
    rows = json.loads(_invoke("workloads", "--json"))
    for row in rows:  # each name and both means stand whole (the trace's are "from trace")
        line = next(ln for ln in table.splitlines() if ln.split() and ln.split()[0] == row["name"])
        means = [str(row[k]) if row[k] is not None else "from trace" for k in ("mean_in", "mean_out")]
        assert all(m in line for m in means), line


def test_analyze_table_is_whole_and_json_has_its_figures(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    table = _invoke("analyze", str(run))
    _whole(table)
    out = runner.invoke(app, ["analyze", str(run), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["run_dir"] == str(run)
    itl = doc["summary"]["itl_s"]
    assert f"{itl['p99'] * 1e3:,.1f}" in table and str(itl["count"]) in table
    assert doc["summary"] == json.loads((run / "summary.json").read_text())


def test_compare_table_is_whole_and_json_has_its_rows(tmp_path: Path) -> None:
    runs = [str(build_run(tmp_path / "long")), str(build_run(tmp_path / "short", stall_scale=0.1))]
    table = _invoke("compare", *runs, "--out", str(tmp_path / "cmp"))
    _whole(table)
    out = runner.invoke(app, ["compare", *runs, "--out", str(tmp_path / "cmp2"), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert [Path(r["run_dir"]).name for r in doc["rows"]] == ["long", "short"]
    assert doc["rows"][0]["worst_gap_s"] > 1.4 > 0.2 > doc["rows"][1]["worst_gap_s"]
    assert doc["verdict"] and doc["report"].endswith("report.html")
    assert "(long)" in table and "(short)" in table


def _console(width: int) -> Console:
    return Console(width=width, force_terminal=False, color_system=None, record=True)


def test_a_wide_table_turns_on_its_side_and_a_narrow_one_does_not() -> None:
    wide = TextTable("steps", ["case", *(f"figure {i}" for i in range(10))])
    wide.add_row("prefill 32k", *(f"{i},234.5 TFLOP" for i in range(10)))
    wide.add_row("decode batch 32", *(f"{i}.25 ms" for i in range(10)))
    console = _console(80)
    shown = layout(console, wide)
    assert shown.columns == ["case", "prefill 32k", "decode batch 32"] and len(shown.rows) == 10
    print_table(console, wide)
    text = console.export_text()
    _whole(text)
    assert "9,234.5 TFLOP" in text and "figure 9" in text
    assert layout(_console(400), wide) is wide, "a table that fits is printed as it is"


def test_a_table_that_fits_no_way_folds_instead_of_cutting() -> None:
    prose = TextTable("notes", ["name", "notes"], turnable=False)
    prose.add_row("x", "a_single_word_longer_than_any_terminal_" * 3)
    console = _console(40)
    print_table(console, prose)
    text = console.export_text()
    assert "…" not in text and "".join(text.split()).count("a_single_word_longer_than_any_terminal_") == 3


def test_a_row_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        TextTable("t", ["a", "b", "c"]).add_row("1", "2")


@pytest.mark.parametrize("command", ["run", "analyze", "compare", "sweep", "workloads", "calibrate", "roofline"])
def test_every_command_that_prints_a_table_takes_json(command: str) -> None:
    shown = " ".join(_invoke(command, "--help").split())
    assert "--json" in shown and "--as-json" not in shown
    if command == "run":  # an Annotated alias beside the engine options keeps its help
        assert "OpenTelemetry" in shown
