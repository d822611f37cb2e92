"""Policy names, one spelling for every lightspec-bench command: none, static:K, dynamic[:K],
dspark[:K] (K = the draft depth, or for dynamic/dspark the maximum one).

The planner's simulator once spelled them static-3, dspark-11; those still parse, as the same
names, so old command lines keep working.
"""

from __future__ import annotations

import argparse
import difflib
import re

KINDS = ("none", "static", "dynamic", "dspark")
SYNTAX = "none, static:K, dynamic[:K] or dspark[:K]"
# The simulator's own planner names: "static-3", "dspark-11" (and ablations with words).
_LEGACY = re.compile(r"^(static|dynamic|dspark|oracle)-(\d+)$")


def parse_policy(text: str, *, kinds: tuple[str, ...] = KINDS) -> tuple[str, int | None]:
    """'static:3' -> ('static', 3); 'dynamic' -> ('dynamic', None): K left to the caller."""
    legacy = _LEGACY.match(text)
    name, sep, k = (legacy.group(1), ":", legacy.group(2)) if legacy else text.partition(":")
    if name not in kinds:
        close = difflib.get_close_matches(name, kinds, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0] + sep + k!r}?" if close else ""
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}: use {_syntax(kinds)}{hint}")
    if name == "none":
        if sep:
            raise argparse.ArgumentTypeError("'none' takes no depth: plain decoding drafts nothing")
        return name, None
    if sep and not k.isdigit():
        raise argparse.ArgumentTypeError(f"policy {text!r}: the depth after ':' must be a whole "
                                         f"number, e.g. {name}:3")
    if name == "static" and not k:
        raise argparse.ArgumentTypeError("static needs its depth, e.g. static:3")
    if k and int(k) < 1:
        raise argparse.ArgumentTypeError(f"policy {text!r}: the depth must be >= 1")
    return name, int(k) if k else None


def policy_name(name: str, k: int | None) -> str:
    """The one printed spelling: 'none', 'static:3', 'dynamic:7' (K always resolved)."""
    return name if name == "none" or k is None else f"{name}:{k}"


def policy_arg(text: str) -> str:
    """argparse type: validates and returns the canonical text; a missing K stays missing
    (it is resolved from --max-depth after parsing)."""
    return policy_name(*parse_policy(text))


def _syntax(kinds: tuple[str, ...]) -> str:
    if kinds == KINDS:
        return SYNTAX
    return SYNTAX.replace(" or ", ", ") + ", or " + ", ".join(k for k in kinds if k not in KINDS)
