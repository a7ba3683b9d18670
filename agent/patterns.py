"""The pattern library for trainer logs: what is worth an operator's attention.

Each pattern has a ``kind`` (the ``log_events.kind`` column), a severity and a regular
expression. The first pattern that matches a line wins, so specific ones (timeouts)
come before general ones (any NCCL WARN). Python tracebacks are recognised by the log
scanner itself (multi-line), with kind ``traceback``.

To add a pattern: append a :class:`Pattern` here and a sample line to
``tests/test_agent_logscan.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Pattern:
    kind: str
    severity: str
    regex: re.Pattern[str]


def _p(kind: str, severity: str, rx: str) -> Pattern:
    return Pattern(kind, severity, re.compile(rx, re.IGNORECASE))


PATTERNS: tuple[Pattern, ...] = (
    # collective timeouts (NCCL watchdog, NCCL itself, gloo on CPU)
    _p("nccl_timeout", "critical",
       r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*time[d ]?\s*out"
       r"|NCCL.*(timed out|timeout)|collective operation timeout"),
    _p("gloo_timeout", "critical", r"gloo.*(timed out|timeout)|Timed out waiting .*gloo"),
    # hardware
    _p("xid", "critical", r"NVRM: Xid|\bXid\s*\(?.*\)?:\s*\d+"),
    _p("ecc", "critical",
       r"uncorrectable ECC|double[- ]bit ECC|ECC error|uncorrected ECC|row remap(ping)? failure"),
    # memory
    _p("oom", "critical",
       r"CUDA out of memory|OutOfMemoryError|out of memory|oom-kill|Killed process \d+"
       r"|Cannot allocate memory|\bMemoryError\b"),
    # CUDA runtime / libraries
    _p("cuda_error", "error",
       r"CUDA error|cudaError\w*|CUBLAS_STATUS_(?!SUCCESS)\w+|CUDNN_STATUS_(?!SUCCESS)\w+"
       r"|illegal memory access|device-side assert|unspecified launch failure"),
    # crashes
    _p("segfault", "critical",
       r"Segmentation fault|SIGSEGV|segfault at|Fatal Python error|core dumped"),
    _p("signal", "error",
       r"Signal \d+ \(SIG\w+\) received|exited with (exit code|signal)|died with <Signals\.SIG\w+"
       r"|SIGABRT|SIGBUS|Aborted \(core"),
    # NCCL errors, then any NCCL WARN
    _p("nccl_error", "error",
       r"nccl(Internal|System|UnhandledCuda|Remote|InvalidUsage|InvalidArgument)Error"
       r"|NCCL error|NCCL.*(failed|failure)|ncclCommAbort"),
    _p("nccl_warn", "warning", r"NCCL WARN"),
    # numerics
    _p("nan", "warning", r"loss is nan|nan loss|NaN or Inf found|non-finite loss"),
)

TRACEBACK_START = re.compile(r"^\s*Traceback \(most recent call last\):")


def match_line(line: str) -> Pattern | None:
    """The first pattern matching ``line``, or None."""
    for p in PATTERNS:
        if p.regex.search(line):
            return p
    return None
