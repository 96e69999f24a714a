"""The phases measurement read into its table: per request, the client's TTFT and decode gaps or the engine's
step log's prefill and decode steps; medians per prompt length, the batched decode rows, and the two lengths
read off the table (where prefill throughput saturates, where its time stops growing linearly). Apart from
`phases.py`, which sends the requests, so the reading can be checked on recorded rows without an engine."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from itlbench.experiments.phases_report import LINEAR_SLACK, SATURATION_SHARE


@dataclass
class Sample:
    prompt_tokens: int
    ttft_s: float
    decode_gap_s: float | None  # mean gap after the first token
    engine_prefill_s: float | None = None


def _samples(tables: dict[str, list[dict[str, Any]]], first: int, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Per request key: its request row and chunk arrival times."""
    chunks: dict[str, list[int]] = defaultdict(list)
    for c in tables["chunks"]:
        chunks[c["request_id"]].append(c["t_ns"])
    out = {}
    for r in tables["requests"][first:]:
        if r["request_id"] in keys:
            out[r["request_id"]] = {**r, "times": sorted(chunks[r["request_id"]])}
    return out


def _mean_gap(times: list[int]) -> float | None:
    """Client view of one decode step; None when the tokens arrived together (nothing to time)."""
    gap = (times[-1] - times[0]) / 1e9 / (len(times) - 1) if len(times) >= 2 else 0.0
    return gap if gap > 0 else None


def _engine_decode_s(steps: list[dict[str, Any]], lo: int | None, hi: int | None) -> float | None:
    """Median decode-only step while one request was generating (phases sends one at a time)."""
    if lo is None or hi is None:
        return None
    mine = [(s["end_ns"] - s["start_ns"]) / 1e9 for s in steps
            if s.get("prefill_tokens") == 0 and (s.get("decode_tokens") or 0) > 0 and lo <= s["end_ns"] <= hi]
    return statistics.median(mine) if mine else None


def _engine_prefill_s(steps: list[dict[str, Any]], server_id: str | None) -> float | None:
    if not server_id:
        return None
    mine = [s for s in steps if server_id in (s.get("prefill_request_ids") or [])]
    return sum((s["end_ns"] - s["start_ns"]) / 1e9 for s in mine) if mine else None


def read_measurement(tables: dict[str, list[dict[str, Any]]],
                     decode: list[dict[str, Any]]) -> tuple[list[Sample], list[dict[str, Any]]]:
    """The prefill samples (requests keyed 'p…') and one row per decode batch, from the recorded tables:
    the engine's step log where there is one, the client's chunk times otherwise."""
    by_key = _samples(tables, 0, [r["request_id"] for r in tables["requests"]])
    steps = tables["steps"]
    samples: list[Sample] = []
    for key, r in by_key.items():
        if key.startswith("p") and r["first_token_ns"] is not None:
            gap = _engine_decode_s(steps, r["first_token_ns"], r["last_token_ns"]) if steps else _mean_gap(r["times"])
            samples.append(Sample(r["prompt_tokens"], (r["first_token_ns"] - r["sent_ns"]) / 1e9,
                                  gap, _engine_prefill_s(steps, r["server_request_id"])))
    return samples, [_decode_row(d, by_key, steps) for d in decode]


def _decode_row(d: dict[str, Any], by_key: dict[str, dict[str, Any]], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Client: median gap while all `batch` streams were decoding; engine: median decode-only step."""
    batch, reqs = d["batch"], [by_key[k] for k in d["keys"] if k in by_key]
    times = [r["times"] for r in reqs if len(r["times"]) >= 2]
    gaps: list[float] = []
    if times:
        lo, hi = max(t[0] for t in times), min(t[-1] for t in times)
        for t in times:
            gaps += [(b - a) / 1e9 for a, b in zip(t, t[1:], strict=False) if a >= lo and b <= hi]
        if not gaps:
            gaps = [g for t in times for g in ((b - a) / 1e9 for a, b in zip(t, t[1:], strict=False))]
    pure = [s for s in steps if s.get("prefill_tokens") == 0 and (s.get("decode_tokens") or 0) > 0
            and d["from_ns"] <= s["start_ns"] <= d["to_ns"]]
    full = max((s["decode_tokens"] for s in pure), default=0)  # requests that arrived late may never all decode together
    engine = [(s["end_ns"] - s["start_ns"]) / 1e9 for s in pure if s["decode_tokens"] == full]
    if engine:
        batch = full
    gaps = [g for g in gaps if g > 0]  # tokens read together carry no timing
    client = statistics.median(gaps) if gaps else None
    eng = statistics.median(engine) if engine else None
    step = eng if eng is not None else client
    return {"batch": d["batch"], "batch_measured": batch, "client_gap_s": client, "engine_step_s": eng,
            "engine_steps": len(engine),
            "tokens_per_s_per_stream": 1 / step if step else None,
            "tokens_per_s_total": batch / step if step else None}


def summarize(samples: list[Sample], lengths: list[int]) -> tuple[list[dict[str, Any]], int | None, int | None, int | None]:
    """Median per length, then the saturation length and the linear range."""
    rows = []
    for n in lengths:
        mine = [s for s in samples if s.prompt_tokens == n]
        if not mine:
            continue
        ttft = statistics.median(s.ttft_s for s in mine)
        engine = [s.engine_prefill_s for s in mine if s.engine_prefill_s is not None]
        gaps = [s.decode_gap_s for s in mine if s.decode_gap_s is not None]
        prefill = statistics.median(engine) if engine else ttft
        decode = statistics.median(gaps) if gaps else None
        rows.append({"prompt_tokens": n, "requests": len(mine), "client_ttft_s": ttft,
                     "engine_prefill_s": statistics.median(engine) if engine else None,
                     "prefill_s": prefill, "prefill_tokens_per_s": n / prefill if prefill > 0 else None,
                     "decode_step_s": decode, "decode_tokens_per_s": 1 / decode if decode else None})
    return rows, *knees(rows)


def knees(rows: list[dict[str, Any]]) -> tuple[int | None, int | None, int | None]:
    """(saturation length, longest length still linear, first superlinear length) from the table."""
    tps = [(r["prompt_tokens"], r["prefill_tokens_per_s"]) for r in rows if r["prefill_tokens_per_s"]]
    if len(tps) < 2:
        return None, None, None
    best_n, best = max(tps, key=lambda x: x[1])
    saturation = next(n for n, v in tps if v >= SATURATION_SHARE * best)
    linear_until, superlinear = best_n, None
    for n, v in tps:
        if n <= best_n:
            continue
        if best / v > LINEAR_SLACK:
            superlinear = n
            break
        linear_until = n
    return saturation, linear_until, superlinear
