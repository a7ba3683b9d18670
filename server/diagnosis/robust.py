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
    return MAD_TO_SIGMA * np.median(np.abs(np.diff(x, axis=1)), axis=1) / np.sqrt(2.0)
