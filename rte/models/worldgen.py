"""The procedural world the ``world`` model learned: its ground truth, in NumPy.

A top-down 2D world on a torus of :data:`PERIOD` x :data:`PERIOD` pixels (it
wraps: walk far enough and you are back). Its geography is fixed: a smooth
height field (hills, lakes) and a finer detail field (trees, dunes, rocks),
each a sum of a few integer-frequency waves, so that a model can learn them
exactly. Its look follows the prompt: the first biome word in it picks the
palette (``meadow``, ``forest``, ``desert``, ``snow``, ``ocean``, ``lava``; a
few synonyms each) and the first weather word the light (``clear``, ``night``,
``fog``). A camera of :data:`VIEW` x :data:`VIEW` pixels starts where the
session's name says (:func:`start`) and moves :data:`SPEED` pixel per chunk
per unit of the ``move`` action (``(dy, dx)``: ``(0, 1)`` pans right, so the
scene slides left).

``tools/train_world.py`` trains :mod:`rte.models.learned` on views of it; the
tests measure the model against :func:`view`.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

PERIOD = 64
VIEW = 32
SPEED = 1  # pixels per chunk per unit of move
MAX_MOVE = 4  # |dy|, |dx| beyond this are clipped

BIOMES: dict[str, tuple[tuple[int, int, int], ...]] = {
    # low, middle, high ground, then the detail's colour (trees, dunes, rocks...)
    "meadow": ((70, 120, 200), (110, 180, 80), (205, 205, 190), (235, 215, 90)),
    "forest": ((40, 80, 120), (35, 95, 45), (80, 150, 65), (15, 50, 20)),
    "desert": ((185, 145, 85), (230, 200, 130), (250, 232, 175), (160, 105, 55)),
    "snow": ((150, 185, 220), (232, 238, 248), (255, 255, 255), (110, 115, 130)),
    "ocean": ((10, 40, 115), (25, 85, 165), (70, 160, 205), (232, 242, 250)),
    "lava": ((45, 20, 20), (125, 30, 12), (255, 125, 25), (255, 225, 90)),
}
DETAIL = {"meadow": 0.3, "forest": 0.55, "desert": 0.35, "snow": 0.3, "ocean": 0.3, "lava": 0.45}
WEATHERS = ("clear", "night", "fog")
SYNONYMS = {
    "grass": "meadow", "field": "meadow", "meadow": "meadow", "plains": "meadow",
    "forest": "forest", "woods": "forest", "jungle": "forest", "trees": "forest",
    "desert": "desert", "sand": "desert", "dunes": "desert",
    "snow": "snow", "ice": "snow", "winter": "snow", "tundra": "snow",
    "ocean": "ocean", "sea": "ocean", "water": "ocean", "islands": "ocean",
    "lava": "lava", "volcano": "lava", "fire": "lava", "hell": "lava",
    "clear": "clear", "sunny": "clear", "day": "clear",
    "night": "night", "dark": "night", "midnight": "night",
    "fog": "fog", "foggy": "fog", "mist": "fog", "misty": "fog",
}  # fmt: skip


def words(prompt: str) -> list[str]:
    return re.findall(r"[a-z]+", prompt.lower())


def look(prompt: str) -> tuple[str, str]:
    """The (biome, weather) a prompt asks for: its first word of each kind, else
    meadow and clear."""
    biome, weather = "", ""
    for word in words(prompt):
        kind = SYNONYMS.get(word, "")
        if kind in BIOMES and not biome:
            biome = kind
        elif kind in WEATHERS and not weather:
            weather = kind
    return biome or "meadow", weather or "clear"


def _waves(seed: int, top: int, count: int, bottom: int = 1) -> np.ndarray:
    """A field on the torus: ``count`` waves whose integer frequencies are at most
    ``top`` per axis (at least ``bottom`` on one), scaled to [0, 1]."""
    rng = np.random.default_rng(seed)
    u, v = np.meshgrid(np.arange(PERIOD), np.arange(PERIOD), indexing="ij")
    field = np.zeros((PERIOD, PERIOD))
    made = 0
    while made < count:
        k, m = (int(f) for f in rng.integers(-top, top + 1, 2))
        if max(abs(k), abs(m)) < bottom:
            continue
        phase = rng.uniform(0, 2 * np.pi)
        amplitude = rng.uniform(0.5, 1.0) / np.hypot(k, m)
        field += amplitude * np.cos(2 * np.pi * (k * u + m * v) / PERIOD + phase)
        made += 1
    scaled: np.ndarray = (field - field.min()) / (field.max() - field.min())
    return scaled


def _smoothstep(low: float, high: float, x: np.ndarray) -> np.ndarray:
    t = np.clip((x - low) / (high - low), 0, 1)
    return t * t * (3 - 2 * t)


HEIGHT = _waves(20261130, 3, 12)
DETAIL_FIELD = _smoothstep(0.5, 0.8, _waves(77, 7, 10, bottom=4))


def world(biome: str, weather: str) -> np.ndarray:
    """The whole torus as a ``(PERIOD, PERIOD, 3)`` float image in [0, 255]."""
    low, middle, high, detail = (np.array(c, np.float64) for c in BIOMES[biome])
    h = HEIGHT[..., None]
    ground = np.where(
        h < 0.5, low + (middle - low) * (h / 0.5), middle + (high - middle) * ((h - 0.5) / 0.5)
    )
    image = ground + (detail - ground) * (DETAIL[biome] * DETAIL_FIELD[..., None])
    if weather == "night":
        image = image * np.array([0.3, 0.36, 0.62]) + np.array([4.0, 6.0, 22.0])
    elif weather == "fog":
        image = 0.45 * image + 0.55 * np.array([205.0, 208.0, 214.0])
    return np.clip(image, 0, 255)


def start(session: str) -> tuple[int, int]:
    """Where a session's camera starts, from its name."""
    digest = hashlib.blake2b(session.encode(), digest_size=4).digest()
    return digest[0] % PERIOD, digest[1] % PERIOD


def delta(move: tuple[int, int]) -> tuple[int, int]:
    """How far the camera goes in one chunk of ``move``, in pixels."""
    dy, dx = (int(np.clip(m, -MAX_MOVE, MAX_MOVE)) * SPEED for m in move)
    return dy, dx


def step(position: tuple[int, int], move: tuple[int, int]) -> tuple[int, int]:
    """The camera after one chunk of ``move``."""
    dy, dx = delta(move)
    return (position[0] + dy) % PERIOD, (position[1] + dx) % PERIOD


def crop(image: np.ndarray, position: tuple[int, int]) -> np.ndarray:
    """The ``VIEW`` x ``VIEW`` window of a torus image whose top-left is ``position``."""
    rows = (position[0] + np.arange(VIEW)) % PERIOD
    cols = (position[1] + np.arange(VIEW)) % PERIOD
    return image[rows[:, None], cols[None, :]]


def view(prompt: str, position: tuple[int, int]) -> np.ndarray:
    """The true frame at ``position`` under ``prompt``: ``(VIEW, VIEW, 3)`` uint8."""
    return crop(world(*look(prompt)), position).round().astype(np.uint8)
