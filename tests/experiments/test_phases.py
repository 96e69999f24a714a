"""`itlbench phases`: its tables, figure and verdict, a simulated GPU's table, and bad input leaving no directory behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app

runner = CliRunner()


def test_lengths_the_context_cannot_hold_exit_2_and_leave_no_directory(tmp_path: Path) -> None:
    """tiny's context is 4,096 tokens: an 8k prompt cannot be measured, found once its server answered."""
    out = tmp_path / "ph"
    result = runner.invoke(app, ["phases", "--model", "tiny", "--lengths", "8k", "--out", str(out)],
                           terminal_width=400)
    assert result.exit_code == 2, result.output
    assert "error: --lengths: no length fits the context (4096 tokens)" in result.output
    assert not out.exists(), sorted(p.name for p in out.iterdir())


def test_the_phases_figure_reads_its_axes_as_durations_lengths_and_rates() -> None:
    """Log axes labelled '10 ms', '1k' and '2,000' as the report's tables write them, not 10^-2 or 2×10^3."""
    from itlbench.experiments.phases_report import PhasesResult, phases_figure

    rows = [{"prompt_tokens": n, "prefill_s": s} for n, s in ((1, 0.0019), (128, 0.016), (1024, 0.136))]
    result = PhasesResult(engine="cpu-small", source="engine_steps", context=65536, lengths=[1, 128, 1024], rows=rows,
                          decode=[{"batch": 1, "tokens_per_s_total": 564}, {"batch": 4, "tokens_per_s_total": 1999}])
    fig = phases_figure(result).figure
    fig.canvas.draw()
    left, right = fig.axes
    labels = [t.get_text() for ax in (left, right) for axis in (ax.xaxis, ax.yaxis)
              for t in (*axis.get_ticklabels(), *axis.get_ticklabels(minor=True)) if t.get_text()]
    assert not any("10^" in t or "$" in t or "×" in t for t in labels), labels
    assert [t.get_text() for t in left.get_xticklabels()] == ["1", "128", "1k"]
    assert "10 ms" in [t.get_text() for t in left.get_yticklabels()]
    assert "2,000" in [t.get_text() for t in right.get_yticklabels(minor=True)]


def test_phases_prints_its_tables_and_verdict_not_only_the_report_path(tmp_path: Path) -> None:
    """What the report says, on the terminal too: every length's prefill, the decode rates, the verdict."""
    import json

    from rich.console import Console

    from itlbench.experiments.phases_report import print_phases, read_phases

    rows = [{"prompt_tokens": n, "requests": 1, "client_ttft_s": s + 0.001, "engine_prefill_s": s, "prefill_s": s,
             "prefill_tokens_per_s": n / s, "decode_step_s": 0.002, "decode_tokens_per_s": 500.0}
            for n, s in ((1, 0.0019), (128, 0.016), (1024, 0.136))]
    decode = [{"batch": 4, "batch_measured": 4, "client_gap_s": 0.0023, "engine_step_s": 0.002,
               "tokens_per_s_per_stream": 500.0, "tokens_per_s_total": 1999.0}]
    (tmp_path / "phases.json").write_text(json.dumps({"engine": "cpu-small", "source": "engine_steps", "context": 65536,
                                                      "lengths": [1, 128, 1024], "rows": rows, "decode": decode,
                                                      "saturation_tokens": 128, "linear_until_tokens": 1024,
                                                      "config": {"output_tokens": 8}}))
    console = Console(record=True, width=200, color_system=None)
    print_phases(console, read_phases(tmp_path), 8)
    out = " ".join(console.export_text().split())
    assert "Prefill per prompt length (medians)" in out and "1k 1 137 ms 136 ms 7,529" in out
    assert "4 (4) 2.3 ms 2.0 ms 500 1,999" in out
    assert "Prefill throughput saturates at about 128 tokens" in out


def _qa_result():
    """The QA pass's study (cpu-small up to 8k): linear up to 2k, 8k past the slack, decode batched at 8."""
    from itlbench.experiments.phases_report import PhasesResult
    from itlbench.experiments.phases_table import knees

    rows = [{"prompt_tokens": n, "requests": 3, "client_ttft_s": s, "engine_prefill_s": s, "prefill_s": s,
             "prefill_tokens_per_s": n / s, "decode_step_s": 0.002, "decode_tokens_per_s": 500.0}
            for n, s in ((1, 0.0016), (16, 0.0097), (128, 0.0257), (512, 0.1), (2048, 0.43), (8192, 2.9))]
    sat, linear, superlinear = knees(rows)
    assert (sat, linear, superlinear) == (128, 2048, 8192)
    decode = [{"batch": 1, "batch_measured": 1, "tokens_per_s_total": 875.0},
              {"batch": 8, "batch_measured": 8, "tokens_per_s_total": 1980.0}]
    return PhasesResult("cpu-small", "engine_steps", 65536, [r["prompt_tokens"] for r in rows], rows, decode,
                        sat, linear, superlinear)


def test_the_figure_marks_the_linear_break_as_the_verdict_states_it() -> None:
    """One reading of where prefill stops scaling linearly: the figure's words are the verdict's ('between 2k and
    8k tokens'), not 'superlinear from 8k' beside a verdict saying 'between 2k and 8k'."""
    from itlbench.experiments.phases_report import phases_figure, phases_verdict

    result = _qa_result()
    fig = phases_figure(result).figure
    fig.canvas.draw()
    names = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    marks = [n for n in names if "linear" in n and "best rate" not in n]
    assert marks == ["stops scaling linearly between 2k and 8k tokens"], names
    assert "stops scaling linearly between 2k and 8k tokens:" in phases_verdict(result)
    assert "saturates at 128 tokens" in names


def test_the_figure_writes_nothing_over_its_points_lines_or_past_its_edge() -> None:
    """Every word the phases figure draws sits inside the figure and off every point and decode line: the QA pass
    found 'superlinear from 8k' over the 8k point and past the plot, and 'saturates at 128' on the batch-8 line."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from itlbench.experiments.phases_report import phases_figure

    fig = phases_figure(_qa_result()).figure
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    page = fig.bbox
    for ax in fig.axes:
        legend = ax.get_legend()
        words = [*ax.texts, *(legend.get_texts() if legend else [])]
        assert words
        points = [ax.transData.transform(np.column_stack(line.get_data())) for line in ax.get_lines()
                  if line.get_marker() not in (None, "None", "", " ")]
        levels = [ax.transData.transform((1, float(line.get_ydata()[0])))[1] for line in ax.get_lines()
                  if tuple(line.get_xdata()) == (0, 1)]  # the decode rates, across the whole axes
        inside = ax.get_window_extent(renderer)
        for text in words:
            box = text.get_window_extent(renderer)
            assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, text
            if text in ax.texts:  # written in the axes: it must stay inside them
                assert inside.x0 <= box.x0 and box.x1 <= inside.x1, text
            assert not any(box.contains(x, y) for xy in points for x, y in xy), text.get_text()
            overlaps_axes = box.x1 > inside.x0 and box.x0 < inside.x1 and box.y1 > inside.y0 and box.y0 < inside.y1
            assert not (overlaps_axes and any(box.y0 - 2 <= y <= box.y1 + 2 for y in levels)), text.get_text()


def test_the_status_line_says_one_token_not_one_tokens(monkeypatch) -> None:
    """'prefill 1 token × 3', as the measurement goes (the client is a stand-in that answers every request)."""
    import asyncio
    from types import SimpleNamespace

    from itlbench.experiments import phases
    from itlbench.workloads.prompts import PromptBuilder

    class Client:
        def __init__(self, target, rows) -> None:
            pass

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc) -> None:
            return None

        async def run(self, plan, t):
            return SimpleNamespace(status="ok", http_status=200)

    monkeypatch.setattr(phases, "StreamClient", Client)
    said: list[str] = []
    cfg = phases.PhasesConfig(concurrency=2, repeats=3)
    asyncio.run(phases._measure(cfg, None, PromptBuilder(), [1, 16, 2048], None, said.append))
    assert said[:3] == ["prefill 1 token × 3", "prefill 16 tokens × 3", "prefill 2k tokens × 3"], said


def test_a_dropped_length_is_said_in_the_singular(tmp_path: Path) -> None:
    from itlbench.experiments.phases import _say_what_does_not_fit

    said: list[str] = []
    _say_what_does_not_fit([8192], None, 4096, 33, [1024], said.append)
    _say_what_does_not_fit([8192, 16384], None, 4096, 33, [1024], said.append)
    assert said[0].startswith("--lengths: 8,192 does not fit the context") and " do not fit " in said[1], said


def test_phases_on_a_simulated_gpu_says_so_and_prices_prefill_as_the_cost_model_does(tmp_path: Path) -> None:
    """`--engine sim --gpu h100`: the table for a GPU that is not here, each step the time the cost model prices
    (the figures `itlbench roofline` estimates), and the output names what was simulated."""
    import json

    from itlbench.core.engine_config import EngineConfig
    from itlbench.core.presets import load_model_config
    from itlbench.sim.runner import SimRunner
    from itlbench.sim.shapes import StepShape

    out = tmp_path / "ph"
    result = runner.invoke(app, ["phases", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100",
                                 "--lengths", "128,2k", "--repeats", "1", "--concurrency", "2", "--output-tokens", "4",
                                 "--out", str(out)], terminal_width=400)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "llama-3.1-8b simulated on H100 SXM (TP 1, bfloat16 weights, K/V at 2 B)" in said
    assert "H100 SXM in 16-bit: MAPE" in said  # how far to trust it, as `run --engine sim` says
    doc = json.loads((out / "phases.json").read_text())
    rows = doc["rows"]
    assert [r["prompt_tokens"] for r in rows] == [128, 2048] and [r["requests"] for r in rows] == [1, 1]
    assert rows[0]["engine_prefill_s"] < rows[1]["engine_prefill_s"] < rows[1]["client_ttft_s"]
    engine = EngineConfig(engine="sim", model="llama-3.1-8b", gpu="h100", chunk_budget=None)
    sim = SimRunner(engine, load_model_config(engine.model), 131_072)
    for r in rows:
        priced = sim.cost_model.time(StepShape.prefill(r["prompt_tokens"]), sim.hardware).total_s
        assert abs(r["engine_prefill_s"] / priced - 1) < 0.01, (r, priced)
    assert "--engine sim --model llama-3.1-8b --gpu h100 --tp 1 --dtype auto" in (out / "report.md").read_text()


def test_a_simulated_context_set_with_max_model_len_is_profiled_whole_and_a_time_scale_is_said_everywhere(
        tmp_path: Path) -> None:
    """`--max-model-len` is the context the default lengths climb to, ending at the longest prompt it holds (not the
    simulator's 32k stop); `--sim-time-scale 4` paces each step at a quarter of its priced time, and the terminal,
    the report, phases.json and the command that reproduces the table all say so."""
    import json

    from itlbench.core.engine_config import EngineConfig
    from itlbench.core.presets import load_model_config
    from itlbench.sim.runner import SimRunner
    from itlbench.sim.shapes import StepShape

    out = tmp_path / "ph"
    result = runner.invoke(app, ["phases", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100",
                                 "--max-model-len", "16384", "--sim-time-scale", "4", "--repeats", "1",
                                 "--concurrency", "2", "--output-tokens", "4", "--out", str(out)], terminal_width=400)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "served at 4× speed: llama-3.1-8b simulated on H100 SXM" in said
    assert "Simulated at 4× speed: every time here is 1/4 of the simulated GPU's, and every rate 4× its." in said
    doc = json.loads((out / "phases.json").read_text())
    assert doc["context"] == 16384 and doc["sim_time_scale"] == 4.0
    assert [r["prompt_tokens"] for r in doc["rows"]] == [1, 16, 128, 512, 2048, 8192, 16384 - 5]
    engine = EngineConfig(engine="sim", model="llama-3.1-8b", gpu="h100", chunk_budget=None, max_model_len=16384)
    sim = SimRunner(engine, load_model_config(engine.model), 16384)
    for r in doc["rows"][4:]:  # long enough that a sleep's overshoot is noise
        priced = sim.cost_model.time(StepShape.prefill(r["prompt_tokens"]), sim.hardware).total_s
        assert abs(r["engine_prefill_s"] * 4 / priced - 1) < 0.02, (r, priced)
    report = (out / "report.md").read_text()
    assert "Simulated at 4× speed" in report and "step log (each step's priced time ÷ 4)" in report
    assert "--max-num-seqs 64 --max-model-len 16384 --sim-time-scale 4 --lengths 1,16,128,512,2k,8k,16379 " in report


@pytest.mark.parametrize(("args", "line"), [
    (["--gpu", "h100"], "error: --gpu: only applies to the simulated engine (add --engine sim)"),
    (["--engine", "sim", "--device", "cuda"], "error: --device: does not apply to --engine sim"),
    (["--engine", "sim", "--torch-threads", "2"], "No such option: --torch-threads"),
    (["--sim-time-scale", "4"], "error: --sim-time-scale: only applies to the simulated engine (add --engine sim or "
                                "drop it)"),
    (["--engine", "sim", "--sim-time-scale", "0"], "error: --sim-time-scale: must be > 0, got 0.0"),
    (["--endpoint", "http://127.0.0.1:9/v1", "--max-model-len", "8192"],
     "error: --max-model-len: configures the bundled engine, which --endpoint does not start (set it on your server)"),
    (["--endpoint", "http://127.0.0.1:9/v1", "--engine", "sim", "--sim-time-scale", "2"],
     "error: --engine: configures the bundled engine, which --endpoint does not start"),
    (["--endpoint", "http://127.0.0.1:9/v1", "--sim-time-scale", "2"],
     "error: --sim-time-scale: configures the bundled engine, which --endpoint does not start"),
    # the model's own limit is named before the simulated GPU's room (which would suggest 464,692 tokens)
    (["--engine", "sim", "--max-model-len", "999999"],
     "error: --max-model-len: 999999 exceeds the model's max_position_embeddings=131072 (use at most 131072)"),
    (["--model", "tiny", "--max-model-len", "8192"],
     "error: --max-model-len: 8192 exceeds the model's max_position_embeddings=4096 (use at most 4096)"),
])
def test_flags_the_engine_would_not_use_exit_2_before_any_server_starts(tmp_path: Path, args: list[str],
                                                                        line: str) -> None:
    out = tmp_path / "ph"
    result = runner.invoke(app, ["phases", *args, "--lengths", "128", "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2 and line in " ".join(result.output.split()), result.output
    assert "starting" not in result.output and "probing" not in result.output and not out.exists()
