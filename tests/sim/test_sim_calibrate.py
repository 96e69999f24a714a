"""Calibration: the fit recovers a known profile, and `itlbench calibrate` turns real step logs into one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import SamplingParams
from itlbench.sim.calibrate import StepData, calibrate, fit_params, mape, params_of, predict
from itlbench.sim.roofline import CostModel, Hardware, StepShape, load_hardware
from itlbench.sim.runner import offline_engine
from tests.support.run_dirs import real_cpu_engine, write_run_dir
from tests.support.sim import run_offline

KNOWN = Hardware("known", "a made-up CPU", 100e9, 10e9, 8e9, dtype="float32", gemm_eff=0.55, attn_eff=0.2,
                 mem_eff=0.7, step_overhead_s=0.004, seq_overhead_s=0.0002, counting="executed")


def sim_steps(budget: int | None, seed: int) -> list:
    """Step records of a simulated mixed workload (shapes only; times come from KNOWN below)."""
    rng = np.random.default_rng(seed)
    arrivals = [(int(i * 5e4), rng.integers(3, 8000, int(rng.integers(50, 3000))).tolist(),
                 SamplingParams(max_tokens=int(rng.integers(5, 60)), ignore_eos=True)) for i in range(40)]
    engine = offline_engine(EngineConfig(model="cpu-small", engine="sim", gpu="h100", chunk_budget=budget,
                                         max_num_seqs=16, kv_blocks=4096))
    run_offline(engine, arrivals)
    return engine.step_log.since(0)


def as_data(records: list, hw: Hardware, noise: float, seed: int) -> StepData:
    cm = CostModel.for_hardware(PRESETS["cpu-small"], hw)
    shapes = [StepShape(r.scheduled_tokens, r.num_sampled, r.context_tokens, r.attention_pairs,
                        r.num_prefill_reqs + r.num_decode_reqs) for r in records]
    costs = [cm.cost(s) for s in shapes]
    true = np.array([cm.time(s, hw).total_s for s in shapes])
    rng = np.random.default_rng(seed)
    return StepData(np.array([c.gemm_flops for c in costs]), np.array([c.attn_flops for c in costs]),
                    np.array([c.bytes for c in costs]), np.array([float(s.sequences) for s in shapes]),
                    true * rng.lognormal(0, noise, len(true)),
                    np.array([r.phase for r in records]))


def test_fit_recovers_a_known_profile_and_predicts_another_workload() -> None:
    train = as_data(sim_steps(256, 1), KNOWN, noise=0.03, seed=1)
    test = as_data(sim_steps(1024, 2), KNOWN, noise=0.0, seed=2)
    assert len(train) > 100 and {"prefill", "decode", "mixed"} <= set(train.phase)
    params = fit_params(train)
    assert params == pytest.approx(params_of(KNOWN), rel=0.15)
    assert mape(predict(params, test), test.seconds) < 0.03


def test_calibrate_command_writes_a_profile_the_sim_can_use(tmp_path: Path) -> None:
    run = write_run_dir(tmp_path / "run", real_cpu_engine(256, 0))
    profile = tmp_path / "cpu.json"
    result = CliRunner().invoke(app, ["calibrate", str(run), "--out", str(profile), "--base", "h100", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc["held_out"]) >= {"decode", "all"} and doc["held_out"]["all"]["steps"] > 5
    assert doc["held_out"]["all"]["mape"] < 1.0  # a real fit, not a guess (tight bounds live in benchmarks/)
    hw = load_hardware(str(profile))
    assert hw.counting == "executed" and hw.dtype == "float32" and hw.peak_flops == 989e12
    # a whole-step roofline: the preset's kernel-by-kernel terms (prefill attention's length ramp among them) dropped
    assert hw.cost_model == "roofline" and hw.attn_k_half == hw.kernel_s == hw.gemm_m_half == 0
    table = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["calibrate", str(run), "--out", str(profile), "--base", "h100"])
    assert table.exit_code == 0 and "…" not in table.output, table.output  # piped: the table stays whole
    assert f"{doc['held_out']['all']['mape']:.1%}" in table.output
    (tmp_path / "a-file").write_text("")
    unwritable = CliRunner().invoke(app, ["calibrate", str(run), "--out", str(tmp_path / "a-file" / "p.json")])
    assert unwritable.exit_code == 2 and "error: --out: cannot write" in unwritable.output, unwritable.output
    # the profile drives the simulator like any GPU preset
    sim = offline_engine(EngineConfig(model="tiny", engine="sim", gpu=str(profile), kv_blocks=512,
                                      max_model_len=2048))
    sim.add_request(list(range(3, 200)), SamplingParams(max_tokens=3, ignore_eos=True))
    while sim.has_unfinished():
        sim.step()
    first = sim.step_log.since(0)[0]
    expected = CostModel.for_hardware(PRESETS["tiny"], hw).time(StepShape.prefill(197), hw).total_s
    assert first.duration_s == pytest.approx(expected, abs=1e-9)
    # the fit is deterministic for a given split
    again = calibrate([run], base=load_hardware("h100"))
    assert again.profile == hw.with_(source=again.profile.source)


def test_calibrate_rejects_what_it_cannot_use(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", str(tmp_path)])
    assert result.exit_code == 2 and "RUN_DIR" in result.output and "run.json" in result.output
    sim = offline_engine(EngineConfig(model="tiny", engine="sim", gpu="h100", kv_blocks=64, max_model_len=512))
    sim.add_request(list(range(3, 50)), SamplingParams(max_tokens=2, ignore_eos=True))
    while sim.has_unfinished():
        sim.step()
    run = write_run_dir(tmp_path / "simrun", sim)
    result = runner.invoke(app, ["calibrate", str(run)])
    assert result.exit_code == 2 and "simulated run" in result.output
    result = runner.invoke(app, ["calibrate", str(run), "--holdout", "1.5"])
    assert result.exit_code == 2 and "--holdout" in result.output


def test_calibration_uses_the_measured_window_only(tmp_path: Path) -> None:
    """Warm-up and drain steps (outside run.json's window) are neither fitted nor scored."""
    engine = real_cpu_engine(256, 1)
    recs = engine.step_log.since(0)
    lo, hi = recs[len(recs) // 4], recs[3 * len(recs) // 4]
    run = write_run_dir(tmp_path / "run", engine, (lo.start_ns, hi.end_ns))
    cal = calibrate([run], base=load_hardware("h100"))
    inside = sum(1 for r in recs if r.scheduled_tokens and r.start_ns >= lo.start_ns and r.end_ns <= hi.end_ns)
    assert cal.fit_steps + cal.errors["all"]["steps"] == inside < len(recs)


def test_no_term_is_fitted_above_its_roof() -> None:
    """Steps whose attention ran 5x faster than the roofs allow (roofs measured on a machine busier than
    the run's, or the wrong --base): unbounded, the fit prices attention at 500 % of the roof (a SIGKILLed
    CPU run's decode steps, which hardly see attention, gave 75,000 %). Bounded by the roofs, it stays at
    100 % and is named as at the roof (with what the fit moved to make up for it)."""
    from itlbench.sim.calibrate import at_roof, roof_floors

    d = as_data(sim_steps(256, 1), KNOWN.with_(attn_eff=5.0), noise=0.03, seed=1)
    floors = roof_floors(KNOWN)
    free = fit_params(d)
    bounded = fit_params(d, floors)
    assert free[1] < floors[1] / 2, "unbounded, attention is fitted above its roof"
    assert (bounded >= floors).all() and "attention" in at_roof(bounded, floors)
    assert mape(predict(bounded, d), d.seconds) < mape(predict(free, d), d.seconds) + 0.06


def test_calibrate_refuses_one_run_given_twice(tmp_path: Path) -> None:
    run = write_run_dir(tmp_path / "run", real_cpu_engine(256, 0))
    result = CliRunner().invoke(app, ["calibrate", str(run), str(run) + "/", "--base", "h100"], terminal_width=300)
    assert result.exit_code == 2
    assert "error: RUN_DIR: " in result.output and "is given twice (its steps would count double)" in result.output


def test_a_run_against_itlbench_serve_calibrates_and_another_server_is_refused(tmp_path: Path) -> None:
    """A GPU box runs `itlbench serve` and is driven with --endpoint: run.json nests the server's engine and model
    under engine.itlbench, and its steps were followed on the same clock. Before, calibrate refused every
    --endpoint run."""
    from itlbench.harness.bundled_server import BundledServer
    from itlbench.harness.orchestrate import run_load_test
    from itlbench.harness.run_config import RunConfig
    from itlbench.testing.openai_peer import PeerConfig, serve_in_thread
    from tests.support.servers import TINY_ENGINE

    def run(url: str, model: str, out: Path, **kw: float) -> Path:
        load = {"duration_s": 2.0, "warmup_s": 0.5, "drain_timeout_s": 30.0, **kw}
        return run_load_test(RunConfig(endpoint=url, model=model, workload="chat-short", streams=4, out=out,
                                       live=False, **load))[0]  # type: ignore[arg-type]

    with BundledServer(TINY_ENGINE, tmp_path / "server.log") as srv:
        served = run(srv.base_url, "tiny", tmp_path / "served")
    cal = calibrate([served], base=load_hardware("h100"))
    assert cal.fit_steps > 20 and cal.errors["all"]["steps"] > 5
    assert cal.profile.dtype == "float32" and cal.profile.counting == "executed"
    with serve_in_thread(PeerConfig(tick_s=0.002)) as (_, url):
        # refused for its server, whatever its load: a short one, its answers in flight at the end cancelled
        other = run(url, "peer", tmp_path / "other", duration_s=0.5, warmup_s=0.0, drain_timeout_s=0.0)
    result = CliRunner().invoke(app, ["calibrate", str(other)])
    assert result.exit_code == 2 and "itlbench serve" in result.output and "Traceback" not in result.output
