"""The colour scale shared by the canvas and the plots: viridis (perceptually uniform, colour-blind safe)."""

from __future__ import annotations

import math

# viridis sampled at 0, 0.1, ..., 1.0 (matplotlib's table)
VIRIDIS = (
    "#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c",
    "#22a884", "#44bf70", "#7ad151", "#bddf26", "#fde725",
)
PLOTLY_SCALE = "Viridis"


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def viridis(value: float) -> str:
    """The viridis colour of `value` in [0, 1] as `#rrggbb` (clamped; NaN/None/non-numbers read as 0)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = 0.0
    if not math.isfinite(value):
        value = 0.0
    value = min(1.0, max(0.0, value))
    scaled = value * (len(VIRIDIS) - 1)
    low = min(int(scaled), len(VIRIDIS) - 2)
    frac = scaled - low
    a, b = _rgb(VIRIDIS[low]), _rgb(VIRIDIS[low + 1])
    r, g, bl = (round(x + (y - x) * frac) for x, y in zip(a, b))
    return f"#{r:02x}{g:02x}{bl:02x}"


def text_on(background: str) -> str:
    """Black or white, whichever reads better on `background` (`#rrggbb`) by WCAG relative luminance."""

    def channel(c: int) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in _rgb(background))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    # contrast with black: (L + 0.05) / 0.05; with white: 1.05 / (L + 0.05)
    return "#111111" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "#ffffff"
