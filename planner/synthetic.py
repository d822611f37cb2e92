"""Synthetic workloads: request lengths, per-position acceptance, drafter confidences.

Not part of the runtime planner. Two benchmark tools draw from it: the simulator (planner/sim)
and the engine's SyntheticAcceptance verifier (lightspec_jax/engine/verifier.py), which gives
benchmarks of untrained models realistic acceptance. It sits beside the simulator, not inside
it, so that serving code never imports the simulator.

Acceptance model (logit space). Request r at step t proposes draft position j = 1..K with
conditional acceptance probability sigmoid(l), l = m_r + z_{r,t} + beta_j + sigma_tok * eps:
  m_r     request quality, N(mu, sigma_req^2), fixed for the request;
  z_{r,t} drift, AR(1) with coefficient rho and stationary sd sigma_drift (easy and hard
          stretches of text: acceptance is correlated within a step and over time);
  beta_j  depth offset, slope * min(j-1, 6) / 6: DSpark (arXiv 2607.05147) reports Eagle3's
          conditional acceptance *rising* along a chat block, 0.53 -> 0.74 (Qwen3-4B). Beyond
          position 7, where no figure exists, it is held flat;
  eps     token noise, iid N(0, 1).
A chain proposal survives to depth j if positions 1..j are all accepted.

Calibration (public figures, peers.md §2): `slope` is solved on the chat profile so that the
model's conditional acceptance rises by 0.74 - 0.53 = 0.21 from position 1 to 7; then each
profile's `mu` is solved so the acceptance length at K=7 (bonus included) equals DSpark
Table 1's Qwen3-14B Eagle3 figures at T=1, averaged over the benchmarks of its kind. Both are
solved by bisection on exact Gauss-Hermite expectations, so no Monte Carlo noise enters.
sigma_req, sigma_drift, rho and sigma_tok are not pinned by any public figure; they are
assumptions, stated here and in the report.

Confidences (the drafter's top-1 probabilities, which the device fill ranks rows by) are
informative but miscalibrated: c = sigmoid(gain * (l + noise * eta) + bias), eta ~ N(0, 1).
With gain < 1 and bias > 0 they are overconfident on hard tokens and underconfident on easy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(40)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()  # expectation over N(0, 1)
_CHAT_RISE = 0.74 - 0.53  # DSpark: Eagle3 conditional acceptance, chat, position 1 -> 7


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """Log-normal token count clipped to [lo, hi]."""

    median: float
    sigma: float
    lo: int
    hi: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.lognormal(np.log(self.median), self.sigma, size=n)  # [n]
        return np.clip(np.round(x), self.lo, self.hi).astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class WorkloadProfile:
    name: str
    tau7: float  # target acceptance length at K=7, bonus included
    tau7_source: str
    prompt: LengthDist
    output: LengthDist
    max_total: int = 2048  # prompt + output, as vLLM's ShareGPT filter (<= 2048)
    request_sigma: float = 0.6
    drift_sigma: float = 0.6
    drift_rho: float = 0.9
    token_sigma: float = 1.2
    conf_gain: float = 0.7
    conf_bias: float = 0.7
    conf_noise: float = 0.8


# Length distributions approximate the datasets behind the acceptance figures (ShareGPT/MT-Bench
# chat turns, HumanEval/MBPP solutions, GSM8K/MATH worked answers); they are assumptions, not
# fits to data we hold.
PROFILES: dict[str, WorkloadProfile] = {
    "chat": WorkloadProfile(
        name="chat", tau7=(2.62 + 2.47 + 2.48) / 3,
        tau7_source="DSpark Table 1, Qwen3-14B Eagle3, mean of MT-Bench/Alpaca/Arena-Hard",
        prompt=LengthDist(median=170, sigma=1.0, lo=4, hi=1024),
        output=LengthDist(median=230, sigma=0.8, lo=4, hi=2044)),
    "code": WorkloadProfile(
        name="code", tau7=(3.81 + 4.14 + 4.01) / 3,
        tau7_source="DSpark Table 1, Qwen3-14B Eagle3, mean of MBPP/HumanEval/LiveCodeBench",
        prompt=LengthDist(median=130, sigma=0.6, lo=4, hi=1024),
        output=LengthDist(median=300, sigma=0.6, lo=4, hi=2044)),
    "math": WorkloadProfile(
        name="math", tau7=(5.24 + 4.60 + 3.71) / 3,
        tau7_source="DSpark Table 1, Qwen3-14B Eagle3, mean of GSM8K/MATH/AIME25",
        prompt=LengthDist(median=90, sigma=0.5, lo=4, hi=1024),
        output=LengthDist(median=380, sigma=0.6, lo=4, hi=2044)),
}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def depth_offsets(slope: float, max_depth: int) -> np.ndarray:
    """beta_j for j = 1..max_depth: [K] logits, rising linearly to position 7, then flat."""
    j = np.arange(1, max_depth + 1)
    return slope * np.minimum(j - 1, 6) / 6.0


def survival_curve(profile: WorkloadProfile, mu: float, slope: float, max_depth: int
                   ) -> np.ndarray:
    """P(accept_len > j), j = 1..max_depth ([K]), over verify steps, by quadrature.

    Averaged over steps, not requests: a request with low quality m takes more steps for the
    same output, so its steps weigh 1/tau(m) more — the same way a measured acceptance length
    (total tokens / total steps) weighs them. The weighting assumes every step verifies
    max_depth drafts.
    """
    m = mu + profile.request_sigma * _NODES  # [Q] request quality
    u = m[:, None] + profile.drift_sigma * _NODES[None, :]  # [Q, Q] step latent
    x = u[..., None] + depth_offsets(slope, max_depth)  # [Q, Q, K]
    g = np.interp(x, _G_GRID, _token_acceptance(profile.token_sigma))  # P(accept j | latent)
    per_request = np.einsum("qzk,z->qk", np.cumprod(g, axis=2), _WEIGHTS)  # [Q, K]
    weight = _WEIGHTS / (1.0 + per_request.sum(axis=1))  # [Q] steps per token of request q
    return weight @ per_request / weight.sum()  # [K]


_G_GRID = np.linspace(-30.0, 30.0, 6001)


@functools.lru_cache(maxsize=None)
def _token_acceptance(token_sigma: float) -> np.ndarray:
    """E_eps[sigmoid(x + token_sigma * eps)] on _G_GRID: the acceptance of one draft token
    whose logit before token noise is x."""
    return _sigmoid(_G_GRID[:, None] + token_sigma * _NODES[None, :]) @ _WEIGHTS


def _bisect(f, lo: float, hi: float, target: float, iters: int = 60) -> float:
    """x in [lo, hi] with f(x) = target for increasing f."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _solve_mu(profile: WorkloadProfile, slope: float) -> float:
    return _bisect(lambda mu: 1.0 + survival_curve(profile, mu, slope, 7).sum(), -8.0, 8.0,
                   profile.tau7)


def _conditional_rise(profile: WorkloadProfile, slope: float) -> float:
    s = survival_curve(profile, _solve_mu(profile, slope), slope, 7)
    return s[6] / s[5] - s[0]


@functools.lru_cache(maxsize=None)
def calibrated_slope() -> float:
    """Depth slope that reproduces the chat conditional-acceptance rise (DSpark, Eagle3)."""
    return _bisect(lambda b: _conditional_rise(PROFILES["chat"], b), -4.0, 6.0, _CHAT_RISE,
                   iters=40)


@dataclass(frozen=True, kw_only=True)
class AcceptanceModel:
    """A profile with its calibrated latent mean and depth slope."""

    profile: WorkloadProfile
    mu: float
    slope: float

    @classmethod
    @functools.lru_cache(maxsize=None)
    def calibrated(cls, name: str) -> AcceptanceModel:
        if name not in PROFILES:
            raise ValueError(f"unknown workload profile {name!r}; choose from {sorted(PROFILES)}")
        profile = PROFILES[name]
        slope = calibrated_slope()
        return cls(profile=profile, mu=_solve_mu(profile, slope), slope=slope)

    def acceptance_length(self, depth: int) -> float:
        """Expected tokens per step when every request verifies `depth` drafts (bonus incl.)."""
        return 1.0 + float(survival_curve(self.profile, self.mu, self.slope, depth).sum())

    def conditional(self, max_depth: int) -> np.ndarray:
        """P(position j accepted | 1..j-1 accepted), j = 1..max_depth: [K]."""
        s = survival_curve(self.profile, self.mu, self.slope, max_depth)
        return s / np.concatenate([[1.0], s[:-1]])

    def survival(self, state: np.ndarray, max_depth: int, spread: float = 0.0) -> np.ndarray:
        """[N, K] P(drafts 1..j all accepted) for requests whose latent state m + z this step
        is known to be `state` ([N]), give or take a normal `spread` (sd; 0: known exactly):
        what a planner that knew each request's acceptance distribution, but not the step's
        draws, would expect of a proposal (the simulator's informed oracles). Given the state
        the positions are independent, each accepted with E_eps sigmoid(m + z + beta_j +
        sigma_tok eps), as `respond_drawn` draws them."""
        nodes, weights = (np.zeros(1), np.ones(1)) if spread == 0.0 else (_NODES, _WEIGHTS)
        x = (state[:, None, None] + spread * nodes[None, :, None]
             + depth_offsets(self.slope, max_depth)[None, None, :])  # [N, Q, K]
        g = np.interp(x, _G_GRID, _token_acceptance(self.profile.token_sigma))
        return np.einsum("nqk,q->nk", np.cumprod(g, axis=2), weights)

    # ---- sampling --------------------------------------------------------------------------

    def new_requests(self, rng: np.random.Generator, n: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prompt_len [n], output_len [n], quality m_r [n]) for n new requests."""
        p = self.profile
        prompt = p.prompt.sample(rng, n)
        output = np.minimum(p.output.sample(rng, n), p.max_total - prompt)
        quality = rng.normal(self.mu, p.request_sigma, size=n)
        return prompt, np.maximum(output, 1), quality

    def initial_drift(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.normal(0.0, self.profile.drift_sigma, size=n)  # [n], stationary start

    def step(self, rng: np.random.Generator, quality: np.ndarray, drift: np.ndarray,
             max_depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One verify step for N requests.

        Returns (new drift [N], accepted drafts a [N] in 0..K if the full proposal were
        verified, confidences [N, K]).
        """
        n = quality.shape[0]
        noise = (rng.standard_normal(n), rng.standard_normal((n, max_depth)),
                 rng.random((n, max_depth)), rng.standard_normal((n, max_depth)))
        return self.respond(quality, drift, *noise)

    def respond(self, quality: np.ndarray, drift: np.ndarray, drift_noise: np.ndarray,
                token_noise: np.ndarray, uniform: np.ndarray, conf_noise: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`step` on given draws: N(0, 1) [N], N(0, 1) [N, K], U(0, 1) [N, K], N(0, 1) [N, K]."""
        return self.respond_drawn(quality, drift,
                                  self.prepare(drift_noise, token_noise, uniform, conf_noise))

    def innovations(self, drift_noise: np.ndarray) -> np.ndarray:
        """The drift's innovations from N(0, 1) draws of any shape: what `drifted` adds."""
        p = self.profile
        return np.sqrt(1.0 - p.drift_rho ** 2) * p.drift_sigma * drift_noise

    def drifted(self, drift: np.ndarray, innovation: np.ndarray) -> np.ndarray:
        """[N] the drift one step on (AR(1)): what every step does, verifying or not."""
        return self.profile.drift_rho * drift + innovation

    def prepare(self, drift_noise: np.ndarray | None, token_noise: np.ndarray,
                uniform: np.ndarray, conf_noise: np.ndarray) -> StepDraws:
        """What of a step's response does not depend on the requests' state, for draws of
        any leading shape ([..., N] and [..., N, K]: a caller may prepare many steps at once
        and respond to them one by one, `respond_drawn(..., draws[t])`). drift_noise None:
        the caller draws the drift's innovations apart (`innovations`) and puts them in."""
        p = self.profile
        # l = (m + z) + beta_j + sigma_tok * eps: everything but the state m + z
        rest = depth_offsets(self.slope, token_noise.shape[-1]) + p.token_sigma * token_noise
        with np.errstate(divide="ignore"):  # u = 0: logit -inf, always accepted (as u < s)
            threshold = np.log(uniform / (1.0 - uniform)) - rest  # [..., N, K]
        # Accepted: u < sigmoid(l), i.e. m + z > logit(u) - rest. A last column that nothing
        # passes makes the leading accepted count one argmin (respond_drawn).
        never = np.full(threshold.shape[:-1] + (1,), np.inf)
        return StepDraws(drift=None if drift_noise is None else self.innovations(drift_noise),
                         threshold=np.concatenate([threshold, never], axis=-1),
                         # c = sigmoid(gain * (l + noise * eta) + bias), less gain * (m + z)
                         conf=p.conf_gain * (rest + p.conf_noise * conf_noise) + p.conf_bias)

    def respond_drawn(self, quality: np.ndarray, drift: np.ndarray, draws: StepDraws
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One verify step for N requests on prepared draws (`prepare`, one step's worth):
        (new drift [N], accepted drafts a [N] in 0..K if the full proposal were verified,
        confidences [N, K]). This runs on the engine's host every step of a synthetic
        benchmark, in the loop's time: a few array operations."""
        drift = self.drifted(drift, draws.drift)  # [N]
        state = (quality + drift)[:, None]  # [N, 1] m + z
        a = (state > draws.threshold).argmin(axis=1)  # [N] leading accepted: the first False
        confidences = _sigmoid(self.profile.conf_gain * state + draws.conf)  # [N, K]
        return drift, a, confidences


@dataclass(frozen=True, eq=False)
class StepDraws:
    """AcceptanceModel.prepare: the state-free part of one or more steps' responses."""

    drift: np.ndarray | None  # [..., N] the drift's innovation (None: drawn apart)
    threshold: np.ndarray  # [..., N, K + 1] position j accepted iff m + z > threshold; the
    # last column is +inf
    conf: np.ndarray  # [..., N, K] a confidence's logit, less gain * (m + z)

    def __getitem__(self, t) -> StepDraws:
        return StepDraws(drift=None if self.drift is None else self.drift[t],
                         threshold=self.threshold[t], conf=self.conf[t])
