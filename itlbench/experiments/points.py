"""The settings a sweep runs: the product of its axes (budgets, policies, load, the user's own `--set`s).

A point is one value per axis. It knows three renderings of itself: its directory name (`b256-r2`),
its label in a comparison (`budget 256, rate 2`), and what it changes: `itlbench run` flags for the
bundled engine and the load, or `{placeholder}` values for a `--serve` command template.

Values go into commands as typed, but they are told apart by what they mean: `8k` and `8192` are one
budget, `1` and `1.0` one rate, so listing both is refused (the sweep would measure one point twice).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from itlbench.core.engine_config import parse_chunk_budget
from itlbench.errors import ConfigError

POLICIES = ("budget", "prefill-first")
BOTH_POLICIES = "both"  # --policy both: every policy
SERVED_UNCHUNKED = "-1"  # SGLang's --chunked-prefill-size -1: chunking off; only a --serve template takes it
ENGINE_AXES = ("chunk_budget", "policy", "max_num_seqs")  # the server's settings
LOAD_AXES = ("rate", "streams")  # the client's: always `itlbench run` flags
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class Axis:
    """One swept setting and its values as typed (text: they go into a command line or a template)."""

    name: str
    values: tuple[str, ...]
    user: bool = False  # a `--set name=...` of the user's own: only a template knows what it means

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Point:
    """One value per axis, in axis order."""

    values: tuple[tuple[Axis, str], ...] = field(default_factory=tuple)

    def value(self, name: str) -> str | None:
        return next((v for a, v in self.values if a.name == name), None)

    def _ordered(self) -> list[tuple[Axis, str]]:
        """The policy right after the budget (`b256-prefill-first`), whatever the axis order."""
        rest = [(a, v) for a, v in self.values if a.name != "policy"]
        pol = [(a, v) for a, v in self.values if a.name == "policy"]
        at = next((i + 1 for i, (a, _) in enumerate(rest) if a.name == "chunk_budget"), 0)
        return rest[:at] + pol + rest[at:]

    @property
    def dirname(self) -> str:
        parts = []
        for axis, v in self._ordered():
            if axis.name == "chunk_budget":
                parts.append("unchunked" if is_unchunked(v) else f"b{v}")
            elif axis.name == "policy":
                if v != "budget":
                    parts.append(v)
            elif axis.name == "rate":
                parts.append(f"r{v}")
            elif axis.name == "streams":
                parts.append(f"s{v}")
            elif axis.name == "max_num_seqs":
                parts.append(f"seqs{v}")
            else:
                parts.append(f"{axis.name}-{re.sub(r'[^0-9A-Za-z.]+', '_', v)}")
        return "-".join(parts) or "point"

    @property
    def label(self) -> str:
        parts = []
        for axis, v in self._ordered():
            if axis.name == "chunk_budget":
                parts.append("unchunked" if is_unchunked(v) else f"budget {v}")
            elif axis.name == "policy":
                if v != "budget":
                    parts.append(v)
            elif axis.name in LOAD_AXES:
                parts.append(f"{axis.name} {v}")
            else:
                parts.append(f"{axis.name}={v}")
        return ", ".join(parts) or "default"

    def run_args(self, served: bool) -> list[str]:
        """`itlbench run` flags: the load always; engine settings only when the bundled engine runs in-process
        (a served point's engine settings are in its command)."""
        out: list[str] = []
        for axis, v in self.values:
            if axis.name in LOAD_AXES or (not served and not axis.user):
                out += [axis.flag, v]
        return out

    def placeholders(self) -> dict[str, str]:
        return {a.name: v for a, v in self.values}

    def as_dict(self) -> dict[str, str]:
        return self.placeholders()


def is_unchunked(value: str) -> bool:
    """Whether a budget as typed turns chunking off: `none` (itlbench's spelling) or `-1` (SGLang's, --serve)."""
    return value.strip() == SERVED_UNCHUNKED or parse_chunk_budget(value) is None


def budget_tokens(value: str, served: bool) -> int | None:
    """A budget's token count (None: unchunked). `-1` only reaches a --serve command, which takes it as typed;
    the bundled engine has its own word for it, so there it is refused rather than guessed."""
    if value.strip() == SERVED_UNCHUNKED:
        if not served:
            raise ConfigError("--chunk-budget", "-1 turns chunking off only in a --serve command (SGLang's "
                              "--chunked-prefill-size -1)", "the bundled engine spells it none")
        return None
    return parse_chunk_budget(value)


def _split(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def refuse_duplicates(flag: str, values: Sequence[str], meaning: Callable[[str], object], what: str,
                      fix: str = "list each value once") -> None:
    """Two values that mean the same (`8k` and `8192`) would run one point twice under two names: refused."""
    seen: dict[object, str] = {}
    for v in values:
        key = meaning(v)
        if key in seen:
            same = f"{seen[key]!r} and {v!r} are the same {what}" if seen[key] != v else f"{v!r} is listed twice"
            raise ConfigError(flag, same, fix)
        seen[key] = v


def _numbers(name: str, text: str, kind: type) -> tuple[str, ...]:
    flag = "--" + name.replace("_", "-")
    values = _split(text)
    if not values:
        raise ConfigError(flag, "no value given", f"e.g. {flag} 1,2,4")
    for v in values:
        try:
            ok = 0 < kind(v) < math.inf  # inf was taken: every run then refused it, the sweep went on
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(flag, f"{v!r} is not a positive {'integer' if kind is int else 'number'}",
                              f"e.g. {flag} {'8,16,32' if kind is int else '1,2,4'}")
        if name == "streams":
            from itlbench.workloads.build import check_load_shape  # loaded only where streams are swept

            check_load_shape(int(v), None, 1.0, 1.0)  # a run's own limit, refused before any point runs
    refuse_duplicates(flag, values, kind, name.replace("_", " "))
    return tuple(values)


def parse_user_sets(sets: list[str]) -> list[Axis]:
    """`--set name=v1,v2` (repeatable) → user axes; the names become `{name}` in the template."""
    axes = []
    for item in sets:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name) or not _split(values):
            raise ConfigError("--set", f"{item!r} is not name=v1,v2", "e.g. --set max_model_len=4096,8192")
        if name in ENGINE_AXES or name in LOAD_AXES or name == "port":
            raise ConfigError("--set", f"{name!r} has its own flag", f"use --{name.replace('_', '-')} instead")
        refuse_duplicates("--set", _split(values), str, f"{name} (the template gets the text as typed)")
        axes.append(Axis(name, tuple(_split(values)), user=True))
    return axes


def parse_budgets(text: str, served: bool) -> tuple[str, ...]:
    """`--chunk-budget` values as typed, each checked (and told apart) by its token count."""
    budgets = _split(text)
    if not budgets:
        raise ConfigError("--chunk-budget", "no budget given", "e.g. --chunk-budget 256,512,2048,8192,none")
    refuse_duplicates("--chunk-budget", budgets, lambda b: budget_tokens(b, served), "budget")
    return tuple(budgets)


def parse_policies(text: str) -> list[str]:
    """`--policy` names; `both` is every policy (the help and the error offer it)."""
    names = [n for p in _split(text) for n in (POLICIES if p == BOTH_POLICIES else (p,))] or ["budget"]
    for p in names:
        if p not in POLICIES:
            raise ConfigError("--policy", f"unknown policy {p!r}", "use budget, prefill-first or both, "
                              "comma-separated")
    both = BOTH_POLICIES in _split(text)
    refuse_duplicates("--policy", names, str, "policy",
                      f"{BOTH_POLICIES} already means {','.join(POLICIES)}" if both else "list each value once")
    return names


def parse_axes(chunk_budgets: str | None, policies: str | None, max_num_seqs: str | None = None,
               rates: str | None = None, streams: str | None = None, sets: list[str] | None = None,
               served: bool = False) -> list[Axis]:
    """The sweep's axes, in the order they vary slowest to fastest (bad values name their flag);
    `served`: the values go into a --serve template (where `-1` may mean unchunked)."""
    axes: list[Axis] = []
    if chunk_budgets is not None:
        axes.append(Axis("chunk_budget", parse_budgets(chunk_budgets, served)))
    if policies is not None:
        names = parse_policies(policies)
        if names != ["budget"]:
            axes.insert(0, Axis("policy", tuple(names)))
    if max_num_seqs is not None:
        axes.append(Axis("max_num_seqs", _numbers("max_num_seqs", max_num_seqs, int)))
    if streams is not None:
        axes.append(Axis("streams", _numbers("streams", streams, int)))
    if rates is not None:
        axes.append(Axis("rate", _numbers("rate", rates, float)))
    axes += parse_user_sets(sets or [])
    return axes


def grid(axes: list[Axis]) -> list[Point]:
    """Every combination, first axis slowest; refuses two points that would share a directory."""
    points = [Point(tuple(zip(axes, combo, strict=True))) for combo in itertools.product(*(a.values for a in axes))]
    names = [p.dirname for p in points]
    if len(set(names)) < len(names):
        dup = next(a for a in axes if len(set(a.values)) < len(a.values)) if any(
            len(set(a.values)) < len(a.values) for a in axes) else axes[0]
        raise ConfigError(dup.flag if not dup.user else "--set", "a value is listed twice", "list each value once")
    return points or [Point()]
