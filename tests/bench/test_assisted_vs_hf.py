"""benchmarks/assisted_vs_hf.py on tiny settings: every method runs and matches transformers."""

import json

from benchmark_scripts import load_benchmark


def test_smoke_every_output_matches_transformers(tmp_path, capsys):
    bench = load_benchmark("assisted_vs_hf")
    out = tmp_path / "results.json"
    bench.main(["--workloads", "math", "--num-prompts", "1", "--max-tokens", "8",
                "--repeats", "1", "--methods", "hf-assisted-k3", "ours-none",
                "ours-draft-lm-k3", "--prefill-chunk", "32", "--out", str(out)])
    rows = json.loads(out.read_text())["workloads"]["math"]["methods"]
    assert list(rows) == ["hf", "hf-assisted-k3", "ours-none", "ours-draft-lm-k3"]
    assert all(r["identical"] and r["tokens"] == 8 for r in rows.values())
    for name in ("hf-assisted-k3", "ours-draft-lm-k3"):  # acceptance counted on both sides
        assert rows[name]["verify_steps"] >= 1 and 1.0 <= rows[name]["acceptance_length"] <= 4.0
    assert "| math | ours-draft-lm-k3 |" in capsys.readouterr().out

    from transformers.generation.candidate_generator import AssistedCandidateGenerator
    assert AssistedCandidateGenerator.update_candidate_strategy.__name__ == \
        "update_candidate_strategy"  # the counting wrapper is removed again
