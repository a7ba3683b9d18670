"""One colour-blind-safe palette for every view (Okabe & Ito, 2008).

Section kinds, rank states and severities get the same colour everywhere, so "orange"
means data loading in the timeline, the legend and the trace export alike. Scalar
fields (heat-map, straggler score) use Cividis, which reads the same under all common
colour-vision deficiencies and in greyscale.
"""

from __future__ import annotations

from typing import Final

BLACK: Final = "#000000"
ORANGE: Final = "#E69F00"
SKY_BLUE: Final = "#56B4E9"
GREEN: Final = "#009E73"
YELLOW: Final = "#F0E442"
BLUE: Final = "#0072B2"
VERMILLION: Final = "#D55E00"
PURPLE: Final = "#CC79A7"
GREY: Final = "#999999"

SCALAR_COLORSCALE: Final = "Cividis"
"""Sequential scale for heat-map values and straggler scores."""

SECTION_COLORS: Final[dict[str, str]] = {
    "forward": BLUE,
    "backward": SKY_BLUE,
    "optimizer": GREEN,
    "dataloader": ORANGE,
    "other": GREY,
    "collective": PURPLE,
    "p2p": VERMILLION,
}
"""Colour of a timeline span by section name (or by ``collective``/``p2p``)."""

KIND_COLORS: Final[dict[str, str]] = {
    "compute": BLUE,
    "dataloader": ORANGE,
    "optimizer": GREEN,
    "other": GREY,
}
"""Colour of a section by its ``kind`` column, used when the name is not known."""

STATE_COLORS: Final[dict[str, str]] = {
    "ok": GREEN,
    "slow": ORANGE,
    "stuck": VERMILLION,
    "hung": VERMILLION,
    "dead": BLACK,
    "missing": GREY,
    "finished": SKY_BLUE,
}

SEVERITY_COLORS: Final[dict[str, str]] = {
    "info": SKY_BLUE,
    "warning": ORANGE,
    "error": VERMILLION,
    "critical": VERMILLION,
}

CULPRIT_COLOR: Final = VERMILLION
ARROW_COLOR: Final = BLACK


def span_color(name: str, kind: str = "") -> str:
    """Colour of a timeline span: by section name first, then by kind."""
    if name in SECTION_COLORS:
        return SECTION_COLORS[name]
    return KIND_COLORS.get(kind, SECTION_COLORS.get(kind, GREY))
