"""A reasoning model's streams through a whole `itlbench run --endpoint`: a test peer streams every
request's first chunks as `delta.reasoning_content`, 40 ms apart, then the answer as content, 10 ms
apart; the summary, the terminal and the report give the time to the first answer token and each
phase's ITL, and they match what the peer was told to send. A run without reasoning has no such
section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from itlbench.testing.openai_peer import PeerConfig, serve_in_thread

REASONING, OUTPUT = 6, 24  # chunks of reasoning, then OUTPUT − REASONING of answer
REASONING_TICK_S, ANSWER_TICK_S = 0.040, 0.010
MS = 1e-3


def _run(url: str, out: Path) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "itlbench", "run", "--endpoint", url, "--model", "peer", "--api", "chat",
                        "--workload", f"fixed:16:{OUTPUT}", "--streams", "3", "--duration", "2", "--warmup", "0",
                        "--no-adaptive-warmup", "--out", str(out), "--no-live"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    return p


def test_a_reasoning_run_reports_the_first_answer_token_and_each_phase(tmp_path: Path) -> None:
    cfg = PeerConfig(tick_s=ANSWER_TICK_S, reasoning_tick_s=REASONING_TICK_S, reasoning_chunks=REASONING,
                     reasoning_field="reasoning_content")
    with serve_in_thread(cfg) as (_, url):
        p = _run(url, tmp_path / "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    r = s["reasoning"]
    ok = s["requests"]["ok"]
    assert ok >= 6 and r["requests"] == r["answered"] == s["ttft_s"]["all"]["count"]  # every request reasoned
    assert r["request_share"] == 1.0
    assert r["chunk_share"] == pytest.approx(REASONING / OUTPUT)
    # TTFT counts the first reasoning chunk (one reasoning tick); TTFA the first answer chunk
    ttft, ttfa = s["ttft_s"]["all"], r["ttfa_s"]["all"]
    assert ttfa["count"] == ttft["count"]
    assert REASONING_TICK_S <= ttft["p50"] < REASONING_TICK_S + 30 * MS
    first_answer = REASONING * REASONING_TICK_S + ANSWER_TICK_S
    assert first_answer <= ttfa["p50"] < first_answer + 60 * MS
    assert r["ttfa_s"]["le128"]["count"] == ttfa["count"]  # 16-token prompts
    assert r["ttfa_by_class_s"][f"fixed:16:{OUTPUT}"]["count"] == ttfa["count"]
    thinking = (REASONING - 1) * REASONING_TICK_S + ANSWER_TICK_S
    assert thinking - 5 * MS <= r["reasoning_s"]["p50"] < thinking + 50 * MS
    # each phase's gaps come at its own tick; the gap into the answer is the answer's (one answer tick)
    itl_r, itl_a, hand = r["itl_reasoning_s"], r["itl_answer_s"], r["handoff_s"]
    assert REASONING_TICK_S - 3 * MS <= itl_r["p50"] < REASONING_TICK_S + 10 * MS
    assert ANSWER_TICK_S - 3 * MS <= itl_a["p50"] < ANSWER_TICK_S + 10 * MS
    assert ANSWER_TICK_S - 3 * MS <= hand["p50"] < ANSWER_TICK_S + 10 * MS
    assert itl_r["count"] + itl_a["count"] == s["itl_s"]["count"]  # the phases split the steady gaps
    assert 0 < hand["count"] <= r["answered"] + 3  # one per request (streams still open at the start count)
    ratio = (OUTPUT - REASONING) / (REASONING - 1)  # answer gaps per reasoning gap of a whole request
    assert ratio * 0.7 < itl_a["count"] / itl_r["count"] < ratio * 1.3
    # the terminal and the report the run wrote show it
    terminal = p.stdout + p.stderr
    assert "Reasoning" in terminal and "TTFA" in terminal and "ITL reasoning" in terminal
    md = (tmp_path / "run" / "report.md").read_text()
    assert "## Reasoning and answer" in md and "TTFA" in md and "ITL, answer phase" in md


def test_a_run_without_reasoning_has_no_reasoning_section(tmp_path: Path) -> None:
    with serve_in_thread(PeerConfig(tick_s=ANSWER_TICK_S)) as (_, url):
        p = _run(url, tmp_path / "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["requests"]["ok"] >= 6 and s["reasoning"] is None
    assert "Reasoning" not in p.stdout + p.stderr
    assert "## Reasoning and answer" not in (tmp_path / "run" / "report.md").read_text()
