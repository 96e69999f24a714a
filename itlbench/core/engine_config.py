"""`EngineConfig`: the bundled engine's scheduler, cache and runner knobs (the ones a sweep varies).

Torch-free on purpose. Every field is also a command-line flag of the same name (`itlbench.cli.engine_options`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_type_hints

from itlbench.core.json_fields import fits, type_name
from itlbench.core.presets import CPU_DEFAULT_PRESET
from itlbench.errors import ConfigError
from itlbench.units import check_finite, parse_tokens

Policy = Literal["budget", "prefill-first"]
POLICIES: tuple[str, ...] = ("budget", "prefill-first")
EngineKind = Literal["torch", "sim"]
ENGINE_KINDS: tuple[str, ...] = ("torch", "sim")
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "sdpa", "flash", "triton")  # itlbench.engine.attention
_DEFAULT_KV_LINK_GBPS = 400.0
# keys are the engine flags' names, as `itlbench run` writes them to run.json's engine
_OBJECT_EXAMPLE = 'write a JSON object of engine flags, _ for -, like {"max_num_seqs": 64, "chunk_budget": 2048}'
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "bfloat16", "float16", "fp8")  # bytes: itlbench.sim.hardware.kv_dtype_bytes


def parse_chunk_budget(text: str | int | None) -> int | None:
    """`2048`, `2k` (= 2048: k is 1024 tokens everywhere), or `none`/`off`/`unchunked` for unchunked."""
    if text is None:
        return None
    if isinstance(text, str) and text.strip().lower() in ("none", "off", "unchunked", "inf"):
        return None
    return parse_tokens(text, "--chunk-budget", "give a token count such as 2048 or 8k (k = 1024), or none")


def parse_context_len(text: str | int | None) -> int | None:
    """`131072` or `128k` (k = 1024, as everywhere); `none`/`model` for the model's own context."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("none", "model")):
        return None
    return parse_tokens(text, "--max-model-len", "give a token count such as 8192 or 128k (k = 1024), or leave it "
                        "out for the model's")


def flag_of(field_name: str) -> str:
    """The flag a user types for a field (`chunk_budget` is `--chunk-budget`): errors and reproduced
    command lines name what the user can change."""
    return "--" + field_name.replace("_", "-")


def option(default: object, help: str, *, parse: Callable[[str], object] | None = None) -> Any:
    """A field that is also a command-line flag `--<field-name>`: `help` is its help text; `parse`
    reads the flag's text where the field's type is not one a CLI parses by itself."""
    return field(default=default, metadata={"help": help, "parse": parse})


@dataclass
class EngineConfig:
    """Scheduler, cache and runner knobs; the ones a sweep varies. Each field is the flag of the same name."""

    model: str = option(CPU_DEFAULT_PRESET, "Preset (cpu-small, llama-3.1-8b, …) or local Hugging Face directory "
                        "(default: llama-3.2-1b on CUDA, cpu-small on CPU, llama-3.1-8b with --engine sim).")
    chunk_budget: int | None = option(2048, "Tokens per engine step (2048, 8k; k = 1024), or 'none' (unchunked "
                                      "prefill).", parse=parse_chunk_budget)
    unchunked_prefill_cap: int = option(16_384, "Unchunked: more whole prompts join a step only up to this many "
                                        "tokens (16384, 16k).", parse=lambda text: parse_tokens(
                                            text, "--unchunked-prefill-cap"))
    policy: Policy = option("budget", "budget (vLLM V1 token budget) or prefill-first (SGLang).")
    mixed: bool = option(False, "prefill-first only: decodes ride in prefill steps.")
    max_num_seqs: int = option(64, "Cap on running sequences.")
    block_size: int = option(16, "Tokens per KV-cache block.")
    kv_blocks: int | None = option(None, "KV-cache blocks (default: sized from --kv-memory-gib).")
    kv_memory_gib: float | None = option(None, "KV-cache memory when --kv-blocks is not given (default: 4 GiB on "
                                         "CPU; on CUDA --gpu-memory-fraction of free memory; --engine sim: a "
                                         "GPU's, e.g. the room your runtime's log reports; default 90 % of it less "
                                         "the weights).")
    gpu_memory_fraction: float = option(0.9, "CUDA: share of free memory after the weights for KV and activations, "
                                        "when neither --kv-blocks nor --kv-memory-gib is given.")
    max_model_len: int | None = option(None, "Context limit in tokens (8192, 128k; k = 1024; default: the model's).",
                                       parse=parse_context_len)
    prefix_caching: bool = option(True, "Reuse KV blocks of identical prompt prefixes.")
    device: str = option("auto", "auto, cpu or cuda.")
    dtype: str = option("auto", "auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16, or, --engine sim only, "
                        "fp8 (weights and K/V at one byte unless --kv-cache-dtype says otherwise, the FP8 tensor rate) "
                        "or fp4 (NVFP4 on a B200: 4.5-bit weights, 16-bit embedding and LM head, an FP8 K/V cache, "
                        "the FP4 tensor rate).")
    kv_cache_dtype: str = option("auto", "--engine sim: the K/V cache's dtype: auto (the weights' dtype; fp8 under fp4), bfloat16, "
                                 "float16 or fp8 (e.g. --dtype fp8 --kv-cache-dtype bfloat16: FP8 weights beside a "
                                 "16-bit cache, vLLM's default for an FP8 checkpoint without K/V scales).")
    attention: str = option("auto", "Attention kernels: auto (flash, triton, then sdpa, whichever runs here), sdpa, "
                            "flash or triton.")
    cuda_graphs: bool = option(True, "CUDA: replay captured graphs for decode-only steps.")
    seed: int = option(0, "Seed for the engine's sampling (and, in `run`, the load's lengths, arrivals and prompts).")
    engine: EngineKind = option("torch", "torch (runs the model) or sim (the same scheduler, each step taking the "
                                "time the cost model prices: on a virtual clock in `run`, paced in real time in "
                                "`serve`; no weights, no torch).")
    gpu: str | None = option(None, "--engine sim: h100, h200, b200, a100, a100-pcie, l40s, rtx4090 (each also as "
                             "NAME-seeds, the source documents' arithmetic, and, where published, NAME-2025, vLLM's "
                             "2025 kernels), cpu, or a profile from `itlbench calibrate` (default h100).")
    tp: int = option(1, "--engine sim: tensor-parallel degree: weights, heads, K/V and FLOPs split over this many "
                     "GPUs, two all-reduces per layer over the profile's link.")
    sim_time_scale: float = option(1.0, "--engine sim: run this many times faster than the simulated GPU (every "
                                   "measured time shrinks by the same factor).")
    disaggregate: bool = option(False, "--engine sim: prefill and decode on separate GPUs, K/V sent over a link.")
    prefill_gpu: str | None = option(None, "--disaggregate: the prefill pool's GPU (default: --gpu).")
    kv_link_gbps: float = option(_DEFAULT_KV_LINK_GBPS, "--disaggregate: prefill → decode link, Gb/s.")
    engine_process: bool | None = option(None, "Run the engine core in its own process, apart from the HTTP front "
                                         "end (default: yes when served from the command line).")
    torch_threads: int | None = option(None, "Torch intra-op threads of the engine (default: the cores available "
                                       "to it, less one).")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_finite(self)
        if self.chunk_budget is not None and self.chunk_budget <= 0:
            raise ConfigError("chunk_budget", f"must be a positive token count or none, got {self.chunk_budget}",
                              "e.g. --chunk-budget 2048, or --chunk-budget none for unchunked prefill")
        if self.policy not in POLICIES:
            raise ConfigError("policy", f"unknown policy {self.policy!r}", f"use one of {', '.join(POLICIES)}")
        if self.mixed and self.policy != "prefill-first":
            raise ConfigError("mixed", "only applies to --policy prefill-first",
                              "the budget policy always mixes decodes into prefill steps")
        for name in ("max_num_seqs", "block_size", "unchunked_prefill_cap"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, f"must be > 0, got {getattr(self, name)}")
        if self.torch_threads is not None and self.torch_threads <= 0:
            raise ConfigError("torch_threads", f"must be > 0, got {self.torch_threads}",
                              "e.g. --torch-threads 1, or leave it out to use the cores available less one")
        if self.kv_blocks is not None and self.kv_blocks <= 0:
            raise ConfigError("kv_blocks", f"must be > 0, got {self.kv_blocks}",
                              "e.g. --kv-blocks 4096, or leave it out to size the cache from --kv-memory-gib")
        if self.kv_memory_gib is not None and self.kv_memory_gib <= 0:
            raise ConfigError("kv_memory_gib", f"must be > 0, got {self.kv_memory_gib}",
                              "e.g. --kv-memory-gib 4, or leave it out for the default")
        if not 0 < self.gpu_memory_fraction <= 1:
            raise ConfigError("gpu_memory_fraction", f"must be in (0, 1], got {self.gpu_memory_fraction}")
        if self.attention not in ATTENTION_BACKENDS:
            raise ConfigError("attention", f"unknown backend {self.attention!r}",
                              f"use one of {', '.join(ATTENTION_BACKENDS)}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ConfigError("max_model_len", f"must be > 0, got {self.max_model_len}",
                              "e.g. --max-model-len 8192, or leave it out for the model's")
        if self.max_model_len is not None and self.max_model_len < self.block_size:  # the context holds no block
            raise ConfigError("max_model_len", f"{self.max_model_len:,} tokens is less than one K/V block of "
                              f"{self.block_size:,} (--block-size)",
                              f"use --max-model-len {self.block_size} or more, or a smaller --block-size")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError("device", f"unknown device {self.device!r}", "use auto, cpu or cuda")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "fp8", "fp4"):
            raise ConfigError("dtype", f"unknown dtype {self.dtype!r}", "use auto, float32, bfloat16, float16, fp8 or fp4")
        self._validate_sim()

    def _validate_sim(self) -> None:
        if self.engine not in ENGINE_KINDS:
            raise ConfigError("engine", f"unknown engine {self.engine!r}", f"use one of {', '.join(ENGINE_KINDS)}")
        if self.engine != "sim" and self.gpu is not None:
            raise ConfigError("gpu", "only applies to the simulated engine", "add --engine sim")
        if self.dtype in ("fp8", "fp4") and self.engine != "sim":
            raise ConfigError("dtype", f"{self.dtype} is simulated only", "add --engine sim, or use bfloat16")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError("kv_cache_dtype", f"unknown dtype {self.kv_cache_dtype!r}",
                              f"use one of {', '.join(KV_CACHE_DTYPES)}")
        if self.kv_cache_dtype != "auto" and self.engine != "sim":
            raise ConfigError("kv_cache_dtype", "only applies to the simulated engine (the torch engine keeps its "
                              "K/V in --dtype)", "add --engine sim, or leave --kv-cache-dtype auto")
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise ConfigError("tp", f"must be a whole number >= 1, got {self.tp!r}", "e.g. --tp 2")
        if self.tp > 1 and self.engine != "sim":
            raise ConfigError("tp", "tensor parallelism is simulated only", "add --engine sim, or use --tp 1")
        if not self.sim_time_scale > 0:
            raise ConfigError("sim_time_scale", f"must be > 0, got {self.sim_time_scale}",
                              "e.g. 4 runs the simulation four times faster than the simulated GPU")
        if self.disaggregate and self.engine != "sim":
            raise ConfigError("disaggregate", "only applies to the simulated engine", "add --engine sim")
        if self.prefill_gpu is not None and not self.disaggregate:
            raise ConfigError("prefill_gpu", "only applies to disaggregated pools", "add --disaggregate")
        if not self.kv_link_gbps > 0:
            raise ConfigError("kv_link_gbps", f"must be > 0, got {self.kv_link_gbps}",
                              f"e.g. --kv-link-gbps {_DEFAULT_KV_LINK_GBPS:g}, the default")
        self._refuse_unused()

    def _refuse_unused(self) -> None:
        """A flag set away from its default that this engine would ignore is refused, not recorded as if it
        had shaped the run (as --prefill-gpu without --disaggregate)."""
        if self.kv_link_gbps != _DEFAULT_KV_LINK_GBPS and not self.disaggregate:
            raise ConfigError("kv_link_gbps", "only applies to disaggregated pools", "add --disaggregate or drop it")
        if self.sim_time_scale != 1 and self.engine != "sim":
            raise ConfigError("sim_time_scale", "only applies to the simulated engine", "add --engine sim or drop it")

    def with_(self, **changes: object) -> EngineConfig:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        """The whole configuration, so a child process runs exactly the engine the parent records."""
        return json.dumps(self.as_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> EngineConfig:
        """Inverse of `to_json`; unknown keys are an error (a silently dropped setting is a lost one)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("--engine-config", f"not valid JSON: {exc}", _OBJECT_EXAMPLE) from None
        if not isinstance(raw, dict):
            raise ConfigError("--engine-config", "is not a JSON object", _OBJECT_EXAMPLE)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError("--engine-config", f"unknown field(s) {', '.join(unknown)}",
                              f"known: {', '.join(sorted(known))}")
        hints = get_type_hints(cls)
        for name, value in raw.items():
            if not fits(value, hints[name]):
                raise ConfigError("--engine-config", f"field {name} is {json.dumps(value)}",
                                  f"give {type_name(hints[name])}")
        return cls(**raw)
