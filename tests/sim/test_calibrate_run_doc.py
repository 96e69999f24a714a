"""`itlbench calibrate` on a run whose run.json was damaged or written by a newer itlbench: one line naming the
member that does not read, exit 2, no profile written; members it does not know are read past."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app

runner = CliRunner()


def _lines(text: str) -> list[str]:
    return [s for s in text.splitlines() if s.strip()]


def _calibratable_run(tmp_path: Path) -> Path:
    """A run of the real engine as calibrate reads it (run.json and steps); the steps come from the simulator,
    which records the same shapes, so no torch is loaded."""
    from itlbench.core.engine_config import EngineConfig
    from itlbench.core.request import SamplingParams
    from itlbench.sim.runner import offline_engine
    from tests.support.run_dirs import write_run_dir

    sim = offline_engine(EngineConfig(model="tiny", engine="sim", gpu="h100", kv_blocks=64, max_model_len=512))
    for i in range(8):
        sim.add_request(list(range(3, 60 + 20 * i)), SamplingParams(max_tokens=4 + 3 * i, ignore_eos=True), f"r{i}")
        sim.step()
    while sim.has_unfinished():
        sim.step()
    run = write_run_dir(tmp_path / "run", sim)
    doc = json.loads((run / "run.json").read_text())
    doc["config"]["engine"]["engine"] = "torch"
    (run / "run.json").write_text(json.dumps(doc))
    return run


@pytest.mark.parametrize(("edit", "line"), [
    (lambda d: d["engine"]["model"].update(num_layers="six"),
     "engine.model does not describe a model (num_layers is 'six', not a number)"),
    (lambda d: d["engine"]["model"].pop("hidden_size"), "engine.model does not describe a model (missing 1 required"),
    (lambda d: d["engine"]["model"].update(rope_scaling="llama3"), "engine.model does not describe a model "
     "(rope_scaling is 'llama3', not an object)"),
    (lambda d: d.update(measure_start_ns="abc"), "measure_start_ns is 'abc', not an integer (nanoseconds)"),
    (lambda d: d.update(end_ns=1e400), "end_ns is inf, not an integer (nanoseconds)"),
], ids=["layers-text", "no-hidden-size", "rope-text", "window-text", "window-inf"])
def test_calibrate_names_the_run_json_member_that_does_not_read(tmp_path: Path, edit, line: str) -> None:
    """Each was a traceback (TypeError from ModelConfig, ValueError/OverflowError from int())."""
    run = _calibratable_run(tmp_path)
    doc = json.loads((run / "run.json").read_text())
    edit(doc)
    (run / "run.json").write_text(json.dumps(doc))
    result = runner.invoke(app, ["calibrate", str(run), "--base", "h100", "--out", str(tmp_path / "cal.json")],
                           terminal_width=400)
    assert result.exit_code == 2, result.output
    assert len(_lines(result.output)) == 1 and line in result.output, result.output
    assert not (tmp_path / "cal.json").exists()


def test_calibrate_reads_a_model_record_with_members_it_does_not_know(tmp_path: Path) -> None:
    """A newer itlbench's run.json may record more of the model: the shapes it knows are enough to price steps."""
    run = _calibratable_run(tmp_path)
    doc = json.loads((run / "run.json").read_text())
    doc["engine"]["model"]["attention_sinks"] = 4
    (run / "run.json").write_text(json.dumps(doc))
    result = runner.invoke(app, ["calibrate", str(run), "--base", "h100", "--out", str(tmp_path / "cal.json"),
                                 "--json"], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "cal.json").read_text())["name"] == "calibrated"


def test_calibrate_out_never_replaces_a_file_that_is_not_a_profile(tmp_path: Path) -> None:
    """`calibrate RUN --out RUN/run.json` overwrote the run's record with the profile; an earlier profile is still
    replaced (the default calibrated.json is written again on every calibration)."""
    run = _calibratable_run(tmp_path)
    record = (run / "run.json").read_bytes()
    args = ["calibrate", str(run), "--base", "h100", "--out"]
    result = runner.invoke(app, [*args, str(run / "run.json")], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == [f"error: --out: {run / 'run.json'} exists and is not a hardware profile: "
                                     "calibrate would replace it (name a new file, or a profile an earlier "
                                     "`itlbench calibrate` wrote)"]
    assert (run / "run.json").read_bytes() == record
    result = runner.invoke(app, [*args, str(run)], terminal_width=400)
    assert result.exit_code == 2 and f"--out: {run} is a directory" in result.output, result.output
    for _ in range(2):
        assert runner.invoke(app, [*args, str(tmp_path / "cal.json"), "--json"]).exit_code == 0


def test_calibrate_refuses_a_negative_seed_in_one_line(tmp_path: Path) -> None:
    """numpy's generators take no negative seed: it was a ValueError traceback, and no profile."""
    run = _calibratable_run(tmp_path)
    result = runner.invoke(app, ["calibrate", str(run), "--base", "h100", "--seed", "-1", "--out",
                                 str(tmp_path / "cal.json")], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == ["error: --seed: must be >= 0, got -1 (give a whole number >= 0)"]
    assert not (tmp_path / "cal.json").exists()
