"""Request generators per workload kind: each is an infinite, seeded stream of RequestPlans
(send_at_s unset), used by closed-loop streams and, with times attached, by the open-loop feed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from itlbench.workloads.catalog import WorkloadSpec
from itlbench.workloads.plan import RequestPlan
from itlbench.workloads.prompts import Prompt, PromptBuilder
from itlbench.workloads.sampling import sample_length, sample_lengths
from itlbench.workloads.trace import Trace


@dataclass
class Context:
    """What every generator of one run shares: the workload, the prompt builder, the limits."""

    spec: WorkloadSpec
    builder: PromptBuilder
    max_model_len: int
    seed: int
    output_tokens: int | None = None
    trace: Trace | None = None
    _doc_lengths: np.ndarray | None = field(default=None, repr=False)

    def doc_lengths(self) -> np.ndarray:
        """Per-document prefix lengths, fixed by the seed so all streams agree on them. The few draws are
        scaled to average `prefix_tokens` exactly: eight lognormal documents alone average anywhere from
        7,400 to 8,700 tokens by seed, and every request reads one of them, so `rag` would not be 8000:400."""
        if self._doc_lengths is None:
            sp = self.spec.shared_prefix
            assert sp is not None
            rng = np.random.default_rng([self.seed, 3])
            draws = sample_lengths(rng, sp.prefix_tokens, sp.prefix_sigma, sp.num_documents).astype(np.float64)
            scaled = np.rint(draws * (sp.prefix_tokens / draws.mean())).astype(np.int64)
            self._doc_lengths = np.clip(scaled, 1, self.max_model_len - 1)
        return self._doc_lengths


@dataclass
class Ids:
    """Readable request ids: prefix + zero-padded counter (s03-000012, o-000123)."""

    prefix: str
    width: int = 6
    count: int = 0

    def next(self) -> str:
        rid = f"{self.prefix}{self.count:0{self.width}d}"
        self.count += 1
        return rid


def _out(ctx: Context, rng: np.random.Generator) -> int:
    if ctx.output_tokens is not None:
        return ctx.output_tokens
    return sample_length(rng, ctx.spec.mean_out, ctx.spec.sigma, 1, ctx.max_model_len - 1)


def _plan(ctx: Context, rid: str, prompt: Prompt, out: int, stream: int | None,
          session: str | None = None, turn: int = 0, think_time_s: float = 0.0) -> RequestPlan:
    return RequestPlan(request_id=rid, workload=ctx.spec.name, cls=ctx.spec.name,
                       prompt_tokens=prompt.tokens, max_tokens=out, prompt_token_ids=prompt.ids,
                       prompt_text=prompt.text, stream=stream, session=session, turn=turn,
                       think_time_s=think_time_s)


def simple(ctx: Context, rng: np.random.Generator, ids: Ids,
           stream: int | None) -> Iterator[RequestPlan]:
    """Independent requests with lognormal lengths and fully unique prompts."""
    while True:
        rid, out = ids.next(), _out(ctx, rng)
        n = sample_length(rng, ctx.spec.mean_in, ctx.spec.sigma, 1, ctx.max_model_len - out)
        yield _plan(ctx, rid, ctx.builder.unique(rid, n), out, stream)


def rag(ctx: Context, rng: np.random.Generator, ids: Ids,
        stream: int | None) -> Iterator[RequestPlan]:
    """A shared document (chosen uniformly from the pool) followed by a unique question."""
    sp = ctx.spec.shared_prefix
    assert sp is not None
    docs = ctx.doc_lengths()
    question_mean = max(1, ctx.spec.mean_in - sp.prefix_tokens)
    while True:
        rid, out = ids.next(), _out(ctx, rng)
        doc = int(rng.integers(0, len(docs)))
        cap = ctx.max_model_len - out
        doc_prompt = ctx.builder.shared(f"doc-{doc}", int(docs[doc])).head(cap - 1)
        q = sample_length(rng, question_mean, ctx.spec.sigma, 1, cap - doc_prompt.tokens)
        yield _plan(ctx, rid, doc_prompt + ctx.builder.unique(rid, q), out, stream)


def agent(ctx: Context, rng: np.random.Generator, ids: Ids,
          stream: int | None) -> Iterator[RequestPlan]:
    """Sessions of turns; each turn's prompt extends the previous one by its (synthetic) output and
    a tool result, so the previous prompt is an exact prefix. A session ends after its drawn number
    of turns or when the next turn would not fit in max_model_len."""
    number = 0
    while True:
        session = f"{ids.prefix}sess-{number:05d}"
        number += 1
        yield from _session(ctx, rng, ids, stream, session)


def session_turns(ctx: Context, number: int, stream: int) -> Iterator[RequestPlan]:
    """Session `number` of an open-loop session feed, on its own seeded generator: its turns are drawn
    lazily while other sessions run, so a shared one would make prompts depend on timing."""
    rng = np.random.default_rng([ctx.seed, 5, number])
    session = f"o-sess-{number:05d}"
    return _session(ctx, rng, Ids(f"{session}-t", width=2), stream, session)


def _session(ctx: Context, rng: np.random.Generator, ids: Ids, stream: int | None,
             session: str) -> Iterator[RequestPlan]:
    s = ctx.spec.sessions
    assert s is not None
    turns = int(rng.integers(s.min_turns, s.max_turns + 1))
    rid, out = ids.next(), _out(ctx, rng)
    first = sample_length(rng, s.initial_tokens, ctx.spec.sigma, 1, ctx.max_model_len - out)
    prompt = ctx.builder.unique(rid, first)
    yield _plan(ctx, rid, prompt, out, stream, session=session, turn=0)
    for turn in range(1, turns):
        tool = sample_length(rng, s.tool_result_tokens, ctx.spec.sigma, 1)
        answer = ctx.builder.unique(f"{rid}:answer", out)
        next_out = _out(ctx, rng)
        think = float(rng.exponential(s.think_time_mean_s))
        if prompt.tokens + out + tool > ctx.max_model_len - next_out:
            return
        rid, out = ids.next(), next_out
        prompt = prompt + answer + ctx.builder.unique(f"{rid}:tool", tool)
        yield _plan(ctx, rid, prompt, out, stream, session=session, turn=turn, think_time_s=think)


def trace_rows(ctx: Context, rng: np.random.Generator, ids: Ids,
               stream: int | None) -> Iterator[RequestPlan]:
    """Closed-loop use of a trace: lengths of rows drawn at random (arrival times unused)."""
    trace = ctx.trace
    assert trace is not None
    while True:
        row = int(rng.integers(0, len(trace)))
        rid = ids.next()
        out = ctx.output_tokens or int(np.clip(trace.output_tokens[row], 1, ctx.max_model_len - 1))
        n = int(np.clip(trace.prompt_tokens[row], 1, ctx.max_model_len - out))
        yield _plan(ctx, rid, ctx.builder.unique(rid, n), out, stream)


def requests(ctx: Context, rng: np.random.Generator, ids: Ids,
             stream: int | None = None) -> Iterator[RequestPlan]:
    """The generator that fits the workload."""
    spec = ctx.spec
    if spec.from_trace:
        return trace_rows(ctx, rng, ids, stream)
    if spec.sessions:
        return agent(ctx, rng, ids, stream)
    if spec.shared_prefix:
        return rag(ctx, rng, ids, stream)
    return simple(ctx, rng, ids, stream)
