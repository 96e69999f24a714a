"""Peer harnesses against one truth: each one's per-request TTFT and ITL scored against a server's own log.

Servers:

- `paced`: itlbench's paced test server (itlbench/testing/paced_server.py) in its own process; one
  chunk per 20 ms tick to every stream; it logs every content chunk's send (`perf_counter_ns`) and
  every request's arrival (its handler's start). Truth per request: TTFT = first send − arrival,
  gaps = differences of consecutive sends, mean ITL = (last send − first send) / (sends − 1).
- `bundled`: `itlbench serve --model tiny` (the bundled engine); its step log (/v1/steps) names the
  step that produced each request's first token (`prefill_request_ids`, the same id the response
  carries). With every running request decoding in every step (max-num-seqs ≥ streams, no
  preemption), token k of a request is produced at the end of the k-th step after that one: that is
  the truth's timeline (a reconstruction, checked by itlbench's own kernel-stamped client). The step
  log has no arrivals: TTFT is scored as the harness's first-token stamp on this host's clock against
  the first-token step's end (the delivery lag), only for harnesses that export absolute stamps.

Harnesses: itlbench itself (kernel reader, in process), `vllm bench serve`, AIPerf and guidellm
(benchmarks/peers/run_harnesses.sh; venvs from install_vllm.sh and install_harnesses.sh). Requests
are matched to the log by the response id a harness exports (AIPerf's raw records, guidellm's
`response_id`, itlbench's `server_request_id`); `vllm bench serve` keeps only the generated text, so
on the paced server the first chunk's text carries the id (`tag_text`; vLLM counts tokens from
`usage`, so the tag does not change its token counts). On the bundled server vLLM's requests are
matched by their first-token stamp to the latest step that ended before it (stated in the output).

Errors: harness − truth, per gap (the first n−1 gaps of a request with n truth sends; a harness's
surplus gaps are counted apart) or per request (TTFT, mean ITL); reported as |error| p50/p99/max, ms.
Each measured command runs under `flock /tmp/itlbench-bench.lock`.

    python benchmarks/harness_truth.py --server paced --streams 100,500 --repeat-100 2 --out ~/peers/runs/ht
    python benchmarks/harness_truth.py --server bundled --streams 100,500 --out ~/peers/runs/ht-bundled
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from itlbench.experiments.selftest import server_log  # noqa: E402
from itlbench.load.driver import drive  # noqa: E402
from itlbench.load.target import Target  # noqa: E402
from itlbench.rundir.reader import read_table  # noqa: E402
from itlbench.rundir.store import RunStore  # noqa: E402
from itlbench.testing.paced_server import PacedConfig, spawn  # noqa: E402
from itlbench.testing.plans import fixed_streams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN_HARNESSES = ROOT / "benchmarks" / "peers" / "run_harnesses.sh"
LOCK = "/tmp/itlbench-bench.lock"
TOKENIZER = Path(os.environ.get("ITLBENCH_VLLM_TOKENIZER", "~/peers/models/cpu-small")).expanduser()
WORD = " the"  # one token in the cpu-small tokenizer the harnesses count with
HARNESSES = ("itlbench", "vllm", "aiperf", "guidellm")
TAG = re.compile(r"\[(cmpl-\d+)\]")


@contextlib.contextmanager
def bench_lock():
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- what a harness reported, per request --------------------------------------------------------
@dataclass
class Req:
    sid: str  # the server's request id
    ttft_ms: float | None = None  # the harness's own TTFT (its clock start to its first token)
    first_abs_ns: int | None = None  # its first-token stamp on this host's perf_counter_ns, where it has one
    gaps_ms: list[float] | None = None  # per-gap ITL, where it exports them
    mean_itl_ms: float | None = None  # its per-request ITL (or TPOT) mean


@dataclass
class HarnessRun:
    harness: str
    reqs: list[Req] = field(default_factory=list)
    unmatched: int = 0
    mean_name: str = ""  # what its per-request mean is called
    gap_name: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    load1: float = 0.0
    note: str = ""


def _wall_to_perf_ns() -> int:
    return time.time_ns() - time.perf_counter_ns()


def parse_vllm(out: Path, matcher=None) -> HarnessRun:
    r = json.loads((out / "vllm-bench" / "result.json").read_text())
    run = HarnessRun("vllm", mean_name="TPOT", gap_name="ITL (per gap)")
    for i, text in enumerate(r["generated_texts"]):
        if r["errors"][i]:
            run.unmatched += 1
            continue
        ttft, itls, lat, n = r["ttfts"][i], r["itls"][i], r["latencies"][i], r["output_lens"][i]
        first = int((r["start_times"][i] + ttft) * 1e9)
        m = TAG.search(text or "")
        sid = m.group(1) if m else (matcher(first) if matcher else None)
        if sid is None:
            run.unmatched += 1
            continue
        run.reqs.append(Req(sid, ttft * 1e3, first, [g * 1e3 for g in itls],
                            (lat - ttft) / (n - 1) * 1e3 if n and n > 1 else None))
    return run


def parse_aiperf(out: Path) -> HarnessRun:
    d = out / "aiperf"
    ids: dict[str, tuple[str, int]] = {}
    for line in (d / "profile_export_raw.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for resp in rec.get("responses") or []:
            for p in resp.get("packets") or []:
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    ev = json.loads(p["value"])
                    if ev.get("choices"):
                        ids[rec["metadata"]["x_request_id"]] = (ev["id"], int(resp["perf_ns"]))
                        break
            if rec["metadata"]["x_request_id"] in ids:
                break
    run = HarnessRun("aiperf", mean_name="inter_token_latency (per request)",
                     gap_name="inter_chunk_latency (per gap)")
    for line in (d / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        hit = ids.get(rec["metadata"]["x_request_id"])
        m = rec.get("metrics") or {}
        if hit is None or "time_to_first_token" not in m:
            run.unmatched += 1
            continue
        icl = m.get("inter_chunk_latency", {}).get("value")
        itl = m.get("inter_token_latency", {}).get("value")
        run.reqs.append(Req(hit[0], m["time_to_first_token"]["value"], hit[1],
                            list(icl) if isinstance(icl, list) else None, itl))
    return run


def parse_guidellm(out: Path) -> HarnessRun:
    b = json.loads((out / "guidellm" / "benchmarks.json").read_text())["benchmarks"][0]
    off = _wall_to_perf_ns()
    run = HarnessRun("guidellm", mean_name="inter_token_latency_ms (per request)")
    for r in b["requests"]["successful"]:
        first = r["info"]["timings"].get("first_token_iteration")
        run.reqs.append(Req(r["response_id"], r["time_to_first_token_ms"],
                            int(first * 1e9) - off if first else None, None, r["inter_token_latency_ms"]))
    run.unmatched = len(b["requests"].get("errored") or []) + len(b["requests"].get("incomplete") or [])
    return run


def run_peer(harness: str, base: str, model: str, out: Path, streams: int, requests: int, tokens: int,
             untagged: bool = False) -> HarnessRun:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load1 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", str(RUN_HARNESSES), base, model, str(TOKENIZER), str(out), str(streams), "32",
                           str(tokens), str(requests), harness], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        log = out / f"{harness}.log"
        tail = log.read_text()[-2000:] if log.exists() else proc.stderr[-2000:]
        raise RuntimeError(f"{harness} failed (rc {proc.returncode}): {tail}")
    if harness == "vllm":  # untagged: ids filled in later by _match_vllm_by_step
        run = parse_vllm(out, (lambda first: f"?{first}") if untagged else None)
    else:
        run = {"aiperf": parse_aiperf, "guidellm": parse_guidellm}[harness](out)
    run.wall_s, run.load1 = wall, load1
    run.cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return run


async def _drive_itlbench(url: str, model: str, run_dir: Path, streams: int, tokens: int, duration_s: float) -> None:
    store = RunStore(run_dir)
    try:
        await drive(fixed_streams(streams, tokens), Target(url, model, timeout_s=None, stream_reader="kernel"),
                    store, duration_s=duration_s, warmup_s=0.0, drain_timeout_s=60.0, handle_sigint=False)
    finally:
        store.close()


def run_itlbench(url: str, model: str, out: Path, streams: int, tokens: int, duration_s: float) -> HarnessRun:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    load1 = os.getloadavg()[0]
    c0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(_drive_itlbench(url, model, out, streams, tokens, duration_s))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    req = read_table(out, "requests")
    chunks = read_table(out, "chunks").sort("request_id", "index")
    by = {r: ts for r, ts in chunks.group_by("request_id", maintain_order=True).agg("t_ns").iter_rows()}
    run = HarnessRun("itlbench", mean_name="TPOT (per request)", gap_name="ITL (per gap)", wall_s=wall, cpu_s=cpu,
                     load1=load1)
    for row in req.iter_rows(named=True):
        ts = by.get(row["request_id"])
        if row["status"] != "ok" or not ts or row["server_request_id"] is None:
            run.unmatched += 1
            continue
        gaps = list(np.diff(np.asarray(ts, np.int64)) / 1e6)
        run.reqs.append(Req(row["server_request_id"], (row["first_token_ns"] - row["scheduled_ns"]) / 1e6, ts[0],
                            gaps, float(np.mean(gaps)) if gaps else None))
    return run


# ---- scoring ------------------------------------------------------------------------------------
@dataclass
class Truth:
    sends: dict[str, list[int]]  # sid -> send (or production) times, perf_counter_ns
    arrivals: dict[str, int]  # sid -> arrival, where known


def _pcts(a: np.ndarray) -> dict | None:
    if a.size == 0:
        return None
    x = np.abs(a)
    return {"n": int(a.size), "p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99)),
            "max": float(x.max()), "signed_median": float(np.median(a)), "signed_mean": float(a.mean())}


def score(run: HarnessRun, truth: Truth) -> dict:
    gap_err, mean_err, ttft_err, first_err, surplus, matched = [], [], [], [], [], 0
    for r in run.reqs:
        s = truth.sends.get(r.sid)
        if not s or len(s) < 2:
            continue
        matched += 1
        sv = np.asarray(s, np.int64)
        tgaps = np.diff(sv) / 1e6
        if r.gaps_ms is not None:
            n = min(len(r.gaps_ms), tgaps.size)
            gap_err.append(np.asarray(r.gaps_ms[:n]) - tgaps[:n])
            surplus.extend(r.gaps_ms[tgaps.size:])
        if r.mean_itl_ms is not None:
            mean_err.append(r.mean_itl_ms - (sv[-1] - sv[0]) / (sv.size - 1) / 1e6)
        a = truth.arrivals.get(r.sid)
        if r.ttft_ms is not None and a is not None:
            ttft_err.append(r.ttft_ms - (sv[0] - a) / 1e6)
        if r.first_abs_ns is not None:
            first_err.append((r.first_abs_ns - sv[0]) / 1e6)
    cat = np.concatenate(gap_err) if gap_err else np.zeros(0)
    return {"harness": run.harness, "requests": len(run.reqs), "matched": matched, "unmatched": run.unmatched,
            "gap_name": run.gap_name, "mean_name": run.mean_name,
            "itl_gap_error_ms": _pcts(cat), "itl_mean_error_ms": _pcts(np.asarray(mean_err)),
            "ttft_error_ms": _pcts(np.asarray(ttft_err)), "first_token_stamp_error_ms": _pcts(np.asarray(first_err)),
            "surplus_gaps": {"n": len(surplus), "median_ms": float(np.median(surplus)) if surplus else None},
            "wall_s": run.wall_s, "client_cpu_s": run.cpu_s, "load1_at_start": run.load1, "note": run.note}


# ---- servers ------------------------------------------------------------------------------------
def paced_case(harness: str, streams: int, rounds: int, tokens: int, out: Path) -> dict:
    cfg = PacedConfig(tick_s=0.02, role_chunk=False, word=WORD, tag_text=harness == "vllm")
    with bench_lock():
        proc, url = spawn(cfg)
        try:
            if harness == "itlbench":
                run = run_itlbench(url, "paced", out, streams, tokens, rounds * tokens * cfg.tick_s)
            else:
                run = run_peer(harness, url.removesuffix("/v1"), "paced", out, streams, streams * rounds, tokens)
            log = server_log(url)
        finally:
            proc.kill()
            proc.wait()
    truth = Truth(log["sends"], log["arrivals"])
    tp = np.concatenate([np.diff(np.asarray(s, np.int64)) for s in log["sends"].values() if len(s) > 1]) / 1e6
    res = score(run, truth)
    res["truth"] = {"requests": len(log["sends"]), "gap_p50_ms": float(np.percentile(tp, 50)),
                    "gap_p99_ms": float(np.percentile(tp, 99)), "gap_max_ms": float(tp.max()),
                    "server_cpu_s": log.get("cpu_s")}
    return res


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steps(base: str) -> list[dict]:
    with urllib.request.urlopen(base + "/v1/steps?since=0&follow=0", timeout=120) as r:
        return [json.loads(x) for x in r.read().splitlines() if x.strip()]


def bundled_truth(steps: list[dict], tokens: int) -> Truth:
    """Token k of a request at the end of the k-th step after the one that produced its first token."""
    ends = [s["end_ns"] for s in steps]
    sends: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for rid in s.get("prefill_request_ids") or ():
            sends[rid] = ends[i:i + tokens]
    return Truth(sends, {})


def bundled_case(harness: str, streams: int, rounds: int, tokens: int, out: Path) -> dict:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "itlbench", "serve", "--model", "tiny", "--port", str(port),
            "--max-num-seqs", str(max(streams, 64)), "--max-waiting", "4096", "--seed", "0"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with bench_lock():
        srv = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(base + "/health", timeout=2).read()
                    break
                time.sleep(0.2)
            model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=10).read())["data"][0]["id"]
            if harness == "itlbench":
                run = run_itlbench(base + "/v1", model, out, streams, tokens, rounds * tokens * 0.05)
                steps = _steps(base)
            else:
                # vLLM's requests carry no id here: matched by first-token stamp after the run
                run = run_peer(harness, base, model, out, streams, streams * rounds, tokens, untagged=True)
                steps = _steps(base)
        finally:
            srv.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                srv.wait(20)
            if srv.poll() is None:
                srv.kill()
    truth = bundled_truth(steps, tokens)
    if harness == "vllm":
        _match_vllm_by_step(run, steps, truth)
    decode = [s for s in steps if s["decode_tokens"] > 0]
    dgaps = np.diff(np.asarray([s["end_ns"] for s in decode], np.int64)) / 1e6 if len(decode) > 1 else np.zeros(0)
    res = score(run, truth)
    res["truth"] = {"requests": len(truth.sends), "steps": len(steps),
                    "step_interval_p50_ms": float(np.percentile(dgaps, 50)) if dgaps.size else None,
                    "step_interval_p99_ms": float(np.percentile(dgaps, 99)) if dgaps.size else None,
                    "step_interval_max_ms": float(dgaps.max()) if dgaps.size else None,
                    "preemptions": int(sum(s["num_preemptions"] for s in steps)),
                    "max_running": int(max((s["num_running"] for s in steps), default=0))}
    res["check"] = _reconstruction_check(steps, tokens)
    return res


def _match_vllm_by_step(run: HarnessRun, steps: list[dict], truth: Truth) -> None:
    """vLLM's requests: the first-token step is the latest step with a prefill that ended before its first
    token; requests sharing that step share the truth's timeline, so any of its ids will do."""
    pre = [(s["end_ns"], s["prefill_request_ids"][0]) for s in steps if s.get("prefill_request_ids")]
    ends = np.asarray([e for e, _ in pre], np.int64)
    for r in run.reqs:
        if r.first_abs_ns is None or not r.sid.startswith("?"):
            continue
        k = int(np.searchsorted(ends, r.first_abs_ns, side="right")) - 1
        r.sid = pre[k][1] if k >= 0 else ""
    run.note = "matched by first-token stamp to the latest prefill step ending before it"


def _reconstruction_check(steps: list[dict], tokens: int) -> dict:
    """Did every request that started in step i finish in step i + tokens − 1 (every running request in
    every step)? Counts finishes the reconstruction predicts against the step log's num_finished."""
    predicted: dict[int, int] = {}
    for i, s in enumerate(steps):
        n = len(s.get("prefill_request_ids") or ())
        if n:
            predicted[i + tokens - 1] = predicted.get(i + tokens - 1, 0) + n
    agree = sum(min(predicted.get(i, 0), s.get("num_finished", 0)) for i, s in enumerate(steps))
    return {"finishes_logged": int(sum(s.get("num_finished", 0) for s in steps)), "finishes_where_predicted": agree}


def _fmt(e: dict | None, key: str = "") -> str:
    if not e:
        return "—"
    return " / ".join(f"{e[k]:.3f}" if e[k] < 10 else f"{e[k]:.1f}" for k in ("p50", "p99", "max"))


def tables(path: Path) -> str:
    """Markdown tables (one per server and stream count) from the JSON lines this script appended."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    out = []
    for server, n in sorted({(r["server"], r["streams"]) for r in rows}):
        out.append(f"\n{server} server, {n} streams\n")
        out.append("| harness | run | load1 | ITL per gap: abs error p50 / p99 / max (ms) | surplus gaps | "
                   "per-request mean ITL: abs error p50 / p99 / max | TTFT: abs error p50 / p99 / max (signed median) | "
                   "first-token stamp − truth p50 / p99 / max | requests matched | client CPU s | truth's own gaps p50 / p99 |")
        out.append("|---|---:|---:|---|---:|---|---|---|---:|---:|---|")
        for r in [r for r in rows if (r["server"], r["streams"]) == (server, n)]:
            if "error" in r:
                out.append(f"| {r['harness']} | {r['rep']} | | failed: {r['error'][:120]} | | | | | | | |")
                continue
            t = r["ttft_error_ms"]
            ttft = f"{_fmt(t)} ({t['signed_median']:+.2f})" if t else "—"
            tr = r["truth"]
            own = (tr.get("gap_p50_ms"), tr.get("gap_p99_ms")) if "gap_p50_ms" in tr else (
                tr.get("step_interval_p50_ms"), tr.get("step_interval_p99_ms"))
            own_s = " / ".join(f"{x:.1f}" for x in own) if None not in own else "—"
            out.append(f"| {r['harness']} | {r['rep']} | {r['load1_at_start']:.1f} | {_fmt(r['itl_gap_error_ms'])} | "
                       f"{r['surplus_gaps']['n']} | {_fmt(r['itl_mean_error_ms'])} | {ttft} | "
                       f"{_fmt(r['first_token_stamp_error_ms'])} | {r['matched']}/{r['requests'] + r['unmatched']} | "
                       f"{r['client_cpu_s']:.1f} | {own_s} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", choices=("paced", "bundled"), default="paced")
    p.add_argument("--streams", default="100,500")
    p.add_argument("--rounds", type=int, default=3, help="requests per stream")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--repeat-100", type=int, default=2, help="runs of the 100-stream case (noise)")
    p.add_argument("--harnesses", default=",".join(HARNESSES))
    p.add_argument("--out", type=Path, default=Path("~/peers/runs/harness-truth").expanduser())
    p.add_argument("--json", type=Path, help="append each scored case as a JSON line here")
    p.add_argument("--table", type=Path, help="print markdown tables from a --json file and exit")
    a = p.parse_args(argv)
    if a.table:
        print(tables(a.table))
        return
    case = paced_case if a.server == "paced" else bundled_case
    for n in [int(x) for x in a.streams.split(",")]:
        for rep in range(a.repeat_100 if n == 100 else 1):
            for h in a.harnesses.split(","):
                out = a.out / a.server / f"{h}-{n}-r{rep}"
                try:
                    res = case(h, n, a.rounds, a.tokens, out)
                except Exception as exc:  # a harness that fails is reported and the others go on
                    res = {"harness": h, "error": repr(exc)[:3000]}
                res.update(server=a.server, streams=n, rep=rep)
                line = json.dumps(res)
                print(line, flush=True)
                if a.json:
                    with a.json.open("a") as f:
                        f.write(line + "\n")


if __name__ == "__main__":
    main()
