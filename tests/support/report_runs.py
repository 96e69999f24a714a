"""Hand-built run directories for report tests: every record written through the real run store.

Timeline (seconds on the run clock): run start 0, measurement from 1 to 11. `streams` steady streams
each receive a token every 20 ms; an injected 8k prompt, sent at 5.0, is prefilled by four 2k steps
over [5.0, 6.5] during which no steady token arrives (one stall per stream, cause: prefill).
"""

from __future__ import annotations

import json
from pathlib import Path

from itlbench.rundir.store import RunStore

S = 1_000_000_000
MS = 1_000_000
PAUSE = (5 * S, 6500 * MS)
INJECTED_SID = "cmpl-inj"


def _config(seed: int, inject: str | None, duration_s: float, endpoint: str | None) -> dict[str, object]:
    engine = None if endpoint else {"model": "cpu-small", "chunk_budget": 2048, "policy": "budget", "mixed": False,
                                    "max_num_seqs": 64}
    return {"workload": "chat", "inject": inject, "inject_max_tokens": 16, "streams": 4, "rate": None,
            "burstiness": 1.0, "duration_s": duration_s, "warmup_s": 1.0, "adaptive_warmup": True, "ramp_s": 0.0,
            "seed": seed, "endpoint": endpoint, "model": "m" if endpoint else "cpu-small", "api": "completions",
            "forced_lengths": True, "slo": None, "stall_factor": 5.0, "stall_floor_s": 0.05, "trace": None,
            "time_scale": 1.0, "workers": 1, "engine": engine}


def build_run(path: Path, *, streams: int = 4, inject: bool = True, external: bool = False, seed: int = 0,
              window: bool = True, duration_s: float = 10.0, stall_scale: float = 1.0) -> Path:
    """Write a run directory; `window=False` leaves run.json as a killed run leaves it (no end time)."""
    store = RunStore(path)
    pause = (PAUSE[0], PAUSE[0] + int((PAUSE[1] - PAUSE[0]) * stall_scale)) if inject else None
    end = 11 * S
    for i in range(streams):
        rid = f"s{i:02d}-000000"
        times = [t for t in range(1200 * MS + i * MS, end, 20 * MS)
                 if pause is None or not (pause[0] < t < pause[1])]
        store.add_many("chunks", [{"request_id": rid, "index": k, "t_ns": t, "n_tokens": 1}
                                  for k, t in enumerate(times)])
        store.add("requests", {"request_id": rid, "server_request_id": f"cmpl-{i}", "workload": "chat", "cls": "chat",
                               "injected": False, "stream": i, "prompt_tokens": 500, "max_tokens": 600,
                               "scheduled_ns": 1100 * MS, "sent_ns": 1101 * MS, "first_token_ns": times[0],
                               "last_token_ns": times[-1], "done_ns": times[-1] + MS, "output_tokens": len(times),
                               "num_chunks": len(times), "status": "ok", "http_status": 200})
    steps, step = [], 0
    t = 500 * MS
    while t < end:
        if pause and pause[0] <= t < pause[1]:
            width = (pause[1] - pause[0]) // 4
            for k in range(4):
                steps.append({"step": step, "phase": "mixed", "prefill_tokens": 2048 - streams,
                              "decode_tokens": streams, "start_ns": pause[0] + k * width,
                              "end_ns": pause[0] + (k + 1) * width, "token_budget": 2048,
                              "prefill_request_ids": [INJECTED_SID], "num_preemptions": 0})
                step += 1
            t = pause[1]
            continue
        steps.append({"step": step, "phase": "decode", "prefill_tokens": 0, "decode_tokens": streams,
                      "start_ns": t, "end_ns": t + 18 * MS, "token_budget": 2048, "prefill_request_ids": [],
                      "num_preemptions": 0})
        step += 1
        t += 20 * MS
    if not external:
        store.add_many("steps", steps)
    if pause:
        first = pause[1] + 10 * MS
        inj_times = [first + k * 20 * MS for k in range(16)]
        store.add("requests", {"request_id": "inj-000", "server_request_id": INJECTED_SID, "workload": "injected",
                               "cls": "injected", "injected": True, "prompt_tokens": 8192, "max_tokens": 16,
                               "scheduled_ns": pause[0], "sent_ns": pause[0] + MS, "first_token_ns": first,
                               "last_token_ns": inj_times[-1], "done_ns": inj_times[-1] + MS, "output_tokens": 16,
                               "num_chunks": 16, "status": "ok", "http_status": 200})
        store.add_many("chunks", [{"request_id": "inj-000", "index": k, "t_ns": t, "n_tokens": 1}
                                  for k, t in enumerate(inj_times)])
    store.add_many("client_samples", [{"t_ns": t * 500 * MS, "loop_lag_s": 0.001, "cpu_percent": 5.0,
                                       "in_flight": streams} for t in range(2, 22)])
    if external:
        rows = []
        for k in range(12):
            tk = k * S
            inside = 0 if pause is None else min(max(tk - pause[0], 0), pause[1] - pause[0]) / S
            rows += [{"t_ns": tk, "name": "vllm:prompt_tokens_total", "labels": '{"model_name":"m"}',
                      "value": 2000.0 + 5000.0 * inside},
                     {"t_ns": tk, "name": "vllm:generation_tokens_total", "labels": '{"model_name":"m"}',
                      "value": 200.0 * k},
                     {"t_ns": tk, "name": "vllm:request_prefill_time_seconds_sum", "labels": '{"model_name":"m"}',
                      "value": 0.1 * k + 1.5 * inside},
                     {"t_ns": tk, "name": "vllm:request_decode_time_seconds_sum", "labels": '{"model_name":"m"}',
                      "value": 0.8 * k}]
        store.add_many("server_metrics", rows)
    store.close()
    endpoint = "http://127.0.0.1:8000/v1" if external else None
    doc: dict[str, object] = {
        "itlbench_version": "0.1.0", "created": "2026-01-01T00:00:00+00:00",
        "config": _config(seed, "8k@4s" if inject else None, duration_s, endpoint),
        "hardware": {"cpu_count": 2, "cuda": None, "torch": "2.13.0+cpu"}, "versions": {"itlbench": "0.1.0"},
        "stall_factor": 5.0, "stall_floor_s": 0.05, "slo": None,
        "engine": {"external": True, "models": ["m"]} if external else
        {"served_model_name": "cpu-small", "engine": {"model": "cpu-small", "chunk_budget": 2048, "policy": "budget"},
         "model": {"name": "cpu-small", "vocab_size": 8192}},
        "target": {"kind": "external" if external else "bundled"},
    }
    if window:
        doc.update({"run_start_ns": 0, "measure_start_ns": 1 * S, "end_ns": end})
    (path / "run.json").write_text(json.dumps(doc))
    return path
