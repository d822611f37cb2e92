"""What a placement costs: the bytes each device holds, and the collectives and FLOPs of a
compiled step (measurement only; engine/sharding.py decides the placement).

Used by the runner's `device_bytes()`, the mesh tests (tests/engine/mesh_check.py) and the
benchmarks that plan or compare layouts (benchmarks/tp_plan.py, benchmarks/dp_split.py).
"""

from __future__ import annotations

import re

import jax
import numpy as np


# --- what each device holds -------------------------------------------------------------

def device_bytes(tree) -> dict[int, int]:
    """Bytes of `tree`'s arrays held by each device (device id -> bytes), read from the
    arrays' own shards: what a sharding really costs, replication included."""
    out: dict[int, int] = {}
    for x in jax.tree.leaves(tree):
        for shard in x.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def replicated_bytes(tree) -> int:
    """Bytes of `tree`'s arrays (or ShapeDtypeStructs with a sharding) that every device
    holds whole (fully replicated)."""
    return sum(_nbytes(x.shape, x.dtype) for x in jax.tree.leaves(tree)
               if x.sharding.is_fully_replicated)


def shard_bytes(tree) -> int:
    """Bytes one device holds of `tree`, from each leaf's sharding (its shard shape), for
    ShapeDtypeStructs on an AbstractMesh as for placed arrays: `device_bytes` without the
    arrays. Each device of a NamedSharding holds one shard of that shape, replicas included
    (the sizes divide evenly: MeshLayout.for_target checks it)."""
    return sum(_nbytes(x.sharding.shard_shape(x.shape), x.dtype) for x in jax.tree.leaves(tree))


# --- what the partitioner inserted ------------------------------------------------------

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_HLO_OP = re.compile(r"^\s*(?:ROOT )?%\S+ = (.+?) (" + "|".join(COLLECTIVES)
                     + r")(?:-start)?\(")
_HLO_CALLEE = re.compile(r"(?:calls|body|condition|to_apply)=(%[\w.\-]+)"
                         r"|branch_computations=\{([^}]*)\}")
_HLO_TRIP = re.compile(r"body=(%[\w.\-]+).*\"known_trip_count\":\{\"n\":\"(\d+)\"")


def hlo_collectives(hlo_text: str, *, trip_count: int | None = None) -> dict:
    """Collective ops in a compiled module's HLO text (`compiled.as_text()`: GSPMD inserts
    them when XLA compiles, so StableHLO from `.lower()` or jax.export has none).

    Returns {"module": {op: count}, "loop": {op: count} or None, "shapes": {op: result
    shapes}}: "loop" counts the body of the while loop run `trip_count` times (the target's
    scan over its L layers: per-layer counts), with the computations it calls (a nested
    loop's body counted once); "module" counts each op once wherever it is."""
    bodies: dict[str, list[str]] = {}
    name = None
    for line in hlo_text.splitlines():
        if line.endswith("{") and not line.startswith(" "):
            name = line.split()[1 if line.startswith("ENTRY") else 0]
            bodies[name] = []
        elif line == "}":
            name = None
        elif name is not None:
            bodies[name].append(line)

    def found(lines) -> list[tuple[str, str]]:  # (result shape, op)
        return [m.groups() for line in lines for m in [_HLO_OP.search(line)] if m]

    def count(lines) -> dict[str, int]:
        ops = [op for _, op in found(lines)]
        return {op: ops.count(op) for op in COLLECTIVES}

    loop = None
    for body, n in _HLO_TRIP.findall(hlo_text):
        if trip_count is not None and int(n) == trip_count and body in bodies:
            seen, todo = set(), [body]
            while todo:  # the body and what it calls
                comp = todo.pop()
                if comp not in seen and comp in bodies:
                    seen.add(comp)
                    todo += [c.strip() for line in bodies[comp]
                             for one, many in _HLO_CALLEE.findall(line)
                             for c in (one or many).split(",")]
            loop = count(line for comp in seen for line in bodies[comp])
            break
    lines = hlo_text.splitlines()
    shapes = {op: sorted({shape for shape, o in found(lines) if o == op}) for op in COLLECTIVES}
    return {"module": count(lines), "loop": loop,
            "shapes": {op: v for op, v in shapes.items() if v}}


def step_report(compiled, *, num_layers: int) -> dict:
    """One compiled step (a jax `Compiled`): its collectives (`hlo_collectives`, per layer
    from the scan over the target's `num_layers` layers) and its FLOPs per device (XLA's
    cost analysis of one device's partitioned module; -1 when XLA gives none)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    found = hlo_collectives(compiled.as_text(), trip_count=num_layers)
    return dict(found, flops_per_device=float((cost or {}).get("flops", -1.0)))
