"""The statistics of a verification and an ablation, at the sample sizes they have (2 to 10
seeds). Intervals of a mean, and of a mean paired difference (seed i is the same for every trial
or combination, so differences are taken seed by seed), are Student-t intervals: exact for normal
noise and honest at small n, where they widen as they should (the half-width is 12.7 standard
errors at n = 2, 4.3 at n = 3, 2.8 at n = 5). A bootstrap of three values would call the range
of three numbers a 95% interval; it is used here only for the probability of being best, which
resamples seeds paired across trials, and is said to rest on few seeds (`few_seeds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 9999
RESAMPLE_SEED = 0  # the same command twice gives the same intervals
FEW_SEEDS = 5  # below this, a probability from resampling seeds is said to rest on few


@dataclass
class Interval:
    mean: float
    low: float
    high: float
    n: int = 0  # the values it rests on

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    @property
    def spread(self) -> bool:
        """Whether its values varied: n equal values say nothing of the noise, and an
        interval of zero width from them supports no verdict."""
        return self.high - self.low > 1e-9 * max(1.0, abs(self.mean))  # not rounding noise

    def excludes(self, x: float) -> bool:
        """A verdict's test: the interval rests on two or more values that varied, and `x`
        lies outside it."""
        return self.n >= 2 and self.spread and not self.contains(x)


def t_interval(values) -> Interval:
    """The mean of `values` (two or more) with its 95% Student-t interval."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    n, mean = len(values), float(values.mean())
    if n < 2:
        raise ValueError("an interval needs two or more values")
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * values.std(ddof=1) / np.sqrt(n))
    return Interval(mean, mean - half, mean + half, n)


def few_seeds(n: int) -> str:
    """What `n` seeds can and cannot tell, for a table's notes ('' from FEW_SEEDS on)."""
    if n >= FEW_SEEDS:
        return ""
    return (f"{n} seeds: each 95% t-interval is wide (at n={n} its half-width is "
            f"{_t_factor(n):.1f} standard errors), so only large differences exclude zero; "
            f"p(best) resamples {n} seeds and is a rough guide, not a probability to bet on "
            f"(use --seeds {FEW_SEEDS} or more)")


def _t_factor(n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1))


@dataclass
class Summary:
    """One verification: `values[i, j]` is trial i's metric with seed j."""

    trials: list[int]
    values: np.ndarray
    maximize: bool
    per_trial: list[Interval]
    p_best: list[float]  # probability of having the best mean, over resampled seeds
    winner: int  # index into trials: the best mean over seeds

    def sign(self) -> float:
        return 1.0 if self.maximize else -1.0


def _bootstrap(data: tuple, statistic):
    from scipy.stats import bootstrap

    return bootstrap(data, statistic, paired=len(data) > 1, vectorized=True,
                     n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE,
                     method="percentile", rng=np.random.default_rng(RESAMPLE_SEED))


def _means(*rows, axis=-1):
    return np.stack([np.mean(row, axis=axis) for row in rows])


def summarise(trials: list[int], values: np.ndarray, maximize: bool) -> Summary:
    """Per-trial means with intervals, and each trial's probability of being the best."""
    values = np.asarray(values, dtype=float)
    result = _bootstrap(tuple(values), _means)
    means = values.mean(axis=1)
    per_trial = [t_interval(row) for row in values]
    signed = (1.0 if maximize else -1.0) * np.atleast_2d(result.bootstrap_distribution)
    best = signed.max(axis=0)
    ties = signed == best  # trials with equal means share the resample's credit
    p_best = (ties / ties.sum(axis=0)).mean(axis=1)
    winner = int(np.argmax((1.0 if maximize else -1.0) * means))
    return Summary(trials, values, maximize, per_trial, [float(p) for p in p_best], winner)


def difference(summary: Summary, i: int, j: int) -> Interval:
    """Trial i minus trial j, paired by seed, signed so that > 0 means i is better."""
    return paired_difference(summary.sign() * summary.values[i],
                             summary.sign() * summary.values[j])


def paired_difference(a, b) -> Interval:
    """The mean of a - b with its t-interval, over the pairs (a[i], b[i])."""
    return t_interval(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))


def mean_interval(values) -> Interval:
    """The mean of `values` with its t-interval."""
    return t_interval(values)


def indistinct(summary: Summary) -> list[int]:
    """The trials (indices) whose difference to the winner's mean is within noise: the
    interval of winner minus trial contains 0."""
    w = summary.winner
    return [i for i in range(len(summary.trials))
            if i != w and not difference(summary, w, i).excludes(0.0)]


def non_dominated(means: np.ndarray, maximize: list[bool]) -> np.ndarray:
    """means[t, m] -> which trials no other trial beats on every objective at once (at least
    as good on all, better on one)."""
    signed = means * np.where(maximize, 1.0, -1.0)
    better_eq = (signed[:, None, :] >= signed[None, :, :]).all(axis=2)  # [u, t]: u >= t on all
    strictly = (signed[:, None, :] > signed[None, :, :]).any(axis=2)
    dominated = (better_eq & strictly).any(axis=0)
    return ~dominated


def front_probability(values: np.ndarray, maximize: list[bool]) -> list[float]:
    """values[t, m, s] -> per trial, the probability that its means over resampled seeds stay
    non-dominated (seeds resampled together for every trial and objective)."""
    t, m, _ = values.shape
    rows = tuple(values.reshape(t * m, -1))
    distribution = np.atleast_2d(_bootstrap(rows, _means).bootstrap_distribution)
    means = distribution.reshape(t, m, -1)  # [trial, objective, resample]
    kept = np.stack([non_dominated(means[:, :, b], maximize) for b in range(means.shape[2])])
    return [float(p) for p in kept.mean(axis=0)]
