"""Contact sheets: a few frames of each session in a row, labelled, as a PNG.

``rte demo --png`` writes one. Frames are scaled up (nearest neighbour) so a
32x32 world is readable; each row is labelled with its session and prompt in
a 3x5 pixel font drawn here (no imaging library needed), and the PNG is
written with zlib alone.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

COLUMNS = 8
GUTTER = 4
TEXT_SCALE = 2
LABEL = 5 * TEXT_SCALE + 2 * GUTTER  # the label band above each row
_GLYPHS = {  # 3x5, row by row, "1" lit
    "a": "010101111101101", "b": "110101110101110", "c": "011100100100011",
    "d": "110101101101110", "e": "111100110100111", "f": "111100110100100",
    "g": "011100101101011", "h": "101101111101101", "i": "111010010010111",
    "j": "001001001101010", "k": "101101110101101", "l": "100100100100111",
    "m": "101111111101101", "n": "110101101101101", "o": "010101101101010",
    "p": "110101110100100", "q": "010101101110011", "r": "110101110101101",
    "s": "011100010001110", "t": "111010010010010", "u": "101101101101111",
    "v": "101101101101010", "w": "101101111111101", "x": "101101010101101",
    "y": "101101010010010", "z": "111001010100111", "0": "111101101101111",
    "1": "010110010010111", "2": "110001010100111", "3": "110001010001110",
    "4": "101101111001001", "5": "111100110001110", "6": "011100111101111",
    "7": "111001010010010", "8": "111101111101111", "9": "111101111001110",
    "-": "000000111000000", ":": "000010000010000", ".": "000000000000010",
    ",": "000000000010100", "'": "010010000000000", " ": "000000000000000",
    "?": "110001010000010",
}  # fmt: skip


def draw_text(
    image: np.ndarray[Any, Any], y: int, x: int, text: str, color: tuple[int, ...]
) -> None:
    """Write ``text`` into ``image`` (H, W, 3) at (y, x), cut at its right edge."""
    s = TEXT_SCALE
    for i, char in enumerate(text.lower()):
        glyph = _GLYPHS.get(char, _GLYPHS["?"])
        left = x + i * 4 * s
        if left + 3 * s > image.shape[1]:
            return
        cells = np.array([int(b) for b in glyph], bool).reshape(5, 3)
        lit = np.kron(cells, np.ones((s, s), bool))
        image[y : y + 5 * s, left : left + 3 * s][lit] = color


def contact_sheet(
    rows: list[list[np.ndarray[Any, Any]]], labels: list[str], scale: int = 4
) -> np.ndarray[Any, Any] | None:
    """One row per session (its first :data:`COLUMNS` frames given), under its label."""
    picked = [(frames[:COLUMNS], label) for frames, label in zip(rows, labels, strict=True)]
    picked = [(frames, label) for frames, label in picked if frames]
    if not picked:
        return None
    h, w, _ = picked[0][0][0].shape
    tile_h, tile_w = h * scale + GUTTER, w * scale + GUTTER
    sheet = np.full((len(picked) * (tile_h + LABEL), COLUMNS * tile_w + GUTTER, 3), 24, np.uint8)
    for r, (frames, label) in enumerate(picked):
        top = r * (tile_h + LABEL)
        draw_text(sheet, top + GUTTER, GUTTER, label, (235, 235, 235))
        for k, frame in enumerate(frames):
            big = frame.repeat(scale, axis=0).repeat(scale, axis=1)
            y, x = top + LABEL, GUTTER + k * tile_w
            sheet[y : y + h * scale, x : x + w * scale] = big[..., :3]
    return sheet


def write_png(path: Path, image: np.ndarray[Any, Any]) -> None:
    """An 8-bit RGB PNG, written with zlib alone."""
    height, width, _ = image.shape
    raw = b"".join(b"\x00" + image[y].tobytes() for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )
