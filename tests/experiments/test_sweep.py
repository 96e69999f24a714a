"""`run_sweep` on runs that a stand-in `itlbench run` scripts: every planned point gets a truthful status,
an interruption is said where it happened and which points it left unrun, and simulator repeats vary the seed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from itlbench.errors import ConfigError
from itlbench.experiments.points import parse_axes
from itlbench.experiments.run_options import repeat_seed, with_seed
from itlbench.experiments.sweep import (
    SweepAborted,
    SweepPlan,
    SweepResult,
    missing_lines,
    order_notes,
    run_sweep,
)
from itlbench.harness.run_config import checks_passed

# what one stand-in run does: "done" (run.json + summary.json, exit 0), "cut" (run.json only, exit 130: Ctrl-C
# while it was analysed), "nothing" (exit 130 before it recorded anything), "done-then-ctrl-c" (finished,
# then Ctrl-C while it drew its report: exit 130), "raise" (KeyboardInterrupt outside the run's own handler)
Script = dict[str, str]


def _fake_run(script: Script, calls: list[list[str]]) -> Callable[[list[str]], int]:
    """`invoke_run` that writes what the point's entry in `script` says (by the --out directory's name)."""

    def invoke(args: list[str]) -> int:
        calls.append(args)
        out = Path(args[args.index("--out") + 1])
        what = script.get(f"{out.parent.name}/{out.name}", script.get(out.name, "done"))
        if what == "raise":
            raise KeyboardInterrupt
        if what == "nothing":
            out.mkdir(parents=True)
            return 130
        out.mkdir(parents=True)
        (out / "run.json").write_text(json.dumps({"stop_reason": "completed"}))
        if what in ("done", "done-then-ctrl-c"):
            (out / "summary.json").write_text("{}")
        return 0 if what == "done" else 130

    return invoke


def _sweep(tmp_path: Path, script: Script, budgets: str = "512,2048,8192,none", repeat: int = 1,
           first_seed: int | None = None, order: str | None = None) -> tuple[dict, list[str], list[list[str]], object]:
    calls: list[list[str]] = []
    plan = SweepPlan(parse_axes(budgets, None), repeat=repeat, first_seed=first_seed, order=order)
    result = run_sweep(plan, ["--engine", "sim"], tmp_path / "sw", _fake_run(script, calls))
    manifest = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    return manifest, missing_lines(result), calls, result


def _statuses(manifest: dict) -> dict[str, str]:
    return {p["point"]: p["status"] for p in manifest["points"]}


def test_an_interrupted_sweep_lists_every_planned_point_and_says_which_did_not_run(tmp_path: Path) -> None:
    """Ctrl-C while the second point's run was analysed (run.json written, no summary.json yet)."""
    manifest, lines, calls, result = _sweep(tmp_path, {"b2048": "cut"})
    assert manifest["interrupted"] is True and len(calls) == 2
    assert _statuses(manifest) == {"b512": "ok", "b2048": "interrupted", "b8192": "not run", "unchunked": "not run"}
    cut = manifest["points"][1]
    assert cut["runs"] == [] and cut["partial_runs"] == ["b2048"], "its records are kept, not compared"
    assert manifest["not_run"] == ["b8192", "unchunked"]
    assert result.run_dirs == [tmp_path / "sw" / "b512"]  # type: ignore[attr-defined]
    assert lines[0] == ("Sweep interrupted (Ctrl-C or SIGTERM) during budget 2048: 2 of 4 points did not run "
                        "(budget 8192 and unchunked).")
    assert "Point budget 2048 was interrupted during its run: its records are kept, left out of the comparison." \
        in lines
    assert "Missing point unchunked: it did not run (the sweep was interrupted first)." in lines


def test_a_run_interrupted_before_it_recorded_anything_is_not_ok_and_not_said_not_to_have_run(tmp_path: Path) -> None:
    manifest, lines, _, result = _sweep(tmp_path, {"b512": "nothing"})
    assert _statuses(manifest)["b512"] == "interrupted" and manifest["points"][0]["runs"] == []
    assert result.run_dirs == []  # type: ignore[attr-defined]
    assert "Point budget 512 was interrupted during its run, before it recorded anything." in lines
    assert not any("sweep stopped" in line or "budget 512: it did not run" in line for line in lines)
    assert lines[0].endswith("3 of 4 points did not run (budget 2048, budget 8192 and unchunked).")


def test_ctrl_c_after_a_point_finished_keeps_it_ok_and_ends_the_sweep(tmp_path: Path) -> None:
    manifest, lines, calls, _ = _sweep(tmp_path, {"b512": "done-then-ctrl-c"})
    assert len(calls) == 1 and manifest["interrupted"] is True
    assert _statuses(manifest) == {"b512": "ok", "b2048": "not run", "b8192": "not run", "unchunked": "not run"}
    assert lines[0].startswith("Sweep interrupted (Ctrl-C or SIGTERM) after budget 512: 3 of 4 points did not run")


def test_an_interrupt_outside_the_run_marks_the_point_it_cut(tmp_path: Path) -> None:
    manifest, _, _, _ = _sweep(tmp_path, {"b8192": "raise"}, budgets="512,8192")
    assert manifest["interrupted"] is True and _statuses(manifest) == {"b512": "ok", "b8192": "interrupted"}


def test_an_uninterrupted_sweep_reports_nothing_missing(tmp_path: Path) -> None:
    manifest, lines, _, _ = _sweep(tmp_path, {}, budgets="512,none")
    assert manifest["interrupted"] is False and set(_statuses(manifest).values()) == {"ok"} and lines == []


def test_simulator_repeats_run_successive_seeds_and_record_them(tmp_path: Path) -> None:
    """The virtual clock has no noise: three runs of one seed are one run three times (a zero-width interval)."""
    first = repeat_seed(["--engine", "sim", "--seed", "7"], served=False)
    assert first == 7
    manifest, _, calls, _ = _sweep(tmp_path, {}, budgets="512,none", repeat=3, first_seed=first)
    seeds = [int(c[c.index("--seed") + 1]) for c in calls]
    assert seeds == [7, 7, 8, 8, 9, 9] and all(c.count("--seed") == 1 for c in calls)  # in rounds
    assert manifest["repeat_seeds"] == [7, 8, 9] and manifest["points"][0]["seeds"] == [7, 8, 9]
    doc = json.loads((tmp_path / "sw" / "b512" / "run2" / "run.json").read_text())
    assert doc["sweep"]["seed"] == 8 and doc["sweep"]["varies"] == ["seed"]


def _runs_called(calls: list[list[str]]) -> list[str]:
    return ["/".join(Path(c[c.index("--out") + 1]).parts[-2:]) for c in calls]


def test_repeats_run_in_rounds_so_drift_falls_on_every_point_alike(tmp_path: Path) -> None:
    manifest, lines, calls, _ = _sweep(tmp_path, {}, budgets="512,none", repeat=3)
    assert _runs_called(calls) == ["b512/run1", "unchunked/run1", "b512/run2", "unchunked/run2", "b512/run3",
                                   "unchunked/run3"]
    assert manifest["order"] == "interleaved" and set(_statuses(manifest).values()) == {"ok"} and lines == []
    assert [p["runs"] for p in manifest["points"]] == [[f"{d}/run{i}" for i in (1, 2, 3)] for d in ("b512", "unchunked")]
    _, _, grouped, _ = _sweep(tmp_path / "g", {}, budgets="512,none", repeat=2, order="grouped")
    assert _runs_called(grouped) == ["b512/run1", "b512/run2", "unchunked/run1", "unchunked/run2"]


def test_an_interrupt_between_rounds_leaves_each_point_with_the_runs_it_finished(tmp_path: Path) -> None:
    manifest, lines, calls, result = _sweep(tmp_path, {"unchunked/run2": "cut"}, budgets="512,2048,none", repeat=3)
    assert _runs_called(calls)[-1] == "unchunked/run2" and len(calls) == 6
    assert _statuses(manifest) == {"b512": "interrupted", "b2048": "interrupted", "unchunked": "interrupted"}
    assert manifest["points"][0]["reason"] == "interrupted after 2 of its 3 runs (its finished runs are compared)"
    assert manifest["points"][2]["runs"] == ["unchunked/run1"] and manifest["points"][2]["partial_runs"] == [
        "unchunked/run2"]
    assert len(result.run_dirs) == 5  # type: ignore[attr-defined]
    assert lines[0] == "Sweep interrupted (Ctrl-C or SIGTERM) during unchunked: every point had started."


def test_a_point_that_fails_in_a_round_is_not_run_again(tmp_path: Path) -> None:
    def failing(args: list[str]) -> int:
        calls.append(args)
        return 1 if "unchunked" in args[args.index("--out") + 1] else _fake_run({}, [])(args)

    calls: list[list[str]] = []
    plan = SweepPlan(parse_axes("512,none", None), repeat=3)
    run_sweep(plan, ["--engine", "sim"], tmp_path / "sw", failing)
    manifest = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert _runs_called(calls) == ["b512/run1", "unchunked/run1", "b512/run2", "b512/run3"]
    assert _statuses(manifest) == {"b512": "ok", "unchunked": "failed"}


def test_an_order_needs_repeats_to_order() -> None:
    with pytest.raises(ConfigError) as err:
        SweepPlan(parse_axes("512,none", None), repeat=1, order="grouped")
    assert err.value.field == "--order" and "--repeat" in (err.value.fix or "")
    with pytest.raises(ConfigError) as err:
        SweepPlan(parse_axes("512,none", None), repeat=3, order="random")
    assert err.value.field == "--order"
    served = SweepPlan(parse_axes("512,none", None, served=True), repeat=3, serve="srv --port {port} {chunk_budget}")
    assert served.order == "grouped" and len(served.rounds) == 1
    # the verdict says when repeats ran grouped, and only then
    assert "--order interleaved" in order_notes(SweepResult([], order="grouped", repeat=3))[0]
    assert order_notes(SweepResult([], order="interleaved", repeat=3)) == []
    assert order_notes(SweepResult([], order="grouped", repeat=1)) == []


def test_only_the_bundled_simulator_varies_the_seed() -> None:
    assert repeat_seed(["--engine", "sim"], served=False) == 0
    assert repeat_seed(["--engine=sim", "--seed=3"], served=False) == 3
    assert repeat_seed(["--engine", "torch"], served=False) is None and repeat_seed([], served=False) is None
    assert repeat_seed(["--engine", "sim"], served=True) is None, "a served engine's repeats keep the seed"
    assert with_seed(["--seed", "1", "--x", "y", "--seed=2"], 5) == ["--x", "y", "--seed", "5"]
    with pytest.raises(ConfigError) as err:
        repeat_seed(["--engine", "sim", "--seed", "x"], served=False)
    assert err.value.field == "--seed"


def test_options_the_first_run_refuses_end_the_sweep_without_a_banner(tmp_path: Path) -> None:
    """It said "sweep point 1/2: b512" before the run's own one-line error, as if the point had started."""
    said: list[str] = []
    plan = SweepPlan(parse_axes("512,none", None), repeat=2)
    with pytest.raises(SweepAborted):
        run_sweep(plan, ["--engine", "sim"], tmp_path / "sw", lambda args: 2, on_status=said.append)
    assert said == [] and not (tmp_path / "sw").exists()


def test_the_first_banner_comes_once_the_run_has_checked_its_input_before_what_it_says(tmp_path: Path) -> None:
    said: list[str] = []
    done = _fake_run({}, [])

    def run(args: list[str]) -> int:
        said.append("run: checking")  # what a run says before its checks pass (nothing in `itlbench run`)
        checks_passed()
        said.append("run: started")
        return done(args)

    run_sweep(SweepPlan(parse_axes("512,none", None)), ["--engine", "sim"], tmp_path / "sw", run, on_status=said.append)
    assert said == ["run: checking", "sweep point 1/2: b512", "run: started", "sweep point 2/2: unchunked",
                    "run: checking", "run: started"]
    said.clear()  # a stand-in that never calls back: the banner is said once its run returns, before the next
    run_sweep(SweepPlan(parse_axes("512,none", None)), ["--engine", "sim"], tmp_path / "sw2", done,
              on_status=said.append)
    assert said == ["sweep point 1/2: b512", "sweep point 2/2: unchunked"]
