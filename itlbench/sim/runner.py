"""Simulated runner: the real scheduler and block manager, with model execution replaced by the
roofline cost model (sim/roofline.py) on a virtual clock.

`Engine(config.with_(engine="sim", gpu="h100"))` builds the same engine the torch runner gets, minus
the model: no weights, no KV tensors, no torch. Each step's cost comes from its chunks' token counts
(rows, rows that sample, cached context, causal pairs) on the chosen hardware, and the tokens are
made up (`SimTokens`): a function of the context under temperature 0 (greedy) or of the request's seed and
context, else drawn from the engine's --seed; never EOS, so lengths are the requested ones, except where a
request set no max_tokens and does not ignore EOS: that one ends with EOS at a plausible length, as a
model's answer would (NATURAL_LENGTH, seeded like its tokens).

Two clocks. Served (`PacedClock`), a step ends `cost / sim_time_scale` after it started on the
perf_counter clock: the engine thread sleeps until then, so streams are paced exactly as the
simulated GPU would pace them and the harness measures a sim like any engine (at a time scale s,
every time it sees is 1/s of the simulated one). Offline (`VirtualClock`), time is just the sum of
step costs: nothing sleeps, and a run of minutes of simulated time takes milliseconds.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from array import array
from collections.abc import Iterable

from itlbench.core.engine import Engine, RunnerInfo, StepRun, resolve_max_model_len
from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import load_model_config
from itlbench.core.request import Request
from itlbench.core.scheduler_output import ScheduledChunk, SchedulerOutput
from itlbench.errors import ConfigError
from itlbench.sim.hardware import kv_dtype_bytes
from itlbench.sim.roofline import CostModel, Hardware, StepShape, StepTime, load_hardware

DEFAULT_GPU = "h100"
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of device memory for weights + KV cache


class PacedClock:
    """perf_counter_ns time; a step lasts exactly its charged cost divided by the time scale."""

    def __init__(self, time_scale: float = 1.0) -> None:
        self.time_scale = time_scale
        self._charged_s = 0.0

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def charge(self, seconds: float) -> None:
        self._charged_s += seconds

    def end_step(self, start_ns: int) -> int:
        end_ns = start_ns + round(self._charged_s / self.time_scale * 1e9)
        self._charged_s = 0.0
        remaining = (end_ns - time.perf_counter_ns()) / 1e9
        if remaining > 0:
            time.sleep(remaining)  # the GIL is free meanwhile: the server streams, the client reads
        return end_ns


class VirtualClock:
    """Simulated time only: starts at `start_ns`, advances by charged step costs (divided by
    `time_scale`) and by `advance_to`."""

    def __init__(self, start_ns: int = 0, time_scale: float = 1.0) -> None:
        self._now_ns = start_ns
        self.time_scale = time_scale
        self._charged_s = 0.0

    def now_ns(self) -> int:
        return self._now_ns

    def advance_to(self, t_ns: int) -> None:
        """Idle until `t_ns` (e.g. the next arrival); never moves backwards."""
        self._now_ns = max(self._now_ns, t_ns)

    def charge(self, seconds: float) -> None:
        self._charged_s += seconds

    def end_step(self, start_ns: int) -> int:
        self._now_ns = start_ns + round(self._charged_s / self.time_scale * 1e9)
        self._charged_s = 0.0
        return self._now_ns


def chunk_shape(chunks: Iterable[ScheduledChunk]) -> StepShape:
    return StepShape.of((c.num_new_tokens, c.start, c.samples) for c in chunks)


def sim_kv_blocks(config: EngineConfig, cost: CostModel, hw: Hardware, max_model_len: int) -> int:
    """KV blocks the simulated device holds: an explicit kv_blocks; else --kv-memory-gib a GPU (the room a runtime's
    log reports); else what 90 % of its memory holds beside the weights, capped at what max_num_seqs full-length
    requests could use. Errors, as vLLM does, when the weights or one full-length request do not fit."""
    if config.kv_blocks is not None:
        return _blocks_given(config.kv_blocks, config.block_size, cost, hw)
    if config.kv_memory_gib is not None:
        tokens = _tokens_in(config.kv_memory_gib, cost, hw)
    elif (tokens := cost.kv_capacity_tokens(hw, GPU_MEMORY_UTILIZATION)) <= 0:
        shard = f", {cost.weight_bytes_per_gpu / 2**30:.1f} GiB per GPU at --tp {cost.tp}" if cost.tp > 1 else ""
        weights = f"{cost.model.name}'s weights ({cost.weight_bytes / 2**30:.1f} GiB{shard})"
        fits_whole = cost.weight_bytes_per_gpu < hw.memory_bytes  # a runtime at a higher utilisation may have room
        raise ConfigError("gpu", f"{weights} do not fit in {GPU_MEMORY_UTILIZATION:.0%} of {hw.the_label}'s "
                          f"{hw.memory_bytes / 2**30:.1f} GiB",
                          "choose a larger GPU, a higher --tp, --dtype fp8 (fp4 on a B200), a smaller model"
                          + (", or give the K/V room a runtime reports with --kv-memory-gib" if fits_whole else ""))
    if tokens < max_model_len and config.kv_memory_gib is not None:
        need = math.ceil(max_model_len * cost.kv_bytes_per_token_per_gpu / 2**30 * 10) / 10
        shorter = f", or --max-model-len {tokens} or less" if tokens >= 2 else ""
        raise ConfigError("kv_memory_gib", f"{config.kv_memory_gib:g} GiB holds {tokens:,} tokens of K/V, fewer than "
                          f"one {max_model_len:,}-token request (max_model_len)",
                          f"use --kv-memory-gib {need:g} or more{shorter}")
    if tokens < max_model_len:
        raise ConfigError("max_model_len", f"{max_model_len} tokens of KV cache do not fit on {hw.the_label} "
                          f"(room for {tokens} beside the weights)", f"use --max-model-len {tokens} or less")
    per_request = math.ceil(max_model_len / config.block_size)
    return min(tokens // config.block_size, config.max_num_seqs * per_request)


def _blocks_given(blocks: int, block_size: int, cost: CostModel, hw: Hardware) -> int:
    """--kv-blocks as given, refused past what one GPU holds beside its weight shard: the default's arithmetic on the
    whole GPU, as --kv-memory-gib is (a runtime run at more than vLLM's 90 % reports room the default would not have).
    The block manager lists every block up front: 10^12 of them ran the machine out of memory."""
    _check_weights_fit(cost, hw)
    most = cost.kv_capacity_tokens(hw, 1.0) // block_size
    if blocks <= most:
        return blocks
    tp = f" at --tp {cost.tp}" if cost.tp > 1 else ""
    raise ConfigError("kv_blocks", f"{blocks:,} blocks of {block_size} tokens do not fit beside {cost.model.name}'s "
                      f"weights on {hw.the_label}{tp} (room for {most:,})",
                      f"use --kv-blocks {most} or less, or leave it out to size it from memory")


def _tokens_in(kv_memory_gib: float, cost: CostModel, hw: Hardware) -> int:
    """Tokens of K/V `kv_memory_gib` of each GPU holds, refused where it is more than the GPU has beside its weights
    (the whole GPU: a runtime run at more than vLLM's 90 % reports room the default would not have)."""
    _check_weights_fit(cost, hw)
    left = (hw.memory_bytes - cost.weight_bytes_per_gpu) / 2**30
    if kv_memory_gib > left:
        raise ConfigError("kv_memory_gib", f"{kv_memory_gib:g} GiB of K/V does not fit beside the weights on the "
                          f"{hw.label} ({left:.1f} GiB left)", f"use --kv-memory-gib {left:.1f} or less")
    return int(kv_memory_gib * 2**30 // cost.kv_bytes_per_token_per_gpu)


def _check_weights_fit(cost: CostModel, hw: Hardware) -> None:
    """Refuse K/V room sized by hand on a GPU its weight shard alone fills."""
    if cost.weight_bytes_per_gpu >= hw.memory_bytes:
        raise ConfigError("gpu", f"{cost.model.name}'s weights do not fit on {hw.the_label}",
                          "choose a larger GPU, a higher --tp, --dtype fp8 (fp4 on a B200), or a smaller model")


def sim_kv_share(config: EngineConfig) -> float | None:
    """The share of one simulated GPU's memory its K/V room takes (GPU_MEMORY_UTILIZATION of it less the weight
    shard); None for the measured 'cpu' profile, for disaggregated pools (two GPUs, no one share) and where
    --kv-blocks or --kv-memory-gib sets the room."""
    if config.disaggregate or (config.gpu or DEFAULT_GPU).strip().lower() == "cpu" or _sized_by_hand(config):
        return None
    hw = sim_hardware(config)
    return sim_cost_model(config, load_model_config(config.model), hw).kv_room_share(hw, GPU_MEMORY_UTILIZATION)


def _sized_by_hand(config: EngineConfig) -> bool:
    """--kv-blocks or --kv-memory-gib: the room is the user's (a runtime's log, its reserve already kept), not the
    share the simulator would derive, so no tight-room check applies."""
    return config.kv_blocks is not None or config.kv_memory_gib is not None


def sim_hardware(config: EngineConfig, gpu: str | None = None) -> Hardware:
    """The profile `--gpu` names, serving `--dtype` (fp8: the FP8 rate, one-byte layer weights and K/V; fp4: NVFP4)."""
    return load_hardware(gpu or config.gpu or DEFAULT_GPU).for_dtype(config.dtype)


def sim_cost_model(config: EngineConfig, model: ModelConfig, hw: Hardware) -> CostModel:
    return CostModel.for_hardware(model, hw, tp=config.tp, cuda_graphs=config.cuda_graphs,
                                  kv_dtype_bytes=kv_dtype_bytes(config.kv_cache_dtype))


def check_sim_config(config: EngineConfig) -> None:
    """Refuse, before any server starts, what a simulated engine would refuse at start-up."""
    model = load_model_config(config.model)
    max_len = config.max_model_len or model.max_position_embeddings
    model.check_window(max_len, f"pass --max-model-len {model.sliding_window} or less")
    gpus = [("--gpu", config.gpu or DEFAULT_GPU)]
    if config.disaggregate and config.prefill_gpu:
        gpus.append(("--prefill-gpu", config.prefill_gpu))
    for flag, gpu in gpus:
        if gpu.strip().lower() == "cpu":
            continue  # measured at start-up; its memory is the machine's
        hw = load_hardware(gpu, flag).for_dtype(config.dtype)
        sim_kv_blocks(config, sim_cost_model(config, model, hw), hw, max_len)


class SimRunner:
    """The simulated `Runner`: stands where the torch `ModelRunner` stands; `run` replaces flatten →
    execute → sample with a charge to the clock."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int,
                 hardware: Hardware | None = None, clock: PacedClock | VirtualClock | None = None) -> None:
        self.hardware = (hardware or load_hardware(config.gpu or DEFAULT_GPU)).for_dtype(config.dtype)
        self.cost_model = sim_cost_model(config, model_config, self.hardware)
        self.num_blocks = sim_kv_blocks(config, self.cost_model, self.hardware, max_model_len)
        self._sized_by_hand = _sized_by_hand(config)
        self.clock = clock or PacedClock(config.sim_time_scale)
        self.block_size = config.block_size
        tp = f"x{config.tp}" if config.tp > 1 else ""
        self._info = RunnerInfo(device=f"sim:{self.hardware.name}{tp}", dtype=self.hardware.dtype,
                                attention=config.attention, block_size=config.block_size)
        self.last: StepTime | None = None
        self.tokens = SimTokens(model_config.vocab_size, model_config.eos_token_ids, config.seed)

    def describe(self) -> str:
        """The simulated deployment in one line, so a run says what it priced (GPU, dtypes, K/V room)."""
        tp = self.cost_model.tp
        gpus = f"{tp} × {self.hardware.label}" if tp > 1 else self.hardware.label
        return (f"{gpus}: {self.hardware.dtype} weights, K/V at {self.cost_model.kv_b} B an element, "
                f"{self.num_blocks:,} K/V blocks of {self.block_size} tokens")

    @property
    def kv_share(self) -> float | None:
        """The share of one GPU's memory its K/V room takes beside the weights (`sim_kv_share`)."""
        return None if self._sized_by_hand else self.cost_model.kv_room_share(self.hardware, GPU_MEMORY_UTILIZATION)

    def step_time(self, output: SchedulerOutput) -> StepTime:
        return self.cost_model.time(chunk_shape(output.chunks), self.hardware)

    @property
    def info(self) -> RunnerInfo:
        return self._info

    def run(self, output: SchedulerOutput, label: str = "step") -> StepRun:
        """Charge the step's cost to the clock; a made-up token for every chunk that samples."""
        self.last = self.step_time(output)
        self.clock.charge(self.last.total_s)
        token = self.tokens.next
        return StepRun({c.request.request_id: token(c.request) for c in output.chunks if c.samples})


# Where the simulator ends a response whose client set no max_tokens (and does not ignore EOS): a lognormal
# length with the mean and spread of the `chat` workload's answers (workloads/catalog.py), drawn per request
# like its tokens. A real model's answer ends where its EOS falls; the simulator has no model to say where.
NATURAL_LENGTH_MEAN = 500
NATURAL_LENGTH_SIGMA = 0.6
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: int) -> int:
    """splitmix64's finaliser: 64 well-mixed bits from any 64."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _prompt_key(prompt: list[int]) -> int:
    """64 bits of the whole prompt (BLAKE2b: the same in every process and Python version)."""
    return int.from_bytes(hashlib.blake2b(array("q", prompt).tobytes(), digest_size=8).digest(), "little")


_KEY, _FOLDED, _EOS_AT, _REQUEST = range(4)  # a context: [key, folded, eos_at, request]


class SimTokens:
    """The simulator's made-up tokens, as deterministic as a model's where a model's would be.

    Temperature 0 (greedy): each token is a function of the context (prompt and the tokens so far), like an
    argmax; a seed with temperature > 0: a function of the seed and the context, so the same request with the
    same seed gives the same text, another seed another. Otherwise a draw from the engine's generator
    (seeded by --seed), as unseeded sampling is. EOS is never drawn, so lengths are the requested ones; an
    open-ended request (`SamplingParams.open_ended`, not ignoring EOS) ends with EOS after NATURAL_LENGTH
    tokens, drawn from its seed and prompt where it has a key, else from the engine's generator.

    A request's context is kept as [key, folded, eos_at, request]: the running hash of its prompt and of the
    `folded` output tokens so far (one multiply-xorshift a token), and the output index of its EOS (or None).
    """

    def __init__(self, vocab: int, stop_ids: Iterable[int], seed: int) -> None:
        self.vocab = vocab
        self.stop_ids = frozenset(stop_ids)
        self.eos = min(self.stop_ids) if self.stop_ids else None
        self.rng = random.Random(seed)
        self._contexts: dict[str, list] = {}
        self._prune_at = 64

    def next(self, req: Request) -> int:
        """The token `req` samples next (its output index is `req.num_output_tokens`)."""
        ctx = self._contexts.get(req.request_id)
        outputs = req.output_token_ids
        if ctx is None or ctx[_REQUEST] is not req or ctx[_FOLDED] > len(outputs):
            ctx = self._context(req)
            if ctx is None:
                return self._avoid_stop(self.rng.randrange(self.vocab))
        n = len(outputs)
        if ctx[_EOS_AT] == n:
            return self.eos  # type: ignore[return-value]
        key = ctx[_KEY]
        if key is None:  # open-ended but not keyed: its tokens are draws
            return self._avoid_stop(self.rng.randrange(self.vocab))
        for i in range(ctx[_FOLDED], n):
            key = ((key ^ outputs[i]) * _GOLDEN) & _MASK
            key ^= key >> 29
        ctx[_KEY], ctx[_FOLDED] = key, n
        token = (key >> 11) % self.vocab
        return token if token not in self.stop_ids else self._avoid_stop(token)

    def _avoid_stop(self, token: int) -> int:
        while token in self.stop_ids:  # never end a stream early: lengths are the requested ones
            token = (token + 1) % self.vocab
        return token

    def _context(self, req: Request) -> list | None:
        """A new context for `req`; None where it needs none (its tokens are draws and its length is given)."""
        sp = req.sampling
        keyed = sp.greedy or sp.seed is not None
        open_ended = sp.open_ended and not sp.ignore_eos and self.eos is not None
        if not keyed and not open_ended:
            return None
        key = None
        if keyed:
            key = _prompt_key(req.prompt_token_ids)
            if not sp.greedy:  # a seed picks the sample; greedy ignores it, as vLLM does
                key = _mix(key ^ _mix((sp.seed or 0) & _MASK))
        eos_at = self._natural_end(req, key) if open_ended else None
        ctx = [key, 0, eos_at, req]
        if len(self._contexts) >= self._prune_at:  # drop finished (and aborted) requests' contexts
            self._contexts = {rid: c for rid, c in self._contexts.items() if not c[_REQUEST].is_finished}
            self._prune_at = max(64, 2 * len(self._contexts))
        self._contexts[req.request_id] = ctx
        return ctx

    def _natural_end(self, req: Request, key: int | None) -> int:
        """The output index of an open-ended request's EOS: NATURAL_LENGTH tokens, EOS included, at least
        min_tokens; past max_tokens it never comes (the request ends at its length)."""
        rng = self.rng if key is None else random.Random(key ^ 0x5EED)
        mu = math.log(NATURAL_LENGTH_MEAN) - NATURAL_LENGTH_SIGMA ** 2 / 2
        length = max(1, req.sampling.min_tokens, round(rng.lognormvariate(mu, NATURAL_LENGTH_SIGMA)))
        return length - 1


def offline_engine(config: EngineConfig, model_config: ModelConfig | None = None, start_ns: int = 0,
                   time_scale: float = 1.0) -> Engine:
    """A simulated `Engine` on a `VirtualClock`: steps cost no wall time (what-ifs, tests)."""
    config = config.with_(engine="sim")
    model_config = model_config or load_model_config(config.model)
    runner = SimRunner(config, model_config, resolve_max_model_len(config, model_config),
                       clock=VirtualClock(start_ns, time_scale))
    return Engine(config, model_config, runner)
