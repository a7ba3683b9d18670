"""Progress of ``fleetscope selfcheck`` on a terminal: a rich progress bar on stderr.

The suite reports through a :data:`~fleetscope.kernels.result.Progress` sink (one line
per probe step). :class:`BarProgress` is such a sink that also counts *stages* (one per
per-device probe variant run in this process, one for the local collective group): the
suite calls :func:`begin` with the number of stages and :func:`stage_done` after each.
Lines still appear, printed above the bar. It is used only when stderr is a terminal
and rich (the ``rca`` extra) is installed; otherwise the plain ``[selfcheck] ...`` lines
go to stderr as before, so logs and pipes stay greppable.
"""

from __future__ import annotations

import sys
from typing import Any

from fleetscope.kernels.result import Progress, stderr_progress


def begin(progress: Progress, total: int) -> None:
    """Tell a staged sink how many stages the suite will run (plain sinks ignore it)."""
    fn = getattr(progress, "begin", None)
    if fn is not None:
        fn(total)


def stage_done(progress: Progress) -> None:
    """Tell a staged sink one stage finished (plain sinks ignore it)."""
    fn = getattr(progress, "stage_done", None)
    if fn is not None:
        fn()


def captures_children(progress: Progress) -> bool:
    """Whether the children of the local group must not write to the terminal directly
    (their lines are forwarded through the sink instead, so they don't tear the bar)."""
    return bool(getattr(progress, "captures_children", False))


class BarProgress:
    """A progress sink drawing a rich bar on stderr; use as a context manager."""

    captures_children = True

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self.console = console or Console(file=sys.stderr)
        self._bar = RichProgress(
            TextColumn("selfcheck"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=self.console, transient=False)
        self._task = self._bar.add_task("starting", total=None)

    def __enter__(self) -> BarProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.stop()

    def __call__(self, message: str) -> None:
        self._bar.console.print(f"[selfcheck] {message}", markup=False, highlight=False)
        self._bar.update(self._task, description=message[:60])

    def begin(self, total: int) -> None:
        self._bar.update(self._task, total=max(int(total), 1), completed=0)

    def stage_done(self) -> None:
        self._bar.advance(self._task)


def terminal_progress(stream: Any = None) -> BarProgress | None:
    """A :class:`BarProgress` when ``stream`` (default stderr) is a terminal and rich is
    installed, else ``None`` (the caller then uses the plain sink)."""
    stream = sys.stderr if stream is None else stream
    try:
        if not stream.isatty():
            return None
        import rich  # noqa: F401
    except (ImportError, AttributeError, ValueError):
        return None
    return BarProgress()


__all__ = ["BarProgress", "begin", "captures_children", "stage_done", "stderr_progress",
           "terminal_progress"]
