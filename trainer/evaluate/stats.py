"""Confidence intervals of `rft eval`: a normal 95% interval over rows, and the paired difference.

The rows are the unit: a row's samples share its prompt, so they are not independent draws, and
the interval treats each row as one observation. An estimate is pooled over the scored rollouts
(the success rate and mean reward `rft train` reports, to the bit); its standard error is the
cluster-robust one of a ratio of sums over rows (linearised):

    m = sum_r y_r / sum_r n_r      SE^2 = k / (k - 1) * sum_r (y_r - m n_r)^2 / (sum_r n_r)^2

where row r has n_r scored rollouts summing to y_r, over the k rows with any. With the same number
of samples in every row this is the textbook standard error of the mean of the row means, s / sqrt(k).
A paired difference (an adapter minus the base, on the rows both scored) uses the per-row residual of
the difference, which with equal counts is the paired standard error of the per-row differences.
The interval is estimate +- 1.96 SE: approximate for few rows or a rate near 0 or 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

LEVEL = 0.95
Z = NormalDist().inv_cdf(0.5 + LEVEL / 2)
INTERVAL_METHOD = (
    "normal 95% interval over rows (cluster standard error of the pooled mean; a difference paired by row)"
)

# Each row's scored values under one policy (a failed rollout left out): rewards, or 1.0/0.0 successes.
RowValues = Sequence[Sequence[float]]


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95% interval, over ``rows`` rows (the bounds are NaN with fewer than 2)."""

    estimate: float
    low: float
    high: float
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def successes(rows: RowValues, threshold: float) -> list[list[float]]:
    """Each reward as 1.0 when above ``threshold`` (the success rule of every evaluation), else 0.0."""
    return [[1.0 if reward > threshold else 0.0 for reward in row] for row in rows]


def pooled(rows: RowValues) -> Interval:
    """The mean over every scored value, with the interval over the rows that have any."""
    kept = [row for row in rows if row]
    count = sum(len(row) for row in kept)
    if not count:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = math.fsum(value for row in kept for value in row) / count
    residuals = [(math.fsum(row) - mean * len(row)) / count for row in kept]
    return _interval(mean, residuals)


def paired_difference(policy: RowValues, base: RowValues) -> Interval:
    """``policy`` minus ``base``, pooled over the rows both scored, with the interval paired by row."""
    if len(policy) != len(base):
        raise ValueError(f"paired rows differ in number: {len(policy)} and {len(base)}")
    pairs = [(mine, theirs) for mine, theirs in zip(policy, base, strict=True) if mine and theirs]
    if not pairs:
        return Interval(math.nan, math.nan, math.nan, 0)
    mine_count = sum(len(mine) for mine, _ in pairs)
    their_count = sum(len(theirs) for _, theirs in pairs)
    mine_mean = math.fsum(value for mine, _ in pairs for value in mine) / mine_count
    their_mean = math.fsum(value for _, theirs in pairs for value in theirs) / their_count
    residuals = [
        (math.fsum(mine) - mine_mean * len(mine)) / mine_count
        - (math.fsum(theirs) - their_mean * len(theirs)) / their_count
        for mine, theirs in pairs
    ]
    return _interval(mine_mean - their_mean, residuals)


def _interval(estimate: float, residuals: list[float]) -> Interval:
    rows = len(residuals)
    if rows < 2:
        return Interval(estimate, math.nan, math.nan, rows)
    error = math.sqrt(rows / (rows - 1) * math.fsum(residual**2 for residual in residuals))
    return Interval(estimate, estimate - Z * error, estimate + Z * error, rows)
