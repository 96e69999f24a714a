"""The command line as a user meets it: listings, clear errors with exit code 2, analyze."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.cli.help_format import flowing
from itlbench.rundir.schema import frame
from itlbench.rundir.store import RunStore

runner = CliRunner()
MS = 1_000_000


def _flat(text: str) -> str:
    """Rich wraps long lines to the terminal; compare words, not line breaks."""
    return " ".join(text.split())


def _paragraphs() -> dict[str, list[str]]:
    """Each command's docstring paragraphs, each joined into one line as a reader reads it."""
    return {info.name or info.callback.__name__: [" ".join(p.split()) for p in inspect.getdoc(info.callback).split("\n\n")]
            for info in app.registered_commands}


def test_help_flows_instead_of_keeping_the_docstrings_line_breaks():
    """Given room, every paragraph of a command's help is one line, in the command list and in its --help
    (typer 0.29 kept the docstring's breaks: 'runs in' ending a line at any width)."""
    wide = {"COLUMNS": "1000"}
    listing = runner.invoke(app, ["--help"], env=wide).output.splitlines()
    for name, paragraphs in _paragraphs().items():
        assert any(paragraphs[0] in line for line in listing), name
        shown = runner.invoke(app, [name, "--help"], env=wide).output.splitlines()
        for paragraph in paragraphs:
            assert any(paragraph in line for line in shown), (name, paragraph)


@pytest.mark.parametrize("width", ["80", "88"])
def test_option_help_folds_a_long_word_instead_of_cutting_it(width: str):
    """Each `…` in --help is one the help text itself holds: none from rich cutting a URL or an SLO example."""
    import typer.main

    for name, command in typer.main.get_command(app).commands.items():
        written = sum((p.help or "").count("…") for p in command.params) + (command.help or "").count("…")
        shown = runner.invoke(app, [name, "--help"], env={"COLUMNS": width}).output
        assert shown.count("…") == written, (name, [line for line in shown.splitlines() if "…" in line])


def test_a_flag_has_no_type_in_help_as_if_it_took_a_value():
    """`--json <bool>` read as `--json true`; a value-taking option keeps its type."""
    shown = runner.invoke(app, ["selftest", "--help"], env={"COLUMNS": "120"}).output
    assert "<bool>" not in shown and "<float>" in shown
    assert "<bool>" not in runner.invoke(app, ["--help"], env={"COLUMNS": "120"}).output


def test_flowing_keeps_paragraphs_and_click_verbatim_blocks():
    assert flowing("One\n  two.\n\nThree\nfour.") == "One two.\n\nThree four."
    assert flowing("Lead.\n\n\b\na\nb") == "Lead.\n\n\b\na\nb"
    assert flowing(None) is None


def test_workloads_lists_the_catalog_as_table_and_json():
    table = runner.invoke(app, ["workloads"], terminal_width=160)
    assert table.exit_code == 0, table.output
    for name in ("chat-short", "chat", "rag", "summarization", "code", "agent", "trace"):
        assert name in table.output
    assert "8000:400" not in table.output  # the means are said once, in their own columns
    agent = next(line for line in table.output.splitlines() if line.lstrip().startswith("agent"))
    assert "means per turn" in agent
    listing = runner.invoke(app, ["workloads", "--json"])
    rows = json.loads(listing.stdout)
    assert {r["name"]: r["in_out"] for r in rows}["rag"] == "8000:400"
    means = {r["name"]: (r["mean_in"], r["mean_out"]) for r in rows}
    assert means["rag"] == (8000, 400) and means["trace"] == (None, None)  # numbers, not their text


@pytest.mark.parametrize(("args", "flag"), [
    (["--inject", "32q"], "--inject"),
    (["--workload", "nope"], "--workload"),
    (["--chunk-budget", "0"], "--chunk-budget"),
    (["--chunk-budget", "lots"], "--chunk-budget"),
    (["--policy", "fifo"], "--policy"),
    (["--mixed"], "--mixed"),
    (["--model", "no-such-preset"], "--model"),
    (["--inject", "100k"], "--inject"),
    (["--max-model-len", "100000"], "--max-model-len"),
    (["--slo", "ttft:le9k=1s"], "--slo"),
    (["--duration", "0"], "--duration"),
    (["--endpoint", "not-a-url", "--model", "m"], "--endpoint"),
    (["--endpoint", "http://127.0.0.1:9/v1"], "--endpoint"),  # nothing listens: --model is then not the problem
    (["--workload", "trace"], "--trace"),
    (["--api", "chat"], "--api"),  # the bundled engine takes token ids: every request failed, exit 1
    (["--engine", "sim", "--model", "llama-3.1-8b", "--api", "chat"], "--api"),
    (["--engine", "sim", "--model", "llama-3.1-8b", "--torch-threads", "1"], "--torch-threads"),  # was ignored
    (["--engine", "sim", "--model", "llama-3.1-8b", "--engine-process"], "--engine-process"),
    (["--engine", "sim", "--device", "cuda"], "--device"),  # was ignored: the simulator computes nothing
    (["--engine", "sim", "--model", "llama-3.1-8b", "--disaggregate", "--prefill-gpu", "zz"], "--prefill-gpu"),
])
def test_bad_run_flags_exit_2_naming_the_flag_and_leave_nothing(tmp_path, args, flag):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--out", str(out), *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert f"error: {flag}" in _flat(result.output)
    assert "Traceback" not in result.output
    assert not out.exists(), "a rejected run must not leave a directory behind"


@pytest.mark.parametrize(("held", "said"), [(["run.json", "chunks"], "already holds a run"),
                                              (["w.out", "w.err"], "already holds files (w.err, w.out)")])
def test_out_that_holds_something_is_refused_saying_what_it_holds(tmp_path, held, said):
    out = tmp_path / "run"
    out.mkdir()
    for name in held:
        (out / name).write_text("x")
    result = runner.invoke(app, ["run", "--out", str(out), "--duration", "1"], terminal_width=300)
    assert result.exit_code == 2, result.output
    assert f"error: --out: {out} {said} (choose a new or empty directory)" in _flat(result.output)
    assert sorted(p.name for p in out.iterdir()) == sorted(held), "nothing there may be touched"


def test_an_error_prints_the_users_text_as_typed_not_as_emoji(tmp_path):
    """rich reads `:a:` as an emoji code; an error must quote what the user typed."""
    result = runner.invoke(app, ["run", "--out", str(tmp_path / "run"), "--workload", "fixed:a:b"], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "'fixed:a:b'" in _flat(result.output)


def test_analyze_recomputes_summary_from_records(tmp_path: Path):
    store = RunStore(tmp_path)
    chunks = [{"request_id": "a", "index": i, "t_ns": (1000 + 20 * i) * MS, "n_tokens": 1} for i in range(11)]
    store.add_many("chunks", chunks)
    store.add("requests", {"request_id": "a", "server_request_id": "x", "cls": "chat", "injected": False,
                           "prompt_tokens": 100, "scheduled_ns": 990 * MS, "sent_ns": 990 * MS,
                           "first_token_ns": 1000 * MS, "status": "ok"})
    store.close()
    store.write_json("run.json", {"run_start_ns": 0, "measure_start_ns": 500 * MS, "end_ns": 2000 * MS})
    result = runner.invoke(app, ["analyze", str(tmp_path)], terminal_width=160)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["itl_s"]["count"] == 10 and summary["itl_s"]["p50"] == pytest.approx(0.020)
    assert summary["ttft_s"]["le128"]["max"] == pytest.approx(0.010)
    assert summary["ttft_s"]["le128"]["p50"] is None  # one request: withheld, and the table says why
    assert "too few requests" in _flat(result.output)
    assert result.stdout.strip().splitlines()[-1] == str(tmp_path)


def test_analyze_rejects_a_directory_without_run_json(tmp_path):
    result = runner.invoke(app, ["analyze", str(tmp_path)], terminal_width=400)
    assert result.exit_code == 2 and "has no run.json" in _flat(result.output)


@pytest.mark.parametrize("text", ["not json", "[1]", '{"config": 5, "engine": "x"}'])
@pytest.mark.parametrize("command", ["analyze", "calibrate", "report"])
def test_a_hand_broken_run_json_is_a_one_line_error(tmp_path: Path, text: str, command: str):
    (tmp_path / "run.json").write_text(text)
    result = runner.invoke(app, [command, str(tmp_path)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "Traceback" not in result.output


def test_frame_keeps_the_schema_for_partial_rows():
    df = frame("requests", [{"request_id": "a"}])
    assert df["status"].to_list() == [None] and df.schema["scheduled_ns"].is_integer()


def test_commands_keep_their_own_options_settings_beside_the_engine_flags():
    """engine_options rewrites a command's signature; its own typer.Option settings (help, envvar) survive."""
    import typer as _typer

    from itlbench.cli import app as _app

    commands = _typer.main.get_command(_app).commands  # type: ignore[attr-defined]
    for name in ("run", "phases"):
        key = next(p for p in commands[name].params if p.name == "api_key")
        assert key.envvar == "ITLBENCH_API_KEY" and key.help, name


def test_no_report_leaves_the_records_and_summary_and_report_draws_them_later(tmp_path: Path):
    """`--no-report` (scripts, sweeps' points) skips only the drawing: `itlbench report` writes it afterwards."""
    out = tmp_path / "run"
    args = ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--workload", "fixed:128:16",
            "--streams", "2", "--duration", "1", "--warmup", "0.2", "--no-report", "--out", str(out)]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["itl_s"]["count"] > 0 and "Report" not in result.output
    assert not (out / "report.html").exists() and not (out / "figures").exists()
    assert result.stdout.strip().splitlines()[-1] == str(out)
    drawn = runner.invoke(app, ["report", str(out)], terminal_width=200)
    assert drawn.exit_code == 0, drawn.output
    assert (out / "report.html").is_file() and (out / "figures" / "itl_cdf.png").is_file()


def test_a_run_aborted_in_its_warmup_says_why_keeps_its_records_and_exits_1(tmp_path: Path):
    """Every request refused (a K/V cache of one block) aborts the run before its measured window opens:
    the terminal must still say what failed and why, not only "requests: 0"."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--kv-blocks", "1",
                                 "--duration", "5s", "--no-live", "--no-report", "--out", str(out)],
                           terminal_width=400)
    text = _flat(result.output)
    assert result.exit_code == 1, result.output
    assert "Cut short: it was aborted: 50 requests in a row failed, the last with prompt: needs" in text
    assert "sent before the measured window (warm-up)" in text
    failed = pl.read_parquet(out / "requests").filter(pl.col("status") == "error").height
    assert failed >= 50 and f"{failed} of them failed" in text
    assert json.loads((out / "summary.json").read_text())["requests"]["outside_window_failed"] == failed
    drawn = runner.invoke(app, ["report", str(out)], terminal_width=400)
    html = (out / "report.html").read_text()
    assert drawn.exit_code == 0 and "This run was cut short: it was aborted" in html
    assert f"Nothing was measured: no request fell in the measured window ({failed:,} were sent in the warm-up" in html
    assert "Valid run" not in html and "No stream stalled" not in html  # no verdict on figures that are not there
    as_json = runner.invoke(app, ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--kv-blocks", "1",
                                  "--duration", "5s", "--no-live", "--no-report", "--json", "--out", str(tmp_path / "j")])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["cut_short"][0].startswith("it was aborted: 50 ")


def test_an_out_directory_that_cannot_be_made_is_a_one_line_error(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = runner.invoke(app, ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--duration", "5s",
                                 "--out", str(blocker / "run")], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert f"error: --out: cannot create {blocker / 'run'}" in _flat(result.output)
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "flag"), [(["roofline", "--compare", "h100,zz"], "--compare"),
                                          (["calibrate", "reports/none", "--base", "zz"], "--base")])
def test_a_profile_named_by_another_flag_is_an_error_naming_that_flag(args: list[str], flag: str):
    result = runner.invoke(app, args, terminal_width=400)
    assert result.exit_code == 2 and f"error: {flag}: unknown GPU or profile 'zz'" in result.output, result.output


@pytest.mark.parametrize("command", [["compare", "RUN"], ["phases", "--lengths", "1"],
                                     ["capacity", "--engine", "sim", "--model", "llama-3.1-8b"],
                                     ["sweep", "--chunk-budget", "512", "--engine", "sim", "--model", "llama-3.1-8b"]])
def test_every_out_that_cannot_be_made_is_a_one_line_error(tmp_path: Path, command: list[str]):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    if command[1] == "RUN":  # compare needs a run to read first
        run = tmp_path / "run"
        made = runner.invoke(app, ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--duration", "3s",
                                   "--no-report", "--no-live", "--out", str(run)])
        assert made.exit_code == 0, made.output
        command = [command[0], str(run)]
    result = runner.invoke(app, [*command, "--out", str(blocker / "out")], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert "error: --out: cannot create" in _flat(result.output) and "Traceback" not in result.output


SIM = ["--engine", "sim", "--model", "llama-3-8b", "--gpu", "h100", "--duration", "10"]


@pytest.mark.parametrize(("args", "flag"), [
    (["--time-scale", "nan"], "--time-scale"), (["--time-scale", "inf"], "--time-scale"),
    (["--rate", "inf"], "--rate"), (["--stall-factor", "nan"], "--stall-factor"),
    (["--stall-factor", "inf"], "--stall-factor"), (["--sim-time-scale", "inf"], "--sim-time-scale"),
    (["--kv-link-gbps", "inf", "--disaggregate"], "--kv-link-gbps"), (["--burstiness", "inf", "--rate", "2"], "--burstiness"),
    (["--kv-memory-gib", "nan"], "--kv-memory-gib"),
    (["--burstiness", "0.5"], "--burstiness"), (["--time-scale", "5"], "--time-scale"),
    (["--kv-link-gbps", "100"], "--kv-link-gbps"),
    (["--workload", "fixed:200000:10"], "--workload"), (["--workload", "fixed:8000:500"], "--workload"),
    (["--workload", "fixed:99999999999999999999:10"], "--workload"), (["--workload", "summarization"], "--workload"),
    (["--slo", "injectd/ttft=off"], "--slo"), (["--slo", "itl_p99=20ms,itl_p99=500ms"], "--slo"),
    (["--inject", "4k/30s", "--duration", "20"], "--inject"),
])
def test_bad_sim_run_flags_exit_2_naming_the_flag_and_leave_nothing(tmp_path, args, flag):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--out", str(out), *SIM, *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert f"error: {flag}" in _flat(result.output)
    assert "Traceback" not in result.output
    assert not out.exists()


def test_sim_time_scale_on_the_torch_engine_is_refused():
    from itlbench.core.engine_config import EngineConfig
    from itlbench.errors import ConfigError

    with pytest.raises(ConfigError, match="only applies to the simulated engine") as err:
        EngineConfig(engine="torch", sim_time_scale=2.0)
    assert err.value.field == "sim_time_scale"


def test_repeated_inject_flags_are_joined(tmp_path, monkeypatch):
    import itlbench.harness.orchestrate as orchestrate

    seen = {}

    def fake_run(cfg, **_):
        seen["inject"] = cfg.inject
        raise orchestrate.ConfigError("--inject", "stop here")

    monkeypatch.setattr(orchestrate, "check_run", fake_run)  # the first to be handed the run's config
    runner.invoke(app, ["run", "--out", str(tmp_path / "r"), *SIM, "--inject", "8k@2s", "--inject", "4k@6s"])
    assert seen["inject"] == "8k@2s;4k@6s"


@pytest.mark.parametrize("command", ["analyze", "report", "compare", "calibrate"])
def test_a_run_whose_parquet_files_are_gone_is_refused_not_read_as_empty(tmp_path: Path, command: str):
    """run.json counts each table's rows when the run ends: a table with none of its part files left is
    bad input (exit 2, one line naming it), not a summary and report of a run that measured nothing."""
    from tests.support.report_runs import build_run

    run = build_run(tmp_path / "run")
    doc = json.loads((run / "run.json").read_text())
    doc["compaction"] = {"requests": {"parts_before": 2, "parts_after": 1, "rows": 9},
                         "scrapes": {"parts_before": 0, "parts_after": 0, "rows": 0}}  # none recorded: none missing
    (run / "run.json").write_text(json.dumps(doc))
    for part in (run / "requests").glob("*.parquet"):
        part.unlink()
    args = [command, str(run), *([str(build_run(tmp_path / "other"))] if command == "compare" else [])]
    result = runner.invoke(app, args, terminal_width=300)
    assert result.exit_code == 2, result.output
    assert "lacks the part files run.json counts: requests/ (9 rows)" in _flat(result.output)
    assert "Traceback" not in result.output


def test_a_run_kept_without_its_records_is_refused_by_its_summarys_count(tmp_path: Path):
    """A run copied with only its JSON and report (as the committed examples are): `report` would have drawn a
    run of nothing over the real report.html."""
    from tests.support.report_runs import build_run

    run = build_run(tmp_path / "run")
    runner.invoke(app, ["analyze", str(run)])
    total = json.loads((run / "summary.json").read_text())["requests"]["total"]
    for part in run.glob("*/*.parquet"):
        part.unlink()
    result = runner.invoke(app, ["report", str(run)], terminal_width=300)
    assert result.exit_code == 2, result.output
    assert f"lacks the part files summary.json counts: requests/ ({total} requests)" in _flat(result.output)
