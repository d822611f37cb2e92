"""Multi-host serving (engine/multihost.py), tried on one machine: two processes joined by
jax.distributed.initialize() with one CPU device each (multihost_check.py) serve the
same scenarios; each checks what it can alone, and here their outputs and plans must agree
- a plan that differed between the processes would have hung the job instead."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_check.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multidevice
def test_two_processes_serve_as_one_device():
    # The suite's XLA flags (conftest.py) without a forced device count: each process has one.
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(flags))
    port = str(_free_port())
    # A process that hangs in a collective (the other never joined) exits by itself after
    # --deadline seconds with its threads' tracebacks on stderr.
    procs = [subprocess.Popen([sys.executable, CHECK, "--process-id", str(i), "--port", port,
                               "--deadline", "600"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in (0, 1)]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=900)
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            proc.kill()
    summaries = []
    for i, (rc, out, err) in enumerate(results):
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"process {i} printed no summary (rc {rc}):\n{out[-2000:]}\n{err[-6000:]}"
        summary = json.loads(lines[-1])
        assert summary["failures"] == [], (i, summary["failures"])
        assert rc == 0, err[-6000:]
        summaries.append(summary)
    lead, follow = summaries
    assert (lead["devices"], lead["local_devices"]) == (2, 1)
    assert set(lead["served"]) == {"dp2/plain", "dp2/static", "dp2/dynamic", "dp2/dspark",
                                   "tp2/dynamic-timed"}
    for name, cases in lead["served"].items():
        # The same tokens, finish reasons, plans and verified rows per slot, step for step.
        assert follow["served"][name] == cases, name
        assert all(out for out, _ in cases), name
