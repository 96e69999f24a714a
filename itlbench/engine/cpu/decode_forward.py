"""The decoder stack of a CPU decode step in one native call (`attention/decode_forward.c`).

The module path (llama.py) calls a dozen operators per layer from Python; on a 2-core CPU at
cpu-small's size the interpreter and ctypes cost between them was ~0.7 ms of a 5.4 ms batch-32 step.
This path runs the same C operators in the same order, embedding lookup and LM head included, so its
logits equal the module path's bit for bit; beside them it returns each row's greedy token.

It takes a step only where every operator it would call is the one the module path calls: a CPU
fp32 model whose projections are all packed in panels, the native row operators and decode kernel,
and a step of decode rows only (all chunks one token), at most MAX_ROWS of them. Everything
else (prefill, mixed steps, other devices and dtypes) runs the module path.
"""

from __future__ import annotations

import ctypes

import torch

from itlbench.engine.batch import FlatBatch
from itlbench.engine.cpu.native import grown
from itlbench.engine.cpu.weights import PACKED, PanelGemm

MAX_ROWS = 256  # decode rows per native step: its workspace holds this many

_LAYER_FIELDS = ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down", "k_cache", "v_cache")


class _Layer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in _LAYER_FIELDS]


class _Shape(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_int64) for name in
                  ("layers", "d", "heads", "kv_heads", "head_dim", "inter", "block_size")),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float)]


class _Model(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_void_p) for name in ("embed", "cos", "sin", "final_norm", "lm_head")),
                ("vocab", ctypes.c_int64)]


class _Step(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int64),
                *((name, ctypes.c_void_p) for name in ("ids", "positions", "rows", "slots", "tables", "lens")),
                ("table_stride", ctypes.c_int64), ("logits", ctypes.c_void_p), ("greedy", ctypes.c_void_p)]


class NativeDecodeForward:
    """Built once per runner over its model and caches (their storage never moves after load)."""

    def __init__(self, lib: ctypes.CDLL, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 rope: tuple[torch.Tensor, torch.Tensor], block_size: int, threads: bool) -> None:
        cfg = model.config
        cos, sin = (t.contiguous() for t in rope)
        self._keep = (model, kv_caches, cos, sin)  # the pointers below are into these
        self._layers = (_Layer * cfg.num_layers)(*[
            _Layer(layer.input_layernorm.weight.data_ptr(), _panels(layer.self_attn.qkv_proj),
                   _panels(layer.self_attn.o_proj), layer.post_attention_layernorm.weight.data_ptr(),
                   _panels(layer.mlp.gate_up_proj), _panels(layer.mlp.down_proj), k.data_ptr(), v.data_ptr())
            for layer, (k, v) in zip(model.layers, kv_caches, strict=True)])
        self._shape = _Shape(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size, block_size, cfg.rms_norm_eps, cfg.head_dim ** -0.5)
        head = model.embed_tokens if model.lm_head is None else model.lm_head
        self._model = _Model(model.embed_tokens.data_ptr(), cos.data_ptr(), sin.data_ptr(), model.norm.weight.data_ptr(),
                             _panels(head), head.shape[0])
        self._vocab = head.shape[0]
        self._group = cfg.num_heads // cfg.num_kv_heads
        p, i = ctypes.c_void_p, ctypes.c_int64
        self._fn = lib.itl_decode_forward_f32
        self._fn.argtypes = [p, p, p, p, p, p, i, i]
        self._fn.restype = ctypes.c_int
        workspace = lib.itl_decode_workspace
        workspace.argtypes, workspace.restype = [p, i], i
        self._work_per_row = int(workspace(ctypes.byref(self._shape), 1))
        self._work = torch.empty(0)
        self._scratch = torch.empty(0)
        self._threads = threads

    @classmethod
    def for_runner(cls, runner: object) -> NativeDecodeForward | None:
        """The native step for this runner's model, or None where any operator would differ."""
        backend = getattr(runner, "backend", None)
        kernel = getattr(backend, "kernel", None)
        row_ops = getattr(runner, "row_ops", None)
        if (runner.device.type != "cpu" or runner.dtype != torch.float32 or kernel is None
                or getattr(row_ops, "name", None) != "native" or runner.weight_layout != "panels"
                or not all(k.is_contiguous() and v.is_contiguous() for k, v in runner.kv_caches)):
            return None
        return cls(kernel.lib, runner.model, runner.kv_caches, (runner.cos, runner.sin), runner.block_size,
                   kernel.openmp)

    @staticmethod
    def supports(batch: FlatBatch, meta: object) -> bool:
        """A step of decode rows only, each its own request and each sampling, and few enough for the
        workspace."""
        return (batch.num_tokens == batch.num_reqs == batch.logits_indices.shape[0] <= MAX_ROWS
                and getattr(meta, "native", None) is not None and not meta.fresh and not meta.extend)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's logits [n, vocab] and greedy token [n] (int64) for the step's token ids and
        positions (int64, contiguous; ids inside the vocabulary, as the engine checks on admission)."""
        n, native = input_ids.shape[0], meta.native
        threads = torch.get_num_threads() if self._threads else 1
        per_thread = self._group * native.max_len
        self._scratch = grown(self._scratch, threads * per_thread)
        if self._work.numel() < n * self._work_per_row:
            self._work = torch.empty(MAX_ROWS * self._work_per_row)
        logits, greedy = torch.empty(n, self._vocab), torch.empty(n, dtype=torch.int64)
        tables = native.tables
        step = _Step(n, input_ids.data_ptr(), positions.data_ptr(), native.rows.data_ptr(),
                     meta.slot_mapping.data_ptr(), tables.data_ptr(), native.lens.data_ptr(), tables.stride(0),
                     logits.data_ptr(), greedy.data_ptr())
        rc = self._fn(ctypes.byref(self._layers), ctypes.byref(self._shape), ctypes.byref(self._model),
                      ctypes.byref(step), self._work.data_ptr(), self._scratch.data_ptr(), per_thread, threads)
        if rc != 0:
            raise ValueError(f"decode scratch of {per_thread} floats is too small")
        return logits, greedy


def _panels(weight: torch.Tensor) -> int:
    packed = getattr(weight, PACKED)
    if not isinstance(packed.multiply, PanelGemm):
        raise ValueError("every projection must be packed in panels")
    return packed.tensor.data_ptr()
