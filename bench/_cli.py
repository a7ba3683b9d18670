"""Argument types the benchmark scripts share (imported as a sibling: ``python
bench/x.py`` puts this folder on ``sys.path``)."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """An argparse ``type``: ``"512,2048,12288"`` -> ``[512, 2048, 12288]`` (empty
    items skipped); a bad item is a usage error naming it."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r} in {text!r} is not an integer (expected e.g. 512,2048)") from None
    return out
