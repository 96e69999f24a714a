"""`itlbench phases`: bad input leaves no directory behind (not even the bundled server's log)."""

from __future__ import annotations

from pathlib import Path

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
