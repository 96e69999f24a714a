"""`itlbench run`: drive a workload (and injected long prompts) against the bundled engine or a server."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated

import typer

from itlbench.cli.app import AsJson, app, console, ended_early_code, fail, print_json, write_report
from itlbench.cli.engine_options import (
    ENGINE_FIELDS,
    engine_config_from_flags,
    engine_options,
    flag_of,
    given_on_command_line,
)
from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.serving.build import require_engine_for
from itlbench.units import parse_duration_s

OtlpEndpoint = Annotated[str | None, typer.Option(help="Export OpenTelemetry spans and GenAI metrics over OTLP/HTTP "
                                                  "to this base URL (e.g. http://127.0.0.1:4318).")]
ReceiveOtlp = Annotated[str | None, typer.Option(help="Receive the OTLP/HTTP request spans of the server given with "
                                                 "--endpoint or --serve on [HOST:]PORT (or auto) and save each run's "
                                                 "to RUN/otel_spans.jsonl (vLLM: --otlp-traces-endpoint "
                                                 "http://HOST:PORT/v1/traces); the bundled engine's steps are "
                                                 "recorded without it.")]


# The opening lines a simulated run has already printed in this sweep or capacity search (None: not in one).
_SAID: ContextVar[set[str] | None] = ContextVar("itlbench_sim_intro_said", default=None)


@contextlib.contextmanager
def sim_intro_once() -> Iterator[None]:
    """Within a sweep or capacity search (its points are `itlbench run`s in this process): a simulated run's opening
    lines (what it simulates, how far to trust the simulator) print at the first point, and at a later one only
    where they differ (a --max-num-seqs point can hold fewer K/V blocks); each point keeps its own result lines."""
    token = _SAID.set(set())
    try:
        yield
    finally:
        _SAID.reset(token)


def said_once(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say`, skipping a line already said within `sim_intro_once` (outside one: `say` itself)."""
    said = _SAID.get()
    if said is None:
        return say

    def once(text: str) -> None:
        if text not in said:
            said.add(text)
            say(text)
    return once


ENDPOINT_FLAGS = ("seed", "model")  # engine flags an --endpoint run uses too: the workload's seed, the served model


def refuse_engine_flags(ctx: typer.Context, endpoint: str | None) -> None:
    """With --endpoint the bundled engine never starts: an engine flag the user typed would be silently ignored."""
    given = [n for n in given_on_command_line(ctx, ENGINE_FIELDS) if n not in ENDPOINT_FLAGS] if endpoint else []
    if given:
        flag = flag_of(given[0])
        raise ConfigError(flag, "configures the bundled engine, which --endpoint does not start", "set it on your server")


def refuse_api_key(ctx: typer.Context, endpoint: str | None) -> None:
    """--api-key typed without --endpoint authenticates to nothing: the bundled engine's server is started without
    it and the client sends it no key (on the virtual clock no server runs at all). Only the typed flag is refused:
    ITLBENCH_API_KEY in the environment may be set for other commands and stays unused here."""
    if endpoint is None and given_on_command_line(ctx, ("api_key",)):
        raise ConfigError("--api-key", "only authenticates to a server given with --endpoint; the bundled engine "
                          "itlbench starts is given no key", "drop --api-key, or measure a server with --endpoint URL")


def print_brief(summary: dict, run_dir: Path) -> None:
    """`--brief`: the run's one line, and why it ended early where it did."""
    from rich.markup import escape

    from itlbench.report.brief import brief_line
    from itlbench.report.terminal import cut_short

    console.print(escape(brief_line(summary, run_dir)), highlight=False)
    if reasons := cut_short(summary, run_dir):
        console.print(f"[bold red]Cut short[/]: {escape('; '.join(reasons))}", highlight=False)


def print_warmup_timeout(run_dir: Path) -> None:
    """Say when the adaptive warm-up gave up on a stream's first token (run.json's `warmup_timeout`)."""
    from itlbench.report.data import read_json

    t = (read_json(run_dir / "run.json") or {}).get("warmup_timeout")
    if isinstance(t, dict):
        console.print(f"[yellow]warning:[/] the warm-up waited {t.get('waited_s', 0):.0f} s for the first token of "
                      f"stream(s) {', '.join(map(str, t.get('streams_without_token') or []))}, which never came; "
                      "the window opened without it (--request-timeout fails such a request sooner)",
                      highlight=False, soft_wrap=True)


def check_sim(engine: EngineConfig) -> None:
    """Refuse, before any server starts, what the simulated engine would refuse at start-up, and the flags it would
    silently ignore: it computes nothing, on a thread of the server, without torch."""
    if engine.engine != "sim":
        return
    from itlbench.core.engine import resolve_max_model_len
    from itlbench.core.presets import load_model_config
    from itlbench.sim.runner import check_sim_config

    # the model's own limit before the GPU's room: a KV cache too small for 999999 must not suggest 464692 tokens
    # to a model that takes 131072
    context = resolve_max_model_len(engine, load_model_config(engine.model))
    if engine.block_size > context:  # the cache sized in whole blocks held none: a ValueError's traceback
        raise ConfigError("--block-size", f"{engine.block_size:,} tokens is more than the {context:,}-token context",
                          "e.g. --block-size 16, vLLM's default")
    check_sim_config(engine)
    for name, given in (("engine_process", engine.engine_process), ("torch_threads", engine.torch_threads)):
        if given:
            raise ConfigError(flag_of(name), "does not apply to --engine sim, which runs on a thread of the server "
                              "and uses no torch", "drop it")
    if engine.device != "auto":
        raise ConfigError("--device", "does not apply to --engine sim, which computes nothing: each step takes the "
                          "time priced for --gpu", "drop it; --gpu names the simulated GPU")


def plan_warnings(run_dir: Path) -> list[str]:
    """What the load plan changed of what was asked (prompts shortened, trace rows skipped), from run.json."""
    from itlbench.report.data import read_json

    doc = read_json(run_dir / "run.json") or {}
    return list((doc.get("plan") or {}).get("warnings") or [])


def print_plan_warnings(run_dir: Path) -> None:
    for warning in plan_warnings(run_dir):
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)


@app.command()
@engine_options(exclude=("model",))
def run(
    ctx: typer.Context,
    workload: Annotated[str, typer.Option(help="chat-short, chat, rag, summarization, code, agent, fixed:IN:OUT "
                                                  "(exact lengths) or trace.")] = "chat",
    inject: Annotated[list[str] | None, typer.Option(help="Long prompts to inject: 32k, 32k@20s, 2x16k@10s,40s, 32k/30s "
                                                        "(every 30 s, from 15 s); repeat the flag or join with ';' "
                                                        "for several.")] = None,
    streams: Annotated[int | None, typer.Option(help="Closed-loop steady streams (default 32; 0 with --rate or trace).")] = None,
    rate: Annotated[float | None, typer.Option(help="Open-loop arrivals per second (instead of or besides streams); "
                                                    "with --workload agent, sessions per second (each then runs "
                                                    "its turns closed-loop).")] = None,
    burstiness: Annotated[float, typer.Option(help="Gamma shape for --rate arrivals; 1 = Poisson.")] = 1.0,
    duration: Annotated[str, typer.Option(help="Measured time after warmup: 60, 60s, 2m.")] = "60s",
    warmup: Annotated[str, typer.Option(help="Load at least this long before measurement starts.")] = "5s",
    adaptive_warmup: Annotated[bool, typer.Option(help="Also warm up until every stream has received a token.")] = True,
    ramp: Annotated[str, typer.Option(help="Spread the streams' first sends over this long.")] = "0s",
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL (…/v1); default: start the bundled engine.")] = None,
    model: Annotated[str | None, typer.Option(help="Served model name (with --endpoint; default: the only one its "
                                              "/v1/models lists), or the bundled engine's preset / HF dir (default: "
                                              "llama-3.2-1b on CUDA, cpu-small on CPU, llama-3.1-8b with --engine sim).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="ITLBENCH_API_KEY", help="Bearer key for --endpoint; prefer setting ITLBENCH_API_KEY (a value given here shows in ps).")] = None,
    api: Annotated[str, typer.Option(help="completions or chat.")] = "completions",
    forced_lengths: Annotated[bool, typer.Option(help="Send ignore_eos and min_tokens (vLLM, SGLang, itlbench accept "
                                                      "them) so every request generates exactly its max_tokens.")] = True,
    prompt_format: Annotated[str, typer.Option(help="With --endpoint: ids (token-id prompts, exact lengths), text "
                                               "(calibrated words), or auto (ids when one probe request is "
                                               "accepted).")] = "auto",
    reuse_prompts: Annotated[bool, typer.Option(help="Send the same prompt text as earlier runs with this seed "
                                                "(default: a per-run salt keeps a server's prefix cache cold; "
                                                "lengths and times stay seeded).")] = False,
    scrape_interval: Annotated[str, typer.Option(help="With --endpoint: also read /metrics every S during the run "
                                                 "(default 0: only just before and just after the measured "
                                                 "window).")] = "0",
    slo: Annotated[str | None, typer.Option(help="SLOs, e.g. 'ttft:le2k=2s,itl_p99=150ms'.")] = None,
    stall_factor: Annotated[float, typer.Option(help="A stall is a gap ≥ factor × its request's median gap…")] = 5.0,
    stall_floor: Annotated[str, typer.Option(help="…and at least this long.")] = "50ms",
    inject_max_tokens: Annotated[int, typer.Option(help="Output tokens of each injected request.")] = 16,
    trace: Annotated[Path | None, typer.Option(help="Trace for --workload trace: an Azure LLM inference CSV, a "
                                                             "BurstGPT CSV or a Mooncake JSONL (format detected).")] = None,
    time_scale: Annotated[float, typer.Option(help="Trace replay speed-up (2 = twice as fast).")] = 1.0,
    drain_timeout: Annotated[str, typer.Option(help="How long in-flight requests may finish after the end.")] = "120s",
    request_timeout: Annotated[str, typer.Option(help="A request not finished by then fails as a timeout (a silent "
                                                     "connection ends no other way).")] = "600s",
    out: Annotated[Path | None, typer.Option(help="Run directory (default reports/<time>-<workload>-…).")] = None,
    workers: Annotated[int, typer.Option(help="Client processes for very high stream counts (with --driver locust: "
                                               "Locust workers).")] = 1,
    driver: Annotated[str, typer.Option(help="aiohttp (one event loop per process) or locust (Locust master and "
                                             "workers; needs the locust extra).")] = "aiohttp",
    master_bind: Annotated[str | None, typer.Option(help="--driver locust: the master listens on HOST:PORT for "
                                                         "--workers workers started by hand on other machines.")] = None,
    locust_ui: Annotated[bool, typer.Option(help="--driver locust: serve Locust's web UI.")] = False,
    locust_ui_port: Annotated[int, typer.Option(help="Port of Locust's web UI (on 127.0.0.1).")] = 8089,
    live: Annotated[bool, typer.Option(help="Show the live progress line.")] = True,
    report: Annotated[bool, typer.Option(help="Write report.html, report.md and figures/ when the run ends (about "
                                              "3 s of drawing; `itlbench report RUN_DIR` writes them later).")] = True,
    stream_reader: Annotated[str, typer.Option(help="auto, kernel (kernel receive timestamps; plain http on Linux) "
                                                    "or aiohttp (user-space timestamps).")] = "auto",
    metrics_port: Annotated[str | None, typer.Option(help="Serve live itlbench_client_* metrics for Prometheus on "
                                                          "this port (PORT or HOST:PORT; loopback by default).")] = None,
    otlp_endpoint: OtlpEndpoint = None,
    receive_otlp: ReceiveOtlp = None,
    limits: Annotated[str | None, typer.Option(help="Caps on what a server may make the client hold, e.g. "
                                               "event=4MiB,head=64KiB,control=8MiB,metrics=64MiB (the defaults).")] = None,
    extra_body: Annotated[str | None, typer.Option(help="JSON object merged into every request's body, e.g. "
                                                   "'{\"logprobs\": 1}' (llama.cpp: exact token counts per chunk).")] = None,
    clock: Annotated[str, typer.Option(help="--engine sim: virtual (in-process, each step advances a simulated "
                                            "clock; seconds of wall time), real (served over HTTP in real time) "
                                            "or auto (virtual unless a flag needs the server).")] = "auto",
    as_json: AsJson = False,
    brief: Annotated[bool, typer.Option(help="One line instead of the summary tables (each point of a sweep or "
                                             "capacity search prints so; `itlbench analyze DIR` prints them).")] = False,
    engine_flags: dict | None = None,
) -> None:
    """Drive a workload (and injected long prompts) against the bundled engine or --endpoint."""
    from itlbench.harness.run_config import RunConfig, checks_passed, parse_extra_body
    from itlbench.load.clients.limits import Limits
    from itlbench.report.terminal import LiveProgress, cut_short, engine_warnings, print_summary

    try:
        refuse_engine_flags(ctx, endpoint)
        refuse_api_key(ctx, endpoint)
        engine = engine_config_from_flags(engine_flags, model=None if endpoint else model)
        if endpoint is None:
            require_engine_for(engine)
        seed = engine.seed
        check_sim(engine)
        cfg = RunConfig(workload=workload, inject=";".join(inject) if inject else None, inject_max_tokens=inject_max_tokens, streams=streams,
                        rate=rate, burstiness=burstiness, duration_s=parse_duration_s(duration, "--duration"),
                        warmup_s=parse_duration_s(warmup, "--warmup"), seed=seed,
                        adaptive_warmup=adaptive_warmup, ramp_s=parse_duration_s(ramp, "--ramp"),
                        endpoint=endpoint, model=model, api_key=api_key, api=api, engine=engine, slo=slo,
                        forced_lengths=forced_lengths, prompt_format=prompt_format, reuse_prompts=reuse_prompts,
                        scrape_interval_s=parse_duration_s(scrape_interval, "--scrape-interval"),
                        stall_factor=stall_factor, stall_floor_s=parse_duration_s(stall_floor, "--stall-floor"),
                        trace=trace, time_scale=time_scale,
                        drain_timeout_s=parse_duration_s(drain_timeout, "--drain-timeout"), out=out,
                        request_timeout_s=parse_duration_s(request_timeout, "--request-timeout"),
                        workers=workers, live=live, metrics_port=metrics_port, otlp_endpoint=otlp_endpoint,
                        driver=driver, master_bind=master_bind, locust_ui=locust_ui, locust_ui_port=locust_ui_port,
                        stream_reader=stream_reader, limits=Limits.parse(limits),
                        extra_body=parse_extra_body(extra_body), clock=clock, receive_otlp=receive_otlp is not None)
        from itlbench.harness.orchestrate import check_run, run_load_test
        from itlbench.telemetry.span_capture import capture, save_and_warn

        checked = check_run(cfg)  # bad input is one line, before the receiver's or the progress's first
        checks_passed()  # a sweep's first point says its banner only now (run_config.after_checks)
        say = lambda s: console.print(f"[dim]{s}[/]", highlight=False)  # noqa: E731
        with capture(receive_otlp, say) as spans:
            with LiveProgress(console, total_s=cfg.duration_s, enabled=live) as progress:
                status = said_once(progress.status) if cfg.virtual_clock else progress.status
                run_dir, summary = run_load_test(cfg, progress=progress.update, on_status=status, checked=checked)
            save_and_warn(spans, run_dir, say)
    except ItlbenchError as exc:
        fail(exc)
        return
    if brief and not as_json:
        print_brief(summary, run_dir)
    elif not as_json:
        print_summary(console, summary, run_dir)
    if not as_json:
        print_plan_warnings(run_dir)
        print_warmup_timeout(run_dir)
    if engine.engine == "sim" and engine.sim_time_scale != 1:
        console.print(f"[yellow]simulated at {engine.sim_time_scale:g}× speed: every time above is 1/"
                      f"{engine.sim_time_scale:g} of the simulated GPU's[/]", highlight=False)
    if report:
        write_report(run_dir)
    if as_json:
        print_json({"run_dir": str(run_dir), "summary": summary, "warnings": engine_warnings(run_dir) + plan_warnings(run_dir),
                    "cut_short": cut_short(summary, run_dir)})
    else:
        print(run_dir)
    if (code := ended_early_code(run_dir)) != 0:
        raise typer.Exit(code)  # every record and the report are written: scripts still learn it went wrong
