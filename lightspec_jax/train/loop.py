"""The optimisation loop both trainers share: AdamW with warmup + cosine decay, one jitted step
over the split parameter state, periodic resumable checkpoints, a tqdm progress bar."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    steps: int
    learning_rate: float = 1e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # the cosine ends at learning_rate * min_lr_ratio
    weight_decay: float = 0.1
    grad_clip: float = 1.0

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a positive int, got {self.steps!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    warmup = min(cfg.warmup_steps, max(cfg.steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=warmup,
        decay_steps=max(cfg.steps, warmup + 1), end_value=cfg.learning_rate * cfg.min_lr_ratio)
    # No decay on norm weights and other vectors (the usual GPT recipe).
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                       optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay,
                                   mask=decay_mask))


@dataclasses.dataclass
class TrainLog:
    losses: list[float] = dataclasses.field(default_factory=list)  # per step
    metrics: list[dict[str, float]] = dataclasses.field(default_factory=list)  # per step
    seconds: float = 0.0  # wall time of the steps run (all sessions when resumed)

    def final(self, window: int = 20) -> dict[str, float]:
        """Means over the last `window` steps: the loss and every metric."""
        tail = slice(-window, None)
        out = {"loss": float(np.mean(self.losses[tail]))} if self.losses else {}
        for key in (self.metrics[-1] if self.metrics else {}):
            out[key] = float(np.mean([m[key] for m in self.metrics[tail]]))
        return out


def run(params, loss_fn: Callable[[Any, Any], tuple[jax.Array, dict]], batch_fn: Callable[[int], Any],
        cfg: OptimConfig, *, checkpoint: str | None = None, checkpoint_every: int = 100,
        desc: str = "train", progress: bool = True) -> tuple[Any, TrainLog]:
    """Minimises loss_fn(params, batch) -> (loss, metrics) over cfg.steps steps.

    batch_fn(step) must be deterministic in `step`: with `checkpoint` (a .npz path) the run
    resumes from the last saved step and sees the same batches it would have seen.
    """
    optimizer = make_optimizer(cfg)
    opt_state = optimizer.init(params)
    log, start = TrainLog(), 0
    if checkpoint and os.path.isfile(checkpoint):
        (params, opt_state), log, start = _restore(checkpoint, (params, opt_state))

    @jax.jit
    def step_fn(params, opt_state, batch):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, metrics

    from tqdm.auto import tqdm

    bar = tqdm(total=cfg.steps, initial=start, desc=desc, disable=not progress, mininterval=2.0)
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        params, opt_state, loss, metrics = step_fn(params, opt_state, batch_fn(step))
        loss = float(loss)  # the host sync: one step in flight is plenty on a CPU
        if not np.isfinite(loss):
            raise FloatingPointError(f"{desc}: loss became {loss} at step {step}; lower the "
                                     f"learning rate (now {cfg.learning_rate})")
        log.losses.append(loss)
        log.metrics.append({k: float(v) for k, v in metrics.items()})
        log.seconds += time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean(log.losses[-20:]):.3f}", refresh=False)
        done = step + 1
        if checkpoint and (done % checkpoint_every == 0 or done == cfg.steps):
            _save(checkpoint, (params, opt_state), log, done)
    bar.close()
    return params, log


def _save(path: str, state, log: TrainLog, step: int) -> None:
    leaves = jax.tree.leaves(state)
    tmp = path + ".tmp.npz"
    np.savez(tmp, *[np.asarray(x) for x in leaves],
             meta=np.asarray(json.dumps({"step": step, "log": dataclasses.asdict(log)})))
    os.replace(tmp, path)


def _restore(path: str, like):
    """State saved by _save, rebuilt into the structure of `like` (same model, same optimizer)."""
    leaves, treedef = jax.tree.flatten(like)
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        saved = [data[f"arr_{i}"] for i in range(len(data.files) - 1)]
    if len(saved) != len(leaves) or any(a.shape != b.shape for a, b in zip(saved, leaves)):
        raise ValueError(f"{path} holds the state of a different model or optimizer; delete it "
                         "or pick another work directory to start afresh")
    state = jax.tree.unflatten(treedef, [jnp.asarray(a, b.dtype) for a, b in zip(saved, leaves)])
    return state, TrainLog(**meta["log"]), meta["step"]
