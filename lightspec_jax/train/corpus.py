"""The local training corpus: only files already on this machine, mixed by character budget.

Four sources, each a list of documents (the trainer ends every document with the EOS token):
ShareGPT conversations (a seeded subset, turns joined by blank lines, so a first human turn is
followed by its reply as in the sharegpt workload), HumanEval prompts with their canonical
solutions, Python source files of this interpreter's standard library, and generated math
word problems with worked solutions (the math workload's generator, on its own seed stream).
"""

from __future__ import annotations

import dataclasses
import os
import random
import sysconfig

from lightspec_jax.bench.workloads import (humaneval_problems, math_problems,
                                           sharegpt_conversations)

# Seed offsets keep the corpus's math problems off the stream the math workload samples (seed 0).
_MATH_SEED_OFFSET = 1_000_003


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorpusConfig:
    """Character budgets per source; 0 leaves a source out."""

    sharegpt_chars: int = 7_000_000
    stdlib_chars: int = 5_000_000
    math_chars: int = 3_000_000
    humaneval_repeats: int = 2  # 164 problems are only ~0.1 MB: seen more than once
    # Conversations are cut here (their start is what the sharegpt workload asks for); source
    # files are split into pieces of about this size.
    max_doc_chars: int = 6_000
    seed: int = 0
    sharegpt_path: str | None = None  # a ShareGPT-format JSON instead of the package's


@dataclasses.dataclass(frozen=True)
class Corpus:
    sources: dict[str, list[str]]  # source name -> documents
    documents: list[str]  # every source's documents, interleaved by a seeded shuffle

    def summary(self) -> dict[str, dict[str, int]]:
        return {name: {"documents": len(docs), "chars": sum(map(len, docs))}
                for name, docs in sorted(self.sources.items())}


def build_corpus(cfg: CorpusConfig = CorpusConfig()) -> Corpus:
    rng = random.Random(cfg.seed)
    sources = {}
    if cfg.sharegpt_chars:
        sources["sharegpt"] = _take(_sharegpt_docs(cfg, rng), cfg.sharegpt_chars, cfg.max_doc_chars)
    if cfg.humaneval_repeats:
        docs = [p["prompt"] + p["canonical_solution"] for p in humaneval_problems()]
        sources["humaneval"] = docs * cfg.humaneval_repeats
    if cfg.stdlib_chars:
        chunks = (c for text in _stdlib_docs(rng) for c in _chunks(text, cfg.max_doc_chars))
        sources["stdlib"] = _take(chunks, cfg.stdlib_chars, cfg.max_doc_chars)
    if cfg.math_chars:
        stream = math_problems(cfg.seed + _MATH_SEED_OFFSET)
        sources["math"] = _take((f"{p.question}\n{p.solution}" for p in stream), cfg.math_chars,
                                cfg.max_doc_chars)
    if not sources:
        raise ValueError("every corpus source is switched off (all budgets are 0)")
    mixed = [doc for name in sorted(sources) for doc in sources[name]]
    rng.shuffle(mixed)
    return Corpus(sources, mixed)


def _take(docs, budget: int, max_doc_chars: int) -> list[str]:
    out, used = [], 0
    for doc in docs:
        if used >= budget:
            break
        doc = doc[:max_doc_chars]
        out.append(doc)
        used += len(doc)
    return out


def _chunks(text: str, size: int):
    """Whole lines, about `size` characters a piece: a long module becomes several documents
    rather than losing its tail."""
    piece, used = [], 0
    for line in text.splitlines(keepends=True):
        if used and used + len(line) > size:
            yield "".join(piece)
            piece, used = [], 0
        piece.append(line)
        used += len(line)
    if piece:
        yield "".join(piece)


def _sharegpt_docs(cfg: CorpusConfig, rng: random.Random):
    conversations = sharegpt_conversations(cfg.sharegpt_path)
    order = list(range(len(conversations)))
    rng.shuffle(order)
    for i in order:
        turns = [text.strip() for _, text in conversations[i] if text.strip()]
        if len(turns) >= 2:
            yield "\n\n".join(turns)


def stdlib_files() -> list[str]:
    """Python files of this interpreter's standard library, tests and site-packages excluded."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in ("test", "tests", "idle_test", "site-packages",
                                          "__pycache__") and not d.startswith("lib2to3"))
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    if not out:
        raise FileNotFoundError(f"no Python files under the standard library at {root}: this "
                                "interpreter ships without its sources; set stdlib_chars=0")
    return out


def _stdlib_docs(rng: random.Random):
    files = stdlib_files()
    rng.shuffle(files)
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            yield text
