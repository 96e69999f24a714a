"""Turn a load description (workload, streams or rate, injections, trace) into a LoadPlan."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from itlbench.errors import ConfigError
from itlbench.workloads.arrivals import arrival_times
from itlbench.workloads.catalog import WorkloadSpec, get_workload
from itlbench.workloads.injection import Injection, injection_times, parse_injections, planned_count
from itlbench.workloads.plan import LoadPlan, RequestPlan, SessionPlan
from itlbench.workloads.prompts import Prompt, PromptBuilder
from itlbench.workloads.sampling import lognormal_mu
from itlbench.workloads.sources import Context, Ids, requests, session_turns
from itlbench.workloads.trace import Trace, TraceReplay, load_trace, replay

DEFAULT_STREAMS = 32


@dataclass(frozen=True)
class LoadSpec:
    """What to send. `streams` None means 32 closed-loop streams, or none when an open-loop
    source (`rate`, or the trace workload) is given; both may be combined explicitly."""

    workload: str = "chat"
    streams: int | None = None
    rate: float | None = None  # open-loop arrivals, requests/s
    burstiness: float = 1.0  # gamma shape: 1 = Poisson, < 1 burstier
    duration_s: float = 60.0
    inject: str | Sequence[str] | None = None
    inject_at_s: float | None = None  # time for specs without '@'; None = half the duration
    inject_max_tokens: int = 16
    seed: int = 0
    max_model_len: int = 32768
    output_tokens: int | None = None  # fixes max_tokens for workload requests
    trace_path: str | None = None
    trace_time_scale: float = 1.0
    trace_offset: int = 0
    trace_limit: int | None = None
    token_ids: bool = True  # False: text prompts for servers that take no token ids
    vocab_size: int = 32000
    reserved_ids: tuple[int, ...] = ()
    tokens_per_word: float = 1.0  # text mode: the target tokenizer's measured tokens per word
    prompt_salt: str | None = None  # per-run salt in every prompt's tokens (None: the seed's own prompts)


MAX_INJECTED = 100_000  # prompts --inject may plan: its schedule is listed up front (1e8 ran away)
MAX_STREAMS = 100_000  # past one client's ephemeral ports to one server (~64k); 100k plans take ~15 s, 2 GB


def check_load_shape(streams: int | None, rate: float | None, burstiness: float, duration_s: float) -> None:
    """The one check of the numbers that shape a load (the run's flags and every LoadSpec)."""
    if streams is not None and streams < 0:
        raise ConfigError("--streams", f"must be >= 0, got {streams}", "e.g. --streams 32, or 0 with --rate")
    if streams is not None and streams > MAX_STREAMS:  # each stream's plan is built up front: 1e11 ran away
        raise ConfigError("--streams", f"must be at most {MAX_STREAMS:,}, got {streams:,}",
                          "each stream holds a connection open; e.g. --streams 32, or an open-loop --rate")
    if rate is not None and not rate > 0:
        raise ConfigError("--rate", f"must be > 0 requests/s, got {rate}", "e.g. --rate 4")
    if not burstiness > 0:
        raise ConfigError("--burstiness", f"must be > 0, got {burstiness}", "1 = Poisson, < 1 burstier, > 1 smoother")
    if not duration_s > 0:
        raise ConfigError("--duration", f"must be > 0 s, got {duration_s}", "e.g. --duration 60")


def _check_numbers(spec: LoadSpec) -> None:
    check_load_shape(spec.streams, spec.rate, spec.burstiness, spec.duration_s)
    if spec.max_model_len < 2:
        raise ConfigError("--max-model-len", f"must be >= 2, got {spec.max_model_len}",
                          "the server's context length, e.g. 8192")
    _check_output("--inject-max-tokens", spec.inject_max_tokens, spec.max_model_len)
    if spec.output_tokens is not None:
        _check_output("--output-tokens", spec.output_tokens, spec.max_model_len)


def _check_output(flag: str, value: int, max_model_len: int) -> None:
    if not 1 <= value < max_model_len:
        raise ConfigError(flag, f"must be in [1, {max_model_len - 1}], got {value}",
                          "leave room for the prompt within --max-model-len")


def _check_sources(spec: LoadSpec, workload: WorkloadSpec) -> None:
    if workload.from_trace and not spec.trace_path:
        raise ConfigError("--trace", "workload 'trace' needs a CSV",
                          "pass --trace path/to/AzureLLMInferenceTrace_conv.csv")
    if spec.trace_path and not workload.from_trace:
        raise ConfigError("--trace", f"a trace file only applies to --workload trace, not '{spec.workload}'",
                          "add --workload trace or drop --trace")
    if workload.from_trace and spec.rate is not None:
        raise ConfigError("--rate", "a trace replays its own arrival times",
                          "drop --rate; use --time-scale to speed it up")


def check_injection_times(inject: str | None, duration_s: float, inject_at_s: float | None = None) -> None:
    """Refuse injections outside the run: what needs no server's context length, so a run against an
    --endpoint refuses them before it probes the server."""
    default_at = duration_s / 2 if inject_at_s is None else inject_at_s
    _check_times(parse_injections(inject, default_at), default_at, duration_s)


def check_without_context(spec: LoadSpec) -> Trace | None:
    """Refuse what of `spec` is wrong whatever the server: the load's shape, an output length below one, a
    workload and --trace that do not go together, injections outside the run, a trace file that cannot be
    read. An --endpoint run learns the context length only by probing the server, so it checks these first
    (nothing is printed or sent for bad input); `build_load_plan` checks the rest against that context.
    Returns the trace it read (None: the workload replays none), for `build_load_plan` not to read it again."""
    workload = get_workload(spec.workload)
    check_load_shape(spec.streams, spec.rate, spec.burstiness, spec.duration_s)
    for flag, value in (("--inject-max-tokens", spec.inject_max_tokens), ("--output-tokens", spec.output_tokens)):
        if value is not None and value < 1:
            raise ConfigError(flag, f"must be >= 1, got {value}", f"give at least one token, e.g. {flag} 16")
    _check_sources(spec, workload)
    check_injection_times(spec.inject, spec.duration_s, spec.inject_at_s)
    return read_trace(spec)


def read_trace(spec: LoadSpec) -> Trace | None:
    """The trace `spec` replays (None: its workload replays none). A run reads it once and hands it to each
    `build_load_plan` (its checks, run.json's plan, the drive): a large trace takes a while to parse."""
    workload = get_workload(spec.workload)
    if not workload.from_trace:
        return None
    _check_sources(spec, workload)  # a run on the bundled engine comes here first: no --trace is not "no file at '.'"
    return load_trace(spec.trace_path or "", spec.trace_offset, spec.trace_limit)


def _check_times(injections: list[Injection], default_at: float, duration_s: float) -> None:
    if not 0 <= default_at < duration_s:
        raise ConfigError("--inject-at", f"{default_at:g} s is outside the run (0-{duration_s:g} s)",
                          "use a time within --duration")
    for inj in injections:
        if inj.every_s is not None and inj.every_s > duration_s:
            raise ConfigError("--inject", f"'{inj.spec}' repeats every {inj.every_s:g} s, longer than the "
                              f"{duration_s:g} s run", "use a period up to --duration, or a time like 32k@10s")
        late = [t for t in inj.at_s if t >= duration_s]
        if late:
            raise ConfigError("--inject", f"'{inj.spec}' is at {late[0]:g} s, after the run ends "
                              f"({duration_s:g} s)", "use an earlier time or a longer --duration")
    if (n := planned_count(injections, duration_s)) > MAX_INJECTED:
        raise ConfigError("--inject", f"plans {n:,} injected prompts, more than {MAX_INJECTED:,}",
                          "inject a few long prompts (e.g. 2x32k@20s or 32k/30s); for a steady stream of long "
                          "prompts use --rate with --workload fixed:IN:OUT")


def _check_injections(spec: LoadSpec, injections: list[Injection], default_at: float) -> None:
    room = spec.max_model_len - spec.inject_max_tokens
    for inj in injections:
        if inj.tokens > room:
            raise ConfigError("--inject", f"'{inj.spec}' needs {inj.tokens} + {spec.inject_max_tokens} "
                              f"tokens but max_model_len is {spec.max_model_len}",
                              f"inject at most {room} tokens or raise --max-model-len")
    _check_times(injections, default_at, spec.duration_s)


def _check_fits(spec: LoadSpec, workload: WorkloadSpec) -> list[str]:
    """Refuse a workload whose lengths (fixed) or mean lengths do not fit the context; warn, with the
    expected share, when the tails of a catalog mix will be shortened to fit."""
    if workload.from_trace:
        return []
    out = spec.output_tokens or workload.mean_out
    first = workload.sessions.initial_tokens if workload.sessions else workload.mean_in
    if first + out > spec.max_model_len:
        what = "needs" if workload.sigma == 0 else "averages"
        raise ConfigError("--workload", f"'{workload.name}' {what} {first} + {out} tokens a request but "
                          f"max_model_len is {spec.max_model_len}",
                          f"keep prompt + output within {spec.max_model_len} tokens, or use a longer-context model")
    share = clipped_share(first, workload.sigma, spec.max_model_len - out)
    if share < 0.001:
        return []
    return [f"--workload {workload.name}: about {share:.1%} of prompts (expected from its lengths) are shortened "
            f"to fit max_model_len {spec.max_model_len}: to at most about {spec.max_model_len - out} tokens"]


def clipped_share(mean: float, sigma: float, cap: int) -> float:
    """The share of lognormal lengths (mean `mean`, log-space `sigma`) above `cap`."""
    if sigma <= 0:
        return float(mean > cap)
    z = (math.log(cap) - lognormal_mu(mean, sigma)) / sigma
    return 0.5 * math.erfc(z / math.sqrt(2))


def _trace_warnings(rep: TraceReplay, spec: LoadSpec) -> list[str]:
    """What a replay changed of its trace: rows skipped as unusable, rows shortened to fit, rows left out
    because they arrive after the run, and a run that outlasts its trace (an idle measured window)."""
    out = []
    rows = len(rep.send_at_s)
    if rep.invalid_rows:
        out.append(f"--trace: {rep.invalid_rows:,} of {rows + rep.invalid_rows:,} rows skipped: "
                   "a missing, zero or negative token count")
    if rep.clipped_rows:
        out.append(f"--trace: {rep.clipped_rows:,} of {rows:,} rows shortened to fit max_model_len "
                   f"{spec.max_model_len} (prompt + output)")
    last, duration, scale = float(rep.send_at_s[-1]), spec.duration_s, spec.trace_time_scale
    late = int(np.sum(rep.send_at_s >= duration))
    if late:
        longer = f"--duration {math.floor(last) + 1}s or " if last <= _LONGEST_SUGGESTED_S else ""
        out.append(f"--trace: {late:,} of {rows:,} rows not sent: they arrive after --duration {duration:g} s "
                   f"(the trace spans {last:.6g} s at --time-scale {scale:g}); to replay it all, use {longer}"
                   f"--time-scale {_round_up(scale * last / duration * 1.001)}")
    elif last < duration / 2:
        out.append(f"--trace: its last row is sent at {last:.3g} s of the {duration:g} s run, so the rest of the "
                   f"window has no trace load (--duration {math.floor(last) + 1}s ends with it)")
    return out


_LONGEST_SUGGESTED_S = 7 * 86_400  # past a week of replay, a warning suggests only a faster --time-scale


def _round_up(value: float, digits: int = 3) -> str:
    """`value` rounded up to `digits` significant digits, as text (29.16 -> 29.2)."""
    if value <= 0:
        return "1"
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return f"{math.ceil(value / step - 1e-9) * step:.{digits}g}"


def _streams(spec: LoadSpec, workload: WorkloadSpec) -> int:
    if spec.streams is not None:
        return spec.streams
    return 0 if spec.rate is not None or workload.from_trace else DEFAULT_STREAMS


def _stream(ctx: Context, index: int) -> Iterator[RequestPlan]:
    rng = np.random.default_rng([ctx.seed, 1, index])
    return requests(ctx, rng, Ids(f"s{index:02d}-"), index)


def _arrivals(ctx: Context, spec: LoadSpec) -> Iterator[RequestPlan]:
    source = requests(ctx, np.random.default_rng([ctx.seed, 2]), Ids("o-"))
    for t in arrival_times(spec.rate or 0.0, spec.duration_s, spec.burstiness, [ctx.seed, 4]):
        yield replace(next(source), send_at_s=t, think_time_s=0.0)


def _arriving_sessions(ctx: Context, spec: LoadSpec, first_stream: int) -> Iterator[SessionPlan]:
    """Sessions arriving at --rate, each on a stream of its own numbered after the closed-loop streams."""
    for i, t in enumerate(arrival_times(spec.rate or 0.0, spec.duration_s, spec.burstiness, [ctx.seed, 4])):
        yield SessionPlan(arrive_at_s=t, stream=first_stream + i, turns=session_turns(ctx, i, first_stream + i))


def _replayed(ctx: Context, rep: TraceReplay, duration_s: float) -> Iterator[RequestPlan]:
    ids = Ids("t-")
    for i, (t, n, out) in enumerate(zip(rep.send_at_s, rep.prompt_tokens, rep.output_tokens, strict=True)):
        if t >= duration_s:
            return
        rid = ids.next()
        prompt = _trace_prompt(ctx, rid, int(n), rep.blocks[i] if rep.blocks else (), rep.block_tokens)
        yield RequestPlan(request_id=rid, workload="trace", cls="trace", prompt_tokens=prompt.tokens,
                          max_tokens=int(out), prompt_token_ids=prompt.ids, prompt_text=prompt.text,
                          send_at_s=float(t))


def _trace_prompt(ctx: Context, rid: str, n: int, blocks: tuple[int, ...], block_tokens: int) -> Prompt:
    """A trace row's prompt: its blocks' shared tokens (Mooncake hash ids: equal ids, equal prefix), then
    tokens of its own for any length the blocks do not cover."""
    prompt: Prompt | None = None
    for h in blocks[: -(-n // block_tokens)]:
        part = ctx.builder.shared(f"trace-block-{h}", block_tokens)
        prompt = part if prompt is None else prompt + part
    if prompt is None:
        return ctx.builder.unique(rid, n)
    if prompt.tokens < n:
        prompt = prompt + ctx.builder.unique(rid, n - prompt.tokens)
    return prompt.head(n)


def _injected(ctx: Context, schedule: list[tuple[float, int]], max_tokens: int) -> Iterator[RequestPlan]:
    ids = Ids("inj-", width=3)
    for t, tokens in schedule:
        rid = ids.next()
        prompt = ctx.builder.unique(rid, tokens)
        yield RequestPlan(request_id=rid, workload="injected", cls="injected",
                          prompt_tokens=prompt.tokens, max_tokens=max_tokens,
                          prompt_token_ids=prompt.ids, prompt_text=prompt.text,
                          injected=True, send_at_s=t)


def _merge(feeds: list[Iterator[RequestPlan]]) -> Iterator[RequestPlan]:
    return heapq.merge(*feeds, key=lambda plan: plan.send_at_s or 0.0)


def build_load_plan(spec: LoadSpec, builder: PromptBuilder | None = None, trace: Trace | None = None) -> LoadPlan:
    """Validate `spec` and build its plan. Pass your own `builder` to keep a handle for
    `calibrate` (text mode); by default one is made from the spec's prompt settings. `trace`: the spec's
    trace as `read_trace` read it (None: read it here)."""
    workload = get_workload(spec.workload)
    _check_numbers(spec)
    _check_sources(spec, workload)
    warnings = _check_fits(spec, workload)
    default_at = spec.duration_s / 2 if spec.inject_at_s is None else spec.inject_at_s
    injections = parse_injections(spec.inject, default_at)
    _check_injections(spec, injections, default_at)
    builder = builder or PromptBuilder(token_ids=spec.token_ids, vocab_size=spec.vocab_size,
                                       reserved_ids=spec.reserved_ids, seed=spec.seed,
                                       tokens_per_word=spec.tokens_per_word, salt=spec.prompt_salt)
    rep = None
    ctx = Context(workload, builder, spec.max_model_len, spec.seed, spec.output_tokens)
    if workload.from_trace:
        trace = _given_or_read(spec, trace)
        rep = replay(trace, spec.max_model_len, spec.trace_time_scale, spec.output_tokens)
        ctx.trace = trace
        warnings += _trace_warnings(rep, spec)
    n_streams = _streams(spec, workload)
    if n_streams == 0 and spec.rate is None and rep is None and not injections:
        raise ConfigError("--streams", "nothing to send: no streams, no --rate, no --inject",
                          "use --streams 32 or --rate 4")
    schedule = injection_times(injections, spec.duration_s)
    feeds = [_injected(ctx, schedule, spec.inject_max_tokens)]
    in_sessions = workload.sessions is not None and spec.rate is not None  # --rate: sessions arrive, not turns
    if spec.rate is not None and not in_sessions:
        feeds.append(_arrivals(ctx, spec))
    if rep is not None:
        feeds.append(_replayed(ctx, rep, spec.duration_s))
    desc = _describe(spec, workload, n_streams, builder, schedule, rep)
    if in_sessions:
        desc["sessions"] = describe_sessions(spec, workload, n_streams)
    desc["warnings"] = warnings
    return LoadPlan(streams=[_stream(ctx, i) for i in range(n_streams)], open_loop=_merge(feeds), description=desc,
                    sessions=_arriving_sessions(ctx, spec, n_streams) if in_sessions else iter(()))


def _given_or_read(spec: LoadSpec, trace: Trace | None) -> Trace:
    if trace is None:
        trace = read_trace(spec)
        assert trace is not None
    elif trace.path != str(Path(spec.trace_path or "")):
        raise ValueError(f"the trace given was read from {trace.path!r}, the spec replays {spec.trace_path!r}")
    return trace


def describe_sessions(spec: LoadSpec, workload: WorkloadSpec, first_stream: int) -> dict[str, object]:
    """run.json's account of sessions arriving at --rate: `rate` counts sessions, not requests, and each
    session sends `mean_turns` requests (fewer where its context fills max_model_len)."""
    s = workload.sessions
    assert s is not None
    mean = (s.min_turns + s.max_turns) / 2
    return {"rate": spec.rate, "unit": "sessions/s", "min_turns": s.min_turns, "max_turns": s.max_turns,
            "mean_turns": mean, "think_time_mean_s": s.think_time_mean_s, "first_stream": first_stream,
            "line": f"{spec.rate:g} sessions/s arrive ({'Poisson' if spec.burstiness == 1 else 'gamma'}), each "
                    f"{s.min_turns}-{s.max_turns} turns (mean {mean:g}) sent one after another: a turn after the "
                    f"previous one answered plus ~{s.think_time_mean_s:g} s think time"}


def _describe(spec: LoadSpec, workload: WorkloadSpec, n_streams: int, builder: PromptBuilder,
              schedule: list[tuple[float, int]], rep: TraceReplay | None) -> dict[str, object]:
    """The resolved parameters, for run.json."""
    desc: dict[str, object] = {
        "workload": asdict(workload),
        "streams": n_streams,
        "rate": spec.rate,
        "burstiness": spec.burstiness,
        "arrivals": "none" if spec.rate is None else ("poisson" if spec.burstiness == 1 else "gamma"),
        "duration_s": spec.duration_s,
        "seed": spec.seed,
        "max_model_len": spec.max_model_len,
        "output_tokens": spec.output_tokens,
        "prompt_mode": "token_ids" if builder.token_ids else "text",
        "prompt_salt": builder.salt,
        "inject": spec.inject if spec.inject is None or isinstance(spec.inject, str) else list(spec.inject),
        "inject_max_tokens": spec.inject_max_tokens,
        "injections": [[t, n] for t, n in schedule],
    }
    if rep is not None:
        desc["trace"] = {
            "path": spec.trace_path, "time_scale": spec.trace_time_scale,
            "offset": spec.trace_offset, "limit": spec.trace_limit, "rows": len(rep.send_at_s),
            "rows_in_run": int(np.sum(rep.send_at_s < spec.duration_s)),
            "clipped_rows": rep.clipped_rows, "invalid_rows": rep.invalid_rows,
            "span_s": float(rep.send_at_s[-1]) if len(rep.send_at_s) else 0.0,
        }
    return desc
