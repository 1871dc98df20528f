"""The statistics of a verification: every interval and probability comes from
`scipy.stats.bootstrap`, resampling seeds paired across trials (seed i is the same for every trial,
so a resample keeps each seed's row whole).

Percentile intervals, not BCa: with a handful of seeds, and with trials whose reruns are bitwise
equal (identical values on CPU), BCa's acceleration estimate is undefined, while a percentile
interval of a constant is that constant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 9999
RESAMPLE_SEED = 0  # the same command twice gives the same intervals


@dataclass
class Interval:
    mean: float
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


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
    low, high = np.atleast_1d(result.confidence_interval.low), \
        np.atleast_1d(result.confidence_interval.high)
    means = values.mean(axis=1)
    per_trial = [Interval(float(m), float(lo), float(hi))
                 for m, lo, hi in zip(means, low, high, strict=True)]
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
    """The mean of a - b with its interval, resampling the pairs (a[i], b[i]) together."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ci = _bootstrap((a, b), lambda x, y, axis=-1: np.mean(x - y, axis=axis)).confidence_interval
    return Interval(float(np.mean(a - b)), float(ci.low), float(ci.high))


def mean_interval(values) -> Interval:
    """The mean of `values` with its interval."""
    values = np.asarray(values, dtype=float)
    ci = _bootstrap((values,), np.mean).confidence_interval
    return Interval(float(values.mean()), float(ci.low), float(ci.high))


def indistinct(summary: Summary) -> list[int]:
    """The trials (indices) whose difference to the winner's mean is within noise: the
    interval of winner minus trial contains 0."""
    w = summary.winner
    return [i for i in range(len(summary.trials))
            if i != w and difference(summary, w, i).low <= 0]


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
