"""Polling with a deadline: the one ``wait_for`` of the test suite.

Use it instead of a fixed ``time.sleep`` before an assertion: it returns as soon as the
condition holds (fast on a quiet machine) and waits up to ``timeout_s`` on a loaded one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    fn: Callable[[], T],
    timeout_s: float = 30.0,
    what: str = "condition",
    interval_s: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``fn`` until it returns something truthy and return that value.

    An exception of a type in ``ignore`` counts as "not yet" (a page mid-render).

    Raises:
        AssertionError: naming ``what`` (and the last value) after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = fn()
        except ignore as e:
            value = e  # type: ignore[assignment]
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {value!r})")
        time.sleep(interval_s)
