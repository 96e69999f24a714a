"""`itlbench run --engine sim` on the issue's deployment against NVIDIA's published NIM serving runs (held out)."""

from __future__ import annotations

import importlib.util
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_one_stream_of_the_issues_command_is_within_15_percent_of_nims_published_run(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("sim_vs_nim", ROOT / "benchmarks" / "sim_vs_nim.py")
    assert spec is not None and spec.loader is not None
    nim = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, nim)  # its dataclass looks itself up there
    spec.loader.exec_module(nim)
    monkeypatch.chdir(ROOT)
    # `--quick`'s rows, each its own `itlbench run` process, run side by side (one a core); the script then prints
    # them as it would have run them one after the other
    quick = [r for r in nim.PUBLISHED if r.concurrency == 1]
    with ThreadPoolExecutor(len(quick)) as pool:
        simulated = dict(zip(quick, pool.map(nim.simulate, quick), strict=True))

    def simulate(row: object, ramp_s: float = 0.0) -> dict[str, float]:
        assert ramp_s == 0.0  # one stream: no row of --quick is run spread
        return simulated[row]

    monkeypatch.setattr(nim, "simulate", simulate)
    monkeypatch.setattr(sys, "argv", ["sim_vs_nim.py", "--quick"])
    nim.main()
    out = capsys.readouterr().out
    assert "--engine sim --model llama-3.3-70b --gpu h100 --tp 2 --dtype fp8" in out
    rows = [line for line in out.splitlines() if re.match(r"\| \d+/\d+ \| 1 \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["5000/500", "500/2000"]  # the page's two one-stream rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        published = [float(cells[i].replace(",", "")) for i in (2, 5, 8)]  # TTFT ms, ITL ms, tok/s
        priced = [float(cells[i].replace(",", "")) for i in (3, 6, 9)]
        for pub, sim in zip(published, priced, strict=True):
            assert abs(sim / pub - 1) <= 0.15, row  # held out: nothing is fitted on these runs
