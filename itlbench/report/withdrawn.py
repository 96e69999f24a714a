"""Which of a run's figures its validity verdict withdrew, and why, for every place a report states one.

`summary.json` holds the verdict as `validity.affected` (figure keys: `ttft_s`, `ttft_s.le128`,
`ttft_by_class_s.injected`, `itl_s`, `itl_s.max`, `itl_all_s`, `tpot_s`, `stalls`, `goodput`,
`throughput`, …) and `validity.reasons` (sentences). The report, its Markdown twin and the terminal
mark each withdrawn figure where it is stated, naming the reason in a few words; the banner keeps
the full sentences. A reason is tied to the figures it bends by the check that wrote it
(analysis/validity.py, analysis/disturbance.py); one this module does not know is named for every
withdrawn figure, so no mark goes without a why.

The ITL views (`itl_s`, `itl_all_s`, `itl_per_token_s`, `tpot_s`) are one family: they are read from
the same chunk stamps, so a verdict that withdraws `itl_s` withdraws them all. TTFT by bucket and by
class (`ttft_s`, `ttft_by_class_s`) are one family too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

FAMILY = {"itl_s": "itl", "itl_all_s": "itl", "itl_per_token_s": "itl", "tpot_s": "itl",
          "ttft_s": "ttft", "ttft_by_class_s": "ttft"}

# (pattern of the reason's sentence, its reason in a few words, the figures it bends): the checks'
# own wording, most specific first. "{0}" in the words is the pattern's first group.
RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (r"^TTFT (\S+): .*sent late", "the client sent {0} requests late", ("ttft_s.{0}", "goodput")),
    (r"^client event-loop lag", "the client's event loop ran late, so chunk stamps are late", ("itl_s", "goodput")),
    (r"^client CPU mean .*kernel receive stamps still hold", "the client's CPU saturated, so it sent late",
     ("ttft_s", "goodput")),
    (r"^client CPU mean", "the client's CPU saturated, so its stamps are late",
     ("ttft_s", "itl_s", "stalls", "goodput")),
    (r"kernel-stamped gaps touch a chunk read together", "the client read chunks late",
     ("itl_s", "stalls", "goodput")),
    (r"stall gaps are the client's own pauses", "the client's own pauses stalled streams", ("stalls", "itl_s.max")),
    (r"^tokens arrived together", "tokens arrived together (buffered), so no gap is measurable",
     ("itl_s", "stalls", "goodput")),
    (r"lost their connection", "connections were lost", ("ttft_s", "itl_s", "stalls", "goodput", "throughput")),
    (r"^first tokens reached the client", "first tokens reached the client late", ("ttft_s", "goodput")),
)


def _split(key: str) -> tuple[str, str | None]:
    head, _, sub = key.partition(".")
    return FAMILY.get(head, head), sub or None


def _touches(a: str, b: str) -> bool:
    """Whether figure keys overlap: one family, and one names the whole of it or both the same part."""
    (fa, sa), (fb, sb) = _split(a), _split(b)
    return fa == fb and (sa is None or sb is None or sa == sb)


@dataclass(frozen=True)
class Reason:
    words: str
    keys: tuple[str, ...] | None  # None: a reason this module does not know, named for every figure


def _reason(text: str) -> Reason:
    for pattern, words, keys in RULES:
        if m := re.search(pattern, text):
            groups = m.groups()
            return Reason(words.format(*groups), tuple(k.format(*groups) for k in keys))
    head = text.split(": ")[0].strip().rstrip(".")
    return Reason(head if len(head) <= 90 else head[:87] + "…", None)


@dataclass(frozen=True)
class Withdrawn:
    """The figures a run's validity verdict withdrew (none for a valid run) and why."""

    affected: tuple[str, ...] = ()
    reasons: tuple[Reason, ...] = ()

    @classmethod
    def of(cls, summary: dict[str, Any]) -> Withdrawn:
        if summary.get("valid") is not False:
            return cls()
        v = summary.get("validity") or {}
        return cls(tuple(str(a) for a in v.get("affected") or []),
                   tuple(_reason(str(r)) for r in v.get("reasons") or []))

    def __bool__(self) -> bool:
        return bool(self.affected)

    def hit(self, figure: str) -> list[str]:
        """The withdrawn keys that overlap `figure` (`ttft_s` overlaps `ttft_s.le128`; `ttft_s.le512` does not)."""
        return [a for a in self.affected if _touches(a, figure)]

    def parts(self, figure: str) -> list[str]:
        """Where only parts of `figure` were withdrawn, their names (`max`, `le128`); empty when all of it was
        (or none)."""
        hits = self.hit(figure)
        if not hits or _split(figure)[1] is not None or any(_split(a)[1] is None for a in hits):
            return []
        head = figure.partition(".")[0]
        own = [a for a in hits if a.partition(".")[0] == head]  # 'all' TTFT: its buckets, not the classes beside them
        return list(dict.fromkeys(str(_split(a)[1]) for a in own or hits))

    def why(self, figure: str) -> str | None:
        """The reasons, in a few words, that `figure` is not valid; None when it stands."""
        hits = self.hit(figure)
        if not hits:
            return None
        known = [r for r in self.reasons if r.keys is not None]
        words = [r.words for r in known if any(_touches(k, h) for k in r.keys or () for h in hits)]
        if not words:  # a class's TTFT, withdrawn by late sends the reasons name by bucket
            family = _split(figure)[0]
            words = [r.words for r in known if any(_split(k)[0] == family for k in r.keys or ())]
        words += [r.words for r in self.reasons if r.keys is None]
        return "; ".join(_merged(list(dict.fromkeys(words)))) or "see the validity verdict"

    def mark(self, figure: str) -> str:
        """'not valid: why' (or 'max not valid: why' where only a part is), '' when the figure stands."""
        why = self.why(figure)
        if why is None:
            return ""
        parts = self.parts(figure)
        return (f"{', '.join(parts)} " if parts else "") + f"not valid: {why}"

    def label(self, figure: str, label: str) -> str:
        """A table row's label with its mark: 'le128 (not valid)', 'all (le128 not valid)'."""
        if self.why(figure) is None:
            return label
        parts = self.parts(figure)
        return f"{label} ({', '.join(parts) + ' ' if parts else ''}not valid)"

    def any_of(self, *figures: str) -> str | None:
        """The reasons for every withdrawn one of `figures`, said once (None: all stand)."""
        words = [w for f in figures if (why := self.why(f)) for w in why.split("; ")]
        return "; ".join(_merged(list(dict.fromkeys(words)))) or None


def _merged(words: list[str]) -> list[str]:
    """Reasons of one rule said once: 'the client sent le2k requests late; the client sent le512 requests late'
    reads 'the client sent le2k and le512 requests late'."""
    out: list[str] = []
    groups: dict[str, list[str]] = {}
    for w in words:
        for _, template, _ in RULES:
            head, sep, tail = template.partition("{0}")
            if sep and w.startswith(head) and w.endswith(tail) and len(w) > len(head) + len(tail):
                key = template
                if key not in groups:
                    groups[key] = []
                    out.append(key)
                groups[key].append(w[len(head):len(w) - len(tail)])
                break
        else:
            out.append(w)
    return [_joined(k, groups[k]) if k in groups else k for k in out]


def _joined(template: str, parts: list[str]) -> str:
    said = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return template.format(said)
