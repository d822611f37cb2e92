"""benchmarks/grid_ratios.py: the best other policy chosen on some repeats is judged on the
others, repeats pair by round, and a cell whose output differs from plain decoding fails."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("grid_ratios")


def row(policy, tok_s, rounds=None, c=1, **extra):
    return {"concurrency": c, "policy": policy, "tok_s": sorted(tok_s)[len(tok_s) // 2],
            "tok_s_repeats": tok_s, "repeat_rounds": rounds or list(range(len(tok_s))), **extra}


def test_a_lucky_repeat_picks_the_best_in_sample_but_not_held_out(bench):
    # static:a is 100 but for one lucky repeat; static:b a steady 110; dynamic 105.
    runs = {"static:a": [100.0, 100.0, 130.0], "static:b": [110.0] * 3,
            "dynamic:7": [105.0] * 3}
    out = bench.cell_ratios(runs, "dynamic:7")
    assert out["best"] == "static:b"
    assert out["in_sample"] == pytest.approx(105 / 110)
    # Splits choosing on {0, 1} pick b (judged on repeat 2: 105 / 110); on {0, 2} or {1, 2}
    # they pick a (130 lifts its median to 115) and judge it on a repeat where it ran 100.
    assert out["held_out"] == pytest.approx(1.05)


def test_repeats_pair_by_round_and_rounds_not_shared_are_left_out(bench):
    rows = [row("none", [90.0, 100.0, 80.0], rounds=[2, 0, 1]),
            row("dynamic:7", [100.0, 120.0], rounds=[0, 2])]
    assert bench.paired(rows) == {"none": [100.0, 90.0], "dynamic:7": [100.0, 120.0]}
    apart = [row("static:3", [100.0], rounds=[0]), row("dynamic:7", [100.0], rounds=[1])]
    with pytest.raises(ValueError, match="no round that every policy at c = 1 ran in"):
        bench.paired(apart)


def test_a_cell_whose_output_differs_is_flagged_and_fails(bench, tmp_path, capsys):
    folder = tmp_path / "math"
    folder.mkdir()
    rows = [row("none", [100.0, 100.0]), row("static:3", [120.0, 110.0], identical_to_none=True),
            row("dynamic:7", [118.0, 121.0], identical_to_none=True),
            row("none", [50.0, 52.0], c=4), row("dynamic:7", [60.0, 61.0], c=4,
                                                 identical_to_none=False)]
    (folder / "serve.json").write_text(json.dumps({"rows": rows}))
    assert bench.main([str(folder)]) == 1
    out = capsys.readouterr().out
    assert "| math | 1 | 2 | 1.039 (static:3) |" in out  # 119.5 / 115
    assert "| math | 4 | 2 | 1.186 (none) (output differs from plain decoding) | 1.187 |" in out
    assert "in sample: 2 of 2 cells >= 0.95, 2 >= 1.0" in out


def test_runs_of_one_workload_pool_cell_by_cell(bench, tmp_path, capsys):
    # Two runs of the same code: dynamic 0.95x plain decoding in one, 1.10x in the other. Each
    # run alone reads its own side of the bar; pooled, the cell is read over all four repeats.
    # A policy one run did not serve is left out of the pooled cell, and a concurrency only
    # one run served is read from that run.
    first, second = tmp_path / "a" / "math", tmp_path / "b" / "math"
    for folder in (first, second):
        folder.mkdir(parents=True)
    (first / "serve.json").write_text(json.dumps({"rows": [
        row("none", [100.0, 100.0]), row("dynamic:7", [95.0, 95.0])]}))
    (second / "serve.json").write_text(json.dumps({"rows": [
        row("none", [100.0, 100.0], rounds=[3, 4]), row("dynamic:7", [110.0, 110.0], rounds=[4, 3]),
        row("static:3", [200.0, 200.0], rounds=[3, 4]),
        row("none", [50.0, 50.0], c=4), row("dynamic:7", [49.0, 49.0], c=4)]}))
    cells = bench.grid([bench.load(str(first)), bench.load(str(second))], "dynamic:7")
    pooled, alone = cells
    assert (pooled["concurrency"], pooled["runs"], pooled["repeats"]) == (1, 2, 4)
    assert pooled["best"] == "none" and pooled["in_sample"] == pytest.approx(1.025)
    assert (alone["concurrency"], alone["runs"]) == (4, 1)
    assert alone["in_sample"] == pytest.approx(0.98)
    assert bench.main([str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "| math | 1 | 4 (2 runs) | 1.025 (none) |" in out
    assert "| math | 4 | 2 | 0.980 (none) | 0.980 |" in out
