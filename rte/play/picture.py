"""What a session's frame looks like on video: upscaled by an integer factor,
with a stamp below it that says which frame it is.

A model's frame (the world's is 32x32 RGB) is too small for a video encoder
and blurs when a browser scales it. :func:`upscale` repeats each pixel into a
``scale`` x ``scale`` block (the world's x8: 256x256, its 8x8 blocks align with
the codec's, so VP8 and H.264 keep the edges sharp and the page shows them
crisp with ``image-rendering: pixelated``).

Video carries no per-frame metadata a page can read, so each frame the
gateway encodes carries its own: :data:`STAMP_ROWS` rows of black and white
blocks below the scene (:func:`stamped`), a 32-bit word a row, most significant
bit left: the chunk index, the page's ``seq`` of the last action the frame
reflects, the wall-clock millisecond (mod 2**32) the frame began generating,
and a check word (the XOR of the three and :data:`CHECK`). The page reads the
rows of each displayed frame (a canvas, a threshold at half grey), drops a
frame whose check fails, and crops them from view. Each row is 8 pixels high
and each bit ``width // 32`` wide, so the stamp survives the encoder.
"""

from __future__ import annotations

from typing import Any

import numpy as np

STAMP_BITS = 32  # bits a row
STAMP_ROWS = 4  # chunk, seq, made ms, check
ROW_HEIGHT = 8
CHECK = 0xA5A5A5A5
TARGET_SIZE = 256  # the long side :func:`scale_for` aims for


def scale_for(shape: tuple[int, int], target: int = TARGET_SIZE) -> int:
    """The integer factor that brings a frame's long side to ``target`` (at least 1)."""
    return max(1, target // max(shape))


def upscale(frame: np.ndarray[Any, Any], scale: int) -> np.ndarray[Any, Any]:
    """Each pixel of an (h, w, 3) frame as a ``scale`` x ``scale`` block."""
    if scale == 1:
        return frame
    return frame.repeat(scale, axis=0).repeat(scale, axis=1)


def stamp_height() -> int:
    return STAMP_ROWS * ROW_HEIGHT


def stamped(
    frame: np.ndarray[Any, Any], scale: int, chunk: int, seq: int, made_ms: int
) -> np.ndarray[Any, Any]:
    """The frame upscaled, with the stamp rows below it: (h*scale + 32, w*scale, 3)."""
    scene = upscale(frame, scale)
    height, width = scene.shape[0], scene.shape[1]
    words = [chunk & 0xFFFFFFFF, seq & 0xFFFFFFFF, made_ms & 0xFFFFFFFF]
    words.append(words[0] ^ words[1] ^ words[2] ^ CHECK)
    bits = (np.array(words, np.uint64)[:, None] >> np.arange(31, -1, -1, dtype=np.uint64)) & 1
    block = max(1, width // STAMP_BITS)
    rows = np.zeros((STAMP_ROWS, width), np.uint8)
    rows[:, : block * STAMP_BITS] = (bits.astype(np.uint8) * 255).repeat(block, axis=1)
    out = np.empty((height + stamp_height(), width, 3), np.uint8)
    out[:height] = scene
    out[height:] = rows.repeat(ROW_HEIGHT, axis=0)[:, :, None]
    return out


def read_stamp(picture: np.ndarray[Any, Any], scene_height: int) -> tuple[int, int, int] | None:
    """(chunk, seq, made ms) from a decoded picture's stamp, or None if its check fails
    (what the page does, for tests and recordings)."""
    width = picture.shape[1]
    block = max(1, width // STAMP_BITS)
    words = []
    for row in range(STAMP_ROWS):
        y = scene_height + row * ROW_HEIGHT + ROW_HEIGHT // 2
        xs = np.arange(STAMP_BITS) * block + block // 2
        bits = picture[y, xs].astype(np.int32).mean(axis=-1) > 127
        words.append(int("".join("1" if b else "0" for b in bits), 2))
    if words[0] ^ words[1] ^ words[2] ^ CHECK != words[3]:
        return None
    return words[0], words[1], words[2]
