"""Hang detection and localisation.

*Stall*: no rank completed a step for ``max(hang_min_s, hang_k x p99 recent step time)``,
or - usually much earlier - no rank completed any traced op while ranks wait in ops
(:mod:`.progress`). Both rules feed the same localisation and the same single finding.

*Localisation* builds a wait-for graph from every rank's latest in-flight record (what
its training thread is blocked in: a collective ``(group_id, seq)``, a p2p op with a
peer, or a section) and its last completed sequence number per group:

* a rank in collective ``G#seq`` waits for each member of ``G`` that is neither in
  ``G#seq`` nor past it (it never reached the collective);
* a rank in a p2p op waits for its peer unless the peer is in the matching op;
* the roots are the ranks reached from blocked ranks that wait for nobody. A root's
  class comes from its own state and heartbeat: process dead, stuck in compute,
  data-loader stall, nothing known, or - when it is blocked in an op whose peers are
  all present - a link/NCCL fault in that group (a mismatch when their ops differ).
  Ranks that wait on each other in a cycle are a collective desync (mismatch).

When every process is gone (a crash propagates through the group), the culprit is the
rank that died first and was last seen earliest.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetscope.topology import Topology

from .breakdown import P2P_OPS
from .findings import Finding, FindingKind, HangAnalysis, HangClass, Severity
from .progress import ProgressStall

CRASH_GAP_NS = 1_500_000_000
DEATH_GAP_NS = 500_000_000
"""Heartbeats (every ~2 s) that saw one rank dead before the others died first."""
"""A rank silent this much before the others (while they still wrote in-flight records
every ~0.5 s) died first."""


@dataclass(frozen=True)
class HangConfig:
    hang_min_s: float = 30.0
    """Never call a stall a hang before this many seconds without a completed step."""
    first_step_min_s: float = 120.0
    """...nor a job that has completed no step yet before this many seconds, unless a rank
    is blocked in an op or dead: start-up (imports, rendezvous, compilation, a checkpoint's
    load) is not a stall. 8 ranks starting on 2 loaded cores took over 30 s to their first
    step, and a clean job was paged as hung "after step -1" with no culprit (bench,
    2026-12-07)."""
    hang_k: float = 5.0
    """...or before this many times the recent p99 step time, if longer."""
    inflight_stale_s: float = 10.0
    """An in-flight record older than this no longer describes the rank."""
    heartbeat_stale_s: float = 15.0
    """A heartbeat older than this means the host/agent is gone."""
    min_blocked_s: float = 2.0
    """An in-flight op/section younger than this (at the time of its record) is a snapshot
    of a running rank, not a rank that is stuck."""
    dead_rank_min_s: float = 5.0
    """Stall threshold once a rank's process is known dead (no step can complete)."""
    hang_op_min_s: float = 20.0
    """Never call a job-wide op silence a hang before this many seconds (see README)."""
    op_min_history_steps: int = 3
    """Complete steps after the warm-up step needed before op silence is judged."""


class RankStateKind(str, enum.Enum):
    """What a rank was doing when last seen (its in-flight record and heartbeat)."""

    COLLECTIVE = "collective"
    """Inside a collective op (waiting for its group, or transferring)."""
    P2P = "p2p"
    """Inside a point-to-point send/recv."""
    SECTION = "section"
    """Inside a timed section (compute, data loading, ...)."""
    DEAD = "dead"
    """Its process is gone (the agent saw it exit)."""
    IDLE = "idle"
    """Alive (fresh heartbeat) but in no traced op or section."""
    UNKNOWN = "unknown"
    """Neither a fresh in-flight record nor a fresh heartbeat."""

    def __str__(self) -> str:  # the value, on every Python (3.11 changed str() of mixins)
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


IN_OP = frozenset({RankStateKind.COLLECTIVE, RankStateKind.P2P})
"""Rank states that wait on other ranks."""
TRACED = frozenset({*IN_OP, RankStateKind.SECTION})
"""Rank states an in-flight record reports."""


@dataclass(frozen=True)
class RankState:
    rank: int
    kind: RankStateKind
    op: str = ""
    group_id: str = ""
    seq: int = -1
    peer: int = -1
    since_ns: int = -1
    host: str = ""


def stall_threshold_s(steps: pd.DataFrame, config: HangConfig, warmup_step: int = -1) -> float:
    """``max(hang_min_s, hang_k x p99 of the recent per-step job time)``, the attempt's
    warm-up step (``warmup_step``: compilation, communicator setup) left out once others exist."""
    if steps.empty:
        return config.hang_min_s
    per_step = steps.groupby("step")["duration_ns"].max().sort_index().tail(50)
    if len(per_step) > 1:
        per_step = per_step[per_step.index != warmup_step]
    p99 = float(np.percentile(per_step.to_numpy(), 99)) / 1e9
    return max(config.hang_min_s, config.hang_k * p99)


class RankStates(Mapping[int, RankState]):
    """What each rank ``0 .. world - 1`` is doing (:func:`rank_states`), held as arrays.

    A read-only mapping rank -> :class:`RankState`; an entry is built only when it is
    looked at (a pass over 12,288 ranks that finds no stall looks at none). ``code``
    (per rank, an index into :data:`KINDS`) answers "which ranks are in which state"
    without building any."""

    KINDS: tuple[RankStateKind, ...] = tuple(RankStateKind)

    def __init__(self, code: np.ndarray, since_ns: np.ndarray, host: np.ndarray, has_host: np.ndarray,
                 op: np.ndarray, group_id: np.ndarray, seq: np.ndarray, peer: np.ndarray) -> None:
        self.code = code
        self._since, self._host, self._has_host = since_ns, host, has_host
        self._op, self._gid, self._seq, self._peer = op, group_id, seq, peer
        self._built: dict[int, RankState] = {}

    def __len__(self) -> int:
        return len(self.code)

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.code)))

    def __contains__(self, r: object) -> bool:
        return isinstance(r, (int, np.integer)) and 0 <= int(r) < len(self.code)

    def __getitem__(self, r: int) -> RankState:
        got = self._built.get(r)
        if got is not None:
            return got
        if r not in self:
            raise KeyError(r)
        r = int(r)
        kind = self.KINDS[int(self.code[r])]
        host = str(self._host[r]) if self._has_host[r] else ""
        if kind in TRACED:
            st = RankState(r, kind, str(self._op[r]), str(self._gid[r]), int(self._seq[r]), int(self._peer[r]),
                           int(self._since[r]), host)
        elif kind == RankStateKind.DEAD:
            st = RankState(r, kind, host=host, since_ns=int(self._since[r]))
        else:
            st = RankState(r, kind, host=host)
        self._built[r] = st
        return st

    def mask(self, *kinds: RankStateKind) -> np.ndarray:
        """Per rank: in one of ``kinds``."""
        return np.isin(self.code, [self.KINDS.index(k) for k in kinds])

    def ranks_in(self, *kinds: RankStateKind) -> list[int]:
        return np.flatnonzero(self.mask(*kinds)).tolist()


_CODE = {k.value: i for i, k in enumerate(RankStates.KINDS)}
_TRACED_VALUES = [k.value for k in TRACED]


def _latest_per_rank(df: pd.DataFrame | None, col: str, world: int) -> tuple[pd.DataFrame, np.ndarray]:
    """The latest row per rank (the rows :func:`_latest` picks) and, per rank of
    ``range(world)``, its position in that frame (-1: none)."""
    pos = np.full(world, -1, dtype=np.int64)
    if df is None or df.empty:
        return pd.DataFrame(), pos
    d = df[df["rank"] >= 0]
    if d["rank"].duplicated().any():  # (the loader's frames hold one row per rank already)
        d = d.sort_values(col).groupby("rank").tail(1)
    r = d["rank"].to_numpy().astype(np.int64)
    ok = r < world
    pos[r[ok]] = np.flatnonzero(ok)
    return d, pos


def _take(values: np.ndarray, pos: np.ndarray, fill: Any) -> np.ndarray:
    """``values[pos]`` per rank, ``fill`` where ``pos`` is -1."""
    if not len(values):
        return np.full(len(pos), fill, dtype=object)
    out = values[np.maximum(pos, 0)]  # (a copy)
    out[pos < 0] = fill
    return out


def _i64(col: pd.Series) -> np.ndarray:
    """An integer column as int64 (a missing value, which no rank state reads, as -1)."""
    if col.dtype.kind in "iub":
        return col.to_numpy().astype(np.int64)
    return pd.to_numeric(col, errors="coerce").fillna(-1).to_numpy().astype(np.int64)


class _RankFacts(NamedTuple):
    """Per rank of ``range(world)``: its latest in-flight record and heartbeat as arrays."""

    has_inf: np.ndarray
    stuck: np.ndarray
    """In a traced op/section for ``min_blocked_s`` at the time of its record."""
    fresh: np.ndarray
    """Its record is at most ``inflight_stale_s`` old."""
    traced_code: np.ndarray
    in_since: np.ndarray
    has_hb: np.ndarray
    alive: np.ndarray
    hb_fresh: np.ndarray
    died_ns: np.ndarray
    host: np.ndarray
    op: np.ndarray
    group_id: np.ndarray
    seq: np.ndarray
    peer: np.ndarray


def _rank_facts(topo: Topology, inflight: pd.DataFrame, heartbeats: pd.DataFrame, now_ns: int,
                config: HangConfig) -> _RankFacts:
    world = topo.world_size
    d, ip = _latest_per_rank(inflight, "ts_ns", world)
    h, hp = _latest_per_rank(heartbeats, "ts_ns", world)
    has_inf, has_hb = ip >= 0, hp >= 0
    n = len(d)
    if n:
        ts, since = _i64(d["ts_ns"]), _i64(d["since_ns"])
        kind_code = d["kind"].map(_CODE).fillna(-1).to_numpy().astype(np.int64)
        stuck_row = d["kind"].isin(_TRACED_VALUES).to_numpy() & (ts - since >= config.min_blocked_s * 1e9)
        fresh_row = now_ns - ts <= config.inflight_stale_s * 1e9
    else:
        since = kind_code = np.zeros(0, dtype=np.int64)
        stuck_row = fresh_row = np.zeros(0, dtype=bool)
    if len(h):
        hb_ts = _i64(h["ts_ns"])
        alive = h["alive"].to_numpy().astype(bool)
        died = _i64(h["dead_since_ns"] if "dead_since_ns" in h.columns else h["ts_ns"])
        hb_fresh_row = now_ns - hb_ts <= config.heartbeat_stale_s * 1e9
        host = _take(h["host"].to_numpy(dtype=object), hp, "") if "host" in h.columns else \
            np.full(world, "", dtype=object)
    else:
        died = np.zeros(0, dtype=np.int64)
        alive = hb_fresh_row = np.zeros(0, dtype=bool)
        host = np.full(world, "", dtype=object)

    def col(name: str, fill: Any) -> np.ndarray:
        return _take(d[name].to_numpy(dtype=object), ip, fill) if n and name in d.columns else \
            np.full(world, fill, dtype=object)

    return _RankFacts(
        has_inf=has_inf, stuck=has_inf & _take(stuck_row, ip, False).astype(bool),
        fresh=has_inf & _take(fresh_row, ip, False).astype(bool),
        traced_code=_take(kind_code, ip, -1).astype(np.int64), in_since=_take(since, ip, -1).astype(np.int64),
        has_hb=has_hb, alive=_take(alive, hp, True).astype(bool),
        hb_fresh=has_hb & _take(hb_fresh_row, hp, False).astype(bool),
        died_ns=_take(died, hp, -1).astype(np.int64), host=host,
        op=col("op", ""), group_id=col("group_id", ""), seq=col("seq", -1), peer=col("peer", -1))


def _states_of(f: _RankFacts, ignore_death: bool) -> RankStates:
    """:func:`rank_states` from the facts: the same decisions as the reference's, per array."""
    idle, unknown, dead = _CODE["idle"], _CODE["unknown"], _CODE["dead"]
    if ignore_death:
        code = np.where(f.stuck, f.traced_code, idle)
        since_ns = np.where(f.stuck, f.in_since, -1)
    else:
        is_dead = f.has_hb & ~f.alive
        busy = f.fresh & f.stuck
        code = np.select([is_dead, busy, f.hb_fresh], [dead, f.traced_code, idle], unknown)
        since_ns = np.select([is_dead, busy], [f.died_ns, f.in_since], -1)
    return RankStates(code.astype(np.int64), since_ns.astype(np.int64), f.host, f.has_hb,
                      f.op, f.group_id, f.seq, f.peer)


def rank_states(
    topo: Topology, inflight: pd.DataFrame, heartbeats: pd.DataFrame, now_ns: int,
    config: HangConfig, ignore_death: bool = False,
) -> RankStates:
    """What each rank is doing now, from its latest in-flight record and heartbeat.

    With ``ignore_death`` every rank gets its last in-flight state however old.
    Array for array what :func:`rank_states_reference` decides rank by rank.
    """
    return _states_of(_rank_facts(topo, inflight, heartbeats, now_ns, config), ignore_death)


def rank_states_reference(
    topo: Topology, inflight: pd.DataFrame, heartbeats: pd.DataFrame, now_ns: int,
    config: HangConfig, ignore_death: bool = False,
) -> dict[int, RankState]:
    """:func:`rank_states` rank by rank (the definition; the previous pass used it, the
    benchmark and the equivalence tests still do)."""
    inf = _latest(inflight, "ts_ns")
    hb = _latest(heartbeats, "ts_ns")
    out: dict[int, RankState] = {}
    for r in topo.ranks():
        h = hb.get(r)
        host = str(h["host"]) if h is not None else ""
        row = inf.get(r)
        stuck = row is not None and row["kind"] in TRACED and (
            int(row["ts_ns"]) - int(row["since_ns"]) >= config.min_blocked_s * 1e9)
        if ignore_death:
            if stuck and row is not None:
                out[r] = RankState(r, RankStateKind(str(row["kind"])), str(row["op"]), str(row["group_id"]),
                                   int(row["seq"]), int(row["peer"]), int(row["since_ns"]), host)
            else:
                out[r] = RankState(r, RankStateKind.IDLE, host=host)
            continue
        if h is not None and not bool(h["alive"]):
            out[r] = RankState(r, RankStateKind.DEAD, host=host, since_ns=int(h.get("dead_since_ns", h["ts_ns"])))
            continue
        fresh = row is not None and now_ns - int(row["ts_ns"]) <= config.inflight_stale_s * 1e9
        hb_fresh = h is not None and now_ns - int(h["ts_ns"]) <= config.heartbeat_stale_s * 1e9
        if fresh and stuck and row is not None:
            out[r] = RankState(r, RankStateKind(str(row["kind"])), str(row["op"]), str(row["group_id"]),
                               int(row["seq"]), int(row["peer"]), int(row["since_ns"]), host)
        elif hb_fresh:
            out[r] = RankState(r, RankStateKind.IDLE, host=host)
        else:
            out[r] = RankState(r, RankStateKind.UNKNOWN, host=host)
    return out


def _latest(df: pd.DataFrame, col: str) -> dict[int, dict]:
    """Rank -> its latest row (as a dict: ``iterrows`` cost ~40 s at 12,288 ranks)."""
    if df is None or df.empty:
        return {}
    d = df[df["rank"] >= 0].sort_values(col).groupby("rank").tail(1)
    cols = list(d.columns)
    arrays = [d[c].to_numpy(dtype=object) if not pd.api.types.is_numeric_dtype(d[c].dtype) else d[c].to_numpy()
              for c in cols]
    return {int(row["rank"]): row for row in (dict(zip(cols, vals)) for vals in zip(*arrays))}


def wait_for_graph(
    topo: Topology, states: Mapping[int, RankState], progress: pd.DataFrame
) -> dict[int, list[tuple[int, str]]]:
    """Edges ``waiter -> [(waited_for, reason)]`` between ranks.

    The members a collective ``G#seq`` waits for are the same for every rank in it, so
    they are found once per ``(G, seq)``, not once per rank (12,288 ranks in 192-rank DP
    groups: 2.4 M member checks -> 25 k); the edges are :func:`wait_for_graph_reference`'s.
    """
    last_seq = _last_seqs(progress)
    edges: dict[int, list[tuple[int, str]]] = {}
    members_of: dict[str, list[int] | None] = {}
    waited_of: dict[tuple[str, int], list[tuple[int, str]] | None] = {}
    if isinstance(states, RankStates):  # only the ranks in an op have edges
        items: Any = ((r, states[r]) for r in states.ranks_in(*IN_OP))
    else:
        items = states.items()
    for r, st in items:
        if st.kind == RankStateKind.COLLECTIVE and st.group_id:
            gid, seq = st.group_id, st.seq
            key = (gid, seq)
            if key not in waited_of:
                if gid not in members_of:
                    try:
                        members_of[gid] = topo.parse_group_id(gid)[1]
                    except ValueError:
                        members_of[gid] = None
                members = members_of[gid]
                waited: list[tuple[int, str]] | None = None
                if members is not None:
                    waited = []
                    for q in members:
                        qs = states.get(q)
                        if qs and qs.kind == RankStateKind.COLLECTIVE and qs.group_id == gid and qs.seq == seq:
                            continue
                        if last_seq.get((q, gid), -1) >= seq >= 0:
                            continue
                        waited.append((q, _where(qs)))
                waited_of[key] = waited
            found = waited_of[key]
            if found is None:
                continue
            for q, where in found:
                if q != r:
                    edges.setdefault(r, []).append((q, f"{st.op} {gid}#{seq}: rank {q} never arrived ({where})"))
        elif st.kind == RankStateKind.P2P and 0 <= st.peer < topo.world_size:
            edge = _p2p_edge(states, r, st)
            if edge is not None:
                edges.setdefault(r, []).append(edge)
    return edges


def _last_seqs(progress: pd.DataFrame | None) -> dict[tuple[int, str], int]:
    """``(rank, group_id) -> last completed seq`` (a later row wins, as in the reference)."""
    if progress is None or progress.empty:
        return {}
    keys = zip(progress["rank"].astype("int64").tolist(), progress["group_id"].astype(str).tolist())
    return dict(zip(keys, progress["last_seq"].astype("int64").tolist()))


def wait_for_graph_reference(
    topo: Topology, states: Mapping[int, RankState], progress: pd.DataFrame
) -> dict[int, list[tuple[int, str]]]:
    """:func:`wait_for_graph` rank by rank and member by member (the definition)."""
    last_seq = _last_seqs(progress)
    edges: dict[int, list[tuple[int, str]]] = {}
    for r, st in states.items():
        if st.kind == RankStateKind.COLLECTIVE and st.group_id:
            try:
                members = topo.parse_group_id(st.group_id)[1]
            except ValueError:
                continue
            for q in members:
                qs = states.get(q)
                if q == r or (qs and qs.kind == RankStateKind.COLLECTIVE and qs.group_id == st.group_id and qs.seq == st.seq):
                    continue
                if last_seq.get((q, st.group_id), -1) >= st.seq >= 0:
                    continue
                where = _where(qs)
                edges.setdefault(r, []).append((q, f"{st.op} {st.group_id}#{st.seq}: rank {q} never arrived ({where})"))
        elif st.kind == RankStateKind.P2P and 0 <= st.peer < topo.world_size:
            edge = _p2p_edge(states, r, st)
            if edge is not None:
                edges.setdefault(r, []).append(edge)
    return edges


def _p2p_edge(states: Mapping[int, RankState], r: int, st: RankState) -> tuple[int, str] | None:
    """Rank ``r``, in p2p op ``st``, waits for its peer unless the peer is in the matching op."""
    qs = states.get(st.peer)
    want = "recv" if st.op in ("send", "isend") else "send"
    if qs and qs.kind == RankStateKind.P2P and qs.peer == r and qs.op.lstrip("i") == want:
        return None
    return st.peer, f"{st.op} with rank {st.peer} ({_where(qs)})"


def _where(s: RankState | None) -> str:
    if s is None:
        return "no data"
    if s.kind in IN_OP:
        return f"in {s.op} {s.group_id}#{s.seq}" + (f" peer {s.peer}" if s.peer >= 0 else "")
    if s.kind == RankStateKind.SECTION:
        return f"in section {s.op}"
    return s.kind


class Localised(NamedTuple):
    """Where a hang is: what :func:`localise` finds."""

    culprits: tuple[int, ...]
    """The ranks to look at, most waited-on first."""
    hang_class: HangClass | None
    group_id: str
    """The process group the culprits are stuck in ("" outside one)."""
    chain: tuple[tuple[int, int, str], ...]
    """Wait-for edges ``(waiter, waited_for, reason)`` leading to the culprits."""
    evidence: dict[str, Any]


def localise(
    topo: Topology, states: Mapping[int, RankState], progress: pd.DataFrame,
    last_seen: dict[int, int] | None = None, last_known: Mapping[int, RankState] | None = None,
    reference: bool = False, failed_ops: Mapping[int, int] | None = None,
) -> Localised:
    """Culprit ranks (most waited-on first), class, group, wait-for chain and evidence.

    ``reference``: the wait-for graph member by member (:func:`wait_for_graph_reference`),
    as the previous pass built it; the same result.

    ``last_known`` are the ranks' states from their latest in-flight records however old,
    used when every process is gone (a crash that took the job down, or a hung job that
    was killed): the graph just before the end still points at the culprit.

    ``failed_ops`` (rank -> time of its first failed op, read once every process is gone):
    ranks whose ops failed under them lost a peer; when some ranks died without a failed
    op, the first to go is among those (:func:`died_without_failed_op`).
    """
    edges = (wait_for_graph_reference if reference else wait_for_graph)(topo, states, progress)
    if isinstance(states, RankStates):
        blocked, dead = states.ranks_in(*IN_OP), states.ranks_in(RankStateKind.DEAD)
    else:
        blocked = [r for r, s in states.items() if s.kind in IN_OP]
        dead = [r for r, s in states.items() if s.kind == RankStateKind.DEAD]
    evidence: dict = {
        "blocked_ranks": sorted(blocked),
        "dead_ranks": sorted(dead),
        "rank_states": {str(r): _where(s) for r, s in sorted(states.items())},
    }
    if dead and len(dead) == len(states):  # everything is gone: who went first?
        died = {r: states[r].since_ns for r in dead}
        by_death = sorted(died.values())
        if len(by_death) > 1 and by_death[1] - by_death[0] >= DEATH_GAP_NS:
            seen, gap = died, DEATH_GAP_NS  # the agent saw one process gone while others ran
        else:
            seen, gap = {r: (last_seen or {}).get(r) or states[r].since_ns for r in dead}, CRASH_GAP_NS
        t_first = min(seen.values())
        first_dead = tuple(sorted(r for r in dead if seen[r] - t_first < gap))
        unfailed = died_without_failed_op(dead, failed_ops)
        if unfailed:  # their peers' ops failed when they vanished: they went first
            first_dead = tuple(r for r in first_dead if r in unfailed) or unfailed
            evidence["failed_op_ranks"] = sorted(r for r in dead if r not in unfailed)
        crash = len(first_dead) < len(dead)  # one went silent while the others still reported
        evidence.update(all_dead=True, first_silent=list(first_dead),
                        silent_before_others_s=round((sorted(seen.values())[len(first_dead)] - t_first) / 1e9, 3)
                        if crash else 0.0)
        if last_known:  # the wait-for graph as it was just before the processes went away
            culprits, cls, gid, last_chain, ev = localise(topo, last_known, progress, reference=reference)
            if culprits:
                if crash and set(culprits) & set(first_dead):
                    culprits = tuple(r for r in culprits if r in first_dead)
                    cls, gid = HangClass.PROCESS_DEAD, ""
                return Localised(culprits, cls, gid, last_chain, {**ev, **evidence})
        return Localised(first_dead, HangClass.PROCESS_DEAD, "", (), evidence)
    # ranks reachable from the blocked ones
    reach: dict[int, int] = {}
    chain: list[tuple[int, int, str]] = []
    frontier = list(blocked)
    seen_nodes = set(frontier)
    while frontier:
        r = frontier.pop()
        for q, why in edges.get(r, []):
            chain.append((r, q, why))
            reach[q] = reach.get(q, 0) + 1
            if q not in seen_nodes:
                seen_nodes.add(q)
                frontier.append(q)
    roots = [r for r in seen_nodes if not edges.get(r)]
    if not roots and seen_nodes:  # ranks wait on each other in a cycle: collective desync
        cyc = sorted(r for r in seen_nodes if edges.get(r))
        return Localised(tuple(cyc), HangClass.COLLECTIVE_MISMATCH, "", tuple(chain), evidence)
    if not roots:
        return Localised((), None, "", (), evidence)
    # upstream count: how many ranks (transitively) wait on each root
    waiters = ({r: _count_upstream(r, edges) for r in roots} if reference else _upstream_counts(roots, edges))
    roots.sort(key=lambda r: (-waiters[r], r))
    top = states[roots[0]]
    group_id = ""
    if top.kind in IN_OP:
        group_id = top.group_id
        members = [r for r in roots if states[r].kind == top.kind and states[r].group_id == group_id]
        ops = {states[r].op.lstrip("i") for r in members}
        cls = HangClass.COLLECTIVE_FAULT
        if top.kind == RankStateKind.COLLECTIVE and len(ops) > 1:
            cls = HangClass.COLLECTIVE_MISMATCH
        culprits = tuple(sorted(members, key=lambda r: (-waiters[r], r)))
        evidence["group_ops"] = {str(r): states[r].op for r in members}
    else:
        cls = {
            RankStateKind.DEAD: HangClass.PROCESS_DEAD,
            RankStateKind.UNKNOWN: HangClass.UNRESPONSIVE,
            RankStateKind.IDLE: HangClass.STUCK_OUTSIDE_TRACED_CODE,
        }.get(top.kind)
        if top.kind == RankStateKind.SECTION:
            cls = HangClass.DATALOADER_STALL if "data" in top.op or "loader" in top.op else HangClass.STUCK_IN_COMPUTE
        culprits = tuple(r for r in roots if states[r].kind not in IN_OP
                         and waiters[r] >= 0.5 * waiters[roots[0]])
        evidence["other_roots"] = [r for r in roots if r not in culprits]
    evidence["num_waiting_on_culprit"] = {str(r): waiters[r] for r in culprits}
    return Localised(culprits, cls, group_id, tuple(_chain_to(chain, set(culprits))), evidence)


def died_without_failed_op(dead: list[int] | tuple[int, ...],
                           failed_ops: Mapping[int, int] | None) -> tuple[int, ...]:
    """Of ``dead`` ranks (every process of the job gone), those whose latest steps hold no
    failed op, when that singles some out: a rank that crashed took no op down with it,
    while each peer that was in (or entered) an op with it saw that op fail - gloo at once
    ("connection closed by peer"), NCCL when its watchdog aborts. Empty when no rank or
    every rank has a failed op (nothing tells them apart)."""
    if not failed_ops:
        return ()
    out = tuple(sorted(r for r in dead if r not in failed_ops))
    return out if len(out) < len(dead) else ()


def _upstream_counts(roots: list[int], edges: dict[int, list[tuple[int, str]]]) -> dict[int, int]:
    """:func:`_count_upstream` of each root, the reverse graph built once (not per root)."""
    rev: dict[int, list[int]] = {}
    for a, outs in edges.items():
        for b, _ in outs:
            rev.setdefault(b, []).append(a)
    out: dict[int, int] = {}
    for root in roots:
        seen, stack = set(), [root]
        while stack:
            for a in rev.get(stack.pop(), []):
                if a not in seen:
                    seen.add(a)
                    stack.append(a)
        out[root] = len(seen)
    return out


def _count_upstream(root: int, edges: dict[int, list[tuple[int, str]]]) -> int:
    rev: dict[int, list[int]] = {}
    for a, outs in edges.items():
        for b, _ in outs:
            rev.setdefault(b, []).append(a)
    seen, stack = set(), [root]
    while stack:
        for a in rev.get(stack.pop(), []):
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return len(seen)


def _chain_to(chain: list[tuple[int, int, str]], roots: set[int]) -> list[tuple[int, int, str]]:
    """Edges on some path into the roots, roots' direct waiters first; capped for size."""
    keep: list[tuple[int, int, str]] = []
    kept: set[tuple[int, int, str]] = set()  # (``e not in keep`` scanned the list: quadratic)
    targets = set(roots)
    for _ in range(64):
        layer = [e for e in chain if e[1] in targets and e not in kept]
        if not layer:
            break
        keep += layer
        kept.update(layer)
        targets = {e[0] for e in layer}
    return keep[:64]


def telemetry_lag_s(now_ns: int, last_seen: dict[int, int] | None, heartbeats: pd.DataFrame) -> float:
    """Seconds since the newest record of any kind from the job (its ranks' records, its
    hosts' agent heartbeats); 0 when nothing is known (no lag can be claimed)."""
    newest = max((last_seen or {}).values(), default=0)
    if heartbeats is not None and not heartbeats.empty and "ts_ns" in heartbeats:
        newest = max(newest, int(heartbeats["ts_ns"].max()))
    return (now_ns - newest) / 1e9 if newest > 0 else 0.0


def spool_last_step(heartbeats: pd.DataFrame) -> int:
    """The newest completed step the agents saw in their ranks' spools (-1: unknown)."""
    if heartbeats is None or heartbeats.empty or "spool_last_step" not in heartbeats:
        return -1
    ranks = heartbeats[heartbeats["rank"] >= 0]
    return int(ranks["spool_last_step"].max()) if not ranks.empty else -1


def analyse_hang(
    job: str,
    topo: Topology,
    now_ns: int,
    steps: pd.DataFrame,
    inflight: pd.DataFrame,
    heartbeats: pd.DataFrame,
    progress: pd.DataFrame,
    started_ns: int = 0,
    last_seen: dict[int, int] | None = None,
    config: HangConfig = HangConfig(),
    job_failed: bool = False,
    rank_last_step: dict[int, int] | None = None,
    progress_stall: ProgressStall | None = None,
    warmup_step: int = -1,
    reference: bool = False,
    failed_ops: Mapping[int, int] | None = None,
) -> HangAnalysis:
    """Is the job stalled, and if so, who is the culprit and why.

    Args:
        job: job id.
        topo: topology.
        now_ns: current time on the server's clock.
        steps: recent ``steps`` rows (rank, step, end_ns, duration_ns).
        inflight: recent ``inflight`` rows (latest per rank is used).
        heartbeats: recent ``heartbeats`` rows; may carry ``dead_since_ns``.
        progress: last completed seq per (rank, group_id) as ``last_seq``.
        started_ns: job start, the reference when no step completed yet.
        last_seen: rank -> time of its last record of any kind.
        config: thresholds.
        job_failed: the job's own final record says it failed.
        rank_last_step: last completed step per rank.
        progress_stall: the job-wide op-progress state (:func:`.progress.progress_stall`);
            when it is stalled the job is stalled even before the step-stall threshold.
        warmup_step: the attempt's first step, left out of the step-time p99.
        reference: rank by rank (:func:`rank_states_reference`), as the previous pass
            did; the same verdict, slower (the benchmark's and the tests' reference).
        failed_ops: rank -> time of its first failed op in the latest steps, once every
            rank is dead (:data:`.loader.FAILED_OPS`): who lost a peer, who went first.
    """
    threshold = stall_threshold_s(steps, config, warmup_step)
    last_end = int(steps["end_ns"].max()) if not steps.empty else int(started_ns)
    last_step = int(steps["step"].max()) if not steps.empty else -1
    stalled_for = (now_ns - last_end) / 1e9 if last_end > 0 else 0.0
    states: Mapping[int, RankState]
    last_known: Mapping[int, RankState]
    if reference:
        states = rank_states_reference(topo, inflight, heartbeats, now_ns, config)
        last_known = rank_states_reference(topo, inflight, heartbeats, now_ns, config, ignore_death=True)
    else:  # both from one read of the frames
        facts = _rank_facts(topo, inflight, heartbeats, now_ns, config)
        states, last_known = _states_of(facts, False), _states_of(facts, True)
    if last_step < 0 and not _any_in(states, *IN_OP):  # starting up: see first_step_min_s
        threshold = max(threshold, config.first_step_min_s)
    if _all_in(states, RankStateKind.DEAD):
        died = sorted(st.since_ns for st in states.values())
        seen = sorted((last_seen or {}).get(r) or st.since_ns for r, st in states.items())
        went_first = len(died) > 1 and (died[1] - died[0] >= DEATH_GAP_NS or seen[1] - seen[0] > CRASH_GAP_NS)
        if went_first:  # one rank went silent while the others still reported: a crash
            threshold = 0.0
        elif rank_last_step and (job_failed or _caught_up(heartbeats, topo)) and _behind(states, rank_last_step):
            # every process is gone within one heartbeat and some ranks completed fewer
            # steps than the others (a crash took the job down at once - rank 0's takes the
            # rendezvous store and with it everyone - before its final status record, if
            # any, was written): the culprit is the rank that fell behind
            laggards = _behind(states, rank_last_step)
            return HangAnalysis(job=job, stalled=True, stalled_since_ns=last_end, stalled_for_s=stalled_for,
                                threshold_s=0.0, last_step=last_step, culprits=laggards,
                                hang_class=HangClass.PROCESS_DEAD, evidence={
                                    "all_dead": True, "job_failed": job_failed,
                                    "last_step_per_rank": {str(r): v for r, v in sorted(rank_last_step.items())},
                                    "culprit_hosts": sorted({states[r].host for r in laggards if states[r].host})})
        elif job_failed or died_without_failed_op(list(states.keys()), failed_ops):
            # (some ranks died with an op failing under them - a peer vanished - and some
            # without: a crash, whether or not the job's final status record was written)
            threshold = 0.0
        elif not _any_in(last_known, *IN_OP):
            # every process exited together and nobody was blocked: the job ended (its
            # final status record may still be on its way)
            return _not_stalled(job, last_end, stalled_for, threshold, last_step)
    dead_for = _dead_for_s(topo, heartbeats, now_ns)
    if dead_for >= config.dead_rank_min_s:  # a rank process is gone: no step can complete
        threshold = min(threshold, config.dead_rank_min_s)
    op = progress_stall
    lag_s = telemetry_lag_s(now_ns, last_seen, heartbeats)
    spool_step = spool_last_step(heartbeats)
    behind = lag_s > config.heartbeat_stale_s or spool_step > last_step
    if behind and not job_failed and not (op is not None and op.stalled):
        # Nothing at all from this job's ranks or agents for a while (host unreachable),
        # or the agents' heartbeats report steps the store does not hold yet (an agent
        # behind on its spool): a step missing from the store proves nothing. Heartbeat
        # loss is reported by its own detector; the stall is judged again as data arrives.
        return _not_stalled(job, last_end, stalled_for, threshold, last_step)
    if stalled_for < threshold and not (op is not None and op.stalled):
        due = [threshold - stalled_for] if last_end > 0 else []
        op_due = op.due_in_s() if op is not None else None
        if op_due is not None:
            due.append(op_due)
        return _not_stalled(job, last_end, stalled_for, threshold, last_step, min(due) if due else None)
    culprits, cls, gid, chain, ev = localise(topo, states, progress, last_seen, last_known, reference=reference,
                                             failed_ops=failed_ops)
    ev["culprit_hosts"] = sorted({states[r].host for r in culprits if states[r].host})
    dead_at = {str(r): int(states[r].since_ns) for r in culprits if states[r].kind == RankStateKind.DEAD}
    if dead_at:  # when each dead culprit's process went (keep_culprits: cause or consequence?)
        ev["culprits_died_ns"] = dead_at
    detected_by = "step_stall"
    # report the rule whose threshold was crossed first (stable from pass to pass)
    if op is not None and op.stalled and (
            stalled_for < threshold or op.quiet_since_ns + op.threshold_s * 1e9 < last_end + threshold * 1e9):
        detected_by = "op_progress"
        last_end, stalled_for, threshold = op.quiet_since_ns, op.quiet_s, op.threshold_s
    if op is not None:
        ev["op_progress"] = op.evidence()
    ev["detected_by"] = detected_by
    return HangAnalysis(job=job, stalled=True, stalled_since_ns=last_end, stalled_for_s=stalled_for,
                        threshold_s=threshold, last_step=last_step, culprits=culprits, hang_class=cls,
                        group_id=gid, chain=chain, evidence=ev)


def _all_in(states: Mapping[int, RankState], kind: RankStateKind) -> bool:
    """Every rank is in state ``kind`` (True for no ranks, like ``all``)."""
    if isinstance(states, RankStates):
        return bool((states.code == RankStates.KINDS.index(kind)).all())
    return all(st.kind == kind for st in states.values())


def _any_in(states: Mapping[int, RankState], *kinds: RankStateKind) -> bool:
    if isinstance(states, RankStates):
        return bool(states.mask(*kinds).any())
    return any(st.kind in kinds for st in states.values())


def _not_stalled(job: str, last_end: int, stalled_for: float, threshold: float, last_step: int,
                 due_in_s: float | None = None) -> HangAnalysis:
    return HangAnalysis(job=job, stalled=False, stalled_since_ns=last_end, stalled_for_s=stalled_for,
                        threshold_s=threshold, last_step=last_step, due_in_s=due_in_s)


def _behind(states: Mapping[int, RankState], rank_last_step: dict[int, int]) -> tuple[int, ...]:
    """The ranks with the fewest completed steps, when that is not every rank."""
    low = min(rank_last_step.get(r, -1) for r in states)
    behind = tuple(sorted(r for r in states if rank_last_step.get(r, -1) == low))
    return behind if len(behind) < len(states) else ()


def _caught_up(heartbeats: pd.DataFrame, topo: Topology) -> bool:
    """The store holds every step each rank's spool had (its last records arrived)."""
    if heartbeats is None or heartbeats.empty or "caught_up" not in heartbeats.columns:
        return False
    mine = heartbeats[heartbeats["rank"].between(0, topo.world_size - 1)]
    return not mine.empty and bool((mine["caught_up"].astype(int) == 1).all())


def _dead_for_s(topo: Topology, heartbeats: pd.DataFrame, now_ns: int) -> float:
    """Seconds since the first rank process of the job died (only ranks whose spool the
    store has caught up with); 0 when none is dead."""
    if heartbeats is None or heartbeats.empty:
        return 0.0
    mine = heartbeats[heartbeats["rank"].between(0, topo.world_size - 1)]
    dead = mine["alive"].astype(int) == 0
    if "caught_up" in mine.columns:  # its last records may still be on the way
        dead &= mine["caught_up"].astype(int) == 1
    if not dead.any():
        return 0.0
    since = mine.loc[dead, "dead_since_ns"] if "dead_since_ns" in mine.columns else mine.loc[dead, "ts_ns"]
    return (now_ns - int(since.min())) / 1e9


def detect_mismatches(job: str, collectives: pd.DataFrame) -> list[Finding]:
    """Collectives whose members disagree on op, size or dtype for one ``(group_id, seq)``."""
    if collectives.empty:
        return []
    c = collectives[~collectives["op"].isin(P2P_OPS)]
    if c.empty:
        return []
    g = c.groupby(["group_id", "seq"])
    n = g.agg(ops=("op", "nunique"), sizes=("bytes", "nunique"), dtypes=("dtype", "nunique"))
    bad = n[(n["ops"] > 1) | (n["sizes"] > 1) | (n["dtypes"] > 1)]
    out = []
    for (gid, seq), _ in bad.head(16).iterrows():
        rows = c[(c["group_id"] == gid) & (c["seq"] == seq)]
        sig = rows[["op", "bytes", "dtype"]].astype(str).agg("/".join, axis=1)
        common = sig.mode().iloc[0]
        odd = rows[sig != common]
        out.append(Finding(
            kind=FindingKind.COLLECTIVE_MISMATCH, job=job,
            ranks=tuple(int(r) for r in odd["rank"]) + tuple(int(r) for r in rows[sig == common]["rank"]),
            score=float(len(odd)), severity=Severity.CRITICAL, group_id=str(gid),
            first_step=int(rows["step"].min()), last_step=int(rows["step"].max()),
            summary=f"{gid}#{seq}: rank(s) {sorted(odd['rank'].tolist())} called "
                    f"{sorted(set(sig[sig != common]))} while the others called {common}",
            evidence={"seq": int(seq), "calls": {str(r): s for r, s in zip(rows["rank"], sig)}},
        ))
    return out


DIED_OF_HANG_NS = 10_000_000_000
"""A rank whose process went more than this after the job's progress stopped died of the
hang (a watchdog's timeout, the launcher tearing the job down, an operator's kill), not
the other way round. Heartbeats see a death up to one period (~2 s) late, and a crashed
rank's peers may have blocked on it a few seconds before it went; no hang is declared
before ``hang_op_min_s`` (20 s) of silence, so a teardown that follows a page is always
past it."""


def stall_onset_ns(analysis: HangAnalysis) -> int:
    """When the hang began: its last completed step, or the last traced op completed
    anywhere in the job if later. Kept from the pass that named the culprits
    (``evidence["stall_onset_ns"]``): ops failing one by one as a hung job is torn down
    complete too, and would move it."""
    kept = analysis.evidence.get("stall_onset_ns")
    if kept:
        return int(kept)
    quiet = int((analysis.evidence.get("op_progress") or {}).get("quiet_since_ns") or 0)
    return max(int(analysis.stalled_since_ns), quiet)


def keep_culprits(previous: HangAnalysis | None, new: HangAnalysis) -> HangAnalysis:
    """Culprit stickiness: while the job stays hung (the same hang: same last step), the
    culprits named first stay the culprits unless new evidence changes them, so the API,
    the UI, the incident and the page agree for as long as the job is hung.

    Evidence that changes them: a culprit named now is dead and was not before (a
    process death is a fact, not a snapshot) and went no later than
    :data:`DIED_OF_HANG_NS` after the hang began (a death the first verdict had not seen
    yet), or a previous culprit now waits in an op on another rank (it was not the root
    after all), or the previous verdict had no culprit. A rank that died later died of
    the hang: a hung job's ranks are killed by watchdogs and launchers, and the ranks
    that wait on the dead ones look like culprits, exactly the confusion a page must not
    follow (``evidence["died_after_stall"]`` lists them). Otherwise the later analysis -
    whose in-flight records age, whose waiting ranks' records go stale one by one -
    keeps the first culprits and records its own candidates in
    ``evidence["latest_candidates"]``. A change is recorded in
    ``evidence["culprit_changed"]`` (from, to, why), which the incident reports and pages.
    """
    if previous is None or not previous.stalled or not new.stalled or previous.last_step != new.last_step:
        return new
    onset = {"stall_onset_ns": stall_onset_ns(previous)}
    if set(new.culprits) == set(previous.culprits) or not previous.culprits:
        carried = previous.evidence.get("culprit_changed")
        return replace(new, evidence={**new.evidence, **onset, **({"culprit_changed": carried} if carried else {})})
    why = ""
    was_dead = set(previous.evidence.get("dead_ranks", []))
    now_dead = set(new.evidence.get("dead_ranks", []))
    died = new.evidence.get("culprits_died_ns") or {}
    newly_dead: list[int] = []
    died_after: list[int] = []
    for r in sorted((set(new.culprits) & now_dead) - was_dead):
        late = int(died.get(str(r), 0)) > onset["stall_onset_ns"] + DIED_OF_HANG_NS
        (died_after if late else newly_dead).append(r)
    blocked = set(new.evidence.get("blocked_ranks", []))
    waiting_old = sorted(r for r in previous.culprits if r in blocked and r not in new.culprits)
    if newly_dead and not new.evidence.get("all_dead"):
        why = f"rank(s) {newly_dead} died"
    elif waiting_old and any(e[0] in waiting_old for e in new.chain):
        why = f"rank(s) {waiting_old} now wait in an op on another rank"
    if why:
        change = {"from": list(previous.culprits), "to": list(new.culprits), "why": why}
        return replace(new, evidence={**new.evidence, **onset, "culprit_changed": change})
    ev = {**new.evidence, **onset, "latest_candidates": list(new.culprits),
          "culprits_kept_since_ns": previous.stalled_since_ns}
    if died_after:
        ev["died_after_stall"] = died_after
    ev.pop("culprits_died_ns", None)  # the new candidates', not the kept culprits'
    for key in ("culprit_changed", "culprit_hosts", "num_waiting_on_culprit", "group_ops", "other_roots",
                "culprits_died_ns"):
        if key in previous.evidence:
            ev[key] = previous.evidence[key]
    return replace(new, culprits=previous.culprits, hang_class=previous.hang_class,
                   group_id=previous.group_id, chain=previous.chain, evidence=ev)
