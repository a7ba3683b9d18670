"""Robust statistics shared by the detectors: scale estimates that one outlier cannot move.

The constants are the usual consistency factors for normally distributed data.
"""

from __future__ import annotations

from typing import Final

import numpy as np

MAD_TO_SIGMA: Final = 1.4826
"""MAD x this estimates the standard deviation of normally distributed data."""

MEDIAN_SE_FACTOR: Final = 1.2533
"""sqrt(pi/2): the standard error of a median of n normal samples is this x sigma / sqrt(n)
(a median is this much noisier than a mean)."""


def mad_sigma(x: np.ndarray, center: float | np.ndarray | None = None) -> float:
    """The standard deviation estimated from the median absolute deviation of ``x`` about
    ``center`` (its median when not given)."""
    c = np.median(x) if center is None else center
    return MAD_TO_SIGMA * float(np.median(np.abs(x - c)))


def diff_sigma(x: np.ndarray) -> np.ndarray:
    """Per row of ``x`` (rows x steps): the standard deviation of white noise estimated from
    the MAD of the step-to-step differences (1.4826 x median |x_t - x_(t-1)| / sqrt 2). A
    level shift inside the row moves one difference only, so it barely changes the
    estimate; zeros for rows of fewer than 2 steps."""
    if x.shape[1] < 2:
        return np.zeros(x.shape[0])
    return MAD_TO_SIGMA * row_median(np.abs(np.diff(x, axis=1))) / np.sqrt(2.0)


def row_median(x: np.ndarray) -> np.ndarray:
    """``np.median(x, axis=1)``, bit for bit, for a 2-D array of many short rows (a
    detector's ranks x steps): numpy sorts many short float rows an order of magnitude
    faster than it partitions them one by one, and the middle of a sorted row is the value
    (or the two values) that partitioning selects, averaged by ``np.mean`` as
    ``np.median`` averages them. Anything but float64 without NaN goes to ``np.median``
    itself (its NaN rule and its integer-to-float mean)."""
    num_cols = x.shape[1]
    if x.dtype != np.float64 or x.size == 0 or np.isnan(x).any():
        return np.median(x, axis=1)
    s = np.sort(x, axis=1)
    h = num_cols // 2
    return np.mean(s[:, h - 1 + num_cols % 2:h + 1], axis=1)
