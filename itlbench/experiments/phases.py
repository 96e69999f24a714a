"""`itlbench phases`: prefill and decode measured apart, the source documents' exercise A as one command.

For each prompt length (1, 16, 128, 512, 2k, 8k, … ×4 up to the context) a few requests are sent one
at a time: TTFT ≈ the prefill of the whole prompt, the gaps after it ≈ one decode step at batch 1.
Then `concurrency` requests decode together for the batched step time. Against an itlbench engine
(the bundled one by default) the engine's own step log gives the prefill and decode step times
besides the client's; an external endpoint gets the client's view only, as in the source documents' Go program.
Prefill is unchunked by default so one prompt is one forward pass. `--engine sim` serves the simulator in real
time (each step sleeps the time the cost model prices for --gpu, --tp, --dtype): the same table, read off the
step log, for a GPU that is not here; its default lengths stop at 32k, whose prefill takes seconds of wall time.

Two lengths are read off the table: where prefill throughput saturates (tokens/s reaches 90 % of its
best: below it a longer prompt costs almost nothing more, above it the work is compute-bound and
time grows with length), and where prefill time stops growing linearly (per-token cost 25 % above
its best: attention against a growing prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import shlex
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.experiments.phases_report import DECODE_PROMPT, PhasesResult, phases_document, tokens
from itlbench.experiments.phases_table import Sample, read_measurement, summarize
from itlbench.load.clients.sse import StreamClient
from itlbench.load.observers.steps_follower import StepsFollower
from itlbench.report.document import Written, write_document
from itlbench.rundir.outdir import make_dir
from itlbench.units import parse_tokens
from itlbench.workloads.plan import RequestPlan
from itlbench.workloads.prompts import PromptBuilder


@dataclass
class PhasesConfig:
    endpoint: str | None = None
    model: str | None = None
    api_key: str | None = None
    lengths: str | None = None
    max_prompt: str | None = None
    concurrency: int = 32
    output_tokens: int = 32
    repeats: int = 3
    engine: EngineConfig | None = None
    out: Path | None = None
    seed: int = 0
    api: str = "completions"

    def validate(self) -> None:
        if self.concurrency < 1:
            raise ConfigError("--concurrency", f"must be >= 1, got {self.concurrency}")
        if self.output_tokens < 3:
            raise ConfigError("--output-tokens", f"must be >= 3 to time decode, got {self.output_tokens}")
        if self.repeats < 1:
            raise ConfigError("--repeats", f"must be >= 1, got {self.repeats}")
        if self.lengths is not None and not self.lengths.replace(",", "").strip():  # '' or ',': the defaults, silently
            raise ConfigError("--lengths", f"{self.lengths!r} lists no length",
                              "e.g. --lengths 1,16,128,512,2k, or leave it out for the defaults")


SIM_DEFAULT_MAX = 32_768  # --engine sim: each step sleeps its priced time; a 128k prompt of an 8B model on an H100 takes ~15 s


def default_lengths(context: int, reserve: int, longest: int | None = None) -> list[int]:
    """1, 16, 128, 512, 2048, 8192, … (×4) while the prompt plus its output fit the context (and `longest`)."""
    out, n = [1, 16, 128], 512
    while n + reserve <= context and (longest is None or n <= longest):
        out.append(n)
        n *= 4
    return [n for n in out if n + reserve <= context]


class _Rows:
    """An in-memory RowWriter: the phases measurement keeps everything in memory."""

    def __init__(self) -> None:
        self.tables: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.tables[table].append(row)


def _plan(builder: PromptBuilder, key: str, n: int, max_tokens: int) -> RequestPlan:
    p = builder.unique(key, n)
    ids = tuple(p.ids) if p.ids is not None else None
    return RequestPlan(request_id=key, workload="phases", cls="phases", prompt_tokens=n, max_tokens=max_tokens,
                       prompt_token_ids=ids, prompt_text=p.text)


async def _measure(cfg: PhasesConfig, target: Any, builder: PromptBuilder, lengths: list[int], steps_url: str | None,
                   on_status: Callable[[str], None]) -> tuple[list[Sample], list[dict[str, Any]], _Rows]:
    rows = _Rows()
    follower = StepsFollower(steps_url, rows) if steps_url else None
    if follower is not None and steps_url is not None:  # not the engine's earlier history
        from itlbench.harness.step_catchup import start_step

        follower.next_step = await start_step(steps_url, cfg.api_key)
    task = asyncio.create_task(follower.run()) if follower else None
    decode: list[dict[str, Any]] = []
    try:
        async with StreamClient(target, rows) as client:
            await client.run(_plan(builder, "warmup", 16, 4), time.perf_counter_ns())
            for n in lengths:
                on_status(f"prefill {tokens(n)} × {cfg.repeats}")
                for i in range(cfg.repeats):
                    key = f"p{n}-{i}"
                    outcome = await client.run(_plan(builder, key, n, cfg.output_tokens), time.perf_counter_ns())
                    if outcome.status != "ok":
                        raise ConfigError("--lengths", f"a {n}-token prompt failed ({outcome.status}, HTTP "
                                          f"{outcome.http_status})", "use shorter prompts (--max-prompt)")
            for batch in sorted({1, cfg.concurrency}):
                on_status(f"decode at batch {batch}")
                keys = [f"d{batch}-{i}" for i in range(batch)]
                t = time.perf_counter_ns()
                await asyncio.gather(*(client.run(_plan(builder, k, DECODE_PROMPT, cfg.output_tokens), t)
                                       for k in keys))
                decode.append({"batch": batch, "keys": keys, "from_ns": t, "to_ns": time.perf_counter_ns()})
        if follower is not None and steps_url is not None:
            from itlbench.harness.step_catchup import until_caught_up

            await until_caught_up(follower, steps_url, cfg.api_key, timeout_s=3.0)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    samples, decode_rows = read_measurement(rows.tables, decode)
    return samples, decode_rows, rows


def phases_command(cfg: PhasesConfig, lengths: list[int]) -> str:
    args = ["itlbench", "phases"]
    if cfg.endpoint:
        args += ["--endpoint", cfg.endpoint, *(["--model", cfg.model] if cfg.model else [])]
    elif cfg.engine is not None:
        args += _engine_args(cfg.engine)
    args += ["--lengths", ",".join(_length_arg(n) for n in lengths), "--concurrency", str(cfg.concurrency),
             "--output-tokens", str(cfg.output_tokens), "--repeats", str(cfg.repeats), "--seed", str(cfg.seed)]
    return shlex.join(args)


def _length_arg(n: int) -> str:
    """A length as --lengths reads it back: '2k' where whole, else the digits (the table's '16,379' would split)."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _engine_args(e: EngineConfig) -> list[str]:
    """The engine flags that reproduce `e`: the bundled engine's, or the simulated GPU's."""
    budget = ["--chunk-budget", "none" if e.chunk_budget is None else str(e.chunk_budget)]
    context = ["--max-model-len", str(e.max_model_len)] if e.max_model_len else []
    if e.engine != "sim":
        return ["--model", e.model, *budget, *context, "--device", e.device]
    from itlbench.sim.runner import DEFAULT_GPU

    pace = ["--sim-time-scale", f"{e.sim_time_scale:g}"] if e.sim_time_scale != 1 else []
    return ["--engine", "sim", "--model", e.model, "--gpu", e.gpu or DEFAULT_GPU, "--tp", str(e.tp), "--dtype", e.dtype,
            "--kv-cache-dtype", e.kv_cache_dtype, *budget, "--max-num-seqs", str(e.max_num_seqs), *context, *pace]


def sim_intro(engine: EngineConfig) -> tuple[str, list[str]]:
    """A simulated engine's name for the report (model, GPUs, number format) and the lines `run --engine sim` opens
    with: what it prices, and how far its figures are to be trusted."""
    from itlbench.core.engine import resolve_max_model_len
    from itlbench.core.presets import load_model_config
    from itlbench.sim.accuracy import check_doc, check_line
    from itlbench.sim.runner import SimRunner

    model = load_model_config(engine.model)
    runner = SimRunner(engine, model, resolve_max_model_len(engine, model))
    hw, tp = runner.hardware, runner.cost_model.tp
    name = (f"{engine.model} simulated on {f'{tp} × ' if tp > 1 else ''}{hw.label} (TP {tp}, {hw.dtype} weights, "
            f"K/V at {runner.cost_model.kv_b} B)")
    return name, [runner.describe(), check_line(check_doc(hw, tp, runner.kv_share))]


def _starting(cfg: PhasesConfig, on_status: Callable[[str], None]) -> str | None:
    """Say what is started (or probed); a simulated engine's name, for the report."""
    if cfg.endpoint is not None:
        on_status(f"probing {cfg.endpoint}")
        return None
    if cfg.engine is None or cfg.engine.engine != "sim":
        on_status("starting the bundled engine")
        return None
    name, lines = sim_intro(cfg.engine)
    scale = cfg.engine.sim_time_scale
    on_status(f"starting the simulated engine, served {'in real time' if scale == 1 else f'at {scale:g}× speed'}: "
              f"{name}")
    for line in lines:
        on_status(line)
    return name


def _check_context(engine: EngineConfig | None) -> int | None:
    """The bundled engine's context, known before it starts (None: an --endpoint's, known once probed); a
    --max-model-len beyond the model's is refused here (the simulator's own start-up check, a KV cache too small
    for it, runs in `sim_intro`, also before anything is said)."""
    if engine is None:
        return None
    from itlbench.core.engine import resolve_max_model_len
    from itlbench.core.presets import load_model_config

    return resolve_max_model_len(engine, load_model_config(engine.model))


def _fitting(lengths: list[int], context: int, reserve: int, cap: int | None) -> list[int]:
    """The lengths a context holds with `reserve` tokens of output, up to --max-prompt; none is bad input."""
    fit = sorted({n for n in lengths if n + reserve <= context and (cap is None or n <= cap)})
    if not fit:
        raise ConfigError("--lengths", f"no length fits the context ({context} tokens) and --max-prompt",
                          "give shorter lengths")
    return fit


def _default_lengths(cfg: PhasesConfig, context: int, reserve: int, sim_name: str | None, cap: int | None) -> list[int]:
    """×4 up to the context, but up to 32k on the simulator (each prompt's prefill takes its priced wall time)
    unless --max-prompt says how far to go. A context set with --max-model-len is the one to profile: the lengths
    climb to it whole and end at the longest prompt it holds (128k's is past 32k, the last ×4 that fits)."""
    sized = cfg.engine is not None and cfg.engine.max_model_len is not None
    lengths = default_lengths(context, reserve, SIM_DEFAULT_MAX if sim_name and cap is None and not sized else None)
    if sized and context - reserve > max(lengths, default=0):
        lengths.append(context - reserve)
    return lengths


def _out_dir(cfg: PhasesConfig) -> Path:
    out = cfg.out or Path("reports") / (dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S") + "-phases")
    if out.exists() and any(out.iterdir()):
        raise ConfigError("--out", f"{out} already holds files", "choose a new directory")
    if not out.exists():  # can it be made? (made for real once there is something to write)
        make_dir(out)
        out.rmdir()
    return out


def _say_what_does_not_fit(explicit: list[int], cap: int | None, context: int, reserve: int, lengths: list[int],
                           on_status: Callable[[str], None]) -> None:
    """A length the user named that the context cannot hold is skipped, and said so (never silently)."""
    room = f"the context ({context:,} tokens, {reserve} of them kept for the output)"
    if dropped := sorted({n for n in explicit if n + reserve > context}):
        on_status(f"--lengths: {', '.join(f'{n:,}' for n in dropped)} {'does' if len(dropped) == 1 else 'do'} not fit "
                  f"{room}: skipped")
    if cap is not None and cap + reserve > context:
        on_status(f"--max-prompt {cap:,} is beyond {room}: the longest prompt tried is {max(lengths):,}")


def _discard(out: Path, created: bool) -> None:
    """Bad input (a length the context cannot hold) or an engine that never started measured nothing: no
    directory is left (its server.log included), and a directory the user made is left empty."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
    elif out.is_dir():
        for child in out.iterdir():
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)


def run_phases(cfg: PhasesConfig, on_status: Callable[[str], None] = lambda s: None) -> Written:
    """Start (or reach) the engine, measure, and write report.html/.md and phases.json."""
    from itlbench.harness.connect import connect
    from itlbench.harness.run_config import RunConfig

    cfg.validate()
    explicit = [parse_tokens(x, "--lengths") for x in (cfg.lengths or "").split(",") if x.strip()]
    cap = parse_tokens(cfg.max_prompt, "--max-prompt") if cfg.max_prompt else None
    out = _out_dir(cfg)
    run_cfg = RunConfig(workload="chat", endpoint=cfg.endpoint, model=cfg.model, api_key=cfg.api_key, api=cfg.api,
                        engine=cfg.engine or EngineConfig(), seed=cfg.seed, out=out)
    run_cfg.validate()
    known = _check_context(cfg.engine)
    if known is not None and explicit:  # before the engine starts: nothing is said or started for bad input
        _fitting(explicit, known, cfg.output_tokens + 1, cap)
    sim_name = _starting(cfg, on_status)
    created = not out.exists()
    try:
        conn = connect(run_cfg, out)
    except ItlbenchError:
        _discard(out, created)
        raise
    try:
        context = conn.max_model_len
        reserve = cfg.output_tokens + 1
        lengths = explicit or _default_lengths(cfg, context, reserve, sim_name, cap)
        lengths = _fitting(lengths, context, reserve, cap)
        _say_what_does_not_fit(explicit, cap, context, reserve, lengths, on_status)
        builder = PromptBuilder(token_ids=conn.vocab_size is not None, vocab_size=conn.vocab_size or 32000,
                                seed=cfg.seed, tokens_per_word=conn.tokens_per_word)
        samples, decode, rows = asyncio.run(_measure(cfg, conn.target, builder, lengths, conn.steps_url, on_status))
        engine_name = sim_name or (str(conn.doc.get("engine", {}).get("served_model_name") or cfg.model or "external")
                                   if cfg.endpoint is None else f"{cfg.endpoint} ({conn.target.model})")
    except ItlbenchError:
        conn.close()
        _discard(out, created)
        raise
    finally:
        conn.close()
    table, sat, linear, superlinear = summarize(samples, lengths)
    source = "the engine's step log and the client" if rows.tables["steps"] else "the client only (TTFT and gaps)"
    scale = cfg.engine.sim_time_scale if cfg.engine is not None else 1.0
    if sim_name and rows.tables["steps"]:
        priced = "each step's priced time" + (f" ÷ {scale:g}" if scale != 1 else "")
        source = f"the simulated engine's step log ({priced}) and the client"
    result = PhasesResult(engine_name, source, context, lengths, table, decode, sat, linear, superlinear, scale)
    doc = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()
                      if k not in ("api_key", "engine")},
           "engine_config": cfg.engine.as_dict() if cfg.engine else None, "engine": conn.doc.get("engine"),
           **asdict(result)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "phases.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return write_document(phases_document(result, cfg.output_tokens, phases_command(cfg, lengths)), out)
