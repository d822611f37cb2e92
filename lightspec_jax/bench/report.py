"""What every lightspec-bench result carries: versions, printed tables with a legend, and the
closing interpretation of a serving run."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import statistics

LEGEND = ("acc.rate = accepted / verified drafts; acc.len = tokens committed per verify step, "
          "bonus token included; rows/step = verify rows per step; d = mean draft depth")


def versions() -> dict[str, str]:
    """The software a result was measured with (recorded in every JSON)."""
    import lightspec_jax

    out = {"lightspec_jax": lightspec_jax.__version__}
    for name in ("jax", "jaxlib", "flax", "numpy"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["python"] = platform.python_version()
    out["platform"] = platform.platform()
    return out


def jax_backend() -> str:
    """The device the engine ran on: platform (device kind), e.g. 'gpu (NVIDIA H200)'."""
    import jax

    device = jax.devices()[0]
    return f"{device.platform} ({device.device_kind})"


def table(header: list[str], rows: list[list[str]], *, legend: str | None = None) -> str:
    """A plain-text table: right-aligned numbers, left-aligned words, header underlined."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    numeric = [all(_is_number(r[i]) for r in rows) if rows else False for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).rjust(w) if num else str(c).ljust(w)
                         for c, w, num in zip(cells, widths, numeric)).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths), *map(line, rows)]
    if legend:
        out.append(legend)
    return "\n".join(out)


def _is_number(text: str) -> bool:
    """Numbers, ratios (1.80x), ranges (162-198) and the '-' of a missing value."""
    return re.fullmatch(r"-|[-+]?[\d.]+(x|-[\d.]+)?", str(text)) is not None


def spread(values: list[float]) -> dict:
    """Median and range of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": list(values)}


def serve_table(rows: list[dict]) -> str:
    header = ["c", "policy", "tok/s (median)", "min-max", "x none", "acc.rate", "acc.len",
              "rows/step", "d", "same as none"]
    plain = {r["concurrency"]: r["tok_s"] for r in rows if r["policy"] == "none"}
    lines = []
    for r in rows:
        base = plain.get(r["concurrency"])
        spec = "acceptance_rate" in r
        lines.append([
            str(r["concurrency"]), r["policy"], f"{r['tok_s']:.0f}",
            f"{r['tok_s_min']:.0f}-{r['tok_s_max']:.0f}",
            f"{r['tok_s'] / base:.2f}x" if base else "-",
            f"{r['acceptance_rate']:.2f}" if spec else "-",
            f"{r['acceptance_length']:.2f}" if spec else "-",
            f"{r['verify_rows_per_step']:.1f}" if spec else "-",
            f"{r['mean_depth']:.1f}" if spec else "-",
            {True: "yes", False: "NO"}.get(r.get("identical_to_none"), "-")])
    return table(header, lines, legend=LEGEND)


def interpret(rows: list[dict]) -> list[str]:
    """One line per concurrency, computed from the medians: each adaptive policy (dynamic,
    dspark) against plain decoding, the best fixed K and the fixed K of its own depth, and
    which policy was fastest. Without an adaptive policy, the fastest one is compared instead."""
    out = []
    for c in dict.fromkeys(r["concurrency"] for r in rows):
        cell = [r for r in rows if r["concurrency"] == c]
        plain = next((r for r in cell if r["policy"] == "none"), None)
        fastest = max(cell, key=lambda r: r["tok_s"])
        adaptive = [r for r in cell if r["policy"].split(":")[0] in ("dynamic", "dspark")]
        parts = []
        for r in adaptive or [fastest]:
            # the best fixed K with the same drafter (rows of one drafter, or no drafter tag)
            fixed = max((x for x in cell if x["policy"].startswith("static")
                         and x.get("drafter") == r.get("drafter")),
                        key=lambda x: x["tok_s"], default=None)
            ratios = []
            if plain and r is not plain:
                ratios.append(f"{r['tok_s'] / plain['tok_s']:.2f}x plain")
            if fixed and r is not fixed:
                ratios.append(f"{r['tok_s'] / fixed['tok_s']:.2f}x best fixed K ({fixed['policy']}"
                              + (", within the noise of repeats)" if not _distinct(r, fixed)
                                 else ")"))
            # The fixed K with the same maximum depth: what the planner's budget choice adds.
            same = next((x for x in cell if x["policy"] == "static:" + r["policy"].split(":")[-1]
                         and x is not fixed), None)
            if same:
                ratios.append(f"{r['tok_s'] / same['tok_s']:.2f}x {same['policy']} (same K)")
            parts.append(" ".join([r["policy"], ", ".join(ratios)]).strip())
        if adaptive and fastest not in adaptive:
            parts.append(f"fastest: {fastest['policy']}")
        elif not adaptive:
            parts[0] = "fastest: " + parts[0]
        out.append(f"c={c}: " + "; ".join(parts))
    return out


def ranking(rows: list[dict]) -> list[str]:
    """Per concurrency, the policies from slowest to fastest by median, in groups: a policy
    the repeats cannot tell from the next slower one joins its group ('~', see _distinct),
    '<' starts the next. Inside a group policies keep the order they were given in, so two
    runs that agree on the groups print the same line.

    Telling apart is not transitive (a ~ b and b ~ c, yet a < c), so no grouping is right
    for every pair: pairs inside a group that the repeats do tell apart follow it in
    brackets, slower first ('[a < c]'), and the line agrees with the interpretation line's
    comparisons."""
    out = []
    for c in dict.fromkeys(r["concurrency"] for r in rows):
        given = [r for r in rows if r["concurrency"] == c]
        by_speed = sorted(given, key=lambda r: r["tok_s"])
        groups = [[by_speed[0]]]
        for slower, faster in zip(by_speed, by_speed[1:]):
            if not _distinct(slower, faster):
                groups[-1].append(faster)
            else:
                groups.append([faster])
        text = " < ".join(" ~ ".join(r["policy"] for r in given if r in group) for group in groups)
        apart = [f"{a['policy']} < {b['policy']}" for group in groups
                 for i, a in enumerate(group) for b in group[i + 1:] if _distinct(a, b)]
        out.append(f"c={c}: {text}" + (f" [{', '.join(apart)}]" if apart else ""))
    return out


# Paired repeats must put the faster policy ahead by at least this much (median of the
# per-repeat ratios): this machine's repeats of one cell spread by 5-20%.
DISTINCT_RATIO = 1.03


def _distinct(a: dict, b: dict) -> bool:
    """Whether the repeats tell two policies of one cell apart. Every repeat times all
    policies back to back, so the machine's drift between repeats (plain decoding moved 258 ->
    312 tok/s between two repeats of one cell) cancels in the per-repeat ratio: the faster
    median must win in EVERY repeat, by DISTINCT_RATIO in the median. Rows without per-repeat
    figures, or without two rounds in common (serve runs one group of engines at a time:
    serve.engine_groups), fall back to disjoint min-max ranges."""
    slow, fast = sorted((a, b), key=lambda r: r["tok_s"])
    slow_runs, fast_runs = by_round(slow), by_round(fast)
    pairs = [(slow_runs[k], fast_runs[k]) for k in slow_runs if k in fast_runs]
    if len(pairs) < 2:
        return slow["tok_s_max"] < fast["tok_s_min"]
    ratios = [f / s for s, f in pairs]
    return min(ratios) > 1.0 and statistics.median(ratios) >= DISTINCT_RATIO


def by_round(row: dict) -> dict:
    """A row's per-repeat tok/s keyed by the round it ran in (its index where unrecorded)."""
    values = row.get("tok_s_repeats") or []
    return dict(zip(row.get("repeat_rounds") or range(len(values)), values))
