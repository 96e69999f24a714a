"""Scheduler: budget and seat limits, both policies' phase behaviour, preemption, prefix caching.

Each test drives the engine loop by hand: schedule() -> a fake sampled token -> commit().
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from itlbench.core.block_manager import BlockManager
from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import Request, RequestStatus, SamplingParams
from itlbench.core.scheduler import Scheduler
from itlbench.core.scheduler_output import SchedulerOutput

EOS = 2
TOKEN = 7  # what the fake model always samples: never EOS unless a test says so
BLOCK = 16


def make_scheduler(policy: str = "budget", budget: int | None = 2048, mixed: bool = False,
                   max_num_seqs: int = 64, kv_blocks: int = 4096, max_model_len: int = 1 << 20,
                   prefix_caching: bool = True) -> Scheduler:
    cfg = EngineConfig(chunk_budget=budget, policy=policy, mixed=mixed, max_num_seqs=max_num_seqs,  # type: ignore[arg-type]
                       block_size=BLOCK, kv_blocks=kv_blocks, prefix_caching=prefix_caching)
    bm = BlockManager(kv_blocks, BLOCK, prefix_caching)
    return Scheduler(cfg, bm, max_model_len)


def make_request(rid: str, prompt: int | list[int], max_tokens: int = 16, seed: int = 0,
                 **sampling: object) -> Request:
    tokens = prompt if isinstance(prompt, list) else [(seed * 7919 + i) % 5000 + 10 for i in range(prompt)]
    params = SamplingParams(max_tokens=max_tokens, **{"ignore_eos": True, **sampling})  # type: ignore[arg-type]
    return Request(rid, tokens, params)


def check_output(sched: Scheduler, out: SchedulerOutput) -> None:
    """Per-step contract: budget, seats, chunk shape."""
    budget = sched.config.chunk_budget
    assert out.token_budget == budget
    if budget is not None:
        assert out.total_tokens <= budget
    assert len(sched.running) <= sched.config.max_num_seqs
    ids = [c.request.request_id for c in out.chunks]
    assert len(ids) == len(set(ids))
    for c in out.chunks:
        assert c.num_new_tokens >= 1
        assert c.start == c.request.num_computed_tokens
        assert c.end <= c.request.num_tokens
        assert c.is_decode == c.request.is_decoding
        assert c.request.status is RequestStatus.RUNNING
        assert len(c.request.block_ids) >= sched.block_manager.blocks_for(c.end)
    for r in out.preempted:
        assert r.status is RequestStatus.WAITING and r.block_ids == [] and r.num_computed_tokens == 0


def step(sched: Scheduler, token: int = TOKEN) -> tuple[SchedulerOutput, list[Request]]:
    out = sched.schedule()
    check_output(sched, out)
    sampled = {c.request.request_id: token for c in out.chunks if c.samples}
    finished = sched.commit(out, sampled, {EOS})
    sched.block_manager.check_invariants()
    return out, finished


def run_to_completion(sched: Scheduler, max_steps: int = 100_000) -> list[Request]:
    finished: list[Request] = []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return finished
        finished += step(sched)[1]
    raise AssertionError("scheduler did not drain: deadlock or livelock")


# ----------------------------------------------------------------- randomized invariants


@dataclass(frozen=True)
class Arrival:
    step: int
    prompt_len: int
    max_tokens: int
    family: int  # requests of one family share their prompt prefix


POLICIES = [("budget", False), ("prefill-first", False), ("prefill-first", True)]

arrivals = st.lists(
    st.builds(Arrival, st.integers(0, 30), st.integers(1, 3000), st.integers(1, 50), st.integers(0, 2)),
    min_size=1, max_size=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=arrivals, budget=st.sampled_from([None, 1, 3, 16, 17, 100, 2048]),
       policy=st.sampled_from(POLICIES), max_num_seqs=st.integers(1, 6), slack=st.integers(0, 40),
       prefix_caching=st.booleans())
def test_random_arrivals_drain_within_limits(reqs: list[Arrival], budget: int | None,
                                             policy: tuple[str, bool], max_num_seqs: int, slack: int,
                                             prefix_caching: bool) -> None:
    # Budgets of a few tokens make a 3000-token prompt take thousands of steps; keep those runs short.
    if budget is not None and budget < 16:
        reqs = [Arrival(a.step, min(a.prompt_len, 200), a.max_tokens, a.family) for a in reqs]
    worst = max(-(-(a.prompt_len + a.max_tokens) // BLOCK) for a in reqs)
    sched = make_scheduler(policy[0], budget, policy[1], max_num_seqs, kv_blocks=worst + slack,
                           prefix_caching=prefix_caching)
    requests = [make_request(f"r{i}", a.prompt_len, a.max_tokens, seed=a.family) for i, a in enumerate(reqs)]
    pending = sorted(zip(reqs, requests, strict=True), key=lambda p: p[0].step)
    finished: list[Request] = []
    for t in range(200_000):
        while pending and pending[0][0].step <= t:
            sched.add(pending.pop(0)[1])
        if not pending and not sched.has_unfinished():
            break
        out, done = step(sched)
        assert out.chunks or not sched.has_unfinished(), "idle step with work queued"
        finished += done
    else:
        raise AssertionError("did not drain")
    assert sorted(r.request_id for r in finished) == sorted(r.request_id for r in requests)
    for r in requests:
        assert r.status is RequestStatus.FINISHED_LENGTH
        assert r.num_output_tokens == r.sampling.max_tokens
        assert r.block_ids == []
    assert sched.block_manager.usage == 0.0
    assert not sched.waiting and not sched.running


# ----------------------------------------------------------------- phase behaviour of the policies


def start_decoders(sched: Scheduler, n: int = 8, max_tokens: int = 200) -> list[Request]:
    decoders = [make_request(f"d{i}", 64, max_tokens, seed=100 + i) for i in range(n)]
    for r in decoders:
        sched.add(r)
    while not all(r.is_decoding for r in decoders):
        step(sched)
    return decoders


def prefill_steps(sched: Scheduler, long: Request) -> list[SchedulerOutput]:
    """Steps from the long prompt's arrival until its first token."""
    sched.add(long)
    outs = []
    while long.num_output_tokens == 0:
        outs.append(step(sched)[0])
    return outs


def test_budget_policy_never_starves_decodes() -> None:
    sched = make_scheduler("budget", 2048)
    decoders = start_decoders(sched)
    long = make_request("long", 32 * 1024, seed=9)
    outs = prefill_steps(sched, long)
    assert len(outs) == -(-32 * 1024 // (2048 - 8))
    for out in outs:
        decoded = {c.request.request_id for c in out.chunks if c.is_decode}
        assert decoded == {r.request_id for r in decoders}
        assert out.num_decode_tokens == 8
        (chunk,) = [c for c in out.chunks if not c.is_decode]
        assert chunk.request is long and chunk.num_new_tokens <= 2048 - 8
        assert out.phase == "mixed"


def test_prefill_first_unchunked_stalls_every_decode() -> None:
    sched = make_scheduler("prefill-first", None)
    decoders = start_decoders(sched)
    before = [r.num_output_tokens for r in decoders]
    outs = prefill_steps(sched, make_request("long", 32 * 1024, seed=9))
    assert len(outs) == 1
    assert outs[0].num_decode_tokens == 0 and outs[0].num_prefill_tokens == 32 * 1024
    assert outs[0].phase == "prefill"
    assert [r.num_output_tokens for r in decoders] == before
    out, _ = step(sched)
    assert out.phase == "decode" and out.num_decode_tokens == 9


def test_prefill_first_chunked_without_mixing_starves_decodes_for_every_chunk() -> None:
    sched = make_scheduler("prefill-first", 2048)
    decoders = start_decoders(sched)
    before = [r.num_output_tokens for r in decoders]
    outs = prefill_steps(sched, make_request("long", 32 * 1024, seed=9))
    assert len(outs) == 16
    assert all(o.num_decode_tokens == 0 and o.num_prefill_tokens == 2048 for o in outs)
    assert [r.num_output_tokens for r in decoders] == before


def test_prefill_first_mixed_decodes_ride_every_prefill_step() -> None:
    sched = make_scheduler("prefill-first", 2048, mixed=True)
    decoders = start_decoders(sched)
    before = [r.num_output_tokens for r in decoders]
    outs = prefill_steps(sched, make_request("long", 32 * 1024, seed=9))
    assert len(outs) == -(-32 * 1024 // (2048 - 8))
    for out in outs:
        assert out.num_decode_tokens == 8 and out.num_prefill_tokens <= 2048 - 8
        assert out.phase == "mixed"
    assert [r.num_output_tokens for r in decoders] == [b + len(outs) for b in before]


def test_prefill_first_admits_all_waiting_prompts_before_decoding() -> None:
    sched = make_scheduler("prefill-first", 100)
    a, b = make_request("a", 150, 3, seed=1), make_request("b", 30, 3, seed=2)
    sched.add(a)
    sched.add(b)
    out, _ = step(sched)
    assert [(c.request.request_id, c.num_new_tokens) for c in out.chunks] == [("a", 100)]
    out, _ = step(sched)  # finishes a's prompt, then b's whole prompt fits
    assert [(c.request.request_id, c.num_new_tokens) for c in out.chunks] == [("a", 50), ("b", 30)]
    out, _ = step(sched)
    assert out.phase == "decode" and out.num_decode_tokens == 2


def test_max_num_seqs_caps_running() -> None:
    sched = make_scheduler("budget", None, max_num_seqs=2)
    reqs = [make_request(f"r{i}", 10, 4, seed=i) for i in range(5)]
    for r in reqs:
        sched.add(r)
    out, _ = step(sched)
    assert len(out.chunks) == 2 and len(sched.waiting) == 3
    assert len(run_to_completion(sched)) == 5


def test_unlimited_budget_prefills_whole_prompts() -> None:
    sched = make_scheduler("budget", None)
    reqs = [make_request(f"r{i}", 1000 + i, 2, seed=i) for i in range(3)]
    for r in reqs:
        sched.add(r)
    out, _ = step(sched)
    assert out.token_budget is None
    assert [c.num_new_tokens for c in out.chunks] == [1000, 1001, 1002]
    assert all(r.num_output_tokens == 1 for r in reqs)


# ----------------------------------------------------------------- preemption


def test_preemption_under_block_pressure_still_finishes_everything() -> None:
    # 10 blocks of 16; each request ends at 40 + 60 = 100 tokens = 7 blocks, so two cannot coexist.
    sched = make_scheduler("budget", 64, kv_blocks=10, prefix_caching=False)
    reqs = [make_request(f"r{i}", 40, 60, seed=i) for i in range(4)]
    for r in reqs:
        sched.add(r)
    preempted = 0
    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        out, _ = step(sched)
        preempted += len(out.preempted)
        assert out.chunks
    assert not sched.has_unfinished()
    assert preempted > 0 and sum(r.num_preemptions for r in reqs) == preempted
    assert all(r.num_output_tokens == 60 and r.status is RequestStatus.FINISHED_LENGTH for r in reqs)
    assert sched.block_manager.usage == 0.0


def test_preemption_takes_the_newest_and_requeues_it_first() -> None:
    sched = make_scheduler("budget", None, kv_blocks=4, prefix_caching=False)
    a, b = make_request("a", 32, 30), make_request("b", 16, 10, seed=1)
    sched.add(a)
    sched.add(b)
    step(sched)  # a holds 2 blocks, b holds 1, one spare
    assert [r.request_id for r in sched.running] == ["a", "b"]
    out, _ = step(sched)  # a's 33rd slot takes the spare; b's 17th slot has none left
    assert out.preempted == [b] and [c.request for c in out.chunks] == [a]
    assert sched.waiting[0] is b and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert b.num_output_tokens == 1  # kept: recompute covers prompt and output so far
    assert run_to_completion(sched) == [a, b]
    assert a.num_output_tokens == 30 and b.num_output_tokens == 10
    assert a.num_preemptions == 0


def test_request_larger_than_the_cache_is_aborted_not_looped() -> None:
    sched = make_scheduler("budget", 64, kv_blocks=4, prefix_caching=False)
    big = make_request("big", 100, 4)  # 7 blocks > 4
    small = make_request("small", 10, 3, seed=1)
    sched.add(big)
    sched.add(small)
    finished = run_to_completion(sched, max_steps=100)
    assert big.status is RequestStatus.FINISHED_ABORTED and big in finished
    assert small.status is RequestStatus.FINISHED_LENGTH and small.num_output_tokens == 3


def test_request_that_outgrows_the_cache_while_decoding_is_aborted() -> None:
    sched = make_scheduler("budget", 64, kv_blocks=2, prefix_caching=False)
    r = make_request("r", 30, 10)  # prompt fits in 2 blocks; decoding past 32 tokens cannot
    sched.add(r)
    finished = run_to_completion(sched, max_steps=100)
    assert finished == [r] and r.status is RequestStatus.FINISHED_ABORTED
    assert r.num_output_tokens == 3 and sched.block_manager.usage == 0.0  # slot 33 needs a 3rd block


# ----------------------------------------------------------------- prefix caching


def test_prefix_cache_hit_counts_full_blocks_below_the_last_token() -> None:
    sched = make_scheduler("budget", 2048)
    prompt = list(range(100, 164))  # 64 tokens = 4 full blocks
    first = make_request("first", prompt, 4)
    sched.add(first)
    run_to_completion(sched)
    assert first.num_cached_tokens == 0
    same = make_request("same", prompt, 4)
    sched.add(same)
    out, _ = step(sched)
    assert same.num_cached_tokens == 48  # at most 63 tokens may come from cache: 3 full blocks
    assert out.chunks[0].start == 48 and out.chunks[0].num_new_tokens == 16
    longer = make_request("longer", prompt + [5, 6, 7], 4)
    sched.add(longer)
    step(sched)
    assert longer.num_cached_tokens == 64
    diverged = make_request("diverged", prompt[:40] + [1] * 30, 4)
    sched.add(diverged)
    step(sched)
    assert diverged.num_cached_tokens == 32
    run_to_completion(sched)
    assert all(r.num_output_tokens == 4 for r in (same, longer, diverged))


def test_concurrent_requests_share_prefix_blocks() -> None:
    sched = make_scheduler("budget", 2048)
    prompt = list(range(500, 560))  # 60 tokens: 3 full blocks + 12
    a = make_request("a", prompt, 8)
    sched.add(a)
    step(sched)
    b = make_request("b", prompt[:48] + [9] * 12, 8)
    sched.add(b)
    step(sched)
    assert b.num_cached_tokens == 48
    assert b.block_ids[:3] == a.block_ids[:3] and b.block_ids[3] != a.block_ids[3]
    for block_id in a.block_ids[:3]:
        assert sched.block_manager.blocks[block_id].ref_count == 2
    run_to_completion(sched)
    assert sched.block_manager.usage == 0.0


def test_prefix_caching_disabled_gives_no_hits() -> None:
    sched = make_scheduler("budget", 2048, prefix_caching=False)
    prompt = list(range(64))
    for rid in ("a", "b"):
        r = make_request(rid, prompt, 2)
        sched.add(r)
        run_to_completion(sched)
        assert r.num_cached_tokens == 0


# ----------------------------------------------------------------- stop conditions and abort


def test_eos_stops_after_min_tokens() -> None:
    sched = make_scheduler()
    r = make_request("r", 8, 10, ignore_eos=False, min_tokens=3)
    sched.add(r)
    finished: list[Request] = []
    while not finished:
        finished = step(sched, token=EOS)[1]
    assert finished == [r] and r.status is RequestStatus.FINISHED_STOPPED and r.num_output_tokens == 3
    assert r.finish_reason == "stop"


def test_ignore_eos_runs_to_max_tokens() -> None:
    sched = make_scheduler()
    r = make_request("r", 8, 5)
    sched.add(r)
    while sched.has_unfinished():
        step(sched, token=EOS)
    assert r.status is RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 5


def test_stop_token_ids_stop() -> None:
    sched = make_scheduler()
    r = make_request("r", 8, 10, stop_token_ids=(TOKEN,))
    sched.add(r)
    _, finished = step(sched)
    assert finished == [r] and r.status is RequestStatus.FINISHED_STOPPED and r.output_token_ids == [TOKEN]


def test_max_model_len_caps_length() -> None:
    sched = make_scheduler(max_model_len=12)
    r = make_request("r", 8, 50)
    sched.add(r)
    run_to_completion(sched)
    assert r.status is RequestStatus.FINISHED_LENGTH and r.num_tokens == 12


def test_abort_between_schedule_and_commit_is_skipped() -> None:
    sched = make_scheduler()
    a, b = make_request("a", 20, 3), make_request("b", 20, 3, seed=1)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert sched.abort("a") is a
    assert a.status is RequestStatus.FINISHED_ABORTED and a.block_ids == []
    finished = sched.commit(out, {"a": TOKEN, "b": TOKEN}, {EOS})
    assert finished == [] and a.num_output_tokens == 0 and b.num_output_tokens == 1
    sched.block_manager.check_invariants()
    assert sched.abort("missing") is None
    run_to_completion(sched)
    assert b.num_output_tokens == 3 and sched.block_manager.usage == 0.0


def test_abort_waiting_request() -> None:
    sched = make_scheduler(max_num_seqs=1)
    a, b = make_request("a", 20, 3), make_request("b", 20, 3, seed=1)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert sched.abort("b") is b and not sched.waiting
    run_to_completion(sched)
    assert a.num_output_tokens == 3 and b.status is RequestStatus.FINISHED_ABORTED


def test_unchunked_steps_take_whole_prompts_up_to_the_cap():
    """Budget none never splits a prompt; further prompts join a step only within the cap."""
    sched = make_scheduler(budget=None, kv_blocks=8192)
    for i in range(4):
        sched.add(make_request(f"r{i}", 8000, seed=i + 1))
    sched.add(make_request("big", 32_768, seed=9))
    firsts = []
    while sched.waiting:
        out, _ = step(sched)
        firsts.append([(c.request.request_id, c.num_new_tokens) for c in out.chunks if not c.is_decode])
    assert firsts[0] == [("r0", 8000), ("r1", 8000)]  # 16000 <= 16384; a third would exceed it
    assert firsts[1] == [("r2", 8000), ("r3", 8000)]
    assert firsts[2] == [("big", 32_768)]  # a prompt longer than the cap still goes whole, alone
