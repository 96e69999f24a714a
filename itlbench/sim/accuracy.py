"""How close each preset comes to published measurements: the error bar beside a simulated figure.

A capacity planner reading `--engine sim --gpu h100 --tp 8` wants to know how far to trust it on eight
H100s, not the MAPE over every GPU. The figures held out of the fit (`sim/published.py`), grouped by the
preset they test and its number format (16-bit, FP8, FP4), and within that by the degree of tensor
parallelism they ran at, answer that; a GPU, format or degree no published figure covers says so
instead of borrowing another's error. Computing them takes seconds (every engine run of the published tables
is simulated), which every simulated run would pay at its start; so the errors are stored in the cache
directory (`system/cache.py`) under a hash of the package's own files, and any change to a term, a parameter
or a figure makes a new hash: a stored error bar cannot go stale.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from itlbench.sim.hardware import GPUS, HALF_DTYPES, KERNELS, SEEDS, Hardware, load_hardware
from itlbench.sim.memory import fixed_reserve_gib
from itlbench.sim.profile import QUANTIZED
from itlbench.sim.published import FIGURES, Figure, default_params, errors
from itlbench.system.cache import CacheDirError, private_cache_dir, untrusted

OVER = 0.15  # issue 29's bound on every figure
# Below this share of a GPU's memory for K/V, the runtime's reserve (sim/memory.py) decides the batch: TensorRT-LLM's
# 70B on one H100 (9 % once it is kept) came out 33-38 % fast without it, every deployment with 31 % or more was within
# 18 % (docs/perf/sim-vs-published-log.md). The simulated engine keeps none, so a run this tight is warned.
TIGHT_KV_SHARE = 0.25


def number_format(dtype: str) -> str:
    """'fp8', '16-bit' (bf16 and fp16 run at one tensor rate, so their figures test the same terms), or
    the dtype itself (a measured CPU's float32)."""
    return "16-bit" if dtype in HALF_DTYPES else dtype


@dataclass(frozen=True)
class Accuracy:
    """Absolute relative errors of a set of figures, summarised."""

    figures: int
    mape: float
    median: float
    worst: float
    bias: float  # mean signed error: > 0 when the simulator is slower than measured
    over: int  # figures more than 15 % off

    @classmethod
    def of(cls, signed_errors: Sequence[float]) -> Accuracy:
        e = np.asarray(signed_errors, dtype=float)
        if not e.size:
            raise ValueError("no figures to summarise")
        a = np.abs(e)
        return cls(int(a.size), float(a.mean()), float(np.median(a)), float(a.max()), float(e.mean()),
                   int((a > OVER).sum()))

    def to_dict(self) -> dict[str, float | int]:
        return {"figures": self.figures, "mape": self.mape, "median_ape": self.median, "worst_ape": self.worst,
                "mean_error": self.bias, "over_15_percent": self.over}

    def line(self) -> str:
        return (f"{self.figures} figures: MAPE {self.mape:.1%}, median {self.median:.1%}, worst {self.worst:.1%}, "
                f"{self.over} over 15 %, mean {self.bias:+.1%}")


@lru_cache(maxsize=1)
def _held_out_errors() -> list[tuple[Figure, float]]:
    """Each held-out figure and its signed error with the stored parameters: read from the cache directory when
    this very code computed them before, else predicted (seconds) and stored for the next process."""
    held = [fig for fig in FIGURES if not fig.fit]
    key = source_key()
    stored = _read_stored(key, held)
    if stored is None:
        stored = [err for _, _, err in errors(default_params(), held)]
        if not _changed_since_loaded():
            _store(key, held, stored)
    return list(zip(held, stored, strict=True))


_PACKAGE = Path(__file__).resolve().parents[1]  # the itlbench package
# When this process loaded the simulator: the key hashes the files on disk, the errors come from the code in memory
_LOADED_AT = time.time()


def _source_files() -> list[Path]:
    return sorted(p for p in _PACKAGE.rglob("*") if p.suffix in (".py", ".json", ".csv") and p.is_file())


@lru_cache(maxsize=1)
def source_key() -> str:
    """A hash of every source and data file of the package: what the simulator's predictions are made of."""
    digest = hashlib.sha256()
    for path in _source_files():
        digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _changed_since_loaded() -> bool:
    """Whether a package file was written after this process loaded the simulator: its errors were then computed
    by code the files (and so the key) no longer hold, and storing them would hand the next process stale ones."""
    return any(path.stat().st_mtime > _LOADED_AT for path in _source_files())


KEPT_VERSIONS = 4  # stored error files of other code (another checkout, an older install) kept beside this one's


def _stored_path(key: str) -> Path | None:
    with contextlib.suppress(CacheDirError):
        return private_cache_dir("sim") / f"held-out-errors-{key[:16]}.json"
    return None


def _read_stored(key: str, held: list[Figure]) -> list[float] | None:
    """The stored errors when they are this user's, of this code and of these figures; else None."""
    path = _stored_path(key)
    if path is None or not path.exists() or untrusted(path) is not None:
        return None
    try:
        doc = json.loads(path.read_text())
        ok = doc["key"] == key and doc["figures"] == [f.key for f in held] and len(doc["errors"]) == len(held)
        return [float(e) for e in doc["errors"]] if ok else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(key: str, held: list[Figure], errs: list[float]) -> None:
    """Write atomically (a concurrent reader sees the old file or the new, never half of one); a cache that
    cannot be written only costs the next process the seconds again."""
    path = _stored_path(key)
    if path is None:
        return
    doc = {"key": key, "figures": [f.key for f in held], "errors": errs}
    others = sorted(path.parent.glob("held-out-errors-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [p for p in others if p != path][KEPT_VERSIONS - 1:]:
        with contextlib.suppress(OSError):
            old.unlink()
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@lru_cache(maxsize=1)
def _held_out() -> dict[tuple[str, str, int], list[float]]:
    """(preset, number format, tp) -> the held-out figures' signed errors with the stored parameters."""
    groups: dict[tuple[str, str, int], list[float]] = {}
    for fig, err in _held_out_errors():
        groups.setdefault((fig.gpu, number_format(fig.dtype), fig.tp), []).append(err)
    return groups


@lru_cache(maxsize=1)
def held_out_by_preset() -> dict[tuple[str, str], Accuracy]:
    """(preset, number format) -> the held-out figures' accuracy, every degree of TP together."""
    merged: dict[tuple[str, str], list[float]] = {}
    for (gpu, fmt, _), errs in sorted(_held_out().items()):
        merged.setdefault((gpu, fmt), []).extend(errs)
    return {key: Accuracy.of(errs) for key, errs in sorted(merged.items())}


@lru_cache(maxsize=1)
def held_out_by_tp() -> dict[tuple[str, str, int], Accuracy]:
    """(preset, number format, tp) -> the held-out figures' accuracy at that degree of TP."""
    return {key: Accuracy.of(errs) for key, errs in sorted(_held_out().items())}


@lru_cache(maxsize=1)
def held_out_tight() -> Accuracy | None:
    """The held-out engine runs whose K/V had under TIGHT_KV_SHARE of the GPU's memory, every preset together
    (the reserve a runtime keeps is not the GPU's); None where there are none."""
    errs = [err for fig, err in _held_out_errors() if fig.kv_share is not None and fig.kv_share < TIGHT_KV_SHARE]
    return Accuracy.of(errs) if errs else None


def preset_accuracy(hw: Hardware, tp: int | None = None) -> Accuracy | None:
    """The held-out accuracy of `hw`'s preset in its number format (at `tp` GPUs when given); None for a
    profile that is not a stored preset as fitted (a calibrated or edited JSON, a `-seeds` profile) or
    where no figure covers it."""
    preset = GPUS.get(hw.name)
    if preset is None or hw.with_(dtype=preset.dtype) != preset:
        return None
    fmt = number_format(hw.dtype)
    return held_out_by_preset().get((hw.name, fmt)) if tp is None else held_out_by_tp().get((hw.name, fmt, tp))


def check_doc(hw: Hardware, tp: int = 1, kv_share: float | None = None) -> dict[str, Any]:
    """`preset_accuracy` as the JSON a run or `roofline --json` carries: `held_out` over every degree of TP,
    `at_tp` over the figures at `tp` GPUs; None where no figure checks `hw` (at that degree). Given the run's
    `kv_share` (its K/V room as a share of one GPU's memory), a tight one adds `tight` (the published runs as tight,
    whatever their GPU, predicted with the runtime's reserve) and `reserve_gib` (that reserve's fixed part a GPU,
    which the simulated engine does not keep); where the weights alone overflow a GPU (`kv_share` 0), `fits` False
    instead."""
    acc, at_tp = preset_accuracy(hw), preset_accuracy(hw, tp)
    doc = {"gpu": hw.name, "label": hw.label, "format": number_format(hw.dtype), "tp": tp,
           "held_out": None if acc is None else acc.to_dict(), "at_tp": None if at_tp is None else at_tp.to_dict()}
    if kv_share is not None and kv_share <= 0:  # nothing to be tight about: the weights alone overflow
        doc.update(kv_share=0.0, tight=None, fits=False)
    elif kv_share is not None:
        tight = held_out_tight() if kv_share < TIGHT_KV_SHARE else None
        doc.update(kv_share=kv_share, tight=None if tight is None else tight.to_dict())
        if tight is not None:
            doc.update(reserve_gib=fixed_reserve_gib(tp), memory_gib=hw.memory_bytes / 2**30)
    return doc


def config_check(gpu: str, dtype: str, tp: int = 1, kv_share: float | None = None) -> dict[str, Any] | None:
    """`check_doc` for the profile a served simulated engine loads (`--gpu`, `--dtype`, `--tp`); None for the
    'cpu' profile, which would measure this machine again and is no preset anyway."""
    if gpu.strip().lower() == "cpu":
        return None
    return check_doc(load_hardware(gpu).for_dtype(dtype), tp, kv_share)


def check_is_loose(check: dict[str, Any]) -> bool:
    """Whether a reader should be warned: no published figure checks the profile (at the run's degree of TP,
    where the check has one), those figures are off by more than 15 % on average, or the run's K/V room is so tight
    that the reserve a runtime keeps, and the simulated engine does not, decides its batch."""
    acc = check.get("at_tp") if "tp" in check else check.get("held_out")
    return not acc or acc["mape"] > OVER or check.get("tight") is not None


def profile_hint(name: str) -> str:
    """Which sibling profile to take instead, where the GPU has one. The fitted preset's kernels are the published
    engines' (mostly TensorRT-LLM's), whose attention is slower at long prompts than vLLM's 2025 kernels; its `-2025`
    sibling runs vLLM's, checked on NVIDIA's kernel tables and vLLM's decode-only latency tests, not on vLLM runs with
    long prompts (on TensorRT-LLM's own runs the preset is the closer, docs/perf/sim-vs-published-log.md). A `-seeds`
    profile only reproduces the source documents."""
    if name in KERNELS:
        return (f"its kernels are vLLM's as NVIDIA measured them in 2025 (kernel tables); --gpu "
                f"{name.removesuffix('-2025')} is the preset published runs check")
    if name in SEEDS:
        return (f"the source documents' illustrative efficiencies, kept to reproduce their tables; --gpu "
                f"{name.removesuffix('-seeds')} is the preset published runs check")
    if f"{name}-2025" in KERNELS:
        return (f"its kernels are fitted to published engine runs (mostly TensorRT-LLM's; attention at most "
                f"{GPUS[name].attn_eff:.0%} of peak); to model vLLM's 2025 kernels, which prefill long prompts faster, "
                f"take --gpu {name}-2025")
    return ""


def check_line(check: dict[str, Any]) -> str:
    """One sentence a person reads beside a simulated figure: how far to trust it on this GPU, and at the
    run's degree of tensor parallelism (a check written before degrees were told apart has no `tp`)."""
    acc, what = check.get("held_out"), f"{check.get('label')} in {check.get('format')}"
    if not acc:
        hint = profile_hint(str(check.get("gpu", "")))
        return (f"{what}: no published figure checks this profile, so its times are unvalidated"
                f"{'; ' + hint if hint else ''} (the presets' errors: docs/perf/sim-vs-published.md)")
    line = (f"{what}: MAPE {acc['mape']:.1%}, median {acc['median_ape']:.1%}, worst {acc['worst_ape']:.1%} against "
            f"{acc['figures']} published figures held out of the simulator's fit")
    if "tp" in check:
        at = check.get("at_tp")
        line += (f"; at TP {check['tp']}: MAPE {at['mape']:.1%}, worst {at['worst_ape']:.1%} ({at['figures']} figures)"
                 if at else f"; none at TP {check['tp']}, so that degree is unvalidated")
    if hint := profile_hint(str(check.get("gpu", ""))):
        line += f"; {hint}"
    if check.get("fits") is False:
        fix = "more --tp" if check.get("format") in QUANTIZED else "more --tp, or --dtype fp8"
        line += f"; its weights alone overflow each GPU's memory at this degree, so no run is possible (take {fix})"
    if (tight := check.get("tight")) is not None:
        line += f"; K/V room only {check['kv_share']:.0%} of each GPU's memory"
        runs = (f"published runs with under {TIGHT_KV_SHARE:.0%} were off by MAPE {tight['mape']:.1%}, worst "
                f"{tight['worst_ape']:.1%} ({tight['figures']} figures)")
        if "reserve_gib" in check:
            room = check["kv_share"] * check["memory_gib"]
            line += (f" ({room:.1f} GiB): a runtime keeps about {check['reserve_gib']:.1f} GiB of that back, which "
                     f"this simulated engine does not, so its batches can be larger than a real one's (a run takes the "
                     f"room your runtime reports with --kv-memory-gib); {runs} "
                     "once that reserve was charged")
        else:  # recorded before the reserve was known
            line += f": {runs}, as the room a real runtime keeps back decides their batch"
    return line + " (docs/perf/sim-vs-published.md)"
