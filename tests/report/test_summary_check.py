"""summary.json damaged or edited by hand, as `report` and `compare` read it: one line naming the member and
the command that writes it again (each was a TypeError or OverflowError traceback), nothing in the run changed;
a newer itlbench's members and null sections are read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.analysis.summary import analyze_run
from itlbench.cli import app
from itlbench.errors import ConfigError
from itlbench.report.summary_check import check_summary
from tests.support.report_runs import build_run

MADE = {"itl_s": {"p99": 0.02, "max": 0.5}, "valid": True, "stalls": {"count": 4, "attribution": [{"cause": "x"}]},
        "requests": {"total": 5}, "reasoning": None}


@pytest.mark.parametrize(("disk", "named"), [
    ({"itl_s": "fast"}, "itl_s is 'fast' (text), where the records give an object"),
    ({"itl_s": {"p99": "0.1"}}, "itl_s.p99 is '0.1' (text), where the records give a number"),
    ({"valid": "yes"}, "valid is 'yes' (text), where the records give true or false"),
    ({"requests": [1]}, "requests is [1] (a list), where the records give an object"),
    ({"itl_s": {"p99": float("nan")}}, "itl_s.p99 is nan, not a finite number"),
    ({"itl_s": {"max": float("inf")}}, "itl_s.max is inf, not a finite number"),
    ({"itl_s": {"max": 10**400}}, "itl_s.max is an integer of 401 digits, not a finite number"),
    ({"stalls": {"attribution": [{"cause": 7}]}}, "stalls.attribution[0].cause is 7 (a number), where the records "
     "give text"),
], ids=["object-text", "number-text", "bool-text", "object-list", "nan", "inf", "huge-int", "in-a-list"])
def test_a_member_the_report_cannot_read_is_named(disk: dict, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_summary(disk, MADE, "runs/r1")
    assert str(info.value) == (f"runs/r1/summary.json: {named} (run `itlbench analyze runs/r1` to write it again "
                               "from the run's records)")


def test_a_newer_summary_and_null_sections_are_read() -> None:
    check_summary({"itl_s": {"p99": 0.1, "p9999": 0.3}, "schema": 99, "stalls": None, "reasoning": {"requests": 2},
                   "requests": {"total": 10**300}}, MADE, "r")


@pytest.mark.parametrize("command", ["report", "compare"])
def test_report_and_compare_refuse_a_damaged_summary_and_change_nothing(tmp_path: Path, command: str) -> None:
    run = build_run(tmp_path / "run")
    summary = analyze_run(run)
    summary["itl_s"]["max"] = 10**400  # was: OverflowError in report/durations.fmt_s
    (run / "summary.json").write_text(json.dumps(summary))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    out = tmp_path / "cmp"
    args = [command, str(run)] + (["--out", str(out)] if command == "compare" else [])
    result = CliRunner().invoke(app, args, terminal_width=400)
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [
        f"error: {run}/summary.json: itl_s.max is an integer of 401 digits, not a finite number (run `itlbench "
        f"analyze {run}` to write it again from the run's records)"]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert not out.exists()


def test_a_part_cut_short_since_the_summary_was_written_is_named_and_its_numbers_left_out(tmp_path: Path) -> None:
    """The report showed summary.json's numbers (every chunk) beside figures of half of them, and did not say a
    record file was left out: the summary it draws is now the records' own, which names the file."""
    import polars as pl

    from itlbench.report.data import load_run

    run = build_run(tmp_path / "run")
    (run / "summary.json").write_text(json.dumps(analyze_run(run)))
    [part] = sorted((run / "chunks").glob("*.parquet"))
    chunks = pl.read_parquet(part)
    chunks.head(chunks.height // 2).write_parquet(part)
    cut = run / "chunks" / "part-00777.parquet"
    chunks.tail(chunks.height - chunks.height // 2).write_parquet(cut)
    cut.write_bytes(cut.read_bytes()[:200])
    whole = json.loads((run / "summary.json").read_text())
    summary = load_run(run).summary
    assert summary["unreadable_parts"] == ["chunks/part-00777.parquet"]
    assert summary["itl_s"]["count"] < whole["itl_s"]["count"]
    assert json.loads((run / "summary.json").read_text()) == whole  # the report reads, never rewrites it
