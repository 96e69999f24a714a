"""The hand-built run of test_analysis.py and test_analysis_stalls.py: 3 steady chat streams pacing 20 ms,
one 32k injected prefill that blocks the engine 1210→1700 ms, so every steady stream sees one 500 ms gap.

Times below are milliseconds on the run clock (converted to ns). Percentiles are linear
interpolation (numpy's default), as the analysis documents.
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis import RunWindow
from itlbench.rundir.schema import frame

MS = 1_000_000
WINDOW = RunWindow(run_start_ns=0, measure_start_ns=1000 * MS, end_ns=11_000 * MS)

R0 = [1030 + 20 * k for k in range(10)] + [1710, 1730, 1750]
R1 = [1040 + 20 * k for k in range(9)] + [1700, 1720]
R2 = [1045 + 20 * k for k in range(9)] + [1705, 1725, 1745]
INJ = [1700, 1720, 1740]
WARM = [600, 610, 990]  # warmup request whose gaps all end before measurement: must not be analysed


def _req(rid, sid, cls, prompt, sched, sent, chunks, stream=None, status="ok"):
    return {
        "request_id": rid,
        "server_request_id": sid,
        "workload": "chat",
        "cls": cls,
        "injected": cls == "injected",
        "stream": stream,
        "prompt_tokens": prompt,
        "max_tokens": 64,
        "scheduled_ns": sched * MS,
        "sent_ns": sent * MS,
        "first_token_ns": chunks[0] * MS if chunks else None,
        "last_token_ns": chunks[-1] * MS if chunks else None,
        "output_tokens": len(chunks),
        "num_chunks": len(chunks),
        "status": status,
    }


def _chunks(rid, times, tokens=None):
    tokens = tokens or {}
    return [
        {"request_id": rid, "index": i, "t_ns": t * MS, "n_tokens": tokens.get(i, 1)}
        for i, t in enumerate(times)
    ]


def _step(i, start, end, prefill=0, decode=0, ids=()):
    return {
        "step": i,
        "phase": "x",
        "prefill_tokens": prefill,
        "decode_tokens": decode,
        "start_ns": start * MS,
        "end_ns": end * MS,
        "prefill_request_ids": list(ids),
    }


def hand_built_tables() -> dict[str, pl.DataFrame]:
    requests = frame(
        "requests",
        [
            _req("w0", "sw", "chat", 50, 500, 500, WARM),
            _req("r0", "s0", "chat", 100, 1000, 1001, R0),
            _req("r1", "s1", "chat", 400, 1010, 1012, R1),
            _req("r2", "s2", "chat", 1000, 1020, 1020, R2, stream=0),
            _req("inj", "sx", "injected", 32768, 1200, 1201, INJ),
            _req("r3", None, "chat", 100, 1500, 1500, [], status="error"),
        ],
    )
    chunks = frame(
        "chunks",
        _chunks("w0", WARM)
        + _chunks("r0", R0)
        + _chunks("r1", R1)
        + _chunks("r2", R2, {1: 2})
        + _chunks("inj", INJ),
    )
    steps = frame(
        "steps",
        [
            _step(0, 1005, 1010, prefill=100, ids=["s0"]),
            _step(1, 1020, 1030, prefill=400, ids=["s1"]),
            _step(2, 1030, 1040, prefill=1000, ids=["s2"]),
            _step(3, 1041, 1046, decode=3),
            _step(4, 1210, 1700, prefill=32768, ids=["sx"]),
            _step(5, 1700, 1705, decode=4),
        ],
    )
    return {"requests": requests, "chunks": chunks, "steps": steps}
