"""lightspec-bench on the shipped tiny pair with tiny settings: results, help, names, errors."""

import argparse
import json
import re

import pytest

from lightspec_jax.assets import tiny_pair
from lightspec_jax.bench.cli import build_parser, main, settings
from lightspec_jax.bench.policies import parse_policy, policy_arg
from lightspec_jax.bench.report import LEGEND, interpret, ranking, serve_table, versions
from lightspec_jax.bench.serve import GROUP_ENGINES, engine_groups, prefill_buckets
from lightspec_jax.bench.simulate import bench_name, resolve

SETTINGS = ("dtype", "max_tokens", "num_prompts", "concurrency", "policies", "seed", "repeats",
            "workload", "target", "drafter", "max_depth")
VERSIONS = ("lightspec_jax", "jax", "jaxlib", "flax", "numpy", "python", "platform")


def test_serve_and_sweep_write_results(tmp_path, capsys):
    out = tmp_path / "serve"
    assert main(["serve", "--concurrency", "2", "--num-prompts", "2", "--max-tokens", "6",
                 "--policies", "none", "static:2", "--repeats", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "serve.json").read_text())
    assert [r["policy"] for r in result["rows"]] == ["none", "static:2"]
    assert result["rows"][1]["identical_to_none"] is True  # greedy speculative == plain
    assert all(len(r["tok_s_repeats"]) == 2 for r in result["rows"])
    assert all(r["tok_s_min"] <= r["tok_s"] <= r["tok_s_max"] for r in result["rows"])
    assert set(SETTINGS) <= set(result["settings"]) and set(VERSIONS) <= set(result["versions"])
    assert result["settings"]["policies"] == ["none", "static:2"]
    assert result["dtype"] == "float32" and result["settings"]["dtype"] == "auto"  # on the CPU
    assert result["ranking"][0].startswith("c=2: ")
    assert result["interpretation"] == [line for line in printed.splitlines()
                                        if line.startswith("c=2: ")]
    for phase in ("building engine none", "building engine static:2", "serving, repeat 2/2"):
        assert phase in printed
    assert LEGEND in printed and re.search(r"^c\s+policy\s+tok/s", printed, re.M)
    assert (out / "serve.png").stat().st_size > 0

    from lightspec_jax.engine.buckets import concurrency_buckets

    out = tmp_path / "sweep"
    assert main(["sweep", "--max-num-seqs", "2", "--max-depth", "2", "--context", "16",
                 "--out", str(out)]) == 0
    result = json.loads((out / "sweep.json").read_text())
    assert sorted(map(int, result["verify_ms"])) == list(concurrency_buckets(2, 2))
    assert sorted(map(int, result["draft_depth_ms"])) == [1, 2]
    assert result["dtype"] == "float32" and "versions" in result
    assert (out / "sweep.png").stat().st_size > 0


def test_serve_compares_drafters_side_by_side(tmp_path, capsys):
    """Several --drafter values: each speculative policy once per drafter, labelled by kind,
    plain decoding once; every drafter's greedy output equals plain decoding's."""
    pair = tiny_pair()
    out = tmp_path / "serve"
    assert main(["serve", "--drafter", pair.drafter, pair.draft_lm, "ngram", "--concurrency",
                 "1", "--num-prompts", "2", "--max-tokens", "5", "--policies", "none",
                 "static:2", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "serve.json").read_text())["rows"]
    assert [r["policy"] for r in rows] == ["none", "static:2 @eagle3", "static:2 @draft_lm",
                                           "static:2 @ngram"]
    assert [r.get("drafter") for r in rows] == [None, "eagle3", "draft_lm", "ngram"]
    assert all(r["identical_to_none"] for r in rows[1:])
    assert "c=1: fastest: " in capsys.readouterr().out


def test_simulate_uses_the_serve_names(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--concurrency", "2", "--policies", "static-3", "dynamic",
                 "--requests", "4", "--jobs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "simulate.json").read_text())
    assert [r["label"] for r in result["runs"]] == ["static:3", "dynamic:11"]
    assert result["settings"]["policies"] == ["static:3", "dynamic:11"]
    assert "| 2 | static:3 |" in printed and "static K=3" not in printed
    assert (out / "simulate.png").stat().st_size > 0


def test_simulate_name_mapping():
    assert resolve("static:3") == resolve("static-3") == "static-3"
    assert resolve("dspark:11") == "dspark-11" and bench_name("dspark-11") == "dspark:11"
    assert resolve("dynamic") == resolve("dynamic:11")
    assert resolve("dynamic-no-refresh") == "dynamic-no-refresh"  # ablations keep their names
    with pytest.raises(argparse.ArgumentTypeError, match="no policy 'static:5'.*static:3"):
        resolve("static:5")
    with pytest.raises(argparse.ArgumentTypeError, match="not simulated"):
        resolve("none")


def test_policy_parsing():
    assert parse_policy("static:11") == ("static", 11)
    assert parse_policy("static-3") == ("static", 3)  # the simulator's old spelling
    assert parse_policy("dynamic") == ("dynamic", None)
    assert policy_arg("dspark:5") == "dspark:5" and policy_arg("static-3") == "static:3"
    with pytest.raises(argparse.ArgumentTypeError, match="static needs"):
        parse_policy("static")
    with pytest.raises(argparse.ArgumentTypeError, match="did you mean 'dynamic:4'"):
        parse_policy("dynamc:4")
    for bad in ("fast", "none:3", "static:x", "static:0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_policy(bad)


@pytest.mark.parametrize("command", ["serve", "sweep", "simulate"])
def test_every_option_has_help_and_a_default(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: lightspec-bench {command}" in text
    # An option's entry: its line(s) from "  --name" up to the next option.
    entries = [e for e in re.split(r"\n(?=  -)", text.split("options:", 1)[1])
               if e.strip().startswith("--")]  # every option but -h/--help
    assert len(entries) >= 4
    for entry in entries:
        signature, _, help_text = entry.strip().partition("  ")  # help starts after 2+ spaces
        help_text = " ".join(help_text.split())
        assert "default" in help_text, f"{command} {signature}: no default shown"
        assert re.sub(r"\(default: [^)]*\)", "", help_text).strip(), f"{signature}: no help"


def test_help_texts():
    parser = build_parser()
    top = parser.format_help()
    assert "  lightspec-bench serve\n      The main job" in top  # line breaks kept
    serve = parser.commands["serve"].format_help()
    flat = " ".join(serve.split())
    assert "none, static:K, dynamic[:K] or dspark[:K]" in flat
    assert "Eagle3 drafter" in flat and "draft LM (a small Qwen3 sharing the target's vocabulary" \
        in flat


@pytest.mark.parametrize("argv, suggestion", [
    (["serv"], "did you mean 'serve'"),
    (["simulat", "--all"], "did you mean 'simulate'"),
    (["serve", "--concurency", "4"], "did you mean '--concurrency'"),
    (["serve", "--workload", "mth"], "did you mean 'math'"),
    (["serve", "--policies", "statc:3"], "did you mean 'static:3'"),
])
def test_typos_get_a_suggestion(argv, suggestion, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert suggestion in capsys.readouterr().err


def test_bad_values_are_usage_errors(capsys):
    for argv, message in ((["serve", "--concurrency", "0"], "--concurrency must be >= 1"),
                          (["serve", "--max-depth", "16"], "--max-depth must be in [1, 15]"),
                          (["serve", "--target", "/nonexistent"], "is not a directory")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def _row(c, policy, tok_s, **spec):
    return {"concurrency": c, "policy": policy, "tok_s": tok_s, "tok_s_min": tok_s * 0.9,
            "tok_s_max": tok_s * 1.1, "requests": 16, **spec}


def test_interpretation_and_table():
    spec = dict(acceptance_rate=0.8, acceptance_length=3.2, verify_rows_per_step=3.7,
                mean_depth=3.0, identical_to_none=True)
    rows = [_row(1, "none", 100), _row(1, "static:3", 200, **spec), _row(1, "dynamic:7", 180, **spec),
            _row(64, "none", 1000), _row(64, "static:3", 600, **spec),
            _row(64, "dynamic:7", 800, **spec)]
    assert interpret(rows) == [
        "c=1: dynamic:7 1.80x plain, 0.90x best fixed K (static:3, within the noise of repeats)"
        "; fastest: static:3",
        "c=64: dynamic:7 0.80x plain, 1.33x best fixed K (static:3); fastest: none"]
    assert interpret(rows[:2]) == ["c=1: fastest: static:3 2.00x plain"]
    # With several drafters, the best fixed K is taken among the same drafter's rows.
    tagged = [_row(1, "none", 100), _row(1, "static:3 @a", 300, drafter="a", **spec),
              _row(1, "static:3 @b", 150, drafter="b", **spec),
              _row(1, "dynamic:7 @b", 180, drafter="b", **spec)]
    assert interpret(tagged) == [
        "c=1: dynamic:7 @b 1.80x plain, 1.20x best fixed K (static:3 @b, within the noise of repeats); "
        "fastest: static:3 @a"]
    assert ranking(rows) == ["c=1: none < static:3 ~ dynamic:7", "c=64: static:3 < dynamic:7 < none"]
    text = serve_table(rows)
    assert text.splitlines()[0].split()[:3] == ["c", "policy", "tok/s"]
    assert text.splitlines()[-1] == LEGEND
    assert "162-198" in text and "0.80x" in text


def test_ranking_pairs_the_repeats():
    """Each repeat times every policy back to back: a machine that slows down between repeats
    moves all of them, and the per-repeat ratio still orders them; a policy ahead in one
    repeat and behind in another, or ahead by under 3%, ties."""
    def row(policy, repeats):
        return {"concurrency": 8, "policy": policy, "tok_s": sorted(repeats)[1],
                "tok_s_min": min(repeats), "tok_s_max": max(repeats),
                "tok_s_repeats": repeats}
    drift = [row("none", [300, 240, 270]), row("static:3", [270, 215, 245])]  # -10% each time
    assert ranking(drift) == ["c=8: static:3 < none"]  # min-max ranges overlap, yet ordered
    mixed = [row("none", [300, 240, 270]), row("static:3", [310, 230, 262])]
    assert ranking(mixed) == ["c=8: none ~ static:3"]
    close = [row("none", [300, 240, 270]), row("static:3", [306, 245, 275])]  # +2% each time
    assert ranking(close) == ["c=8: none ~ static:3"]


def test_ranking_names_the_pairs_a_group_tells_apart():
    """b ties a and c ties b, but the repeats put c ahead of a in every one of them by over
    3%: the group a ~ b ~ c says so in brackets, as the interpretation line, which compares
    that pair, does (a main-job run printed the bare group static:3 ~ static:7 ~ dynamic:7
    beside 'dynamic:7 0.87x best fixed K (static:7)')."""
    def row(policy, repeats):
        return {"concurrency": 1, "policy": policy, "tok_s": sorted(repeats)[1],
                "tok_s_min": min(repeats), "tok_s_max": max(repeats),
                "tok_s_repeats": repeats}
    a = row("dynamic:7", [500, 520, 480])
    b = row("static:3", [530, 510, 505])  # ahead of a in two repeats of three: a tie
    c = row("static:7", [540, 545, 515])  # ahead of b in all three by 1-7%, under 3% median
    assert ranking([a, b]) == ["c=1: dynamic:7 ~ static:3"]  # each pair on its own
    assert ranking([b, c]) == ["c=1: static:3 ~ static:7"]
    assert ranking([a, c]) == ["c=1: dynamic:7 < static:7"]
    # a group keeps the given order; the pair it tells apart follows, slower first
    assert ranking([b, a, c]) == ["c=1: static:3 ~ dynamic:7 ~ static:7 [dynamic:7 < static:7]"]
    assert ranking([row("none", [100, 100, 100]), c, b, a]) == [
        "c=1: none < static:7 ~ static:3 ~ dynamic:7 [dynamic:7 < static:7]"]
    assert "within the noise" not in interpret([a, b, c])[0]  # c against a: told apart


def test_versions_and_assets():
    assert set(versions()) == set(VERSIONS)
    pair = tiny_pair()
    assert pair.target.endswith("tiny-pair/target") and pair.draft_lm.endswith("draft-lm")
    target, drafter, draft_lm, dflash = pair  # also a plain tuple
    from lightspec_jax.checkpoint import DFLASH, drafter_kind

    assert drafter_kind(dflash) == DFLASH


def test_prefill_buckets():
    # one prompt: powers of two from 32 and their midpoints
    assert prefill_buckets(1, 40) == (32, 48, 64)
    assert prefill_buckets(1, 20) == (32,)
    # a wave, capped at 256
    assert prefill_buckets(64, 40) == (32, 48, 64, 96, 128, 192, 256)
    # never below the concurrency; a short prompt's own bucket
    assert prefill_buckets(300, 10) == (16, 24, 32, 48, 64, 96, 128, 192, 256, 300)


def test_ranking_pairs_only_runs_of_one_round():
    """With several drafters serve runs one group of engines at a time: rows from different
    groups share no round, so their repeats are not paired and only disjoint ranges order
    them; rows that share rounds are paired on those rounds alone."""
    def row(policy, repeats, rounds):
        return {"concurrency": 1, "policy": policy, "tok_s": sorted(repeats)[len(repeats) // 2],
                "tok_s_min": min(repeats), "tok_s_max": max(repeats),
                "tok_s_repeats": repeats, "repeat_rounds": rounds}
    # plain decoding runs with both groups; each drafter's policy beats it in its own rounds
    plain = row("none", [300, 227, 200, 190], [0, 1, 2, 3])
    first = row("static:3 @a", [330, 250], [0, 1])
    second = row("static:3 @b", [300, 220], [2, 3])
    assert ranking([plain, first]) == ["c=1: none < static:3 @a"]
    assert ranking([plain, second]) == ["c=1: none < static:3 @b"]
    # different groups, overlapping ranges: a tie
    assert ranking([first, second]) == ["c=1: static:3 @a ~ static:3 @b"]
    # paired by index instead, @a would lead in every repeat
    unrounded = [{k: v for k, v in r.items() if k != "repeat_rounds"} for r in (first, second)]
    assert ranking(unrounded) == ["c=1: static:3 @b < static:3 @a"]


def test_engine_groups_bound_the_engines_alive():
    """serve's engines in groups: plain decoding in each, one drafter's policies per group, at
    most GROUP_ENGINES speculative engines alive at once (a process's memory maps run out
    near 20 engines on a CPU)."""
    plain = ("none", 0, "exact", False, "a")
    spec = [("static", k, v, False, d) for d in ("a", "b") for k in range(1, 6)
            for v in ("exact", "probabilistic")]  # 10 per drafter
    groups = engine_groups([plain] + spec, ["a", "b"])
    assert all(g[0] == plain and len(g) - 1 <= GROUP_ENGINES for g in groups)
    assert all(len({p[4] for p in g[1:]}) == 1 for g in groups)
    assert [p for g in groups for p in g[1:]] == spec  # each once, in order
    assert len(groups) == 4
    assert engine_groups([plain], ["a"]) == [[plain]]
    few = [plain] + spec[:3]
    assert engine_groups(few, ["a"]) == [few]  # one drafter, few policies: one group


def test_settings_name_paths_under_the_working_directory_relative_to_it(tmp_path, monkeypatch):
    """A serve.json kept in a repository names no folder of the machine that wrote it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pair").mkdir()
    args = argparse.Namespace(command="serve", target=str(tmp_path / "pair" / "target"),
                              drafter=["ngram", "pair/drafter", "/elsewhere/dflash"],
                              out="results/run")
    s = settings(args)
    assert s["target"] == "pair/target" and s["out"] == "results/run"
    assert s["drafter"] == ["ngram", "pair/drafter", "/elsewhere/dflash"]
    assert "command" not in s
