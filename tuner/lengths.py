"""The one response-length model: the cost model integrates it, the measuring runners draw from it.

RL rollouts (DAPO/GRPO on math) produce response lengths with a long right tail and a spike at
the cap (`data.max_response_length`): most answers end after a few hundred to a few thousand
tokens, a few ramble until they are truncated. The model is a mixture:

    with probability q            the response is truncated at the cap;
    with probability 1 - q        it is min(Exp(θ), cap).

`q` is the truncated share beyond what the exponential itself puts at the cap (verl logs the
whole share as `response_length/clip_ratio`); θ is solved so that the mean is the workload's
mean. The survival function S(x) = P(length > x) = q + (1 - q)·e^(-x/θ) for x < cap.

A generation step ends when its longest response ends, so the tail decides how long the last,
nearly empty decode steps run (tuner/estimate/generation.py integrates S and its residual-life
form).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol

DEFAULT_CLIP_FRACTION = 0.0
"""Extra share of responses truncated at the cap when the workload does not say. The capped
exponential already puts e^(-cap/θ) at the cap, which grows as the mean approaches the cap
(0.25% at a 3.3k mean under a 20k cap, nothing at a 0.5k mean under 8k, as the GRPO
reference's 68 s generation shows); a run whose `response_length/clip_ratio` is higher sets
the workload's `response_clip_fraction`, and the spike is added on top."""
EULER_GAMMA = 0.5772156649
"""Expected max of n unit exponentials is ln(n) + gamma."""


def solve_theta(mean: float, cap: float) -> float:
    """Scale θ of an exponential capped at `cap` whose mean is `mean`: mean = θ(1 - e^(-cap/θ)).
    Fixed-point iteration, monotone and fast."""
    if mean <= 0:
        return 1.0
    if mean >= cap * 0.999:
        return cap * 1e3
    theta = mean
    for _ in range(200):
        nxt = mean / (1.0 - math.exp(-cap / theta))
        if abs(nxt - theta) < 1e-9 * theta:
            return nxt
        theta = nxt
    return theta


@dataclass(frozen=True, kw_only=True, slots=True)
class ResponseLengths:
    """Response lengths of one step: a capped exponential plus a spike at the cap."""

    mean: float
    """Mean response length, tokens."""
    cap: int
    """`data.max_response_length`, tokens."""
    clip_fraction: float
    """q: the extra share truncated at the cap (0 gives a plain capped exponential)."""
    theta: float
    """Scale of the exponential part."""

    @classmethod
    def of(
        cls, mean: float, cap: int, clip_fraction: float = DEFAULT_CLIP_FRACTION
    ) -> ResponseLengths:
        """The model with this mean and cap. A clip fraction the mean cannot carry (q·cap above
        the mean) is lowered to half the mean's share of the cap."""
        if cap <= 0:
            raise ValueError(f"the response cap must be positive, got {cap}")
        if not 0 <= clip_fraction < 1:
            raise ValueError(f"clip fraction {clip_fraction} must lie in [0, 1)")
        mean = min(max(mean, 1.0), float(cap))
        q = min(clip_fraction, 0.5 * mean / cap)
        rest = (mean - q * cap) / (1.0 - q)
        return cls(mean=mean, cap=cap, clip_fraction=q, theta=solve_theta(rest, cap))

    @property
    def at_cap(self) -> float:
        """P(length = cap): the spike plus the exponential's own mass beyond the cap."""
        q = self.clip_fraction
        return q + (1.0 - q) * math.exp(-self.cap / self.theta)

    def survival(self, x: float) -> float:
        """P(length > x)."""
        if x >= self.cap:
            return 0.0
        if x <= 0:
            return 1.0
        q = self.clip_fraction
        return q + (1.0 - q) * math.exp(-x / self.theta)

    def second_moment(self) -> float:
        """E[length^2]. For X ~ Exp(θ) and x = cap/θ, E[min(X, cap)^2] is the integral below the
        cap plus the mass beyond it, at the cap: 2θ²(1 - e^(-x)(1 + x + x²/2)) + cap²·e^(-x),
        which is 2θ²(1 - e^(-x)(1 + x)) (θ²x² = cap²): that form holds the cap's mass already."""
        q, t, c = self.clip_fraction, self.theta, float(self.cap)
        x = c / t
        capped = 2 * t * t * (1 - math.exp(-x) * (1 + x))
        return q * c * c + (1 - q) * capped

    def mean_residual(self) -> float:
        """Mean remaining length of a response found in flight at a random time (the
        length-biased residual life E[L^2] / (2 E[L]))."""
        return self.second_moment() / (2.0 * self.mean)

    def residual_survival(self, r: float) -> float:
        """P(remaining length > r) for a response found in flight at a random time:
        ∫_r^cap S(x) dx / mean."""
        if r >= self.cap:
            return 0.0
        r = max(0.0, r)
        q, t, c = self.clip_fraction, self.theta, float(self.cap)
        integral = q * (c - r) + (1 - q) * t * (math.exp(-r / t) - math.exp(-c / t))
        return min(1.0, integral / self.mean)

    def mean_age_alive(self, r: float) -> float:
        """Mean age (tokens already generated) of the responses found in flight at a random
        time whose remaining length exceeds r: the length-biased joint law of (age, residual)
        has density f(age + residual) / mean, so given residual > r the age has density
        proportional to S(age + r) on [0, cap - r)."""
        u = float(self.cap) - r
        if u <= 0:
            return 0.0
        r = max(0.0, r)
        q, t = self.clip_fraction, self.theta
        e, eu = math.exp(-r / t), math.exp(-u / t)
        mass = q * u + (1 - q) * t * e * (1 - eu)
        if mass <= 0:
            return u / 2
        first = q * u * u / 2 + (1 - q) * e * t * t * (1 - eu * (1 + u / t))
        return first / mass

    def longest_of(self, n: float) -> float:
        """Expected longest of n responses (the cap once n·P(length = cap) reaches one)."""
        n = max(1.0, n)
        if n * self.at_cap >= 1.0:
            return float(self.cap)
        q = self.clip_fraction
        return min(
            float(self.cap), self.theta * (math.log(n * (1 - q) / (1 - n * q)) + EULER_GAMMA)
        )

    def quantile(self, u: float) -> float:
        """Inverse of the distribution function (u in [0, 1))."""
        s = 1.0 - u
        if s <= self.at_cap:
            return float(self.cap)
        q = self.clip_fraction
        return min(float(self.cap), -self.theta * math.log((s - q) / (1.0 - q)))


def draw_response_lengths(
    count: int,
    *,
    max_len: int,
    mean_len: float,
    seed: int,
    clip_fraction: float = DEFAULT_CLIP_FRACTION,
) -> list[int]:
    """`count` response lengths in 1..max_len from ResponseLengths whose mean is `mean_len` (to
    the nearest token of the total), the same for the same arguments on any Python."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    if not 1 <= mean_len <= max_len:
        raise ValueError(f"mean response length {mean_len} must lie in 1..{max_len}")
    if mean_len >= max_len:
        return [max_len] * count
    model = ResponseLengths.of(mean_len, max_len, clip_fraction)
    rng = random.Random(seed)
    out = [min(max_len, max(1, round(model.quantile(rng.random())))) for _ in range(count)]
    target = round(count * mean_len)
    order = list(range(count))
    rng.shuffle(order)
    diff = target - sum(out)
    if diff:
        _spread(out, order, diff, max_len)
    return out


def _spread(out: list[int], order: list[int], diff: int, max_len: int) -> None:
    """Move the lengths `out` (each kept in 1..max_len) by `diff` tokens in all, in place: what
    passes over `order` moving each length by one token until the difference is gone give, in
    one sort instead of a pass per token (a 10^8-token cap left differences of 10^9 tokens).
    Every length moves by min(its room, level) for the highest level the difference pays for
    in whole passes; the rest, one token each, goes to the first lengths in `order` with room
    left."""
    step = 1 if diff > 0 else -1
    need = abs(diff)
    room = [max_len - v if step > 0 else v - 1 for v in out]
    level, paid, left = 0, 0, len(out)  # lengths with room above `level`
    for r in sorted(room):
        if r > level:
            rise = min(r - level, (need - paid) // left)
            level += rise
            paid += rise * left
            if level < r:
                break
        left -= 1
    for i in range(len(out)):
        out[i] += step * min(room[i], level)
    rest = need - paid
    for i in order:
        if rest == 0:
            break
        if room[i] > level:
            out[i] += step
            rest -= 1


class LengthSettings(Protocol):
    """What the draws read of a workload (tuner.workload.Workload is one; it imports this
    module, so this module names it only through this protocol): responses per prompt, the
    prompt's and the response's cap and mean, tokens, and the share truncated at the cap."""

    @property
    def n(self) -> int: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def mean_prompt_len(self) -> float: ...
    @property
    def response_len(self) -> int: ...
    @property
    def mean_response_len(self) -> float: ...
    @property
    def clip_fraction(self) -> float: ...


def step_lengths(workload: LengthSettings, samples_prompts: int, seed: int) -> list[int]:
    """Sample lengths (prompt + response) for `samples_prompts` prompts x n responses, from the
    workload's one response-length model (above); samples of a prompt are adjacent."""
    plens, rlens = prompt_and_response_lengths(workload, samples_prompts, seed)
    return [plens[i // workload.n] + r for i, r in enumerate(rlens)]


def prompt_and_response_lengths(
    workload: LengthSettings, prompts: int, seed: int
) -> tuple[list[int], list[int]]:
    """The two draws behind `step_lengths`: a length for each of `prompts` prompts, and one for
    each of its n responses (a prompt's responses adjacent)."""
    w = workload
    plens = draw_response_lengths(
        prompts, max_len=w.prompt_len, mean_len=w.mean_prompt_len, seed=seed
    )
    rlens = draw_response_lengths(
        prompts * w.n,
        max_len=w.response_len,
        mean_len=w.mean_response_len,
        seed=seed + 1_000_003,
        clip_fraction=w.clip_fraction,
    )
    return plens, rlens
