"""PyTorch Flight Recorder dumps -> ``collectives`` records and a hang analysis.

Flight Recorder (FR) keeps a ring buffer of every ProcessGroup op per rank and dumps it
on a timeout (``TORCH_FR_BUFFER_SIZE``, ``TORCH_FR_DUMP_TEMP_FILE``) or on request
(``torch._C._distributed_c10d._dump_fr_trace`` / ``_dump_fr_trace_json``). A directory
holds one dump per rank, pickle or JSON; the rank is the last number in the file name
(``nccl_trace_rank_3``, ``rank3.json``, ``3.pkl``).

Unlike torch's own ``fr_trace`` analyser this works on gloo dumps, whose ``pg_config``
is empty (a group's members are then the world for the default group, the ranks that
recorded the group otherwise) and whose entries stay ``scheduled`` until ``retired``.

The analysis, per process group: the lowest sequence number some rank is still in
(enqueued, not completed) is where the group stopped; dumped members that never
enqueued it are the culprits (they never arrived), members that did are waiting,
members without a dump are missing (unknown). Op/size/dtype mismatches at any sequence
number come from :func:`fleetscope.server.diagnosis.hangs.detect_mismatches`; a group
whose ranks are all present but disagree on the op they are in is a desync.
"""

from __future__ import annotations

import json
import pickle
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_RANK = re.compile(r"(\d+)(?!.*\d)")
DTYPES: dict[str, tuple[str, int]] = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2), "Int": ("int32", 4), "Long": ("int64", 8),
    "Short": ("int16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1), "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "Float8_e5m2": ("float8_e5m2", 1),
}
"""FR's dtype names -> (torch name as the hooks write it, bytes per element)."""
MAX_DUMP_BYTES = 1 << 30


class DumpError(ValueError):
    """A file that is not a Flight Recorder dump (the message names the file)."""


def rank_of(path: Path) -> int:
    m = _RANK.search(path.name)
    if m is None:
        raise DumpError(f"{path}: no rank number in the file name (e.g. nccl_trace_rank_3)")
    return int(m.group(1))


class _SafeUnpickler(pickle.Unpickler):
    """FR pickles hold only builtins (dicts, lists, tuples, str, int, float, None)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in an FR dump")


def load_dump(path: Path) -> dict[str, Any]:
    """One rank's dump (pickle or JSON), as a dict with ``entries``."""
    size = path.stat().st_size
    if size > MAX_DUMP_BYTES:
        raise DumpError(f"{path}: {size} bytes, over the {MAX_DUMP_BYTES} byte limit")
    data = path.read_bytes()
    try:
        if data[:1] in (b"{", b"["):
            doc = json.loads(data)
        else:
            import io

            doc = _SafeUnpickler(io.BytesIO(data)).load()
    except (ValueError, pickle.UnpicklingError, EOFError) as e:
        raise DumpError(f"{path}: not a Flight Recorder dump ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries", []), list):
        raise DumpError(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    doc.setdefault("entries", [])
    return doc


def load_dir(directory: Path) -> dict[int, dict[str, Any]]:
    """Every rank's dump in ``directory`` (files starting with '.' are skipped)."""
    out: dict[int, dict[str, Any]] = {}
    files = sorted(p for p in Path(directory).iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise DumpError(f"{directory}: no dump files")
    for p in files:
        rank = rank_of(p)
        if rank in out:
            raise DumpError(f"{p}: a second dump for rank {rank}")
        out[rank] = load_dump(p)
    return out


def group_id(pg: Any) -> str:
    """A group id for FR's ``process_group`` (name, desc): the default group is ``world``."""
    name, desc = (list(pg) + ["", ""])[:2] if isinstance(pg, (list, tuple)) else (str(pg), "")
    if desc == "default_pg":
        return "world"
    return f"pg{name}" + (f".{desc}" if desc and desc != "undefined" else "")


def _members(dump: dict[str, Any]) -> dict[str, list[int]]:
    """Group id -> member ranks from ``pg_config`` (NCCL fills it; gloo mostly not)."""
    out: dict[str, list[int]] = {}
    for key, cfg in (dump.get("pg_config") or {}).items():
        if not isinstance(cfg, dict):
            continue
        try:
            ranks = json.loads(cfg.get("ranks") or "[]") if isinstance(cfg.get("ranks"), str) else list(cfg.get("ranks") or [])
        except ValueError:
            continue
        if ranks:
            out[group_id((cfg.get("name", key), cfg.get("desc", "")))] = [int(r) for r in ranks]
    return out


def _nbytes(sizes: Any, dtypes: Any) -> tuple[int, str]:
    total, first = 0, ""
    for shape, dt in zip(sizes or [], dtypes or []):
        name, width = DTYPES.get(str(dt), (str(dt).lower(), 0))
        first = first or name
        n = 1
        for d in shape:
            n *= int(d)
        total += n * width
    return total, first


def _t(v: Any) -> int:
    try:
        v = int(v)
    except (TypeError, ValueError):
        return -1
    return v if v > 0 else -1


def to_records(job: str, rank: int, dump: dict[str, Any], world_size: int,
               host: str = "") -> list[dict[str, Any]]:
    """``collectives`` rows of one rank's dump (schema ``fleetscope.schema.COLLECTIVES``)."""
    members = _members(dump)
    rows = []
    for e in dump["entries"]:
        gid = group_id(e.get("process_group", ("", "")))
        ranks = members.get(gid) or (list(range(world_size)) if gid == "world" else [])
        op = str(e.get("profiling_name", "")).split(":")[-1] or "unknown"
        p2p = bool(e.get("is_p2p")) or op in ("send", "recv")
        nbytes, dtype = _nbytes(e.get("input_sizes"), e.get("input_dtypes"))
        created = _t(e.get("time_created_ns"))
        started = _t(e.get("time_discovered_started_ns"))
        completed = _t(e.get("time_discovered_completed_ns"))
        fr_state = str(e.get("state", ""))
        if fr_state == "completed" or e.get("retired"):
            state = "completed"
        elif fr_state == "started":
            state = "started"
        else:
            state = "enqueued"
        rows.append({
            "job": job, "attempt": 0, "rank": rank, "host": host, "step": 0, "microbatch": -1,
            "group_id": gid, "axis": "world" if gid == "world" else "",
            "group_rank": ranks.index(rank) if rank in ranks else -1,
            "group_size": len(ranks) if ranks else -1,
            "seq": int(e.get("p2p_seq_id" if p2p else "collective_seq_id", -1) or 0),
            "op": op, "bytes": nbytes, "dtype": dtype, "peer": -1, "state": state,
            "enqueued_ns": created, "started_ns": started if started > 0 else created,
            "completed_ns": completed if state == "completed" else -1,
            "duration_ns": completed - (started if started > 0 else created)
            if state == "completed" and completed > 0 and created > 0 else -1,
        })
    return rows


@dataclass
class GroupStop:
    """Where one process group stopped."""

    group_id: str
    seq: int
    op: str
    culprits: list[int]
    """Dumped members that never enqueued ``seq`` (they never arrived)."""
    waiting: list[int]
    """Members in the op at ``seq`` (enqueued, not completed)."""
    missing: list[int]
    """Members without a dump: their state is unknown."""
    last_seq: dict[str, int] = field(default_factory=dict)
    """Each dumped member's last enqueued sequence number in the group."""
    since_ns: int = -1


@dataclass
class FrAnalysis:
    job: str
    world_size: int
    dumped: list[int]
    missing: list[int]
    culprits: list[int]
    kind: str
    """never_arrived | mismatch | all_in_op | missing_only | no_hang"""
    summary: str
    stops: list[GroupStop]
    mismatches: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def analyse(job: str, rows: list[dict[str, Any]], world_size: int, dumped: set[int],
            members: dict[str, list[int]] | None = None) -> FrAnalysis:
    """The hang analysis of imported ``collectives`` rows (see the module docstring)."""
    import pandas as pd
    from fleetscope.server.diagnosis.hangs import detect_mismatches

    members = dict(members or {})
    missing = sorted(set(range(world_size)) - dumped)
    coll = [r for r in rows if r["op"] not in ("send", "recv")]
    by_group: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in coll:
        by_group[r["group_id"]][r["rank"]].append(r)
    stops: list[GroupStop] = []
    for gid, per_rank in by_group.items():
        group_ranks = members.get(gid) or (list(range(world_size)) if gid == "world" else sorted(per_rank))
        inflight = [r for rs in per_rank.values() for r in rs if r["state"] != "completed"]
        if not inflight:
            continue
        seq = min(r["seq"] for r in inflight)
        at = [r for r in inflight if r["seq"] == seq]
        last = {q: max((r["seq"] for r in per_rank.get(q, [])), default=0)
                for q in group_ranks if q in dumped}
        culprits = sorted(q for q, s in last.items() if s < seq)
        stops.append(GroupStop(
            group_id=gid, seq=seq, op=at[0]["op"], culprits=culprits,
            waiting=sorted({r["rank"] for r in at}),
            missing=sorted(q for q in group_ranks if q not in dumped),
            last_seq={str(q): s for q, s in sorted(last.items())},
            since_ns=min((r["enqueued_ns"] for r in at if r["enqueued_ns"] > 0), default=-1)))
    stops.sort(key=lambda s: (s.since_ns if s.since_ns > 0 else 1 << 62, s.group_id))
    found = detect_mismatches(job, pd.DataFrame(coll)) if coll else []
    mismatches = [{"group_id": f.group_id, "seq": f.evidence["seq"], "ranks": list(f.ranks),
                   "odd_ranks": sorted(f.ranks[:int(f.score)]), "summary": f.summary,
                   "calls": f.evidence["calls"]} for f in found]
    if not stops:
        return FrAnalysis(job, world_size, sorted(dumped), missing, [], "no_hang",
                          "no rank is inside a collective in its dump", [], mismatches)
    top = stops[0]
    at_stop = [m for m in mismatches if m["group_id"] == top.group_id and m["seq"] == top.seq]
    if top.culprits:
        kind, culprits = "never_arrived", top.culprits
        summary = (f"{top.group_id}#{top.seq} ({top.op}): rank(s) {top.culprits} never arrived; "
                   f"{top.waiting} wait in it")
    elif at_stop:
        kind, culprits = "mismatch", at_stop[0]["odd_ranks"]
        summary = f"{top.group_id}#{top.seq}: ranks disagree on the op: {at_stop[0]['summary']}"
    elif top.missing:
        kind, culprits = "missing_only", top.missing
        summary = (f"{top.group_id}#{top.seq} ({top.op}): every dumped rank waits in it; "
                   f"rank(s) {top.missing} left no dump")
    else:
        kind, culprits = "all_in_op", top.waiting
        summary = (f"{top.group_id}#{top.seq} ({top.op}): every member is in the op "
                   f"(transport/backend fault in the group)")
    if missing:
        summary += f"; missing (no dump): {missing}"
    return FrAnalysis(job, world_size, sorted(dumped), missing, culprits, kind, summary, stops,
                      mismatches)


TOPOLOGY_AXES = ("tp", "dp", "pp")
"""Axes tried in this order, as the hooks do when they name a group by its members."""


@dataclass(frozen=True)
class GroupMatch:
    """An FR process group identified as one of the job's topology groups."""

    group_id: str
    """The hooks' name, e.g. ``tp.pp0.dp1`` (or ``world``)."""
    axis: str
    ranks: tuple[int, ...]
    """Member ranks in group-rank order."""


def match_groups(rows: list[dict[str, Any]], members: dict[str, list[int]],
                 topology: Any, dumped: set[int] | None = None) -> dict[str, GroupMatch]:
    """FR group id -> the hooks' topology group it is, matched by member ranks.

    The members are ``pg_config``'s when the dump has them (NCCL): they must equal a
    topology group's (the first axis in the hooks' order, tp, dp, pp, on a tie). gloo
    dumps have none; then the members seen are the dumped ranks that recorded the group,
    and a topology group fits when it holds them all and its other members left no dump.
    Of the fitting groups not yet taken by another FR group the largest is chosen, if it
    is the only one of its size (several equal to the members seen: the first axis, as
    the hooks name it); otherwise the group waits until others are matched, and keeps
    FR's name if that never settles it. Exact matches go first.
    """
    world = tuple(range(topology.world_size))
    dumped = set(world) if dumped is None else set(dumped)
    candidates: list[tuple[str, str, tuple[int, ...]]] = []
    for axis in TOPOLOGY_AXES:
        for gid, ranks in topology.groups(axis).items():
            candidates.append((gid, axis, tuple(ranks)))
    seen: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        seen[r["group_id"]].add(int(r["rank"]))
    out: dict[str, GroupMatch] = {}
    taken: set[str] = set()

    def pick(fr_gid: str, first: bool) -> tuple[str, str, tuple[int, ...]] | None | bool:
        """A candidate; None: never matches; False: not decidable yet."""
        exact = members.get(fr_gid)
        want = set(exact) if exact else seen.get(fr_gid, set())
        if not want:
            return None
        if exact and want == set(world):  # the hooks call a group of every rank "world"
            return ("world", "world", world)
        free = [c for c in candidates if c[0] not in taken]
        if exact:
            equal = [c for c in free if set(c[2]) == want]
            return equal[0] if equal else None
        fits = [c for c in free if want <= set(c[2]) and not (set(c[2]) - want) & dumped]
        if not fits:
            return None
        size = max(len(c[2]) for c in fits)
        top = [c for c in fits if len(c[2]) == size]
        if len(top) == 1 and (not first or set(top[0][2]) == want):
            return top[0]
        if all(set(c[2]) == want for c in top):
            return top[0]
        return False

    pending = sorted(g for g in set(seen) | set(members) if g != "world")
    first = True
    while pending:  # exact and complete matches first; partial ones once others are taken
        left = []
        for fr_gid in pending:
            hit = pick(fr_gid, first)
            if hit is False:
                left.append(fr_gid)
            elif isinstance(hit, tuple):
                out[fr_gid] = GroupMatch(*hit)
                if hit[0] != "world":
                    taken.add(hit[0])
        if len(left) == len(pending) and not first:
            break
        pending, first = left, False
    return out


def apply_topology(rows: list[dict[str, Any]], matches: dict[str, GroupMatch]) -> None:
    """Rename matched groups in ``rows`` (in place) to the hooks' names, with their axis,
    group rank and group size."""
    for r in rows:
        m = matches.get(r["group_id"])
        if m is None:
            continue
        r["group_id"], r["axis"], r["group_size"] = m.group_id, m.axis, len(m.ranks)
        r["group_rank"] = m.ranks.index(r["rank"]) if r["rank"] in m.ranks else -1


def import_dir(directory: Path, job: str, world_size: int | None = None,
               topology: Any = None) -> tuple[list[dict], FrAnalysis]:
    """Read every dump in ``directory``: (collectives rows, analysis).

    With ``topology`` (a :class:`fleetscope.topology.Topology`) FR's process groups
    (``pg1``, ...) are renamed to the hooks' group names (``tp.pp0.dp0``, ...) by their
    member ranks (:func:`match_groups`), so imported collectives join live ones.
    """
    dumps = load_dir(directory)
    members: dict[str, list[int]] = {}
    for d in dumps.values():
        for gid, ranks in _members(d).items():
            members.setdefault(gid, ranks)
    if topology is not None:
        if world_size is not None and world_size != topology.world_size:
            raise DumpError(f"--world-size {world_size} but the topology dp x tp x pp is {topology.world_size}")
        world_size = topology.world_size
    if world_size is None:
        world_size = max([max(dumps) + 1, *(max(r) + 1 for r in members.values() if r)])
    bad = [r for r in dumps if r >= world_size]
    if bad:
        raise DumpError(f"dumps for ranks {bad} but the world size is {world_size}")
    rows = [row for rank, d in sorted(dumps.items()) for row in to_records(job, rank, d, world_size)]
    if topology is not None:
        matches = match_groups(rows, members, topology, set(dumps))
        apply_topology(rows, matches)
        members = {gid: ranks for gid, ranks in members.items() if gid not in matches}
        members.update({m.group_id: list(m.ranks) for m in matches.values()})
    return rows, analyse(job, rows, world_size, set(dumps), members)


def inflight_rows(job: str, rows: list[dict], at_ns: int) -> list[dict]:
    """``inflight`` rows for the ranks in an op at dump time (what the hang view reads)."""
    out = []
    latest: dict[int, dict] = {}
    for r in rows:
        if r["state"] != "completed" and r["op"] not in ("send", "recv"):
            cur = latest.get(r["rank"])
            if cur is None or r["enqueued_ns"] < cur["enqueued_ns"]:
                latest[r["rank"]] = r
    for rank, r in sorted(latest.items()):
        out.append({"job": job, "attempt": 0, "rank": rank, "host": "", "ts_ns": at_ns,
                    "step": 0, "kind": "collective", "op": r["op"], "group_id": r["group_id"],
                    "axis": r["axis"], "seq": r["seq"], "peer": -1,
                    "since_ns": r["enqueued_ns"] if r["enqueued_ns"] > 0 else at_ns})
    return out
