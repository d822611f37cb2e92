"""Closed-loop serving simulation: any planner, or an oracle, on a synthetic workload.

    python -m lightspec_jax.planner.sim.simulate --all        # the tables in simulate.md
    python -m lightspec_jax.planner.sim.simulate --profiles chat --concurrency 256 --json out.json

(the command line lives in planner/sim/cli.py; this module is the simulation itself)

C requests are in flight; a finished request is replaced at once by the next (request rate
infinite, ignore-EOS fixed output lengths, as `vllm bench serve --max-concurrency C`). Each step:

  admit    new requests are prefilled inside the step (their compute is charged); the drafter
           proposes for them at prefill, as Eagle3 engines do (`--no-draft-at-prefill`: not)
  plan     planner.plan(step i, remaining=each request's allowance), THEN planner.observe(step
           i-1) and observe_host(step i-1): statistics arrive one step late, as with overlapped
           scheduling (lightspec-algorithm.md §9). The remaining allowances are exact here (the
           engine's lag one step under overlap and subtract the token in flight)
  accept   the workload profile draws, per request and position, whether drafts match and the
           drafter's confidences (planner/synthetic.py)
  fill     the device's choice (planner/fill.py): the top u - N draft rows by prefix survival
           of clipped confidences (every request keeps its target row), deterministic tie order;
           as in the engine, a proposal is cut at remaining - 1 drafts before the fill, so no
           row is verified past a request's end
  commit   accept_len = min(accepted, verified) + 1; `wasted_tokens` counts any committed past
           the request's output length (none, by the cut: the metric is a check)
  cost     device: target(bucket) + the draft run at the next depth (its first forward over the
           bucket, then one forward over N per further depth; depth 0, the floor, runs none:
           the engine's floor step only writes the drafter's cache) + prefill; host: host_ms(N). The step's wall time is max(device, host)
           (overlapped loop) or device + host (`--no-overlap`); `--no-host-cost` sets host to 0.
           2% log-normal noise on each measured time; the planners see these times: target and
           draft through observe(), host through observe_host() (on decode-only steps, as the
           engine), and start from tables profiled on the same cost model
  floor    the dynamic planner is offered depth 0 (PlannerSpec(floor=True)), as the engine does
           with autoregressive drafters; static and DSpark-style are not. After a depth-0 step
           no request holds a proposal (num_with_proposal 0 on the next plan)
  bounds   the oracle knows how many drafts of each request will be accepted; the informed
           oracle only each request's acceptance probabilities this step (oracle.py)
  reuse    the dynamic planner reuses its decisions as a serving engine's does (SERVING_REUSE),
           which, with the loop overlapped, it does only where the host's time is not hidden
           (LightSpecOptions.hidden_host_share); `dynamic-every-step` decides every step

Metrics cover the saturated phase only: steps that start while requests are still queued, so
every slot that frees is refilled and the batch holds C requests. The drain at the end (the
last, longest requests running at ever lower concurrency) is excluded: with a few hundred
requests it would otherwise dominate low-concurrency results; its totals are in `extra`.
Throughput counts every output token (the prefill's first token included) over simulated time.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from .. import make_planner
from ..fill import fill_lengths, survival_scores
from ..synthetic import PROFILES, AcceptanceModel
from ..types import PlannerSpec, StepObservation, geometric_buckets
from .costmodel import RooflineCostModel, profile_host, profile_tables
from .oracle import InformedOracle, Oracle
from .policies import POLICIES


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    profile: str
    concurrency: int
    policy: str
    num_requests: int
    seed: int = 0
    steps_per_octave: int = 4  # verify buckets: geometric_buckets(C (K+1), steps_per_octave)
    draft_at_prefill: bool = True
    timing_noise: float = 0.02
    host_cost: bool = True  # charge the cost model's host time (False: host 0, device only)
    overlap: bool = True  # a step costs max(device, host); False: device + host


@dataclass(kw_only=True)
class RunResult:
    profile: str
    concurrency: int
    policy: str
    label: str
    seed: int = 0
    output_tokens: int = 0
    time_ms: float = 0.0
    steps: int = 0
    request_steps: int = 0  # sum over steps of N
    committed: int = 0  # accept_len summed (bonus included)
    wasted_tokens: int = 0  # accepted past a request's end (0: the fill never verifies there)
    host_bound_steps: int = 0  # steps whose host time exceeded their device time
    accepted_drafts: int = 0
    verified_drafts: int = 0
    fill_rows: int = 0  # real verified rows, target rows included
    bucket_rows: int = 0  # compiled rows run, padding included
    draft_depth_sum: int = 0
    probes: int = 0
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Output tokens per second of simulated time."""
        return 1000.0 * self.output_tokens / self.time_ms if self.time_ms else 0.0

    @property
    def acceptance_length(self) -> float:
        return self.committed / self.request_steps if self.request_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_drafts / self.verified_drafts if self.verified_drafts else 0.0

    @property
    def rows_per_request_step(self) -> float:
        return self.fill_rows / self.request_steps if self.request_steps else 0.0

    def summary(self) -> dict:
        out = asdict(self)
        out.update(throughput=self.throughput, acceptance_length=self.acceptance_length,
                   acceptance_rate=self.acceptance_rate,
                   rows_per_request_step=self.rows_per_request_step)
        return out


def run(config: SimConfig, cost_model=None, trace: list | None = None) -> RunResult:
    """Simulate one (profile, concurrency, policy) to completion of config.num_requests.

    trace: if a list, one dict per step is appended (N, rows, bucket, depths, tokens, ms).
    """
    wall = time.perf_counter()
    cost = cost_model or RooflineCostModel()
    policy = POLICIES[config.policy]
    model = AcceptanceModel.calibrated(config.profile)
    k = policy.max_depth
    c = config.concurrency
    spec = PlannerSpec(verify_buckets=geometric_buckets(c * (k + 1),
                                                        steps_per_octave=config.steps_per_octave),
                       draft_depths=tuple(range(1, k + 1)), max_depth=k,
                       floor=policy.offers_floor)
    planner = oracle = None
    if policy.kind == "oracle":
        oracle = Oracle(spec, cost, host=config.host_cost, overlap=config.overlap)
    elif policy.kind == "informed":
        oracle = InformedOracle(spec, cost, model=model, slots=c, host=config.host_cost,
                                overlap=config.overlap, **dict(policy.options))
    else:
        target, draft = profile_tables(cost, spec.verify_buckets)
        host = profile_host(cost, range(1, c + 1)) if config.host_cost else None
        planner = make_planner(policy.kind, spec, target_costs=target, draft_costs=draft,
                               host_costs=host, overlap=config.overlap, **dict(policy.options))
    prompts, outputs, quality, drift0 = requests_for(config)  # [R] each
    profile_index = sorted(PROFILES).index(config.profile)
    rng = np.random.default_rng([config.seed, 2, profile_index, c])
    # Host timing noise draws from its own stream, so runs with and without host cost see the
    # same acceptance draws and differ by the host cost alone.
    host_rng = np.random.default_rng([config.seed, 3, profile_index, c])
    res = RunResult(profile=config.profile, concurrency=c, policy=config.policy,
                    label=policy.label, seed=config.seed)

    slot_req = np.full(c, -1)  # request id held by each slot, -1 free
    generated = np.zeros(c, dtype=np.int64)
    drift = np.zeros(c)
    has_proposal = np.zeros(c, dtype=bool)
    next_req = 0
    # Whether the drafter proposes after the latest step: not before the first plan, nor after
    # a floor step. The oracle picks its depth in hindsight, so it always has a proposal.
    drafting = False
    pending, pending_host, stale_conf = None, None, None
    # Whole-step periods as the engine reports them: the draft before a verify, then it.
    pending_period, last_draft_ms = None, None
    last_depth = 0  # the depth the last step planned to draft (the proposal verified next)
    drain = RunResult(profile=config.profile, concurrency=c, policy=config.policy,
                      label=policy.label)
    while True:
        queued = next_req < config.num_requests
        acc = res if queued else drain  # where this step's metrics go
        prefill_ms = 0.0
        free = np.flatnonzero(slot_req < 0)[:config.num_requests - next_req]
        if free.size:
            ids = np.arange(next_req, next_req + free.size)
            next_req += free.size
            slot_req[free], drift[free] = ids, drift0[ids]
            if policy.kind == "informed":
                oracle.admit(free)
            generated[free] = 1  # prefill emits the first token
            has_proposal[free] = config.draft_at_prefill and drafting
            acc.output_tokens += free.size
            prefill_ms = sum(cost.prefill_ms(int(p)) for p in prompts[ids])
            done = generated[free] >= outputs[ids]
            slot_req[free[done]] = -1
        idx = np.flatnonzero(slot_req >= 0)  # [N] active slots
        if idx.size == 0:
            if next_req >= config.num_requests:
                break
            continue
        ids = slot_req[idx]
        n = idx.size
        m = int(has_proposal[idx].sum())
        context = float((prompts[ids] + generated[idx]).sum())
        remaining = outputs[ids] - generated[idx]  # [N] >= 1
        before = drift[idx]  # [N] the drift a step ago (an informed oracle may know it)
        drift[idx], potential, conf = model.step(rng, quality[ids], drift[idx], k)
        # The proposal's real depth: the last draft may have stopped short (draft_stop). Its
        # forwards saved are credited to this step (priced at this batch).
        n_bucket = spec.bucket_for(n)
        proposal_depth = stopped_depth(conf, has_proposal[idx], last_depth, policy.draft_stop)
        stopped = proposal_depth < last_depth
        saved_ms = ((last_depth - proposal_depth) * cost.draft_ms(n_bucket, context, n)
                    if stopped else 0.0)

        if oracle is not None:
            room = np.where(has_proposal[idx], remaining - 1, 0)  # [N] drafts of use
            if policy.kind == "oracle":
                known = np.minimum(potential, room)  # the drafts that will be accepted
            else:  # acceptance probabilities, not the draws
                known = oracle.survival(idx, quality[ids], before, drift[idx], room)  # [N, K]
            depth, bucket, verified = oracle.choose(known, context=context)
            draft_depth = depth
            if policy.kind == "informed":
                oracle.learn(idx, verified, np.minimum(potential, verified))
        else:
            plan = planner.plan(num_requests=n, num_with_proposal=m, confidences=stale_conf,
                                context_len=context, remaining=remaining)
            if pending is not None:
                planner.observe(pending)
            if pending_host is not None:
                planner.observe_host(num_requests=pending_host[0], host_ms=pending_host[1],
                                     drafted=pending_host[2])
            if pending_period is not None:
                planner.observe_period(plan=pending_period[0], period_ms=pending_period[1])
            verify_depth = (min(plan.verified_depth, proposal_depth) if stopped
                            else plan.verified_depth)
            verified = _fill(conf, has_proposal[idx], verify_depth, plan.fill_rows - n,
                             remaining)
            bucket, draft_depth = plan.verify_rows, plan.draft_depth
            acc.probes += plan.probe
        fill = n + int(verified.sum())  # real rows (the plan's budget may exceed the proposals)
        accept = np.minimum(potential, verified) + 1  # [N] bonus included
        committed = np.minimum(accept, remaining)

        noise = np.exp(config.timing_noise * rng.standard_normal(2))
        target_ms = cost.target_ms(bucket, context, n) * noise[0]
        draft_ms = 0.0  # the floor (depth 0) runs no drafter forward
        if draft_depth > 0:
            draft_ms = (cost.draft_ms(bucket, context, n)
                        + (draft_depth - 1) * cost.draft_ms(n_bucket, context, n)) * noise[1]
        host_ms = 0.0
        if config.host_cost:
            host_ms = cost.host_ms(n) * float(np.exp(config.timing_noise
                                                     * host_rng.standard_normal()))
        device_ms = target_ms + draft_ms + prefill_ms - saved_ms
        step_ms = max(device_ms, host_ms) if config.overlap else device_ms + host_ms
        if planner is not None:
            pending = StepObservation(plan=plan, accept_lens=accept, target_ms=target_ms,
                                      draft_ms=draft_ms, context_len=int(context),
                                      verify_lens=verified + 1,
                                      had_proposal=has_proposal[idx].copy())
            # The engine refreshes host costs from decode-only steps (prefill changes the work).
            pending_host = ((n, host_ms, draft_depth > 0) if config.host_cost and not free.size
                            else None)
            # Between two decode-only read-backs the device ran the previous step's drafting
            # and this step's verify (and the host its loop).
            pending_period = None
            if not free.size and last_draft_ms is not None:
                device = target_ms + last_draft_ms - saved_ms
                pending_period = (plan, max(device, host_ms) if config.overlap
                                  else device + host_ms)
            last_draft_ms = None if free.size else draft_ms
            stale_conf = conf  # DSpark-style reads last step's confidences (host lag)
        else:
            decode_ms = target_ms + draft_ms
            oracle.account(float(committed.sum()), max(decode_ms, host_ms) if config.overlap
                           else decode_ms + host_ms)

        if trace is not None:
            trace.append(dict(n=n, m=m, fill=fill, bucket=bucket, draft_depth=draft_depth,
                              proposal_depth=proposal_depth, saved_ms=saved_ms,
                              verified=verified.copy(), accept=accept.copy(),
                              remaining=remaining.copy(), committed=int(committed.sum()),
                              step_ms=step_ms, device_ms=device_ms, host_ms=host_ms,
                              prefill_ms=prefill_ms, admitted=int(free.size)))
        acc.time_ms += step_ms
        acc.steps += 1
        acc.request_steps += n
        acc.output_tokens += int(committed.sum())
        acc.committed += int(accept.sum())
        acc.wasted_tokens += int((accept - committed).sum())
        acc.host_bound_steps += int(host_ms > device_ms)
        acc.accepted_drafts += int((accept - 1).sum())
        acc.verified_drafts += int(verified.sum())
        acc.fill_rows += fill
        acc.bucket_rows += bucket
        acc.draft_depth_sum += draft_depth
        generated[idx] += committed
        last_depth = draft_depth
        drafting = oracle is not None or draft_depth > 0
        has_proposal[idx] = drafting
        finished = idx[generated[idx] >= outputs[ids]]
        slot_req[finished] = -1
    res.wall_s = time.perf_counter() - wall
    res.extra.update(drain_steps=drain.steps, drain_time_ms=drain.time_ms,
                     whole_run_throughput=1000.0 * (res.output_tokens + drain.output_tokens)
                     / (res.time_ms + drain.time_ms))
    return res


def pooled(summaries: list[dict]) -> dict:
    """One cell's runs under several seeds (RunResult.summary() each) as one run: counters
    summed, so its throughput is every seed's output tokens over every seed's simulated time.
    extra["seeds"] lists the seeds and extra["seed_throughput"] each one's throughput, in
    that order; extra["whole_run_throughput"] is their mean."""
    first = summaries[0]
    if len(summaries) == 1:
        return first
    cell = ("profile", "concurrency", "policy", "label")
    if any(tuple(s[k] for k in cell) != tuple(first[k] for k in cell) for s in summaries):
        raise ValueError("pooled() takes runs of one (profile, concurrency, policy) cell")
    counters = [f.name for f in fields(RunResult) if f.name not in (*cell, "seed", "extra")]
    res = RunResult(**{k: first[k] for k in cell}, seed=first["seed"],
                    **{k: sum(s[k] for s in summaries) for k in counters})
    res.extra.update(
        seeds=[s["seed"] for s in summaries],
        seed_throughput=[s["throughput"] for s in summaries],
        drain_steps=sum(s["extra"]["drain_steps"] for s in summaries),
        drain_time_ms=sum(s["extra"]["drain_time_ms"] for s in summaries),
        whole_run_throughput=float(np.mean([s["extra"]["whole_run_throughput"]
                                            for s in summaries])))
    return res.summary()


def requests_for(config: SimConfig) -> tuple[np.ndarray, ...]:
    """(prompt_len, output_len, quality, initial drift), each [R], for a run's requests.

    They depend on (seed, profile) only, so every policy and concurrency serves the same ones.
    """
    model = AcceptanceModel.calibrated(config.profile)
    rng = np.random.default_rng([config.seed, 1, sorted(PROFILES).index(config.profile)])
    prompts, outputs, quality = model.new_requests(rng, config.num_requests)
    return prompts, outputs, quality, model.initial_drift(rng, config.num_requests)


def stopped_depth(conf: np.ndarray, has_proposal: np.ndarray, depth: int, stop: float) -> int:
    """Forwards a draft loop planned at `depth` runs when it stops once no request's prefix
    survival at the position just drafted reaches `stop` (Policy.draft_stop; 0: `depth`).
    conf: [N, K] the proposal's confidences; has_proposal: [N] the requests it drafts for."""
    if stop <= 0.0 or depth == 0 or not has_proposal.any():
        return depth
    drafted = conf[has_proposal, :depth]  # [M, depth]
    best = survival_scores(drafted, np.full(drafted.shape[0], depth)).max(axis=0)  # [depth]
    below = np.flatnonzero(best < stop)
    return int(below[0]) + 1 if below.size else depth


def _fill(conf: np.ndarray, has_proposal: np.ndarray, depth: int, budget: int,
          remaining: np.ndarray | None = None) -> np.ndarray:
    """Device fill: verified drafts per request [N] when `budget` draft rows go to requests
    with a proposal of `depth` (the rule in planner/fill.py), each proposal first cut at its
    request's remaining - 1 drafts (remaining: [N] tokens each may still emit), as the engine
    cuts it: a request commits at most `remaining` tokens, its bonus included."""
    proposal_len = np.where(has_proposal, depth, 0)  # [N]
    if remaining is not None:
        proposal_len = np.minimum(proposal_len, remaining - 1)
    return fill_lengths(conf[:, :depth], proposal_len, budget)


def default_requests(concurrency: int) -> int:
    """Enough requests for several generations of the batch, and >= 32 at low concurrency."""
    return max(4 * concurrency, 32)


if __name__ == "__main__":  # python -m lightspec_jax.planner.sim.simulate
    from .cli import main

    sys.exit(main())
