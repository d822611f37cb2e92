"""benchmarks/h200_check.py --dry-run: the device check's whole logic on CPU at tiny shapes.

The H200 run happens rarely and costs scarce device time; this keeps the script from rotting
between runs. It runs the driver in a subprocess (it starts its own pytest and jax runtimes),
about 1-2 minutes on two CPU cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_dry_run_writes_every_section(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "h200_check.py"), str(tmp_path),
         "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "h200_check.json").read_text())
    assert results["errors"] == {}, results["errors"]
    assert results["dry_run"] is True
    assert {"env", "kernel_tests", "kernel_timings", "verify_step", "serving", "section_s",
            "total_s"} <= results.keys()

    tests = results["kernel_tests"]
    assert tests["tests"] >= 1 and tests["failures"] == tests["errors"] == 0

    kernels = {row["kernel"] for row in results["kernel_timings"]}
    assert kernels == {"fill", "verify", "commit", "vocab_argmax (XLA)", "verify_attention",
                       "verify_attention (Mosaic GPU)"}
    assert not any("error" in row for row in results["kernel_timings"])
    # Every kernel figure comes with its own roofline (bytes it must move / 4.8 TB/s).
    assert all(row["bytes"] > 0 and 0 < row["fraction_of_roofline"]
               for row in results["kernel_timings"])
    assert results["reference_ops"] == []

    assert set(results["verify_step"]) == {"qwen3-14b", "qwen3-0.6b"}
    for model in results["verify_step"].values():
        assert [row["B"] for row in model["rows"]] == [4, 8]
        for row in model["rows"]:
            assert row["ms"] > 0 and row["roofline_ms"] > 0 and row["bound"] in ("memory", "compute")
            assert row["attention"] == "xla"  # the model's attention on CPU

    policies = [row["policy"] for row in results["serving"]]
    assert policies == ["static K=5", "dynamic K=5", "static K=2", "none"]
    assert all(row["tok_s"] > 0 and row["c"] == 4 for row in results["serving"])
    # Throughput while requests still waited for a slot (spec_serving.QueueWatch): 8 prompts
    # on 4 slots leave a queue behind the first admissions.
    assert all(row["steady_tok_s"] > 0 and row["steady_tokens"] > 0
               for row in results["serving"])
    # The dry run's requests emit 4-12 tokens each (--serve-length-spread 0.5 of 8).
    assert all(row["length_spread"] == 0.5 for row in results["serving"])
    assert "kernel tests:" in (tmp_path / "summary.txt").read_text()
    # Each engine served once more under cProfile: the step loop's functions, per step.
    for row in results["serving"]:
        profile = row["host_profile"]
        assert profile["steps"] > 0 and profile["by_own_time"]
        assert any(name.endswith(":step") and "engine.py" in name for name in profile["phases"])
        decode = [v for name, v in profile["phases"].items() if name.endswith(":decode")]
        assert decode and decode[0]["calls_per_step"] > 0  # every policy dispatches decode steps


def test_output_lengths_spread_around_new_tokens():
    import numpy as np

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from h200_check import output_lengths
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    rng = np.random.default_rng(0)
    assert output_lengths(128, 0.0, 6, rng) == [128] * 6
    spread = output_lengths(128, 0.5, 2000, rng)
    assert min(spread) == 64 and max(spread) == 192  # both ends drawn, nothing past them
    assert abs(sum(spread) / len(spread) - 128) < 3
    assert min(output_lengths(1, 0.9, 50, rng)) >= 1
