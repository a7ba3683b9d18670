"""Read pixels of a browser screenshot (PNG) without an imaging library.

Chromium's screenshots are 8-bit RGB or RGBA PNGs, non-interlaced: enough to decode them
with zlib and the five PNG row filters.
"""

from __future__ import annotations

import struct
import zlib


class Image:
    """Decoded pixels: ``pixel(x, y)`` -> (r, g, b)."""

    def __init__(self, width: int, height: int, channels: int, rows: list[bytearray]) -> None:
        self.width, self.height, self.channels, self.rows = width, height, channels, rows

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        row, i = self.rows[y], x * self.channels
        return row[i], row[i + 1], row[i + 2]

    def mean(self, x: float, y: float, r: int = 2) -> tuple[float, float, float]:
        """Mean colour of the (2r+1)^2 pixels around (x, y)."""
        xs = range(max(int(x) - r, 0), min(int(x) + r + 1, self.width))
        ys = range(max(int(y) - r, 0), min(int(y) + r + 1, self.height))
        px = [self.pixel(a, b) for a in xs for b in ys]
        if not px:
            raise ValueError(f"({x:.0f}, {y:.0f}) lies outside the {self.width}x{self.height} screenshot")
        return tuple(sum(p[k] for p in px) / len(px) for k in range(3))  # type: ignore[return-value]


def decode_png(data: bytes) -> Image:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG (depth {depth}, colour type {color}, interlace {interlace})")
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        cur = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = cur[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                cur[i] = (cur[i] + a) & 0xFF
            elif f == 2:
                cur[i] = (cur[i] + b) & 0xFF
            elif f == 3:
                cur[i] = (cur[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(cur)
        prev = cur
    return Image(width, height, channels, rows)


def distance(c1: tuple[float, ...], c2: tuple[float, ...]) -> float:
    return sum((a - b) ** 2 for a, b in zip(c1, c2)) ** 0.5
