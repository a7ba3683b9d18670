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

and the statistic, in log-likelihood units, is W_t = max(0, W_{t-1} + theta_r y_t) (Page's
CUSUM; vectorised as the cumulative sum minus its running minimum). A rank is flagged when
W reaches ``h_r = max(ln(N x C / alpha), min_steps x theta_r x (b_r - kappa))``:

* under no slowdown E[exp(theta_r y)] <= 1 for ``theta_r = lambda x 2 kappa / s_r^2``
  (the Gaussian root at the rank's own scale) where ``lambda`` (<= ``root_cap``, 4) is
  the root of the pooled empirical moment over every rank-step of the window, taken at
  its upper confidence bound: mean(exp(lambda theta_r y)) + 2 standard errors = 1 (heavy
  tails give lambda < 1, so smaller weights; spiky noise, whose robust scale is read
  from its upper tail and overstates what the clipped increments carry, lambda > 1; a
  small pool, a wide bound, a smaller lambda). Then each
  increment z = theta y has E[exp(z)] <= 1, and W_t is the largest sum of the latest
  increments (any start): read backwards from t those sums are a walk whose exponential
  is a supermartingale, so by Ville's inequality P(W_t >= h) <= exp(-h) at each step.
  This holds when theta changes from step to step (each pass weighs its new steps with
  its own window's estimate), which lets the statistic be carried across passes. The
  weights are estimated from a window that holds the steps they weigh, as the stateless
  test's were: the bound holds to the accuracy of that estimate (24 steps x ranks);
* Bonferroni over ``N`` = max(ranks of the job, ``fleet_ranks`` = 12,288) ranks and ``C``
  tested components: P(any false finding at a given step of a 12,288-rank job) <=
  ``alpha`` (1e-4);
* and at least ``min_steps`` (3) steps at the clip, ``3 (b_r - kappa)``: on a very quiet
  host one or two long steps cannot name a rank.

Carried across passes (:class:`CusumState`, kept per job by the diagnosis loop through
:class:`.stragglers.StragglerState`): each pass folds only the steps it has not folded,
so evidence is no longer capped at the 24-step window and a pass costs O(ranks x new
steps) for the statistic. W is capped at ``cap`` (2) thresholds, which only lowers it
(the bound stands) and lets a finding clear about as fast as it was raised once the
slowdown ends. The drift: for Gaussian noise the delay h s^2 / (2 kappa (d - kappa)) is
least at kappa = d / 2, so ln 1.1 is (within 4%) the best drift for 1.2x (ln 1.2 / 2 =
ln 1.095) and still names every larger slowdown; a 1.2x rank gains ln 1.2 - kappa = 0.087
per step in log units, a healthy one loses kappa.

Expected delay for a slowdown of ``f`` (log ratio d = ln f): about
h / (theta (d - kappa)) steps; with Gaussian per-step noise s this is
ln(N C / alpha) s^2 / (2 kappa (d - kappa)), i.e. ~1,200 s^2 steps for 1.2x at the default
rate, and at least ~7 (3 steps at the clip): ~7 steps at s = 0.05, 12 at s = 0.1, ~110 at
s = 0.3, ~175 at s = 0.38 (the reference trainer's compute on 2 shared CPU cores at load
7-25). Without a carried state (an on-demand pass) the statistic restarts with the
window. The change point is the step after the last zero of W before the crossing (it
may predate the window when carried); the factor is measured over the window's steps
since it.

Cost: O(ranks x window) numpy per component for the noise estimates (20 passes for the
empirical root), O(ranks x new steps) for the statistic, no raw events; state O(ranks) per
component.
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
    root_cap: float = 4.0
    """The pooled empirical root may raise the Gaussian root at the robust scale up to this
    factor (spiky noise: the robust scale, read from the upper tail, overstates the noise
    the clipped increments carry)."""
    root_z: float = 2.0
    """The root is that of the moment's upper confidence bound at this many standard errors."""
    cap: float = 2.0
    """A carried statistic is capped at this many thresholds (a finding clears within
    about as many steps after the slowdown ends as it took to raise)."""


@dataclass(frozen=True)
class CusumResult:
    hit: np.ndarray
    """bool per rank: S at the latest step >= its threshold."""
    stat: np.ndarray
    """S at the latest step per rank, in log-likelihood units (theta-weighted)."""
    threshold: np.ndarray
    """h per rank, in the same units: ln(N C / alpha), or more for ``min_steps``."""
    onset: np.ndarray
    """Column index of the change point per rank (first step of the final excursion)."""
    theta: float
    """lambda: the per-rank Gaussian roots are scaled by this (1: the Gaussian holds)."""
    num_steps: int
    """Columns of the window."""
    onset_step: np.ndarray | None = None
    """Step number of the change point per rank (-1: no excursion); may predate the window
    when the statistic is carried across passes."""
    num_folded: int = 0
    """Columns folded into the statistic by this call (the per-pass cost)."""
    level: np.ndarray | None = None
    """Per row: the mean clipped log ratio (centred on the typical rank) since the change
    point, over all the excursion's steps (NaN: no excursion): exp of it is the factor."""
    level_steps: np.ndarray | None = None
    """Per row: the steps that mean is over."""

    @property
    def score(self) -> np.ndarray:
        """S / h (>= 1 when flagged)."""
        return self.stat / np.maximum(self.threshold, 1e-12)


def empirical_root(y: np.ndarray, upper: float, z_conf: float = 0.0) -> float:
    """The positive root theta of mean(exp(theta y)) = 1 (y: pooled increments, negative
    mean), searched in (0, ``upper``]; ``upper`` when the moment stays below 1 there,
    0 when the increments' mean is not negative (no test is possible).

    With ``z_conf`` > 0 the moment is its upper confidence bound, mean + z_conf x its
    standard error (sd(exp(theta y)) / sqrt(n)): a root a small pool cannot overstate
    (0 when even that bound never falls below 1)."""
    y = y[np.isfinite(y)]
    if y.size == 0 or y.mean() >= 0:
        return 0.0
    se = z_conf / math.sqrt(y.size)

    def g(t: float) -> float:  # log of the (bounded) mean of exp(t y), without overflow
        z = t * y
        top = float(z.max())
        e = np.exp(z - top)
        return top + math.log(float(np.mean(e)) + (se * float(np.std(e)) if se else 0.0))

    if g(upper) <= 0:
        return upper
    lo, hi = 0.0, upper
    for _ in range(12):  # bisection (to 2.4e-4 of the upper end): g < 0 on (0, root), > 0 after it (g is convex, g(0) = 0)
        mid = (lo + hi) / 2
        if g(mid) <= 0:
            lo = mid
        else:
            hi = mid
    return lo


LEVEL_CLIP = math.log(100.0)
"""The excursion's level (the factor since the change point) clips each step's log ratio
here."""


@dataclass
class CusumState:
    """The CUSUM of one stream (one component of every rank) carried across passes:
    O(rows) floats, whatever the history."""

    evidence: np.ndarray
    """Per row: W, the statistic in log-likelihood units (theta-weighted increments), capped."""
    onset_step: np.ndarray
    """Per row: the step where the current excursion of W above 0 began (-1: W is 0)."""
    level_sum: np.ndarray | None = None
    """Per row: the sum of the excursion's centred log ratios (each clipped at
    +-``LEVEL_CLIP``), so its mean is the slowdown since the change point, over every step
    of it, not only the window's."""
    level_steps: np.ndarray | None = None
    """Per row: the excursion's steps."""

    def __post_init__(self) -> None:
        n = self.evidence.shape[0]
        if self.level_sum is None:
            self.level_sum = np.zeros(n)
        if self.level_steps is None:
            self.level_steps = np.zeros(n, dtype=np.int64)

    @classmethod
    def empty(cls, num_rows: int) -> CusumState:
        return cls(np.zeros(num_rows), np.full(num_rows, -1, dtype=np.int64))

    @property
    def level(self) -> np.ndarray:
        """Per row: the mean log ratio to the stage peers since the change point (NaN: none)."""
        assert self.level_sum is not None and self.level_steps is not None
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.level_steps > 0, self.level_sum / np.maximum(self.level_steps, 1), np.nan)


@dataclass(frozen=True)
class _Params:
    """What a pass learns from its window: the centre, clip bounds and per-row roots."""

    m: float
    kappa: float
    bound: np.ndarray
    centre: float
    theta: np.ndarray
    lam: float
    threshold: np.ndarray
    """Per row, in log-likelihood units: max(ln(N C / alpha), ``min_steps`` at the clip)."""


def _params(x: np.ndarray, pooled_sigma: float, num_components: int, num_ranks: int,
            config: CusumConfig, row_sigma: np.ndarray | None) -> _Params:
    m = float(np.median(x))
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
    gauss = 2 * config.kappa / s ** 2
    # the pooled moment, each rank at its own Gaussian root: mean(exp(lam theta_r y)) = 1
    # (its upper confidence bound, so a small pool cannot overstate lam), each rank's
    # increments about its own median: the moment measures the noise's shape, and a
    # straggler's level shift is no noise (one rank of 8 is 1/8 of the pool: its shifted
    # increments drove the pooled moment above 1, lambda and its own weight to 0). A rank
    # noisier than its estimated scale still weighs on everyone's lambda.
    own_clipped = np.clip(x - np.median(x, axis=1, keepdims=True), -bound[:, None], bound[:, None])
    y_shape = own_clipped - float(np.median(own_clipped.mean(axis=1))) - config.kappa
    lam = empirical_root((gauss[:, None] * y_shape).ravel(), config.root_cap, config.root_z)
    theta = lam * gauss
    log_tests = math.log(max(num_ranks, config.fleet_ranks) * max(num_components, 1) / config.alpha)
    # and never fewer than ``min_steps`` steps at the clip: one or two long steps name nobody
    floor = config.min_steps * theta * (bound - config.kappa)
    h = np.where(theta > 0, np.maximum(log_tests, floor), np.inf)
    return _Params(m, config.kappa, bound, centre, theta, lam, h)


def fold(state: CusumState, x_new: np.ndarray, steps_new: np.ndarray, params: _Params,
         cap: float = 2.0) -> None:
    """Fold new columns (steps ``steps_new``, oldest first) into ``state`` in place:
    W_t = min(max(0, W_(t-1) + theta_r y_t), cap x h_r). O(rows x new columns); vectorised
    as the cumulative sum minus its running minimum, the carried W as the walk's start.
    The cap only ever lowers W, so it keeps the false-alarm bound; it lets a finding clear
    within about as many steps after the slowdown ends as it took to raise."""
    num_rows, k = x_new.shape
    if k == 0 or num_rows == 0:
        return
    y = np.clip(x_new - params.m, -params.bound[:, None], params.bound[:, None]) - params.centre
    z = params.theta[:, None] * (y - params.kappa)
    c = np.concatenate([-state.evidence[:, None], np.cumsum(z, axis=1)], axis=1)
    low = np.minimum.accumulate(c, axis=1)
    w = c[:, -1] - low[:, -1]
    # the excursion began after the last index where the walk sat at its running minimum
    # (index j of ``c``: the excursion starts at new column j; index 0 with a carried
    # excursion: the carried onset stands)
    last_min = k - np.argmax((c <= low + 1e-12)[:, ::-1], axis=1)
    started = np.where(last_min < k, np.asarray(steps_new, dtype=np.int64)[np.minimum(last_min, k - 1)], -1)
    carried = (last_min == 0) & (state.onset_step >= 0)
    onset = np.where(carried, state.onset_step, started)
    # the excursion's level: the carried sum and steps when it goes on, else its new steps'
    # (the level is clipped at +-ln 100, not at the increments' bound: a 40x data loader's
    # factor must read 40x, and one 20x pause moves a 100-step mean by 3% only)
    lv = np.clip(x_new - params.m, -LEVEL_CLIP, LEVEL_CLIP) - params.centre
    cy = np.concatenate([np.zeros((num_rows, 1)), np.cumsum(lv, axis=1)], axis=1)
    j = np.minimum(last_min, k)
    since = cy[:, -1] - cy[np.arange(num_rows), j]
    assert state.level_sum is not None and state.level_steps is not None
    state.level_sum = np.where(w > 0, np.where(carried, state.level_sum + since, since), 0.0)
    state.level_steps = np.where(w > 0, np.where(carried, state.level_steps + k, k - j), 0).astype(np.int64)
    state.onset_step = np.where(w > 0, onset, -1).astype(np.int64)
    state.evidence = np.minimum(w, cap * params.threshold)  # no cap in a pass with no test (h = inf)


def cusum(x: np.ndarray, pooled_sigma: float, num_components: int, num_ranks: int,
          config: CusumConfig = CusumConfig(), row_sigma: np.ndarray | None = None,
          state: CusumState | None = None, new_from: int = 0, new_to: int | None = None,
          steps: np.ndarray | None = None) -> CusumResult:
    """One-sided CUSUM per row of ``x`` (ranks x steps log ratios, oldest first).

    Args:
        x: log ratios to the stage peers' median (the pass's window).
        pooled_sigma: robust noise scale of all rank-steps of ``x[:, :new_to]``.
        num_components: components tested per rank (the Bonferroni factor C).
        num_ranks: ranks of the job (N = max(this, ``config.fleet_ranks``)).
        config: drift, clip, false-alarm rate.
        row_sigma: each row's own noise, :func:`.robust.diff_sigma` of ``x[:, :new_to]``
            (computed when not given).
        state: the stream's carried statistic (updated in place); without it the test
            starts afresh on the window.
        new_from: with ``state``: the first column of ``x`` not folded yet (the columns
            before it only inform the noise estimate).
        new_to: with ``state``: fold columns up to this one (exclusive; default all); the
            columns after it (a step still arriving) inform nothing.
        steps: the step number of each column (default 0, 1, ...).
    """
    num_rows, num_steps = x.shape
    step_ids = np.arange(num_steps, dtype=np.int64) if steps is None else np.asarray(steps, dtype=np.int64)
    if num_steps < config.min_steps or num_rows == 0:
        st = state.evidence if state is not None else np.zeros(num_rows)
        on = np.zeros(num_rows, dtype=np.int64)
        return CusumResult(np.zeros(num_rows, dtype=bool), st.copy(), np.full(num_rows, np.inf),
                           on, 0.0, num_steps, np.full(num_rows, -1, dtype=np.int64), 0)
    if state is None:
        state, new_from, new_to = CusumState.empty(num_rows), 0, num_steps
    new_to = num_steps if new_to is None else min(max(new_to, 0), num_steps)
    new_from = min(max(new_from, 0), new_to)
    if new_to < config.min_steps:
        return CusumResult(np.zeros(num_rows, dtype=bool), state.evidence.copy(), np.full(num_rows, np.inf),
                           np.full(num_rows, num_steps - 1, dtype=np.int64), 0.0, num_steps,
                           state.onset_step.copy(), 0)
    judged = x[:, :new_to]
    params = _params(judged, pooled_sigma, num_components, num_ranks, config, row_sigma)
    fold(state, x[:, new_from:new_to], step_ids[new_from:new_to], params, config.cap)
    stat = state.evidence.copy()
    onset_step = state.onset_step.copy()
    # the change point as a column of the window (0 when it lies before the window)
    col = np.searchsorted(step_ids, np.where(onset_step >= 0, onset_step, step_ids[-1]), side="left")
    onset = np.minimum(col, num_steps - 1).astype(np.int64)
    assert state.level_steps is not None
    return CusumResult(stat >= params.threshold, stat, params.threshold, onset, params.lam, num_steps,
                       onset_step, new_to - new_from, state.level, state.level_steps.copy())


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
