"""Virtual-time runs (`itlbench run --engine sim`, clock auto/virtual): the simulator in-process on a
discrete-event clock writes the tables a served run writes, keeps the load's timeline (closed-loop
sends at the previous answer's end, injections at their scheduled time, open-loop arrivals), and
agrees with the served, real-time run of the same load on every engine decision."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.report.run_report import write_run_report
from itlbench.rundir.reader import read_table, table_parts
from itlbench.rundir.schema import TABLES
from itlbench.workloads.arrivals import arrival_times

ENGINE = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", max_model_len=8192)
LLAMA_31_70B = {"vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                "rope_theta": 500000.0}  # Llama-3.1-70B's published architecture


def _run(out: Path, **kw: object) -> tuple[Path, dict]:
    args: dict = {"workload": "fixed:256:16", "streams": 3, "duration_s": 2.0, "warmup_s": 0.2, "live": False,
                  "out": out, "engine": ENGINE, "seed": 5}
    args.update(kw)
    return run_load_test(RunConfig(**args))


def _table(run_dir: Path, name: str) -> pl.DataFrame:
    return read_table(run_dir, name)


@pytest.fixture(scope="module")
def virtual(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return _run(tmp_path_factory.mktemp("virtual") / "run", inject="1k@0.5s", ramp_s=0.1)


def test_a_virtual_run_writes_the_tables_the_analysis_reads_and_says_its_clock(virtual: tuple[Path, dict]) -> None:
    run_dir, summary = virtual
    for name in ("requests", "chunks", "steps"):  # the files as written, before any reader conforms them
        frame = pl.concat([pl.read_parquet(part) for part in table_parts(run_dir, name)])
        assert frame.height > 0 and dict(frame.schema) == TABLES[name], name
    assert not (run_dir / "client_samples").exists() and not (run_dir / "server.log").exists()  # no client, no server
    chunks = _table(run_dir, "chunks")
    assert chunks["stamp"].unique().to_list() == ["virtual"] and (chunks["t_read_ns"] == chunks["t_ns"]).all()
    steps = _table(run_dir, "steps")
    # every token arrives at the end of the step that sampled it
    assert set(chunks["t_ns"].to_list()) <= set(steps["end_ns"].to_list())
    run = json.loads((run_dir / "run.json").read_text())
    assert run["clock"] == "virtual" and run["driver"]["name"] == "virtual" and run["engine"]["device"] == "sim:h100"
    assert summary["clock"]["kind"] == "virtual" and "not applicable" in summary["validity"]["client_checks"]
    assert summary["requests"]["ok"] > 0 and summary["itl_s"]["count"] > 0 and summary["ttft_s"]["all"]["count"] > 0
    # the window is virtual time: two seconds measured, after the warm-up
    assert run["end_ns"] - run["measure_start_ns"] == 2_000_000_000 and run["measure_start_ns"] >= 200_000_000
    html = (run_dir / "report.html").read_text() if (run_dir / "report.html").exists() else None
    from itlbench.report.run_report import write_run_report

    write_run_report(run_dir)
    report = (run_dir / "report.md").read_text()
    assert "Simulated time (virtual clock)" in report
    # and how far to trust it: the H100 preset's error on the published figures held out of its fit
    assert run["sim_check"]["gpu"] == "h100" and run["sim_check"]["held_out"]["figures"] > 20
    assert summary["sim_check"] == run["sim_check"]
    assert "How far to trust the simulator: H100 SXM in 16-bit: MAPE " in report
    assert html is None or "Valid run: the client kept up" not in html


def test_a_virtual_run_redrawn_without_its_summary_says_the_same(virtual: tuple[Path, dict], tmp_path: Path) -> None:
    """summary.json lost (a sweep point cut off before writing it): the report computes one from the
    records, and it must still say the clock was virtual and how far to trust the simulator, never that
    a client kept up (no client ran)."""
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(virtual[0], run_dir)
    (run_dir / "summary.json").unlink()
    write_run_report(run_dir)
    report = (run_dir / "report.md").read_text()
    assert "Simulated time (virtual clock)" in report and "How far to trust the simulator" in report
    assert "the client kept up" not in report
    assert "the simulated engine (sim:h100) runs on no GPU" in report


def test_closed_loop_streams_send_the_next_request_at_the_previous_ones_end(virtual: tuple[Path, dict]) -> None:
    run_dir, _ = virtual
    reqs = _table(run_dir, "requests").filter(~pl.col("injected")).sort("sent_ns")
    run = json.loads((run_dir / "run.json").read_text())
    firsts = []
    for (stream,), group in reqs.group_by("stream", maintain_order=True):
        sent, done = group["sent_ns"].to_list(), group["done_ns"].to_list()
        assert len(sent) >= 3, stream
        assert sent[1:] == done[:-1], f"stream {stream} waited or overlapped"
        assert (group["scheduled_ns"] == group["sent_ns"]).all()
        firsts.append((stream, sent[0]))
    ramp = 100_000_000  # --ramp 0.1s over 3 streams: stream k starts at k/3 of it
    assert sorted(firsts) == [(k, run["run_start_ns"] + ramp * k // 3) for k in range(3)]
    assert reqs.filter(pl.col("sent_ns") >= run["end_ns"]).height == 0, "nothing is sent after the window"


def test_an_injection_lands_at_its_scheduled_virtual_time(virtual: tuple[Path, dict]) -> None:
    run_dir, _ = virtual
    run = json.loads((run_dir / "run.json").read_text())
    inj = _table(run_dir, "requests").filter(pl.col("injected")).row(0, named=True)
    assert inj["sent_ns"] == run["measure_start_ns"] + 500_000_000 and inj["prompt_tokens"] == 1024
    steps = _table(run_dir, "steps").sort("step")
    first = steps.filter(pl.col("prefill_request_ids").list.contains(inj["server_request_id"])).row(0, named=True)
    before = steps.filter(pl.col("step") == first["step"] - 1).row(0, named=True)
    # admitted at the first step boundary after it arrived (the engine was busy: steps back to back), as
    # the served engine thread admits it
    assert before["start_ns"] <= inj["sent_ns"] <= first["start_ns"] == before["end_ns"]
    assert inj["first_token_ns"] > inj["sent_ns"] and inj["status"] == "ok"


def test_open_loop_arrivals_are_sent_at_their_seeded_times(tmp_path: Path) -> None:
    run_dir, _ = _run(tmp_path / "rate", streams=0, rate=20.0, adaptive_warmup=False)
    run = json.loads((run_dir / "run.json").read_text())
    sent = sorted(t - run["measure_start_ns"] for t in _table(run_dir, "requests")["sent_ns"].to_list())
    expected = [int(t * 1e9) for t in arrival_times(20.0, 2.0, 1.0, [5, 4]) if t < 2.0]
    assert sent == expected and len(sent) > 20


def _decisions(run_dir: Path) -> list[tuple]:
    steps = _table(run_dir, "steps").sort("step")
    keys = ("phase", "prefill_tokens", "decode_tokens", "num_prefill_reqs", "num_decode_reqs", "num_running",
            "num_waiting", "num_preemptions", "context_tokens")
    return [(*(r[k] for k in keys), r["end_ns"] - r["start_ns"]) for r in steps.iter_rows(named=True)]


@pytest.mark.e2e
def test_virtual_and_served_real_time_runs_agree_on_steps_ttft_and_itl(tmp_path: Path) -> None:
    """One stream, so each request runs alone in both (the served one's next request reaches the engine
    after an idle gap, a virtual one's at once: neither meets another request). Tolerance: the served
    TTFT and ITL medians include the HTTP request and SSE delivery, so they may exceed the virtual
    ones by up to 10 ms + 10 %, and never fall below them by more than 1 ms."""
    kw = {"workload": "fixed:512:32", "streams": 1, "duration_s": 2.0, "warmup_s": 0.0}
    virt, vs = _run(tmp_path / "virtual", **kw)
    real, rs = _run(tmp_path / "real", clock="real", **kw)
    assert json.loads((real / "run.json").read_text()).get("clock") is None and (real / "client_samples").exists()
    # served or virtual, a simulated run records its preset's published error bar alike
    assert rs["sim_check"] == vs["sim_check"] and rs["sim_check"]["held_out"]["figures"] > 20
    v, r = _decisions(virt), _decisions(real)
    n = 3 * 32  # the first three requests: a prefill step and 31 decode steps each
    assert len(v) >= n and len(r) >= n and v[:n] == r[:n], "the same decisions and the same step costs"
    for fig in (("ttft_s", "all", "p50"), ("itl_s", "p50")):
        vv, rv = vs, rs
        for k in fig:
            vv, rv = vv[k], rv[k]
        assert vv - 1e-3 <= rv <= vv * 1.1 + 10e-3, (fig, vv, rv)


def test_the_70b_tp2_fp8_command_runs_in_virtual_time_and_prints_ttft_and_itl(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_70B))
    out = tmp_path / "run"
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", str(tmp_path / "config.json"), "--gpu", "h100",
                                      "--tp", "2", "--dtype", "fp8", "--workload", "fixed:5000:500", "--duration", "5s",
                                      "--no-live", "--out", str(out)], terminal_width=200)
    wall = time.perf_counter() - t0
    assert result.exit_code == 0, result.output
    assert "TTFT by prompt bucket" in result.output and "Inter-token latency" in result.output
    assert "Clock virtual" in result.output
    assert "2 × H100 SXM: fp8 weights, K/V at 1 B an element" in result.output  # the deployment it priced
    assert "Sim check H100 SXM in fp8: MAPE " in result.output and "; at TP 2: MAPE " in result.output  # its error bar
    report = (out / "report.md").read_text()
    assert "simulated 2 × H100 SXM in fp8 (run on " in report  # the report's header says so
    assert "> ℹ️ How far to trust the simulator: H100 SXM in fp8" in report  # within 15 % at TP2: told, not warned
    assert "K/V room only" not in result.output  # half of each GPU left for K/V: not a tight deployment
    run = json.loads((out / "run.json").read_text())
    assert run["clock"] == "virtual" and run["engine"]["device"] == "sim:h100x2"
    assert run["simulation"]["simulated_s"] > 20 and wall < 60  # a warm-up of ~17 s and 17 s answers, in seconds
    summary = json.loads((out / "summary.json").read_text())
    assert 0.005 < summary["itl_s"]["p50"] < 0.1


def test_a_70b_on_one_h100_is_warned_that_a_runtime_would_keep_most_of_its_kv_room(tmp_path: Path) -> None:
    """72 GB of FP8 layers and 16-bit tables leave 5 % of an H100 (4.0 GiB) for K/V, of which a runtime keeps about
    2.9 GiB back and the simulated engine none: the published runs that tight were a third fast until that reserve
    was charged. The H100's FP8 figures at TP1 are within 15 % on average, yet the run says so and its report warns."""
    result = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", "llama-3.3-70b", "--gpu", "h100", "--dtype",
                                      "fp8", "--max-model-len", "8192", "--workload", "fixed:1000:100", "--duration",
                                      "5s", "--no-live", "--out", str(tmp_path / "run")], terminal_width=400)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # the console wraps long lines
    assert ("K/V room only 5% of each GPU's memory (4.0 GiB): a runtime keeps about 2.9 GiB of that back, which this "
            "simulated engine does not") in said
    check = json.loads((tmp_path / "run" / "run.json").read_text())["sim_check"]
    assert 0.045 < check["kv_share"] < 0.055 and check["tight"]["figures"] == 4 and check["at_tp"]["mape"] < 0.15
    assert check["reserve_gib"] == 2.9 and check["memory_gib"] == 81_559 / 1024
    assert "> ⚠️ How far to trust the simulator: H100 SXM in fp8" in (tmp_path / "run" / "report.md").read_text()


def test_the_kv_room_a_runtime_reports_is_given_with_kv_memory_gib(tmp_path: Path) -> None:
    """The room vLLM's log reports ("Available KV cache memory: 1.5 GiB") holds exactly that many tokens a GPU; the
    reserve is then already kept, so the run is not called tight. More than the GPU has beside its weights is refused
    in one line naming the flag."""
    args = ["run", "--engine", "sim", "--model", "llama-3.3-70b", "--gpu", "h100", "--dtype", "fp8", "--max-model-len",
            "4096", "--workload", "fixed:1000:50", "--duration", "3s", "--no-live", "--no-report"]
    result = CliRunner().invoke(app, [*args, "--kv-memory-gib", "1.5", "--out", str(tmp_path / "run")],
                                terminal_width=400)
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["engine"]["kv_blocks"] == int(1.5 * 2**30 // (80 * 8 * 128 * 2)) // 16 == 614  # 160 KiB a token
    assert "kv_share" not in run["sim_check"] and "K/V room only" not in result.output
    assert run["sim_check"]["at_tp"]["mape"] < 0.15
    too_much = CliRunner().invoke(app, [*args, "--kv-memory-gib", "20", "--out", str(tmp_path / "no")],
                                  terminal_width=400)
    assert too_much.exit_code == 2, too_much.output
    said = " ".join(too_much.output.split())
    assert "error: --kv-memory-gib: 20 GiB of K/V does not fit beside the weights on the H100 SXM" in said
    assert "Traceback" not in too_much.output


def test_a_b200_in_nvfp4_runs_and_prints_its_own_error_bar(tmp_path: Path) -> None:
    """--dtype fp4 on the B200: the NVFP4 deployment priced, and the error on TensorRT-LLM's B200 FP4 runs."""
    result = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", "llama-3.3-70b", "--gpu", "b200", "--dtype",
                                      "fp4", "--workload", "fixed:2000:100", "--duration", "5s", "--no-live", "--out",
                                      str(tmp_path / "run")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "B200: fp4 weights, K/V at 1 B an element" in result.output
    assert "Sim check B200 in fp4: MAPE " in result.output and "; at TP 1: MAPE " in result.output
    header = (tmp_path / "run" / "report.md").read_text().splitlines()[2]  # the GPU priced, then the host
    assert "· simulated B200 in fp4 (run on " in header and "CPUs" in header, header
    eight = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", "llama-3.3-70b", "--gpu", "b200", "--dtype",
                                     "fp4", "--tp", "8", "--workload", "fixed:2000:100", "--duration", "5s",
                                     "--no-live", "--out", str(tmp_path / "tp8")], terminal_width=200)
    assert eight.exit_code == 0, eight.output
    assert "; at TP 8: MAPE " in eight.output  # release 0.20's TP8 runs: within 15 % on average, so told, not warned
    assert "> ℹ️ How far to trust the simulator: B200 in fp4" in (tmp_path / "tp8" / "report.md").read_text()
    sixteen_args = ["run", "--engine", "sim", "--model", "llama-3.1-405b", "--dtype", "fp4", "--tp", "16", "--workload",
                    "fixed:2000:100", "--duration", "5s", "--no-live"]
    # sixteen B200s span two HGX baseboards, whose all-reduces no profile prices: refused; one whose NVLink joins 72
    # GPUs (an NVL72 rack's, a profile JSON) runs, warned that no published figure checks it
    crossing = CliRunner().invoke(app, [*sixteen_args, "--gpu", "b200", "--out", str(tmp_path / "x")], terminal_width=200)
    assert crossing.exit_code == 2 and "error: --tp: 16 GPUs exceed the B200's NVLink 5 domain of 8" in crossing.output
    from itlbench.sim.hardware import GPUS

    GPUS["b200"].with_(link_domain=72).save(tmp_path / "nvl72.json")
    sixteen = CliRunner().invoke(app, [*sixteen_args, "--gpu", str(tmp_path / "nvl72.json"), "--out",
                                       str(tmp_path / "tp16")], terminal_width=200)
    assert sixteen.exit_code == 0, sixteen.output
    assert "B200 in fp4: no published figure checks this profile" in sixteen.output  # an edited profile: warned
    assert "> ⚠️ How far to trust the simulator: B200 in fp4" in (tmp_path / "tp16" / "report.md").read_text()
    refused = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu", "h100", "--dtype", "fp4", "--workload",
                                       "fixed:64:8", "--no-live", "--out", str(tmp_path / "no")], terminal_width=200)
    assert refused.exit_code == 2 and "no FP4 tensor rate" in refused.output and "Traceback" not in refused.output


@pytest.mark.parametrize(("kw", "needle"), [
    ({"clock": "sometimes"}, "unknown clock"),
    ({"clock": "virtual", "engine": EngineConfig(model="llama-3.1-8b", engine="sim", disaggregate=True)},
     "--disaggregate"),
    ({"clock": "virtual", "workers": 2}, "--workers"),
    ({"clock": "virtual", "engine": EngineConfig(model="cpu-small")}, "needs the bundled simulator"),
])
def test_a_clock_the_run_cannot_have_is_a_one_line_error_naming_the_flag(kw: dict, needle: str) -> None:
    args = {"workload": "fixed:64:8", "streams": 1, "engine": ENGINE, **kw}
    with pytest.raises(ConfigError) as err:
        RunConfig(**args).validate()
    assert err.value.field == "--clock" and needle in str(err.value)


def test_auto_is_virtual_for_the_simulator_unless_a_flag_needs_the_server() -> None:
    assert RunConfig(engine=ENGINE).virtual_clock
    assert not RunConfig(engine=ENGINE, clock="real").virtual_clock
    assert not RunConfig(engine=ENGINE.with_(sim_time_scale=2.0)).virtual_clock  # pacing is a served thing
    assert not RunConfig(engine=EngineConfig(model="cpu-small")).virtual_clock
    assert not RunConfig(endpoint="http://127.0.0.1:1/v1", model="m").virtual_clock


def test_request_timeouts_and_the_drain_end_on_the_virtual_clock(tmp_path: Path) -> None:
    """Answers of 400 tokens (~3 s at ~8 ms a step) against a 1 s request timeout: each request fails as
    a timeout at its deadline and its stream sends the next; after the window the drain gives the
    rest 0.5 s before they are cancelled."""
    run_dir, summary = _run(tmp_path / "t", workload="fixed:256:400", streams=2, duration_s=2.0, warmup_s=0.0,
                            request_timeout_s=1.0, drain_timeout_s=0.5)
    run = json.loads((run_dir / "run.json").read_text())
    reqs = _table(run_dir, "requests").sort("sent_ns")
    timeouts = reqs.filter(pl.col("status") == "timeout")
    assert timeouts.height >= 2 and (timeouts["done_ns"] - timeouts["sent_ns"] == 1_000_000_000).all()
    assert (timeouts["error_kind"] == "timeout").all() and (timeouts["num_chunks"] > 0).all()
    for (_,), group in reqs.group_by("stream"):
        assert group["sent_ns"].to_list()[1:] == group["done_ns"].to_list()[:-1]  # the stream carries on
    cancelled = reqs.filter(pl.col("status") == "cancelled")
    assert cancelled.height == 2 and (cancelled["done_ns"] == run["end_ns"] + 500_000_000).all()
    assert reqs.filter(pl.col("status") == "ok").height == 0 and summary["requests"]["timeout"] >= 2


def test_fixed_shape_streams_sent_at_once_keep_their_phase_and_the_run_says_so(tmp_path: Path) -> None:
    """With no jitter on the virtual clock, closed loops of one fixed shape started together keep arriving in waves
    (each prompt queues behind the others'), where the same streams spread by --ramp arrive alone: TTFT is the
    phase's, so such a run warns and points at --ramp and --rate."""
    engine = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", max_model_len=8192, chunk_budget=8192)
    kw = {"workload": "fixed:2000:100", "streams": 10, "duration_s": 30.0, "warmup_s": 10.0, "engine": engine}
    (in_step, s_in), (spread, s_spread) = _run(tmp_path / "a", **kw), _run(tmp_path / "b", ramp_s=3.0, **kw)
    warnings = [json.loads((d / "run.json").read_text())["engine"]["serving"]["warnings"] for d in (in_step, spread)]
    assert len(warnings[0]) == 1 and "10 closed-loop streams of one fixed shape" in warnings[0][0]
    assert "--ramp" in warnings[0][0] and warnings[1] == []
    write_run_report(in_step)
    assert warnings[0][0] in (in_step / "report.md").read_text()  # the report warns too, not only the terminal
    assert s_in["ttft_s"]["all"]["mean"] > 2 * s_spread["ttft_s"]["all"]["mean"]  # waves queue, spread prompts don't
    _run(tmp_path / "c", workload="chat", streams=10, duration_s=2.0)  # lengths vary: no phase to keep
    assert json.loads((tmp_path / "c" / "run.json").read_text())["engine"]["serving"]["warnings"] == []


def test_a_virtual_run_reports_progress_on_simulated_time_without_changing_it(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A long simulation showed a bar that never moved: the drive now hands the live view snapshots of simulated
    time and counts (no latencies or client CPU: there is no client), and the run is the same with or without."""
    import itlbench.sim.virtual_drive as vd

    monkeypatch.setattr(vd, "PROGRESS_EVERY_S", 0.0)
    snaps = []
    run_dir, summary = run_load_test(RunConfig(workload="fixed:256:16", streams=3, duration_s=2.0, warmup_s=0.2,
                                               live=False, out=tmp_path / "a", engine=ENGINE, seed=5),
                                     progress=snaps.append)
    _, quiet = _run(tmp_path / "b")
    assert summary["itl_s"] == quiet["itl_s"] and summary["ttft_s"] == quiet["ttft_s"]
    assert len(snaps) > 10 and all(s.virtual and s.itl_p50_ms is None for s in snaps)
    elapsed = [s.elapsed_s for s in snaps]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 2.0 and not snaps[0].measuring and snaps[-1].measuring
    assert all(s.sent == s.done + s.in_flight for s in snaps) and snaps[-1].in_flight == 0


def test_the_live_view_of_a_virtual_run_shows_simulated_time_not_client_figures() -> None:
    import io

    from rich.console import Console

    from itlbench.load.progress import ProgressSnapshot
    from itlbench.report.terminal import LiveProgress

    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    snap = ProgressSnapshot(elapsed_s=75.5, measuring=True, sent=9, done=7, in_flight=2, errors=0, itl_p50_ms=None,
                            itl_p99_ms=None, ttft_p50_ms=None, cpu_percent=0.0, loop_lag_ms=0.0, virtual=True)
    with LiveProgress(console, total_s=600) as live:
        live.update(snap)
    shown = console.file.getvalue()
    assert "sent 9 done 7 in-flight 2 err 0 │ simulated 75.5 s" in shown and "client CPU" not in shown


def test_a_simulated_run_without_a_model_prices_a_real_model_not_the_cpu_toy() -> None:
    """On a machine without CUDA `--engine sim` took cpu-small (8M parameters): a simulated H100 prefilled 32k
    tokens in 13 ms. Left out, the simulator's model is llama-3.1-8b; the torch engine keeps its CPU default."""
    from itlbench.cli.engine_options import engine_config_from_flags

    assert engine_config_from_flags({"engine": "sim", "model": None}).model == "llama-3.1-8b"
    assert engine_config_from_flags({"engine": "torch", "model": None, "device": "cpu"}).model == "cpu-small"
