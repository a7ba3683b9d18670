"""Which plotly.js the browser loads: the vendored *cartesian* partial bundle when it
matches the installed ``plotly`` package, else the full bundle Dash serves.

A cold browser compiles and runs plotly.js before it can draw the first graph; for the
4.8 MB full bundle that is the largest single item of a cold-cache job page load. The
dashboard draws only cartesian traces (:data:`TRACE_TYPES`), which the 1.5 MB partial
bundle holds. ``dcc.Graph`` loads plotly.js from ``window._dashPlotlyJSURL`` (unless
``window.Plotly`` exists); :func:`head_html` pins that URL to the partial bundle.

The bundle is served with V8's explicit compile hint (:data:`COMPILE_HINT`): Chromium
then compiles its functions eagerly on a background thread while the file streams in,
instead of lazily on the main thread during the first draws. On the 12,288-rank job
page in headless Chromium that cut plotly.js's main-thread time from about 1.1 s to
0.5–0.8 s. Browsers without the feature read a comment.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

VENDOR = Path(__file__).parent / "vendor"
PARTIAL = VENDOR / "plotly-cartesian.min.js"
ROUTE = "/_fleetscope/plotly-cartesian-{version}.min.js"
TRACE_TYPES = frozenset(
    {"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
     "image", "pie", "scatter", "scatterternary", "violin"}
)  # fmt: skip
"""The trace types of the cartesian bundle (its ``moduleType:"trace"`` registrations);
the figure builders must stay within them (a unit test checks)."""


COMPILE_HINT = b"//# allFunctionsCalledOnLoad\n"
"""V8's magic comment for eager compilation of the whole script (Chromium >= 136)."""


@lru_cache(maxsize=1)
def served_bytes() -> bytes:
    """The partial bundle as served: :data:`COMPILE_HINT`, then the vendored file."""
    return COMPILE_HINT + PARTIAL.read_bytes()


@lru_cache(maxsize=1)
def partial_version() -> str | None:
    """plotly.js version of the vendored partial bundle (from its header), ``None`` when
    the file is missing or has no version header."""
    try:
        with PARTIAL.open("rb") as f:
            head = f.read(200).decode("ascii", "replace")
    except OSError:
        return None
    m = re.search(r"plotly\.js \(cartesian - minified\) v(\d+\.\d+\.\d+)", head)
    return m.group(1) if m else None


def full_version() -> str:
    """plotly.js version bundled with the installed ``plotly`` package (what the figure
    JSON the server builds is written for)."""
    from plotly.offline import get_plotlyjs_version

    return str(get_plotlyjs_version())


def use_partial() -> bool:
    """Serve the partial bundle: it exists and is the same plotly.js version."""
    v = partial_version()
    return v is not None and v == full_version()


def route_path() -> str:
    return ROUTE.format(version=partial_version())


def head_html(url: str) -> str:
    """Preload the partial bundle at ``url`` and make ``dcc.Graph`` load it.

    The Dash renderer assigns ``window._dashPlotlyJSURL`` (the full bundle) when it
    starts; the property defined here keeps ``url`` instead.
    """
    return (
        f'<link rel="preload" href="{url}" as="script">\n        '
        "<script>Object.defineProperty(window, '_dashPlotlyJSURL', "
        f"{{get: function () {{ return '{url}'; }}, set: function () {{}}}});</script>\n        "
    )
