"""Sequential straggler test: a one-sided CUSUM over steps with a stated false-alarm rate.

Input: per-rank-per-step log ratios ``x`` (ranks x steps, oldest first) of one component
of own work to the leave-one-out median of the rank's pipeline-stage peers at the same
step (:func:`.stragglers._log_ratio`). A step that slows every rank alike (machine load)
cancels out of its own ratios.

Per rank, per step, the evidence increment is

    y_t = clip(x_t - m, -c s_r, +c s_r) - mu - kappa

* ``m``: median of all rank-steps (the centre of the noise, ~0);
* ``mu``: the median over ranks of each rank's mean clipped deviation (skewed noise -
  preemption only adds time - has a clipped mean above its median);
* ``s_r``: the noise scale of rank r, the larger of the pooled robust scale of all
  rank-steps (:func:`.stragglers._robust_sigma`) and the rank's own (from the MAD of its
  step-to-step differences, :func:`.robust.diff_sigma`, which the onset of a slowdown does
  not inflate): a rank on a noisy host is judged against its own noise, not its quiet
  peers';
* ``c`` (3): one long step (a GC pause, a preemption) adds at most ``b_r = max(c s_r,
  3 kappa)`` (so a 1.2x step is not clipped on a quiet host);
* ``kappa`` = ln 1.1: half the smallest slowdown worth naming (1.2x, ln 1.2 / 2).

and the statistic is S_t = max(0, S_{t-1} + y_t) (Page's CUSUM; vectorised as the
cumulative sum minus its running minimum). A rank is flagged when S at the latest step
reaches ``h_r = ln(N x C / alpha) / theta_r``:

* under no slowdown E[exp(theta_r y)] <= 1 for ``theta_r = lambda x 2 kappa / s_r^2``
  (the Gaussian root at the rank's own scale) where ``lambda`` <= 1 is the root of the
  pooled empirical moment mean(exp(lambda theta_r y)) = 1 over every rank-step of the
  window (heavy or skewed tails give lambda < 1, so a larger threshold); then
  exp(theta_r S_t) is dominated by a supermartingale and, by Ville's inequality,
  P(S_t >= h_r) <= exp(-theta_r h_r) at each step;
* Bonferroni over ``N`` = max(ranks of the job, ``fleet_ranks`` = 12,288) ranks and ``C``
  tested components: P(any false finding at a given step of a 12,288-rank job) <=
  ``alpha`` (1e-4);
* and at least ``min_steps`` (3) steps at the clip, ``3 (b_r - kappa)``: on a very quiet
  host one or two long steps cannot name a rank.

Expected delay for a slowdown of ``f`` (log ratio d = ln f): about
h / (d - kappa) steps; with Gaussian per-step noise s this is
ln(N C / alpha) s^2 / (2 kappa (d - kappa)), i.e. ~1,200 s^2 steps for 1.2x at the default
rate, and at least ~7 (3 steps at the clip): ~7 steps at s = 0.05, 12 at s = 0.1, ~175 at
s = 0.38 (the reference trainer's compute on 2 shared CPU cores at load 7-25). The
statistic restarts with each pass's window (24 steps): evidence is capped at the window.
The change point is the step after the last zero of S before the crossing; the factor is
measured over the steps since it.

Cost: O(ranks x steps) numpy per component (20 passes for the empirical root), no raw
events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .robust import diff_sigma


@dataclass(frozen=True)
class CusumConfig:
    kappa: float = math.log(1.1)
    """Drift: half the smallest slowdown worth naming (1.2x) in log units."""
    clip: float = 3.0
    """Increments are clipped at this many noise scales (one long step adds at most this)."""
    fleet_ranks: int = 12_288
    """The false-alarm rate holds for a job of at least this many ranks."""
    alpha: float = 1e-4
    """P(a false finding at a given step of such a job), all ranks and components together."""
    min_steps: int = 3
    """Judge no rank on fewer steps, and never name one on fewer steps at the clip."""


@dataclass(frozen=True)
class CusumResult:
    hit: np.ndarray
    """bool per rank: S at the latest step >= its threshold."""
    stat: np.ndarray
    """S at the latest step per rank."""
    threshold: np.ndarray
    """h per rank."""
    onset: np.ndarray
    """Column index of the change point per rank (first step of the final excursion)."""
    theta: float
    """lambda: the per-rank Gaussian roots are scaled by this (1: the Gaussian holds)."""
    num_steps: int
    """Columns judged."""

    @property
    def score(self) -> np.ndarray:
        """S / h (>= 1 when flagged)."""
        return self.stat / np.maximum(self.threshold, 1e-12)


def empirical_root(y: np.ndarray, upper: float) -> float:
    """The positive root theta of mean(exp(theta y)) = 1 (y: pooled increments, negative
    mean), searched in (0, ``upper``]; ``upper`` when the moment stays below 1 there,
    0 when the increments' mean is not negative (no test is possible)."""
    finite = np.isfinite(y)
    if not finite.all():
        y = y[finite]
    if y.size == 0 or y.mean() >= 0:
        return 0.0

    def g(t: float) -> float:  # log mean exp(t y), without overflow
        z = t * y
        top = float(z.max())
        return top + math.log(float(np.mean(np.exp(z - top))))

    if g(upper) <= 0:
        return upper
    lo, hi = 0.0, upper
    for _ in range(20):  # bisection (to 1e-6 of the upper end): g < 0 on (0, root), > 0 after it (g is convex, g(0) = 0)
        mid = (lo + hi) / 2
        if g(mid) <= 0:
            lo = mid
        else:
            hi = mid
    return lo


def cusum(x: np.ndarray, pooled_sigma: float, num_components: int, num_ranks: int,
          config: CusumConfig = CusumConfig(), row_sigma: np.ndarray | None = None,
          center: float | None = None) -> CusumResult:
    """One-sided CUSUM per row of ``x`` (ranks x steps log ratios, oldest first).

    Args:
        x: log ratios to the stage peers' median.
        pooled_sigma: robust noise scale of all rank-steps of ``x``.
        num_components: components tested per rank (the Bonferroni factor C).
        num_ranks: ranks of the job (N = max(this, ``config.fleet_ranks``)).
        config: drift, clip, false-alarm rate.
        row_sigma: each row's own noise, :func:`.robust.diff_sigma` of ``x`` (computed when
            not given).
        center: ``np.median(x)`` when the caller has it already (computed when not given).
    """
    num_rows, num_steps = x.shape
    empty = np.zeros(num_rows)
    if num_steps < config.min_steps or num_rows == 0:
        return CusumResult(np.zeros(num_rows, dtype=bool), empty, np.full(num_rows, np.inf),
                           np.zeros(num_rows, dtype=np.int64), 0.0, num_steps)
    m = float(np.median(x)) if center is None else center
    dev = x - m
    own = diff_sigma(dev) if row_sigma is None else row_sigma
    s = np.maximum(np.maximum(pooled_sigma, own), 1e-3)
    bound = np.maximum(config.clip * s, 3 * config.kappa)  # a 1.2x step passes unclipped
    clipped = np.clip(dev, -bound[:, None], bound[:, None])
    # skewed noise (preemption only ever adds time) has a clipped mean above its median:
    # centre on the typical rank's clipped mean (a median over ranks, so a few slow ranks
    # do not move it); under exchangeable ranks a healthy rank's increments then average
    # -kappa
    centre = float(np.median(clipped.mean(axis=1)))
    y = clipped - centre - config.kappa
    gauss = 2 * config.kappa / s ** 2
    # the pooled moment, each rank at its own Gaussian root: mean(exp(lam theta_r y)) = 1
    lam = empirical_root((gauss[:, None] * y).ravel(), 1.0)
    theta = lam * gauss
    log_tests = math.log(max(num_ranks, config.fleet_ranks) * max(num_components, 1) / config.alpha)
    with np.errstate(divide="ignore"):
        h = np.where(theta > 0, log_tests / np.maximum(theta, 1e-300), np.inf)
    # and never fewer than ``min_steps`` steps at the clip: one or two long steps name nobody
    h = np.maximum(h, config.min_steps * (bound - config.kappa))
    stat, last_min = _page_walk(y)
    onset = np.minimum(last_min, num_steps - 1).astype(np.int64)
    return CusumResult(stat >= h, stat, h, onset, lam, num_steps)


def _page_walk(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``y`` (rows x steps): Page's statistic at the last step (the cumulative
    sum c, with c_0 = 0, minus its running minimum) and the change point (the last index
    of c where c sat at its running minimum, within 1e-12; an index into c, i.e. the
    column where the final excursion begins). The running sums, minima and last indices
    advance a step at a time over all rows at once: numpy's ``cumsum`` and
    ``minimum.accumulate`` along short rows cost several times more, for the same
    additions and comparisons in the same order."""
    num_rows, num_steps = y.shape
    c = np.zeros(num_rows)  # c_0
    low = np.zeros(num_rows)
    last = np.zeros(num_rows, dtype=np.int64)
    for t in range(num_steps):
        c = y[:, 0].copy() if t == 0 else c + y[:, t]  # np.cumsum's first sum is y_0 itself
        low = np.minimum(low, c)
        last[c <= low + 1e-12] = t + 1
    return c - low, last


def expected_delay(sigma: float, factor: float, num_ranks: int = 0, num_components: int = 5,
                   config: CusumConfig = CusumConfig()) -> float:
    """Steps the CUSUM needs, on average, to name a rank ``factor`` times its peers under
    Gaussian per-step log-ratio noise ``sigma`` (threshold over mean increment, at least
    ``min_steps`` steps at the clip); ``inf`` when ``factor`` is not above exp(kappa)."""
    d = math.log(factor) - config.kappa
    if d <= 0:
        return math.inf
    log_tests = math.log(max(num_ranks, config.fleet_ranks) * max(num_components, 1) / config.alpha)
    s = max(sigma, 1e-3)
    h = max(log_tests * s ** 2 / (2 * config.kappa),
            config.min_steps * (max(config.clip * s, 3 * config.kappa) - config.kappa))
    return h / d
