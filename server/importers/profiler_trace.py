"""torch.profiler / Kineto Chrome traces -> ``sections``, ``collectives`` and ``steps``.

One trace per rank (``prof.export_chrome_trace(...)``, or the files torch.profiler's
``tensorboard_trace_handler`` writes; plain or gzipped JSON). Times: Kineto's ``ts``
(microseconds) plus ``baseTimeNanoseconds`` is ns since the epoch, so ranks line up.

* **Sections**: ``record_function`` ranges (``user_annotation``) other than ops and
  profiler steps; the name gives the kind (forward/backward -> compute, ...).
* **Collectives**: the c10d calls on the training thread (``c10d::allreduce_`` ...;
  NCCL traces: ``record_param_comms`` with its group, size and dtype). On gloo the
  op's execution is the ``gloo:<op>`` range on the backend's worker thread, paired
  with the calls in order; on NCCL the GPU kernel ``nccl:<op>`` / ``ncclDevKernel_*``.
  Ops are numbered per process group in call order, as the hooks do.
* **Steps**: ``ProfilerStep#N`` ranges when the trace has them (a profiler schedule);
  otherwise each occurrence of the trace's first section name starts a step.
"""

from __future__ import annotations

import gzip
import json
import re
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path
from typing import Any

MAX_TRACE_BYTES = 2 << 30
_RANK = re.compile(r"(\d+)(?!.*\d)")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
C10D_OPS: dict[str, str] = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced",
    "broadcast_": "broadcast", "reduce_": "reduce", "allgather_": "all_gather",
    "_allgather_base_": "all_gather_into_tensor", "allgather_coalesced_": "all_gather_coalesced",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "alltoall_base_": "all_to_all_single", "alltoall_": "all_to_all", "barrier": "barrier",
    "gather_": "gather", "scatter_": "scatter", "send": "send", "recv_": "recv",
    "recv_any_source_": "recv",
}
"""``c10d::<op>`` dispatcher ops -> the op names the hooks write."""
_BACKEND_NAMES = {"allreduce": "all_reduce", "all_reduce": "all_reduce", "broadcast": "broadcast",
                  "all_gather": "all_gather", "allgather": "all_gather",
                  "_allgather_base": "all_gather_into_tensor",
                  "all_gather_into_tensor": "all_gather_into_tensor",
                  "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
                  "reduce_scatter_tensor": "reduce_scatter_tensor",
                  "all_to_all": "all_to_all_single", "alltoall_base": "all_to_all_single",
                  "barrier": "barrier", "send": "send", "recv": "recv", "reduce": "reduce",
                  "gather": "gather", "scatter": "scatter"}
KINDS = {"forward": "compute", "backward": "compute", "optimizer": "optimizer",
         "dataloader": "dataloader"}
_NOT_SECTIONS = ("gloo:", "nccl:", "ProfilerStep#", "Optimizer.", "## ")
_DTYPES = {"Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2),
           "BFloat16": ("bfloat16", 2), "Int": ("int32", 4), "Long": ("int64", 8),
           "Byte": ("uint8", 1), "Char": ("int8", 1), "Bool": ("bool", 1)}


class TraceError(ValueError):
    """A file that is not a Chrome trace (the message names the file)."""


def load_trace(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceError(f"{path}: {size} bytes, over the {MAX_TRACE_BYTES} byte limit")
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, ValueError, EOFError) as e:
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"{path}: not a Chrome trace JSON file ({e})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: not a Chrome trace (no traceEvents list)")
    return doc


def trace_rank(path: Path, doc: dict[str, Any]) -> int:
    info = doc.get("distributedInfo") or {}
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = _RANK.search(Path(path).name)
    if m is None:
        raise TraceError(f"{path}: no distributedInfo.rank and no rank number in the file name")
    return int(m.group(1))


def _kind(name: str) -> str:
    low = name.lower()
    for key, kind in KINDS.items():
        if key in low:
            return kind
    return "other"


def _payload(args: dict[str, Any]) -> tuple[int, str]:
    n = args.get("In msg nelems")
    dtype = str(args.get("dtype", ""))
    name, width = _DTYPES.get(dtype, (dtype.lower(), 0))
    if n is None:
        dims = args.get("Input Dims") or []
        first = dims[0] if dims else []
        tensors = first if first and isinstance(first[0], list) else [first] if first else []
        n = 0
        for shape in tensors:
            k = 1
            for d in shape:
                k *= int(d)
            n += k
    return int(n) * width, name


def to_records(job: str, path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """``{"rank", "sections", "collectives", "steps"}`` of one rank's trace."""
    rank = trace_rank(path, doc)
    base = int(doc.get("baseTimeNanoseconds") or 0)
    host = str(doc.get("host_name") or "")

    def ns(us: float) -> int:
        return base + int(round(float(us) * 1000))

    events = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
              and "ts" in e and "dur" in e and isinstance(e.get("name"), str)]
    events.sort(key=lambda e: float(e["ts"]))
    ident = {"job": job, "attempt": 0, "rank": rank, "host": host}
    # --- steps
    marks = [(ns(e["ts"]), ns(e["ts"] + e["dur"]), int(m.group(1))) for e in events
             if (m := _STEP.match(e["name"]))]
    annotations = [e for e in events if e.get("cat") in ("user_annotation", "gpu_user_annotation")
                   and not e["name"].startswith(_NOT_SECTIONS)]
    if not marks and annotations:
        first = annotations[0]["name"]
        starts = [ns(e["ts"]) for e in annotations if e["name"] == first]
        end = max(ns(e["ts"] + e["dur"]) for e in events)
        marks = [(t, starts[i + 1] if i + 1 < len(starts) else end, i) for i, t in enumerate(starts)]
    starts = [m[0] for m in marks]

    def step_at(t: int) -> int:
        i = bisect_right(starts, t) - 1
        return marks[i][2] if i >= 0 else (marks[0][2] if marks else 0)

    steps = [dict(ident, step=n, start_ns=t0, end_ns=t1, duration_ns=t1 - t0) for t0, t1, n in marks]
    sections = []
    for e in annotations:
        t0, t1 = ns(e["ts"]), ns(e["ts"] + e["dur"])
        sections.append(dict(ident, step=step_at(t0), microbatch=-1, name=e["name"],
                             kind=_kind(e["name"]), start_ns=t0, end_ns=t1, duration_ns=t1 - t0,
                             device_ns=-1))
    # --- collectives: calls on the training thread, executions on the backend
    comms = [e for e in events if e["name"] == "record_param_comms"]
    calls = comms or [e for e in events if e["name"].startswith("c10d::")
                      and e["name"][6:] in C10D_OPS]
    execs: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        name = e["name"]
        if name.startswith(("gloo:", "nccl:")):
            execs[_BACKEND_NAMES.get(name.split(":", 1)[1], name.split(":", 1)[1])].append(e)
        elif name.startswith("ncclDevKernel_") or name.startswith("ncclKernel_"):
            op = re.sub(r"(?<!^)(?=[A-Z])", "_", name.split("_")[1].split("(")[0]).lower()
            execs[_BACKEND_NAMES.get(op, op)].append(e)
    taken: dict[str, int] = defaultdict(int)
    seq: dict[str, int] = defaultdict(int)
    p2p_seq: dict[tuple[str, int], int] = defaultdict(int)
    pg_info = (doc.get("distributedInfo") or {}).get("pg_config") or []
    pgs = {str(p.get("pg_name")): p for p in pg_info if isinstance(p, dict)}
    collectives = []
    for e in calls:
        args = e.get("args") or {}
        if comms:
            op = _BACKEND_NAMES.get(str(args.get("Collective name", "")), str(args.get("Collective name", "")))
            pg_name = str(args.get("Process Group Name", "0"))
        else:
            op = C10D_OPS[e["name"][6:]]
            pg_name = "0" if len(pgs) <= 1 else ""
        if not op or op in ("wait", "init"):
            continue
        pg = pgs.get(pg_name, {})
        gid = "world" if pg.get("pg_desc", "default_pg" if pg_name == "0" else "") == "default_pg" else f"pg{pg_name}"
        ranks = list(pg.get("ranks") or [])
        nbytes, dtype = _payload(args)
        t0 = ns(e["ts"])
        i = taken[op]
        ex = execs.get(op, [])
        t1 = ns(ex[i]["ts"] + ex[i]["dur"]) if i < len(ex) else ns(e["ts"] + e["dur"])
        taken[op] += 1
        if op in ("send", "recv"):
            peer = int(args.get("Peer rank", -1)) if "Peer rank" in args else -1
            p2p_seq[(op, peer)] += 1
            s = p2p_seq[(op, peer)]
        else:
            peer = -1
            seq[gid] += 1
            s = seq[gid]
        collectives.append(dict(
            ident, step=step_at(t0), microbatch=-1, group_id=gid, axis="world" if gid == "world" else "",
            group_rank=ranks.index(rank) if rank in ranks else -1,
            group_size=len(ranks) if ranks else int(args.get("Group size", -1)), seq=s, op=op,
            bytes=nbytes, dtype=dtype, peer=peer, state="completed", enqueued_ns=t0,
            started_ns=t0, completed_ns=max(t1, t0), duration_ns=max(t1, t0) - t0))
    return {"rank": rank, "sections": sections, "collectives": collectives, "steps": steps}
