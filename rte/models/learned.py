"""The ``world`` model: a small world model that learned a world, run in NumPy.

Trained by ``tools/train_world.py`` (torch, CPU, seeded, bit-reproducible) on
views of the procedural world of :mod:`rte.models.worldgen`; the weights ship
with the package (``world_weights.npz``, checked against :data:`WEIGHTS_SHA256`)
and load by default. ``weights=PATH`` loads retrained ones (unchecked: the pin
is the shipped file's); ``weights="random"`` gives the same network untrained,
for tests that need no file and as the baseline the trained one is measured
against. Inference is NumPy: the CPU path (``rte demo``, ``rte play``) never
imports torch.

The lanes are the world model's (:mod:`rte.models.world`), small:

* ENCODE ``encode_prompt``: the prompt's words, hashed into buckets, embedded
  and averaged, then a dense layer: the look the prompt asks for (biome,
  weather), as a vector the decoder is conditioned on.
* HOT ``denoise``: the camera moves by the row's ``move``; the latent of its
  view is read from the learned terrain (a linear map of Fourier features of
  world coordinates, computed once for the whole world when the model loads)
  and refined by a learned denoiser that sees the row's cache, its previous
  latent shifted by the move (trained to remove noise from the terrain latent
  with it); HOT ``finalize`` commits the camera and the cache.
* DEFERRED ``decode``: a per-pixel MLP, conditioned on the prompt's vector,
  from latent to RGB, written into the chunk's slot.

Every row is computed on its own arrays (no matrix product spans rows), so a
session's frames are the same solo and batched, in process and in a daemon.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rte.errors import StateError
from rte.models import worldgen
from rte.models.cost import CostDial
from rte.models.prompt_move import PromptMoveModel
from rte.stages import Batch
from rte.state import ModelIdentity, RowState, digest_of

WEIGHTS = Path(__file__).with_name("world_weights.npz")
WEIGHTS_SHA256 = "caeb2fe596fdea4b3079b10811c0208865b5cb974df33c3dd10cc0094b4cb440"
LATENT = 8  # channels of the latent, per pixel
EMBED = 16  # the prompt's vector
BUCKETS = 512  # hashed word buckets of the prompt encoder
HIDDEN = 64  # the decoder's hidden width
REFINE = 32  # the denoiser's hidden width
TOP = 7  # Fourier features up to this integer frequency per axis

# name -> shape: the whole network, as trained and as shipped
SHAPES: dict[str, tuple[int, ...]] = {
    "terrain_w": (0, LATENT),  # rows: the features (set below)
    "terrain_b": (LATENT,),
    "words": (BUCKETS, EMBED),
    "prompt_w": (EMBED, EMBED),
    "prompt_b": (EMBED,),
    "refine1_w": (2 * LATENT, REFINE),
    "refine1_b": (REFINE,),
    "refine2_w": (REFINE, LATENT),
    "refine2_b": (LATENT,),
    "decode1_w": (LATENT, HIDDEN),
    "decode1_e": (EMBED, HIDDEN),
    "decode1_b": (HIDDEN,),
    "decode2_w": (HIDDEN, HIDDEN),
    "decode2_e": (EMBED, HIDDEN),
    "decode2_b": (HIDDEN,),
    "decode3_w": (HIDDEN, 3),
    "decode3_b": (3,),
}


def frequencies() -> np.ndarray:
    """The (k, m) pairs of the Fourier features: half the plane, up to :data:`TOP`."""
    pairs = [(0, m) for m in range(1, TOP + 1)]
    pairs += [(k, m) for k in range(1, TOP + 1) for m in range(-TOP, TOP + 1)]
    return np.array(pairs, np.float64)


def features(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """cos and sin of every frequency at world coordinates ``u``, ``v`` (any shape)."""
    kl = frequencies()
    phase = 2 * np.pi * (u[..., None] * kl[:, 0] + v[..., None] * kl[:, 1]) / worldgen.PERIOD
    return np.concatenate([np.cos(phase), np.sin(phase)], axis=-1).astype(np.float32)


SHAPES["terrain_w"] = (2 * len(frequencies()), LATENT)


def bucket(word: str) -> int:
    digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % BUCKETS


def prompt_buckets(prompt: str) -> list[int]:
    """The buckets of a prompt's words (the encoder's input; none: the empty prompt)."""
    return [bucket(w) for w in worldgen.words(prompt)]


def random_weights(seed: int = 20261130) -> dict[str, np.ndarray]:
    """The untrained network: what training starts from."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in SHAPES.items():
        fan_in = shape[0] if len(shape) == 2 else 1
        scale = 0.0 if len(shape) == 1 else 1.0 / np.sqrt(fan_in)
        out[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out


def load_weights(path: Path = WEIGHTS, sha256: str | None = WEIGHTS_SHA256) -> dict[str, Any]:
    """The shipped (or a given) weights, checked: ValueError when they are not those,
    saying how to restore the shipped file and how to load other weights instead."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise ValueError(
            f"{path}: checksum {digest[:16]}..., expected {sha256[:16]}... (the shipped "
            f"weights, pinned in rte/models/learned.py): restore them (git checkout -- {path} "
            "in a checkout, else reinstall rte); to run retrained weights, load them by path "
            "(--model-setting weights=PATH, or LearnedWorldModel(weights=PATH))"
        )
    with np.load(path) as npz:
        weights = {name: npz[name].astype(np.float32) for name in npz.files}
    for name, shape in SHAPES.items():
        if weights.get(name, np.empty(0)).shape != shape:
            raise ValueError(f"{path}: {name} should be {shape}")
    return weights


def world_identity(
    weights: dict[str, np.ndarray], view: int, hidden: int, refine: int
) -> ModelIdentity:
    """The identity of a world model's row states: its weights and widths (the NumPy
    and the torch model of the same weights read each other's)."""
    return ModelIdentity(
        "world", digest_of(view, hidden, refine, *(weights[k] for k in sorted(weights)))
    )


def world_position(state: RowState) -> tuple[int, int]:
    """A world row state's camera position; StateError when it is not two ints."""
    position = state.meta.get("position")
    if not isinstance(position, list | tuple) or len(position) != 2:
        raise StateError(f"row state 'position': expected (y, x), got {position!r}")
    y, x = (int(p) for p in position)
    return y, x


def _relu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.maximum(x, 0, out=x)
    return out


class LearnedWorldModel(PromptMoveModel):
    """Args:
    max_sessions: rows in the arena.
    pipelined: decode chunk N-1 while making chunk N.
    weights: ``"trained"`` (the shipped file, checked), ``"random"`` (untrained),
        or the path of a file ``tools/train_world.py`` wrote (not checked).
    cost: each stage costs this many times its work (for real-time tests and
        benchmarks; see :mod:`rte.models.cost`).
    cost_file: a file holding the cost factor, re-read while the model runs.
    """

    name = "world"

    def __init__(
        self,
        max_sessions: int = 8,
        *,
        pipelined: bool = True,
        weights: str = "trained",
        cost: float = 1.0,
        cost_file: str | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.cost = CostDial(cost, cost_file)
        self.pipelined = pipelined
        self.frame_shape = (worldgen.VIEW, worldgen.VIEW, 3)
        if weights == "random":
            self.w = random_weights()
        elif weights == "trained":
            self.w = load_weights()
        else:
            self.w = load_weights(Path(weights), sha256=None)
        u, v = np.meshgrid(np.arange(worldgen.PERIOD), np.arange(worldgen.PERIOD), indexing="ij")
        self.terrain = features(u, v) @ self.w["terrain_w"] + self.w["terrain_b"]  # (P, P, C)
        self.position = [(0, 0)] * max_sessions
        self.cache = np.zeros((max_sessions, worldgen.VIEW, worldgen.VIEW, LATENT), np.float32)
        self.embedding = np.zeros((max_sessions, EMBED), np.float32)
        self.encodes: list[tuple[str, str]] = []

    # -- the network ----------------------------------------------------------

    def embed(self, prompt: str) -> np.ndarray:
        """ENCODE's work for one prompt: its vector."""
        ids = prompt_buckets(prompt)
        mean = self.w["words"][ids].mean(axis=0) if ids else np.zeros(EMBED, np.float32)
        vector: np.ndarray = np.tanh(mean @ self.w["prompt_w"] + self.w["prompt_b"])
        return vector.astype(np.float32)

    def refine(self, latent: np.ndarray, previous: np.ndarray) -> np.ndarray:
        """HOT's denoiser: the view's latent, refined with the cached (shifted) one."""
        w = self.w
        both = np.concatenate([latent, previous], axis=-1)
        hidden = _relu(both @ w["refine1_w"] + w["refine1_b"])
        refined: np.ndarray = latent + hidden @ w["refine2_w"] + w["refine2_b"]
        return refined

    def render(self, latent: np.ndarray, embedding: np.ndarray) -> np.ndarray:
        """DEFERRED's decoder: one view's latent to an RGB uint8 frame."""
        w = self.w
        h = _relu(latent @ w["decode1_w"] + (embedding @ w["decode1_e"] + w["decode1_b"]))
        h = _relu(h @ w["decode2_w"] + (embedding @ w["decode2_e"] + w["decode2_b"]))
        rgb = 255.0 / (1.0 + np.exp(-(h @ w["decode3_w"] + w["decode3_b"])))
        return np.asarray(rgb.round(), dtype=np.uint8)

    # -- the StageModel contract ------------------------------------------------

    def seed(self, batch: Batch) -> None:
        for row, session, cond in zip(batch.rows, batch.sessions, batch.conditioning, strict=True):
            self.position[row] = worldgen.start(session)
            self.cache[row] = worldgen.crop(self.terrain, self.position[row])
            self.embedding[row] = self.embed(cond.get("prompt", ""))

    def detach(self, row: int) -> None:
        self.cache[row] = 0.0
        self.embedding[row] = 0.0

    def state_identity(self) -> ModelIdentity:
        return world_identity(self.w, worldgen.VIEW, HIDDEN, REFINE)

    def export_rows(self, rows: Sequence[int]) -> list[RowState]:
        return [
            RowState(
                {"cache": self.cache[r].copy(), "embedding": self.embedding[r].copy()},
                {"position": list(self.position[r])},
            )
            for r in rows
        ]

    def import_rows(self, rows: Sequence[int], states: Sequence[RowState]) -> None:
        for row, state in zip(rows, states, strict=True):
            self.cache[row] = state.array("cache", self.cache.shape[1:], np.float32)
            self.embedding[row] = state.array("embedding", (EMBED,), np.float32)
            self.position[row] = world_position(state)

    def _denoise(self, batch: Batch) -> None:
        with self.cost.stage():
            self._denoise_rows(batch)

    def _denoise_rows(self, batch: Batch) -> None:
        latents, positions = [], []
        for row, cond in zip(batch.rows, batch.conditioning, strict=True):
            move = tuple(int(m) for m in cond.get("move", (0, 0)))
            dy, dx = worldgen.delta((move[0], move[1]))
            position = worldgen.step(self.position[row], (move[0], move[1]))
            previous = np.roll(self.cache[row], (-dy, -dx), axis=(0, 1))  # the cache, aligned
            latents.append(self.refine(worldgen.crop(self.terrain, position), previous))
            positions.append(position)
        batch.carry["latent"] = latents
        batch.carry["position"] = positions
        batch.carry["embedding"] = [self.embedding[row].copy() for row in batch.rows]

    def _finalize(self, batch: Batch) -> None:
        carry = batch.carry
        for row, latent, position in zip(
            batch.rows, carry["latent"], carry["position"], strict=True
        ):
            self.position[row] = position
            self.cache[row] = latent

    def _decode(self, batch: Batch) -> None:
        carry = batch.carry
        with self.cost.stage():
            for latent, embedding, out in zip(
                carry["latent"], carry["embedding"], batch.out, strict=True
            ):
                out[...] = self.render(latent, embedding)

    def _encode_prompt(self, batch: Batch) -> None:
        for row, session, cond in zip(batch.rows, batch.sessions, batch.conditioning, strict=True):
            if "prompt" in cond:
                self.embedding[row] = self.embed(cond["prompt"])
                self.encodes.append((session, cond["prompt"]))
