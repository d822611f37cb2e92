"""Every ```python block of README.md runs as written, from the repository root, on the CPU.

Conventions the README follows:
  - The blocks run top to bottom in one fresh interpreter with one shared namespace (as a reader
    pastes them into one session): a later block may use names an earlier block defined.
  - `<!-- no-run -->` on the line right before a block's opening fence leaves it out (for
    blocks that need a GPU or a real checkpoint).
  - A block that still names a `path/to/` placeholder is skipped with that reason; so is a
    later block that fails only for a name a skipped block would have defined.
Each block is one test; the whole README runs once, in a subprocess with a timeout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TIMEOUT_S = 600  # the whole README; a block that hangs fails the run, not the suite
NO_RUN = re.compile(r"^\s*<!--\s*no-run\b.*-->\s*$")
PLACEHOLDER = "path/to/"


def python_blocks(text: str) -> list[dict]:
    """[{line, code, no_run}] for each ```python fence (line: 1-based line of the fence)."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(```+|~~~+)\s*python\s*$", lines[i])
        if not fence:
            i += 1
            continue
        indent, marker = fence.group(1), fence.group(2)
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        blocks.append({"line": start + 1, "code": "\n".join(body) + "\n",
                       "no_run": start > 0 and bool(NO_RUN.match(lines[start - 1]))})
        i += 1
    return blocks


# Runs in the subprocess: each block exec'd in one namespace; one JSON record per block.
_RUNNER = textwrap.dedent("""
    import json, sys, time, traceback
    blocks, out = json.load(open(sys.argv[1])), sys.argv[2]
    namespace, results = {"__name__": "__main__"}, []
    for b in blocks:
        if b["skip"]:
            results.append({"status": "skipped"})
            continue
        print(f"----- README.md line {b['line']} -----", flush=True)
        start = time.perf_counter()
        try:
            exec(compile(b["code"], f"README.md:{b['line']}", "exec"), namespace)
            results.append({"status": "ok", "seconds": time.perf_counter() - start})
        except BaseException as e:
            results.append({"status": "error", "name_error": isinstance(e, NameError),
                            "traceback": traceback.format_exc()})
        json.dump(results, open(out, "w"))
    json.dump(results, open(out, "w"))
""")

BLOCKS = python_blocks(README.read_text(encoding="utf-8")) if README.exists() else []


def _skip_reason(block: dict) -> str | None:
    if block["no_run"]:
        return "marked <!-- no-run -->"
    if PLACEHOLDER in block["code"]:
        return (f"uses a {PLACEHOLDER} placeholder; point it at the shipped pair "
                "(lightspec_jax.assets.tiny_pair()) or mark it <!-- no-run -->")
    return None


def run_blocks(blocks: list[dict], tmp: Path, *, timeout: float = TIMEOUT_S) -> dict:
    """Runs the blocks without a skip reason in one subprocess, from the repository root."""
    payload = [{**b, "skip": _skip_reason(b) is not None} for b in blocks]
    (tmp / "blocks.json").write_text(json.dumps(payload))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    try:
        proc = subprocess.run([sys.executable, "-c", _RUNNER, str(tmp / "blocks.json"),
                               str(tmp / "results.json")], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        output, timed_out = proc.stdout + proc.stderr, False
    except subprocess.TimeoutExpired as e:
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                         for x in (e.stdout or b"", e.stderr or b""))
        timed_out = True
    path = tmp / "results.json"
    results = json.loads(path.read_text()) if path.exists() else []
    return {"results": results, "output": output, "timed_out": timed_out}


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory) -> dict:
    return run_blocks(BLOCKS, tmp_path_factory.mktemp("readme"))


def test_readme_has_python_blocks():
    assert BLOCKS, f"no ```python blocks found in {README}"


@pytest.mark.parametrize("index", range(len(BLOCKS)),
                         ids=[f"README.md:{b['line']}" for b in BLOCKS])
def test_readme_block_runs(index, readme_run):
    block = BLOCKS[index]
    reason = _skip_reason(block)
    if reason:
        pytest.skip(reason)
    results = readme_run["results"]
    where = f"README.md line {block['line']}"
    if index >= len(results):
        pytest.fail(f"{where} never finished ("
                    f"{'timed out after %d s' % TIMEOUT_S if readme_run['timed_out'] else 'the run died'})"
                    f"; output:\n{readme_run['output'][-4000:]}")
    result = results[index]
    if result["status"] == "error":
        skipped = [b["line"] for b in BLOCKS[:index] if _skip_reason(b)]
        if result["name_error"] and skipped:
            pytest.skip(f"uses a name that the skipped block(s) at line(s) {skipped} define")
        pytest.fail(f"{where} raised:\n{result['traceback']}\noutput:\n"
                    f"{readme_run['output'][-4000:]}")


def test_block_extraction_and_runner(tmp_path):
    """The conventions above, on a made-up README."""
    text = ("# t\n```python\nx = 41\n```\n<!-- no-run -->\n```python\nraise SystemExit(3)\n```\n"
            "```bash\necho no\n```\n```python\nprint(x + 1)\nimport nowhere_at_all\n```\n"
            "```python\nopen('path/to/model')\n```\n")
    blocks = python_blocks(text)
    assert [(b["line"], b["no_run"]) for b in blocks] == [(2, False), (6, True), (12, False),
                                                          (16, False)]
    assert [_skip_reason(b) is not None for b in blocks] == [False, True, False, True]
    run = run_blocks(blocks, tmp_path, timeout=60)
    assert [r["status"] for r in run["results"]] == ["ok", "skipped", "error", "skipped"]
    assert "42" in run["output"]  # the namespace is shared: block 3 saw block 1's x
    assert "nowhere_at_all" in run["results"][2]["traceback"]
