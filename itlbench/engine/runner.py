"""`ModelRunner`: owns the model, the paged KV cache and the RoPE tables; runs one step.

It is the torch `Runner` of `itlbench.core.engine`: `run` flattens the scheduled chunks into one row
batch, runs the model (`execute`) and samples the rows that yield a token, timing each part.

On CUDA it also owns the decode CUDA graphs (`cuda_graph.DecodeGraphs`): a step whose chunks are all
one token long replays a captured graph, every other step runs eagerly; `last_cuda_graph` says
which one the last `execute` took, for the step record.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import time

import numpy as np
import torch

from itlbench.core.engine import RunnerInfo, StepRun, WallClock
from itlbench.core.engine_config import EngineConfig
from itlbench.core.hf_config import require_engine_family
from itlbench.core.model_config import ModelConfig
from itlbench.core.nvtx import nvtx_range
from itlbench.core.scheduler_output import SchedulerOutput
from itlbench.core.steps import step_tokens_note
from itlbench.engine.attention import choose, make_backend
from itlbench.engine.batch import FlatBatch, Flattener
from itlbench.engine.cpu import native
from itlbench.engine.cpu import weights as cpu_weights
from itlbench.engine.cpu.decode_forward import NativeDecodeForward
from itlbench.engine.cuda_graph import DecodeGraphs, graph_buckets
from itlbench.engine.device import resolve_device, resolve_dtype
from itlbench.engine.kv_pool import check_kv_pool, kv_room, pool_failed
from itlbench.engine.model.llama import ForwardContext, LlamaForCausalLM
from itlbench.engine.model.loader import load_weights
from itlbench.engine.model.rope import rope_tables
from itlbench.engine.model.row_ops import row_ops_for
from itlbench.engine.sampler import Sampler

log = logging.getLogger("itlbench.engine")

GIB = 1 << 30
CPU_KV_GIB = 4.0  # KV pool on CPU when kv_memory_gib is not given
CUDA_RESERVE_BYTES = 1 * GIB  # CUDA context growth, cuBLAS workspaces, graph pools: kept out of the KV pool


def max_step_tokens(config: EngineConfig, max_model_len: int) -> int:
    """The most rows one step can carry: the budget, or unchunked a whole prompt of max_model_len."""
    return config.chunk_budget if config.chunk_budget is not None else max(config.unchunked_prefill_cap,
                                                                           max_model_len)


def activation_bytes(model: ModelConfig, tokens: int, dtype_bytes: int) -> int:
    """Peak activations of one step of `tokens` rows, generously: the MLP's gate/up output and
    product, the QKV and attention output, and a few residual-width temporaries per row."""
    per_row = 3 * model.intermediate_size + 2 * (model.num_heads + 2 * model.num_kv_heads) * model.head_dim \
        + 6 * model.hidden_size
    return tokens * per_row * dtype_bytes


def num_kv_blocks(config: EngineConfig, model: ModelConfig, max_model_len: int, dtype_bytes: int,
                  block_size: int | None = None, free_bytes: int | None = None) -> int:
    """Blocks in the KV pool. Explicit kv_blocks wins; else kv_memory_gib; else, on CUDA
    (`free_bytes` = free device memory after the weights), `gpu_memory_fraction` of it less one step's
    activations and a fixed reserve; else 4 GiB. Capped at what max_num_seqs full-length requests
    could use and never below one full-length request."""
    if config.kv_blocks is not None:
        return config.kv_blocks
    block_size = block_size or config.block_size
    per_request = -(-max_model_len // block_size)
    block_bytes = model.kv_bytes_per_token(dtype_bytes) * block_size
    if config.kv_memory_gib is not None:
        budget = config.kv_memory_gib * GIB
    elif free_bytes is not None:
        budget = free_bytes * config.gpu_memory_fraction - CUDA_RESERVE_BYTES \
            - activation_bytes(model, max_step_tokens(config, max_model_len), dtype_bytes)
    else:
        budget = CPU_KV_GIB * GIB
    fits = int(max(budget, 0) // block_bytes)
    return max(per_request, min(fits, config.max_num_seqs * per_request))


@torch.no_grad()
def init_dummy_weights_on_device(model: LlamaForCausalLM, seed: int) -> None:
    """The loader's dummy scheme (uniform ±1/sqrt(fan_in), unit norms) drawn by the device's own
    generator: an 8B model in well under a second instead of a minute of CPU sampling. Same seed,
    same weights on the same kind of device (not bit-equal to the CPU draw)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
            continue
        bound = p.shape[1] ** -0.5
        p.uniform_(-bound, bound, generator=gen)


HUGE_PAGE = 2 << 20


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeroed KV storage. On CPU an anonymous mapping: pages are mapped lazily, so a large cache only
    costs the memory that requests actually fill, and asked for as transparent huge pages where the
    kernel allows (Linux, THP `always` or `madvise`). Decode walks a sequence's blocks wherever they
    landed, one 4 KB page each; with 2 MB pages those walks stop missing the TLB. Attention over 32
    sequences x 8k tokens in scattered blocks, two threads, µs per layer: 5,114 -> 4,114 (blocks in
    order: 2,381 -> 2,342)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    if not hasattr(mmap, "MAP_ANONYMOUS"):  # no anonymous mappings (Windows): plain zeros
        return torch.zeros(shape, dtype=dtype)
    count = int(np.prod(shape))
    nbytes = count * torch.empty(0, dtype=dtype).element_size()
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zero-filled
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    offset = -start % HUGE_PAGE  # align to a huge page so every whole 2 MB of the cache can be one
    return torch.frombuffer(region, dtype=dtype, count=count, offset=offset).view(shape)


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int,
                 attention_backend: str | None = None) -> None:
        require_engine_family(model_config)  # a Mistral or Qwen config is the simulator's, not this Llama's
        self.config, self.model_config, self.max_model_len = config, model_config, max_model_len
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        choice = choose(attention_backend or config.attention, self.device, config.block_size, self.dtype)
        log.info(choice.note)
        self.attention, self.block_size = choice.backend, choice.block_size
        self.model = LlamaForCausalLM(model_config, self.dtype, self.device).eval()
        if self.device.type == "cuda" and model_config.path is None:
            init_dummy_weights_on_device(self.model, config.seed)
        else:
            load_weights(self.model, model_config, config.seed)
        self.weight_layout = "as loaded"
        # a CPU engine without its native library measures the slow path: run.json must say so
        fallback = native.fallback_warning() if self.device.type == "cpu" else None
        self.warnings: tuple[str, ...] = (fallback,) if fallback else ()
        if self.device.type == "cpu":
            gemm = cpu_weights.panel_gemm() if self.dtype == torch.float32 else None
            self.weight_layout = cpu_weights.pack_projections(self.model, gemm)
        self.row_ops = row_ops_for(self.device, self.dtype)
        self.cos, self.sin = rope_tables(model_config, max_model_len, self.dtype, self.device)
        self.backend = make_backend(choice.backend, self.device)
        dtype_bytes = torch.finfo(self.dtype).bits // 8
        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else None
        sizing = config
        if config.kv_blocks is not None and self.block_size != config.block_size:
            # flash resized the blocks: keep the token capacity that --kv-blocks asked for
            sizing = config.with_(kv_blocks=-(-config.kv_blocks * config.block_size // self.block_size))
        self.num_blocks = num_kv_blocks(sizing, model_config, max_model_len, dtype_bytes, self.block_size, free)
        # one block past the manager's range: where padded CUDA graph rows write
        self.scratch_block = self.num_blocks
        pool_tokens = (self.num_blocks + 1) * self.block_size
        if self._sized_past_default(sizing, max_model_len):
            room, said = kv_room(config, str(self.device), free, self.weight_bytes)
            check_kv_pool(config, max_model_len, pool_tokens, model_config.kv_bytes_per_token(dtype_bytes), room, said)
        shape = (self.num_blocks + 1, self.block_size, model_config.num_kv_heads, model_config.head_dim)
        try:
            self.kv_caches = [(_zeros(shape, self.dtype, self.device), _zeros(shape, self.dtype, self.device))
                              for _ in range(model_config.num_layers)]
        except (OSError, MemoryError, torch.cuda.OutOfMemoryError) as exc:  # room the check could not see
            raise pool_failed(config, max_model_len, pool_tokens * model_config.kv_bytes_per_token(dtype_bytes),
                              str(self.device), exc) from exc
        # CPU decode steps: the whole decoder stack in one native call (None: always the module path)
        self.native_decode = NativeDecodeForward.for_runner(self)
        # each logits row's greedy token when the last step computed it beside the head (the native step)
        self.last_greedy: torch.Tensor | None = None
        self.last_cuda_graph = False
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda" and config.cuda_graphs and getattr(self.backend, "graph_capable", False):
            self.graphs = self.build_decode_graphs(capture=True)
            log.info("cuda graphs: decode buckets %s", ",".join(map(str, self.graphs.buckets)))
        self.clock = WallClock()
        self.sampler = Sampler(config.seed)
        self._flatten = Flattener(self.block_size, self.device)

    def _sized_past_default(self, sizing: EngineConfig, max_model_len: int) -> bool:
        """Whether the pool is a size given by hand, or the default's floor of one full-length request (which a huge
        --block-size or --max-model-len decides), rather than the default's own share of memory (which fits)."""
        if sizing.kv_blocks is not None or sizing.kv_memory_gib is not None:
            return True
        at_floor = self.num_blocks <= -(-max_model_len // self.block_size)
        # a CPU pool is mapped lazily: the model's own context (llama-3.2-1b's 128k, an 8 GiB floor) runs short
        # requests on a laptop that could not hold a full-length one, so only a context asked for by hand, or a block
        # larger than the context (a --block-size past any use), is checked there
        by_hand = sizing.max_model_len is not None or self.block_size > max_model_len
        return at_floor and (self.device.type != "cpu" or by_hand)

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @property
    def info(self) -> RunnerInfo:
        return RunnerInfo(device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
                          attention=self.attention, block_size=self.block_size,
                          decode_kernel=getattr(self.backend, "decode_kernel", getattr(self.backend, "name", None)),
                          weight_layout=self.weight_layout, warnings=self.warnings)

    def run(self, output: SchedulerOutput, label: str = "step") -> StepRun:
        """Flatten the chunks into one row batch, run the model, sample the rows that yield a token."""
        t0 = time.perf_counter_ns()
        with nvtx_range("prepare"):
            batch = self._flatten(output)
        t1 = time.perf_counter_ns()
        # the forward's own NVTX range is `label` (step/<phase>)
        logits = self.execute(batch, label, step_tokens_note(output.num_prefill_tokens, output.num_decode_tokens))
        t2 = time.perf_counter_ns()
        with nvtx_range("sample"):
            tokens = self.sampler(logits, batch.sample_requests, self.last_greedy) if batch.sample_requests else []
        t3 = time.perf_counter_ns()
        sampled = {r.request_id: t for r, t in zip(batch.sample_requests, tokens, strict=True)}
        return StepRun(sampled, t1 - t0, t2 - t1, t3 - t2, self.last_cuda_graph)

    def build_decode_graphs(self, capture: bool) -> DecodeGraphs:
        """Fixed-buffer decode runner over this model; `capture=False` runs it eagerly (CPU tests)."""
        with torch.inference_mode():
            return DecodeGraphs(self._logits_all_rows, self.backend, graph_buckets(self.config.max_num_seqs),
                                -(-self.max_model_len // self.block_size), self.scratch_block,
                                self.block_size, self.device, capture=capture)

    def _logits_all_rows(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object) -> torch.Tensor:
        ctx = ForwardContext(self.cos[positions], self.sin[positions], self.kv_caches, self.backend, meta,
                             self.row_ops)
        return self.model.compute_logits(self.model(input_ids, ctx)).float()

    @torch.inference_mode()
    def execute(self, batch: FlatBatch, label: str = "step", note: str | None = None) -> torch.Tensor:
        """Run the batch; logits [len(logits_indices), vocab] for the rows that sample. On CUDA the
        step is an NVTX range `label` (e.g. `step/decode`) with `note` (token counts) as a mark."""
        self.last_greedy = None
        with nvtx_range(label, note):
            if self.graphs is not None and self.graphs.supports(batch):
                self.last_cuda_graph = True
                return self.graphs.run(batch)[batch.logits_indices]
            self.last_cuda_graph = False
            meta = self.backend.prepare(batch)
            if self.native_decode is not None and self.native_decode.supports(batch, meta):
                logits, self.last_greedy = self.native_decode.run(batch.input_ids, batch.positions, meta)
                return logits
            cos, sin = self.cos[batch.positions], self.sin[batch.positions]
            hidden = self.model(batch.input_ids, ForwardContext(cos, sin, self.kv_caches, self.backend, meta,
                                                                self.row_ops))
            return self.model.compute_logits(hidden[batch.logits_indices]).float()
