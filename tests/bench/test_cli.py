"""Smoke runs of each lightspec-bench command on the shipped tiny pair (tiny settings)."""

import json

import pytest

from lightspec_jax.bench.cli import concurrency_buckets, main, parse_policy


def test_serve_and_sweep_write_results(tmp_path):
    out = tmp_path / "serve"
    assert main(["serve", "--concurrency", "2", "--num-prompts", "2", "--max-tokens", "6",
                 "--policies", "none", "static:2", "--out", str(out)]) == 0
    result = json.loads((out / "serve.json").read_text())
    assert [r["policy"] for r in result["rows"]] == ["none", "static K=2"]
    assert result["rows"][1]["identical_to_none"] is True  # greedy speculative == plain
    assert (out / "serve.png").stat().st_size > 0

    out = tmp_path / "sweep"
    assert main(["sweep", "--max-num-seqs", "2", "--max-depth", "2", "--context", "16",
                 "--out", str(out)]) == 0
    result = json.loads((out / "sweep.json").read_text())
    assert sorted(map(int, result["verify_ms"])) == list(concurrency_buckets(2, 2))
    assert (out / "sweep.png").stat().st_size > 0


def test_simulate_passes_through(capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--help"])
    assert e.value.code == 0
    assert "lightspec-bench simulate" in capsys.readouterr().out


def test_policy_parsing():
    assert parse_policy("static:11") == ("static", 11)
    assert parse_policy("dynamic") == ("dynamic", None)
    with pytest.raises(Exception, match="static needs"):
        parse_policy("static")
    with pytest.raises(Exception, match="unknown policy"):
        parse_policy("fast")
