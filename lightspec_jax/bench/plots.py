"""PNG plots of lightspec-bench results. Every figure says what was run in its title, labels
both axes, and keeps legends outside the axes so they cover no data."""

from __future__ import annotations

import os


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    fig = {"serve": _serve, "sweep": _sweep, "simulate": _simulate}[result["command"]](plt, result)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight" keeps outside legends in frame
    plt.close(fig)


def model_name(path: str | None) -> str:
    """The directory name of a checkpoint path ('tiny-pair/target' for the shipped pair)."""
    if not path:
        return "-"
    path = os.path.normpath(path)
    name = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))
    # "target" alone says little: the shipped pair's is tiny-pair/target.
    return f"{parent}/{name}" if name in ("target", "drafter", "draft-lm") and parent else name


def _serve(plt, result: dict):
    s = result["settings"]
    rows = result["rows"]
    cs = list(dict.fromkeys(r["concurrency"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    # Several drafters (serve --drafter A B ...): one colour per drafter, the policy alone
    # under each bar, a legend naming the drafters; otherwise one colour per policy.
    drafters = list(dict.fromkeys(r["drafter"] for r in rows if r.get("drafter")))
    cmap = plt.get_cmap("tab10")
    if drafters:
        hue = {d: cmap(i % 10) for i, d in enumerate(drafters)}
        color = lambda r: hue.get(r.get("drafter"), "0.6")  # noqa: E731
        label = lambda r: r["policy"].split(" @")[0]  # noqa: E731
    else:
        hue = {p: cmap(i % 10) for i, p in enumerate(policies)}
        color = lambda r: hue[r["policy"]]  # noqa: E731
        label = lambda r: r["policy"]  # noqa: E731
    most = max(sum(r["concurrency"] == c for r in rows) for c in cs)
    many = most > 8  # narrow bars: vertical labels and ratios
    width = max(2.6, 0.32 * most)
    fig, axes = plt.subplots(1, len(cs), figsize=(3.2 + width * len(cs), 4.6 if many else 4.2),
                             squeeze=False)
    for ax, c in zip(axes[0], cs):
        cell = [r for r in rows if r["concurrency"] == c]
        plain = next((r["tok_s"] for r in cell if r["policy"] == "none"), None)
        xs = range(len(cell))
        ys = [r["tok_s"] for r in cell]
        err = [[r["tok_s"] - r["tok_s_min"] for r in cell], [r["tok_s_max"] - r["tok_s"] for r in cell]]
        ax.bar(xs, ys, yerr=err, capsize=2 if many else 4, color=[color(r) for r in cell])
        for x, r in zip(xs, cell):
            if plain:
                ax.annotate(f"{r['tok_s'] / plain:.2f}x", (x, r["tok_s_max"]), ha="center",
                            va="bottom", xytext=(0, 2), textcoords="offset points",
                            fontsize=7 if many else 8, rotation=90 if many else 0)
        ax.set_xticks(list(xs), [label(r) for r in cell], rotation=90 if many else 20)
        ax.set_title(f"c = {c} requests in flight, {cell[0]['requests']} prompts")
        ax.set_xlabel("policy")
        ax.set_ylim(0, (1.3 if many else 1.15) * max(r["tok_s_max"] for r in cell))
    if drafters:
        from matplotlib.patches import Patch

        axes[0][-1].legend(handles=[Patch(color=hue[d], label=d) for d in drafters],
                           title="drafter", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                           fontsize=8)
    axes[0][0].set_ylabel("output tokens / s (median; whiskers: min-max)")
    synthetic = (f"  SYNTHETIC acceptance ({s['synthetic']})" if s.get("synthetic") else "")
    given = s.get("drafter")
    given = given if isinstance(given, list) else [given] if given else []
    # one drafter: named in the title (several are told apart by colour)
    pair = (f" + {model_name(given[0])}" if len(given) == 1 and
            any("acceptance_rate" in r for r in rows) else "")
    fig.suptitle(f"lightspec-bench serve: {s['workload']} workload, {model_name(s['target'])}"
                 f"{pair}, {result['dtype']}, up to {s['max_tokens']} new tokens, {s['repeats']} repeats"
                 f"{synthetic}\nratios over bars: x plain decoding (none)", fontsize=10)
    fig.tight_layout()
    return fig


def _sweep(plt, result: dict):
    s = result["settings"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = sorted(result["verify_ms"], key=int)
    left.plot([int(b) for b in rows], [result["verify_ms"][b] for b in rows], "o-",
              label="target verify (whole step)")
    rows = sorted(result["draft_commit_ms"], key=int)
    # Nil (a placeholder) where the verify step writes the drafter's cache.
    if any((ms or 0) > 1e-3 for ms in result["draft_commit_ms"].values()):
        left.plot([int(b) for b in rows], [result["draft_commit_ms"][b] for b in rows], "s-",
                  label="drafter commit forward")
    left.set_xlabel("verify rows B (whole batch)")
    left.set_ylabel("ms per step")
    left.set_title("cost by verify budget")
    left.set_ylim(bottom=0)
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    depths = sorted(result["draft_depth_ms"], key=int)
    right.plot([int(d) for d in depths], [result["draft_depth_ms"][d] for d in depths], "^-",
               color="tab:green")
    right.set_xticks([int(d) for d in depths])
    right.set_xlabel("draft depth d (tokens drafted per request)")
    right.set_ylabel("ms that drafting adds per step (all slots)")
    right.set_title("cost by draft depth")
    right.set_ylim(bottom=0)
    fig.suptitle(f"lightspec-bench sweep: {model_name(s['target'])} + {model_name(s['drafter'])}, "
                 f"{result['dtype']}, {s['max_num_seqs']} slots, {s['context']} context tokens each",
                 fontsize=10)
    fig.tight_layout()
    return fig


def _simulate(plt, result: dict):
    runs = result["runs"]
    profiles = list(dict.fromkeys(r["profile"] for r in runs))
    fig, axes = plt.subplots(1, len(profiles), figsize=(1.5 + 4.2 * len(profiles), 4.2),
                             squeeze=False, sharey=True)
    for ax, profile in zip(axes[0], profiles):
        mine = [r for r in runs if r["profile"] == profile]
        cs = sorted({r["concurrency"] for r in mine})
        # Throughput spans orders of magnitude over concurrency: plot it relative to the best
        # policy at each level, where the differences between policies show.
        best = {c: max(r["throughput"] for r in mine if r["concurrency"] == c) for c in cs}
        for label in dict.fromkeys(r["label"] for r in mine):
            pts = sorted((r["concurrency"], r["throughput"] / best[r["concurrency"]])
                         for r in mine if r["label"] == label)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrency c (requests in flight)")
        ax.set_title(f"{profile} profile")
    axes[0][0].set_ylabel("throughput / best policy at that c")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    requests = result["settings"].get("requests") or "max(4 c, 32)"
    fig.suptitle(f"lightspec-bench simulate: synthetic acceptance, {result['cost_model']} step "
                 f"times, {requests} requests per run", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
