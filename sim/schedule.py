"""One training step of a DP x PP x TP job, vectorised over ranks.

The schedule is the reference trainer's (:mod:`fleetscope.trainer.pipeline_parallel`,
``tensor_parallel``, ``data_parallel``, ``train._step``): per step a ``dataloader``
section; the non-interleaved 1F1B pipeline (warm-up forwards, one-forward-one-backward,
cool-down backwards) with p2p ``recv`` / ``send`` and the paired steady-state exchanges
of ``batch_isend_irecv``; inside every ``forward`` / ``backward`` section ``K`` TP
all-reduces (the LM head adds an ``all_gather`` forward and an ``all_reduce`` backward
on the last stage); a ``grad_sync`` section with one DP all-reduce; ``optimizer``.

Every pipeline chain (one per (dp, tp)) runs the same program, so the program is
interpreted once per step and each instruction acts on a (DP, TP) array of times:
a TP collective completes for its whole group at the latest member's arrival plus the
link time (lock-step), a p2p transfer when both sides posted, the DP all-reduce when
the slowest replica arrived. A late rank therefore makes its peers wait, and a hung
rank (time ``inf``) makes everyone who depends on it wait forever, as in the real job.

Times are float64 ns relative to the simulation start (exact to the ns for ~100 days).
Sequence numbers follow the hooks: collectives per group (the n-th op of a group has
the same ``seq`` on every member), p2p per (group, direction, peer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from fleetscope.sim.faults import HANG_WHERE, FaultPlan

from fleetscope.topology import Topology

OPS = ("all_reduce", "all_gather", "send", "recv")
AXES = ("tp", "dp", "pp")
DTYPES = ("bfloat16", "float32")
SECTIONS = ("dataloader", "forward", "backward", "grad_sync", "optimizer")
SECTION_KINDS = ("dataloader", "compute", "compute", "other", "optimizer")
INF = np.inf
_W = {w: i for i, w in enumerate(HANG_WHERE)}
KEY_SHIFT = 36
"""Activity lookups key (rank, time in step) as ``rank << 36 | ns``: steps up to 68 s."""


@dataclass(frozen=True)
class Timing:
    """Durations of one step's parts, derived from the target step time."""

    step_ms: float = 2000.0
    """Target step time (the schedule's bubble included)."""
    noise: float = 0.02
    """Relative standard deviation of every duration (log-normal jitter)."""
    rank_spread: float = 0.004
    """Relative spread of the ranks' persistent speed (no two GPUs are identical)."""

    def parts_ns(self, num_mb: int, pp: int, tp_ops: int) -> dict[str, float]:
        step = self.step_ms * 1e6
        slots = num_mb + pp - 1  # forward+backward slots of the 1F1B critical path
        fb = 0.805 * step / slots  # calibrated: the mean step comes out at step_ms
        fwd = fb / 3.0
        return {"dataloader": 0.02 * step, "forward": fwd, "backward": 2 * fwd,
                "optimizer": 0.03 * step, "grad_sync": 0.002 * step, "dp_link": 0.05 * step,
                "tp_link": 0.1 * fwd / max(1, tp_ops + 1), "pp_link": 0.01 * fwd,
                "gap": 0.0005 * step}


PART_NAMES = ("dataloader", "forward", "backward", "optimizer", "grad_sync", "dp_link", "tp_link",
              "pp_link", "gap")
"""The keys of :meth:`Timing.parts_ns` (ns): section base durations, link times, the gap
between steps."""


@dataclass(frozen=True)
class StepFactors:
    """Per-rank knobs of one step, set explicitly by a caller instead of a :class:`FaultPlan`.

    Every array is indexed by global rank (``link`` by group index, in the order of
    :attr:`Layout.group_names`); ``None`` leaves that part as the fault plan has it. They
    act on top of the fault plan, so a caller may use either or both.
    """

    compute: np.ndarray | None = None
    """Multiplies the forward and backward compute of the rank."""
    dataloader: np.ndarray | None = None
    """Multiplies the rank's dataloader section."""
    pause_ns: np.ndarray | None = None
    """Untimed host pause before the step's work (GC-like or launch skew): the step's
    start is before it, no section covers it."""
    link: np.ndarray | None = None
    """Multiplies the link time of every op of the group (TP/DP collectives, PP p2p)."""


class Layout:
    """Rank arrays of the mesh: ``rank_of[d, p, t]``, group-id indices per axis."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        D, P, T = topo.dp, topo.pp, topo.tp
        self.shape = (D, P, T)
        stride, strides = 1, {}
        for axis in topo.axes_fastest_first:
            strides[axis] = stride
            stride *= topo.size(axis)
        d, p, t = np.meshgrid(np.arange(D), np.arange(P), np.arange(T), indexing="ij")
        self.rank_of = (d * strides["dp"] + p * strides["pp"] + t * strides["tp"]).astype(np.int32)
        self.coords = {"dp": d, "pp": p, "tp": t}
        # group ids (the topology's own strings), one dictionary for all axes
        names: list[str] = []
        self.gidx: dict[str, np.ndarray] = {}
        fixed = {"tp": (("pp", P), ("dp", D)), "dp": (("pp", P), ("tp", T)), "pp": (("dp", D), ("tp", T))}
        for axis in AXES:
            (a1, n1), (a2, n2) = fixed[axis]
            base = len(names)
            names += [f"{axis}.{a1}{i}.{a2}{j}" for i in range(n1) for j in range(n2)]
            self.gidx[axis] = (base + self.coords[a1] * n2 + self.coords[a2]).astype(np.int32)
        self.group_names = names
        n = topo.world_size
        self.by_rank = {k: np.empty(n, dtype=np.int32) for k in ("dp", "pp", "tp")}
        for k in ("dp", "pp", "tp"):
            self.by_rank[k][self.rank_of.ravel()] = self.coords[k].ravel()
        # spot check against the topology (one place decides the mapping)
        r = int(self.rank_of[D - 1, P - 1, T - 1])
        c = topo.coords(r)
        assert (c.dp, c.pp, c.tp) == (D - 1, P - 1, T - 1)
        assert names[self.gidx["tp"][D - 1, P - 1, T - 1]] == topo.group_id("tp", r)


def pipeline_program(stage: int, num_stages: int, num_mb: int) -> list[tuple]:
    """The instructions of one stage per step, exactly as ``run_1f1b`` calls them.

    ``("F"|"B", mb)``; ``("recv"|"send", msg)``; ``("xchg", send_msg, recv_msg)`` for
    ``batch_isend_irecv``; a message is ``(kind, mb, src_stage, dst_stage)``.
    """
    s, P, M = stage, num_stages, num_mb
    first, last = s == 0, s == P - 1
    warmup = min(P - s - 1, M)
    remaining = M - warmup
    prog: list[tuple] = []
    fwd = bwd = 0
    for _ in range(warmup):
        if not first:
            prog.append(("recv", ("act", fwd, s - 1, s)))
        prog.append(("F", fwd))
        if not last:
            prog.append(("send", ("act", fwd, s, s + 1)))
        fwd += 1
    if remaining > 0 and not first:
        prog.append(("recv", ("act", fwd, s - 1, s)))
    for i in range(remaining):
        prog.append(("F", fwd))
        if not last:
            prog.append(("xchg", ("act", fwd, s, s + 1), ("grad", bwd, s + 1, s)))
        fwd += 1
        prog.append(("B", bwd))
        if i == remaining - 1:
            if not first:
                prog.append(("send", ("grad", bwd, s, s - 1)))
        elif not first:
            prog.append(("xchg", ("grad", bwd, s, s - 1), ("act", fwd, s - 1, s)))
        bwd += 1
    for _ in range(warmup):
        if not last:
            prog.append(("recv", ("grad", bwd, s + 1, s)))
        prog.append(("B", bwd))
        if not first:
            prog.append(("send", ("grad", bwd, s, s - 1)))
        bwd += 1
    return prog


@dataclass
class StepOut:
    """Everything one step produced (times relative to the simulation start)."""

    step: int
    sections: dict[str, np.ndarray]
    collectives: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    inflight: dict[str, np.ndarray]
    end: np.ndarray
    """(D, P, T) clock after the step (``inf`` for blocked or dead ranks)."""
    blocked: dict[str, np.ndarray]
    """Ranks that block for good in this step: their activity from then on."""


class _Acc:
    """Column chunks of one record type; scalars are broadcast on concatenation."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.chunks: list[tuple] = []

    def add(self, *cols) -> None:
        self.chunks.append(cols)

    def build(self, dtypes: dict[str, type]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        if not self.chunks:
            return {k: np.empty(0, dtype=dtypes[k]) for k in self.names}
        lens = [np.size(c[0]) for c in self.chunks]
        for i, k in enumerate(self.names):
            parts: list[np.ndarray] = []
            for c, n in zip(self.chunks, lens):
                v = c[i]
                parts.append(np.full(n, v, dtype=dtypes[k]) if np.ndim(v) == 0
                             else np.asarray(v, dtype=dtypes[k]).ravel())
            out[k] = np.concatenate(parts)
        return out


_COLL = ("rank", "step", "microbatch", "gidx", "axis", "group_rank", "group_size", "seq", "op",
         "bytes", "dtype", "peer", "enq", "done")
_COLL_T: dict[str, type] = {
    "rank": np.int32, "step": np.int64, "microbatch": np.int32, "gidx": np.int32,
    "axis": np.int8, "group_rank": np.int32, "group_size": np.int32, "seq": np.int64,
    "op": np.int8, "bytes": np.int64, "dtype": np.int8, "peer": np.int32,
    "enq": np.float64, "done": np.float64}
_SEC = ("rank", "step", "microbatch", "name", "start", "end")
_SEC_T: dict[str, type] = {"rank": np.int32, "step": np.int64, "microbatch": np.int32,
                           "name": np.int8, "start": np.float64, "end": np.float64}


class StepModel:
    """Plays steps of one job; keeps the per-group sequence counters between steps."""

    def __init__(self, topo: Topology, num_mb: int, tp_ops: int, timing: Timing,
                 faults: FaultPlan | None = None, seed: int = 0, inflight_interval_ns: float = 5e8,
                 act_bytes: int = 64 << 20, grad_bytes: int = 1 << 30,
                 parts_ns: Mapping[str, float] | None = None, record_inflight: bool = True,
                 tp_bytes: int | None = None) -> None:
        """``faults`` None: no faults. ``parts_ns`` overrides some or all of the
        durations :meth:`Timing.parts_ns` derives (keys of :data:`PART_NAMES`).
        ``record_inflight`` False skips the in-flight samples (a caller that wants only
        the sections, ops and steps). ``tp_bytes``: the TP collectives' size (default
        ``act_bytes``)."""
        self.topo, self.layout = topo, Layout(topo)
        self.M, self.K = num_mb, tp_ops
        if faults is None:
            faults = FaultPlan([], topo.world_size, 1)
        self.timing, self.faults = timing, faults
        self.rng = np.random.default_rng(seed)
        self.parts = timing.parts_ns(num_mb, topo.pp, tp_ops)
        unknown = set(parts_ns or {}) - set(PART_NAMES)
        if unknown:
            raise ValueError(f"parts_ns: unknown part(s) {sorted(unknown)}; known: {PART_NAMES}")
        self.parts.update({k: float(v) for k, v in (parts_ns or {}).items()})
        self.record_inflight = record_inflight
        self.tp_bytes = act_bytes if tp_bytes is None else tp_bytes
        self.programs = [pipeline_program(s, topo.pp, num_mb) for s in range(topo.pp)]
        self.act_bytes, self.grad_bytes = act_bytes, grad_bytes
        D, P, T = self.layout.shape
        self.speed = np.exp(self.rng.normal(0.0, timing.rank_spread, (D, P, T)))
        self.tp_seq = [0] * P
        self.dp_seq = 0
        self.p2p_seq: dict[tuple[int, str, int], int] = {}
        self.inflight_interval = float(inflight_interval_ns)
        self.phase = self.rng.uniform(0, self.inflight_interval, topo.world_size)
        ro = self.layout.rank_of
        self.f = {k: getattr(faults, k)[ro] for k in (
            "compute_factor", "compute_from", "dl_factor", "dl_from", "hang_step", "hang_where",
            "dead_step", "gc_every", "gc_pause_ns")}
        self.slow = {a: faults.slow_ns[a][ro] for a in AXES}

    # ---------------------------------------------------------------- helpers
    def _jit(self, shape) -> np.ndarray:
        return np.exp(self.rng.normal(0.0, self.timing.noise, shape))

    def _hang(self, step: int, *wheres: str) -> np.ndarray:
        """(D, P, T) mask of ranks whose hang of one of ``wheres`` applies at ``step``."""
        f = self.f
        m = np.zeros(self.layout.shape, dtype=bool)
        for w in wheres:
            m |= (f["hang_where"] == _W[w]) & (step >= f["hang_step"])
        return m

    # ---------------------------------------------------------------- one step
    def play(self, step: int, clock: np.ndarray, factors: StepFactors | None = None) -> StepOut:
        """Play step ``step`` from per-rank start times ``clock`` ((D, P, T), ns);
        ``factors`` (optional) scale this step's parts per rank / per group."""
        L, pt, f = self.layout, self.parts, self.f
        D, P, T = L.shape
        ro = L.rank_of
        fx = factors or StepFactors()
        x_comp = 1.0 if fx.compute is None else np.asarray(fx.compute, dtype=np.float64)[ro]
        x_dl = 1.0 if fx.dataloader is None else np.asarray(fx.dataloader, dtype=np.float64)[ro]
        if fx.link is None:
            x_link = {a: np.ones(L.shape) for a in AXES}
        else:
            lk = np.asarray(fx.link, dtype=np.float64)
            x_link = {a: lk[L.gidx[a]] for a in AXES}
        clock = clock.copy()
        dead = step >= f["dead_step"]
        clock[dead] = INF
        start = clock.copy()
        if fx.pause_ns is not None:
            clock = clock + np.asarray(fx.pause_ns, dtype=np.float64)[ro]
        secs, colls = _Acc(_SEC), _Acc(_COLL)
        h_coll = self._hang(step, "collective")
        h_in_coll = self._hang(step, "in_collective")
        h_p2p = self._hang(step, "p2p")
        h_in_p2p = self._hang(step, "in_p2p")
        h_compute = self._hang(step, "compute")
        comp = np.where(step >= f["compute_from"], f["compute_factor"], 1.0) * self.speed * x_comp
        # dataloader
        d = pt["dataloader"] * self._jit((D, P, T)) * np.where(step >= f["dl_from"], f["dl_factor"], 1.0) * x_dl
        secs.add(ro, step, -1, 0, clock, clock + d)
        clock = clock + d
        gc_mb = self._gc_microbatch(step)

        def collective(p, arrive, axis_i, op_i, mb, nbytes):
            """TP collective of stage ``p`` ((D, T) arrival times); returns completion."""
            hp = (slice(None), p, slice(None))
            enq = np.where(h_coll[hp], INF, arrive)
            eff = np.where(h_in_coll[hp], INF, enq + self.slow["tp"][hp])
            done = eff.max(axis=1, keepdims=True) + pt["tp_link"] * self._jit((D, 1)) * x_link["tp"][:, p, :1]
            done = np.broadcast_to(done, (D, T))
            self.tp_seq[p] += 1
            colls.add(ro[hp], step, mb, L.gidx["tp"][hp], axis_i, L.coords["tp"][hp], T,
                      self.tp_seq[p], op_i, nbytes, 0, -1, enq, done)
            return np.where(np.isinf(enq), INF, done)

        def compute(p, kind, mb):
            hp = (slice(None), p, slice(None))
            c = clock[hp]
            base = pt["forward" if kind == "F" else "backward"]
            dur = base * comp[hp] * self._jit((D, T))
            if kind == "F":
                dur = dur + np.where(gc_mb[hp] == mb, f["gc_pause_ns"][hp], 0.0)
            t0 = c.copy()
            head = p == P - 1 and T > 1
            n_ops = self.K if T > 1 else 0
            part = dur / (n_ops + 1)
            if kind == "F" and mb == 0:
                c = np.where(h_compute[hp], INF, c)
            if kind == "B" and head:  # LM head: its input-grad all-reduce comes first
                c = collective(p, c + part * 0.5, 0, 0, mb, self.tp_bytes)
            for _ in range(n_ops):
                c = collective(p, c + part, 0, 0, mb, self.tp_bytes)
            c = c + part
            if kind == "F" and head:  # LM head: gather the vocab-parallel logits
                c = collective(p, c, 0, 1, mb, self.tp_bytes)
            secs.add(ro[hp], step, mb, 1 if kind == "F" else 2, t0, c)
            clock[hp] = c

        posts: dict[tuple, np.ndarray] = {}
        done_msg: dict[tuple, np.ndarray] = {}

        def post(p, msg, side):
            key = (msg, side)
            if key not in posts:
                hp = (slice(None), p, slice(None))
                posts[key] = np.where(h_p2p[hp], INF, clock[hp])
            return posts[key]

        def complete(msg):
            if msg not in done_msg:
                kind, mb, src, dst = msg
                sp, rp = posts[(msg, "send")], posts[(msg, "recv")]
                hs, hr = (slice(None), src, slice(None)), (slice(None), dst, slice(None))
                eff = np.maximum(np.where(h_in_p2p[hs], INF, sp + self.slow["pp"][hs]),
                                 np.where(h_in_p2p[hr], INF, rp + self.slow["pp"][hr]))
                done_msg[msg] = eff + pt["pp_link"] * self._jit((D, T)) * x_link["pp"][:, src, :]
            return done_msg[msg]

        def record_p2p(p, msg, side, done):
            kind, mb, src, dst = msg
            hp = (slice(None), p, slice(None))
            other = dst if side == "send" else src
            key = (p, side, other)
            self.p2p_seq[key] = self.p2p_seq.get(key, 0) + 1
            enq = posts[(msg, side)]
            colls.add(ro[hp], step, -1, L.gidx["pp"][hp], 2, p, P, self.p2p_seq[key],
                      2 if side == "send" else 3, self.act_bytes, 0,
                      ro[:, other, :], enq, np.where(np.isinf(enq), INF, done))

        pc = [0] * P
        progs = self.programs
        while True:
            moved = False
            for p in range(P):
                prog = progs[p]
                while pc[p] < len(prog):
                    ins = prog[pc[p]]
                    op = ins[0]
                    if op in ("F", "B"):
                        compute(p, op, ins[1])
                    elif op in ("recv", "send"):
                        msg = ins[1]
                        post(p, msg, op)
                        if (msg, "send" if op == "recv" else "recv") not in posts:
                            break
                        dn = complete(msg)
                        record_p2p(p, msg, op, dn)
                        hp = (slice(None), p, slice(None))
                        clock[hp] = np.where(np.isinf(posts[(msg, op)]), INF, dn)
                    else:  # xchg: isend + irecv, waited in that order
                        _, smsg, rmsg = ins
                        post(p, smsg, "send")
                        post(p, rmsg, "recv")
                        if (smsg, "recv") not in posts or (rmsg, "send") not in posts:
                            break
                        ds, dr = complete(smsg), complete(rmsg)
                        dr = np.maximum(ds, dr)
                        record_p2p(p, smsg, "send", ds)
                        record_p2p(p, rmsg, "recv", dr)
                        hp = (slice(None), p, slice(None))
                        clock[hp] = np.where(np.isinf(posts[(smsg, "send")]), INF, dr)
                    pc[p] += 1
                    moved = True
            if all(pc[p] == len(progs[p]) for p in range(P)):
                break
            if not moved:  # cannot happen for the 1F1B programs (they are deadlock-free)
                raise RuntimeError(f"pipeline schedule stuck at {pc}")
        # grad_sync: one DP all-reduce per (stage, tp)
        g0 = clock.copy()
        if D > 1:
            arrive = clock + pt["grad_sync"] * 0.5 * self._jit((D, P, T))
            enq = np.where(h_coll, INF, arrive)
            eff = np.where(h_in_coll, INF, enq + self.slow["dp"])
            done = eff.max(axis=0, keepdims=True) + pt["dp_link"] * self._jit((1, P, T)) * x_link["dp"][:1]
            done = np.broadcast_to(done, (D, P, T))
            self.dp_seq += 1
            colls.add(ro, step, -1, L.gidx["dp"], 1, L.coords["dp"], D, self.dp_seq, 0,
                      self.grad_bytes, 1, -1, enq, done)
            clock = np.where(np.isinf(enq), INF, done) + pt["grad_sync"] * 0.5
        else:
            clock = clock + pt["grad_sync"]
        secs.add(ro, step, -1, 3, g0, clock)
        o = pt["optimizer"] * self._jit((D, P, T)) * self.speed
        secs.add(ro, step, -1, 4, clock, clock + o)
        clock = clock + o
        sec = secs.build(_SEC_T)
        col = colls.build(_COLL_T)
        # started but never entered (hang before the op) are not records of this rank
        keep = np.isfinite(col["enq"])
        col = {k: v[keep] for k, v in col.items()}
        keep = np.isfinite(sec["start"])
        sec = {k: v[keep] for k, v in sec.items()}
        end = clock
        fin = np.isfinite(end).ravel()
        steps: dict[str, np.ndarray] = {
            "rank": ro.ravel()[fin], "step": np.full(int(fin.sum()), step, dtype=np.int64),
            "start": start.ravel()[fin], "end": end.ravel()[fin]}
        if self.record_inflight:
            inflight, blocked = self._inflight(step, start, end, dead, sec, col)
        else:
            inflight, blocked = _empty_inflight(), _empty_blocked()
        end = end + pt["gap"] * self._jit((D, P, T))
        return StepOut(step, sec, col, steps, inflight, end, blocked)

    def _gc_microbatch(self, step: int) -> np.ndarray:
        every = self.f["gc_every"]
        out = np.full(self.layout.shape, -1)
        if step > 0:
            m = (every > 0) & (step % np.maximum(every, 1) == 0)
            if m.any():
                import random

                for idx in zip(*np.nonzero(m)):
                    r = int(self.layout.rank_of[idx])
                    out[idx] = random.Random(r * 7919 + step).randrange(self.M)
        return out

    # ---------------------------------------------------------------- liveness
    def _inflight(self, step, start, end, dead, sec, col):
        """In-flight samples of this step (the hooks write one per rank every interval)."""
        n = self.topo.world_size
        ro = self.layout.rank_of.ravel()
        s = np.empty(n)
        e = np.empty(n)
        s[ro], e[ro] = start.ravel(), end.ravel()
        finite_s = np.isfinite(s)
        finite_e = e[np.isfinite(e)]
        if not finite_s.any():
            return _empty_inflight(), _empty_blocked()
        base = float(s[finite_s].min())
        cap = float(finite_e.max()) if finite_e.size else base + 3 * self.timing.step_ms * 1e6
        e_cap = np.where(np.isfinite(e), e, cap)
        iv = self.inflight_interval
        k0 = np.ceil((np.where(finite_s, s, cap) - self.phase) / iv)
        k1 = np.ceil((e_cap - self.phase) / iv)
        cnt = np.where(finite_s, np.maximum(0, k1 - k0), 0).astype(np.int64)
        total = int(cnt.sum())
        ranks = np.repeat(np.arange(n, dtype=np.int32), cnt)
        first = np.repeat(k0, cnt)
        within = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        ts = (first + within) * iv + self.phase[ranks]
        kind, op, gidx, axis, seq, peer, since = self._lookup(ranks, ts, base, sec, col)
        infl = {"rank": ranks, "ts": ts, "step": np.full(total, step, dtype=np.int64), "kind": kind,
                "op": op, "gidx": gidx, "axis": axis, "seq": seq, "peer": peer, "since": since}
        # ranks blocked for good from this step: the activity they stay in
        stuck = np.nonzero(finite_s & ~np.isfinite(e))[0].astype(np.int32)
        blocked = _empty_blocked()
        if stuck.size:
            far = np.full(stuck.size, 1e300)  # later than any finite end: only open activities
            kind, op, gidx, axis, seq, peer, since = self._lookup(stuck, far, base, sec, col)
            since = np.where(kind == 0, np.nan, since)  # idle: "since" is each sample's time
            blocked = {"rank": stuck, "step": np.full(stuck.size, step, dtype=np.int64), "kind": kind,
                       "op": op, "gidx": gidx, "axis": axis, "seq": seq, "peer": peer, "since": since,
                       "next_k": k1[stuck].astype(np.int64)}
        return infl, blocked

    def _lookup(self, ranks, ts, base, sec, col):
        """What each (rank, time) is in: a collective/p2p op, else a section, else idle.

        kind codes: 0 idle, 1 section, 2 collective, 3 p2p; op is an OPS index for ops
        and a SECTIONS index for sections.
        """
        n = ranks.size
        kind = np.zeros(n, dtype=np.int8)
        op = np.full(n, -1, dtype=np.int8)
        gidx = np.full(n, -1, dtype=np.int32)
        axis = np.full(n, -1, dtype=np.int8)
        seq = np.full(n, -1, dtype=np.int64)
        peer = np.full(n, -1, dtype=np.int32)
        since = ts.copy()
        lim = (1 << KEY_SHIFT) - 1
        qk = (ranks.astype(np.int64) << KEY_SHIFT) | np.clip(np.nan_to_num(ts - base, posinf=lim), 0, lim).astype(np.int64)
        for layer in ("sections", "collectives"):
            if layer == "sections":
                rk, t0, t1 = sec["rank"], sec["start"], sec["end"]
            else:
                rk, t0, t1 = col["rank"], col["enq"], col["done"]
            if rk.size == 0:
                continue
            keys = (rk.astype(np.int64) << KEY_SHIFT) | np.clip(t0 - base, 0, lim).astype(np.int64)
            order = np.argsort(keys, kind="stable")
            ks = keys[order]
            i = np.searchsorted(ks, qk, side="right") - 1
            ok = i >= 0
            j = order[np.where(ok, i, 0)]
            ok &= (rk[j] == ranks) & (t1[j] > ts) & (t0[j] <= ts)
            if layer == "sections":
                kind[ok] = 1
                op[ok] = sec["name"][j[ok]]
            else:
                kind[ok] = np.where(col["axis"][j[ok]] == 2, 3, 2)
                op[ok] = col["op"][j[ok]]
                gidx[ok] = col["gidx"][j[ok]]
                axis[ok] = col["axis"][j[ok]]
                seq[ok] = col["seq"][j[ok]]
                peer[ok] = col["peer"][j[ok]]
            since[ok] = t0[j[ok]]
        return kind, op, gidx, axis, seq, peer, since


def _empty_inflight() -> dict[str, np.ndarray]:
    return {"rank": np.empty(0, np.int32), "ts": np.empty(0), "step": np.empty(0, np.int64),
            "kind": np.empty(0, np.int8), "op": np.empty(0, np.int8), "gidx": np.empty(0, np.int32),
            "axis": np.empty(0, np.int8), "seq": np.empty(0, np.int64), "peer": np.empty(0, np.int32),
            "since": np.empty(0)}


def _empty_blocked() -> dict[str, np.ndarray]:
    out = _empty_inflight()
    del out["ts"]
    out["next_k"] = np.empty(0, np.int64)
    return out
