"""The n-gram's serve table from serve/<workload>/serve.json: plain tok/s, the best fixed K,
dynamic:7, and the ratios (BENCHMARKS.md, fifty-eighth session)."""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

print("| workload | c | plain tok/s | best static (tok/s, x plain, acc.len) | dynamic:7 (tok/s, "
      "x plain, acc.len) | dynamic / best static | dynamic / best other |")
print("|---|---|---|---|---|---|---|")
for workload in ("sharegpt", "humaneval", "math"):
    rows = json.load(open(os.path.join(HERE, "serve", workload, "serve.json")))["rows"]
    for c in sorted({r["concurrency"] for r in rows}):
        cell = {r["policy"]: r for r in rows if r["concurrency"] == c}
        plain = cell["none"]["tok_s"]
        statics = [r for p, r in cell.items() if p.startswith("static:")]
        best = max(statics, key=lambda r: r["tok_s"])
        dyn = cell["dynamic:7"]
        other = max(plain, best["tok_s"])
        print(f"| {workload} | {c} | {plain:.0f} | {best['policy']}: {best['tok_s']:.0f}, "
              f"{best['tok_s'] / plain:.2f}x, {best['acceptance_length']:.2f} | "
              f"{dyn['tok_s']:.0f}, {dyn['tok_s'] / plain:.2f}x, {dyn['acceptance_length']:.2f} | "
              f"{dyn['tok_s'] / best['tok_s']:.2f} | {dyn['tok_s'] / other:.2f} |")
