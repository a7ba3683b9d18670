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
