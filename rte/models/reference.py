"""The reference model: a deterministic NumPy StageModel that exercises every lane.

It is the default model of the demo and the daemon, and the model the tests
run. Per row it keeps a latent state (``channels x h x w``, the analogue of a
KV cache) and an encoded prompt.

* HOT ``denoise``: the next latent from the row's state, its ``move`` action (a
  roll of the state by ``(dy, dx)``), its encoded prompt, and noise seeded by
  (session, chunk index); HOT ``finalize``: commit it as the new state.
* DEFERRED ``decode``: latent to an RGB ``uint8`` frame, written in place into
  the chunk's output buffer.
* ENCODE ``encode_prompt``: the heavy ``prompt`` key to an embedding, with a
  settable cost (``encode_cost_s``) to make encodes over budget.
* ``frame``: an input image (``uint8``, ``(k*H, k*W, 3)`` for an output of
  ``(H, W, 3)``), blended half and half into every later output, sampled every
  k-th pixel: what a video-in or img2img model consumes, for the tests and
  ``rte bench`` to send large inputs through the slab.

Rows never mix and every row is computed on arrays of its own, so a session's
output is bit-identical solo and batched, and two sessions differ.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rte.models.prompt_move import PromptMoveModel
from rte.stages import Batch
from rte.state import ModelIdentity, RowState, digest_of


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class ReferenceModel(PromptMoveModel):
    """Args:
    max_sessions: rows in the arena.
    pipelined: decode chunk N-1 while generating chunk N (depth 2), or not (depth 1).
    channels, latent_hw: the latent's shape, ``(channels, h, w)``.
    scale: the frame is ``(h * scale, w * scale, 3)`` uint8.
    encode_cost_s: seconds each prompt encode takes (sleeps on the ENCODE lane).
    """

    name = "reference"

    def __init__(
        self,
        max_sessions: int = 8,
        *,
        pipelined: bool = True,
        channels: int = 4,
        latent_hw: tuple[int, int] = (16, 16),
        scale: int = 4,
        encode_cost_s: float = 0.0,
    ) -> None:
        self.max_sessions = max_sessions
        self.pipelined = pipelined
        self.encode_cost_s = encode_cost_s
        self._latent_shape = (channels, *latent_hw)
        self._scale = scale
        self.frame_shape = (latent_hw[0] * scale, latent_hw[1] * scale, 3)
        self._state = np.zeros((max_sessions, *self._latent_shape), np.float32)
        self._prompt = np.zeros((max_sessions, channels, 1, 1), np.float32)
        self._noise_seed = [0] * max_sessions
        palette = np.random.default_rng(7).uniform(-1.0, 1.0, (channels, 3))
        self._palette = palette.astype(np.float32) / np.float32(channels)
        self.encodes: list[tuple[str, str]] = []  # (session, prompt) of every ENCODE

    def conditioning_keys(self) -> frozenset[str]:
        return frozenset({"prompt", "move", "frame"})

    def check_conditioning(self, conditioning: Mapping[str, Any]) -> None:
        super().check_conditioning(conditioning)
        frame = conditioning.get("frame")
        if frame is None:
            return
        h, w, _ = self.frame_shape
        shape: tuple[int, ...] = getattr(frame, "shape", ())
        if (
            not isinstance(frame, np.ndarray)
            or frame.dtype != np.uint8
            or len(shape) != 3
            or shape[2] != 3
            or shape[0] % h
            or shape[1] % w
            or shape[0] // h != shape[1] // w
            or not shape[0]
        ):
            what = f"{frame.dtype}{shape}" if isinstance(frame, np.ndarray) else repr(frame)
            raise ValueError(
                f"frame must be a uint8 image of (k*{h}, k*{w}, 3) for a whole k, got {what}"
            )

    def seed(self, batch: Batch) -> None:
        for row, session, cond in zip(batch.rows, batch.sessions, batch.conditioning, strict=True):
            self._noise_seed[row] = _digest(session)
            rng = np.random.default_rng([self._noise_seed[row], 1 << 40])
            self._state[row] = rng.standard_normal(self._latent_shape, np.float32) * 0.5
            self._prompt[row] = self._embed(cond.get("prompt", ""))

    def detach(self, row: int) -> None:
        self._state[row] = 0.0
        self._prompt[row] = 0.0

    # -- a row's state (suspend, resume) ------------------------------------

    def state_identity(self) -> ModelIdentity:
        return ModelIdentity("reference", digest_of(self._latent_shape, self._scale, self._palette))

    def export_rows(self, rows: Sequence[int]) -> list[RowState]:
        return [
            RowState(
                {"state": self._state[r].copy(), "prompt": self._prompt[r].copy()},
                {"noise_seed": self._noise_seed[r]},
            )
            for r in rows
        ]

    def import_rows(self, rows: Sequence[int], states: Sequence[RowState]) -> None:
        for row, state in zip(rows, states, strict=True):
            self._state[row] = state.array("state", self._latent_shape, np.float32)
            self._prompt[row] = state.array("prompt", self._prompt.shape[1:], np.float32)
            self._noise_seed[row] = state.number("noise_seed")

    # -- stages -----------------------------------------------------------

    def _denoise(self, batch: Batch) -> None:
        latents = []
        for row, chunk, cond in zip(batch.rows, batch.chunks, batch.conditioning, strict=True):
            noise = np.random.default_rng([self._noise_seed[row], chunk]).standard_normal(
                self._latent_shape, np.float32
            )
            dy, dx = cond.get("move", (0, 0))
            state = np.roll(self._state[row], (int(dy), int(dx)), axis=(1, 2))
            latent = np.tanh(
                np.float32(0.85) * state + np.float32(0.35) * noise + self._prompt[row]
            )
            latents.append(latent)
        batch.carry["latent"] = latents

    def _finalize(self, batch: Batch) -> None:
        for row, latent in zip(batch.rows, batch.carry["latent"], strict=True):
            self._state[row] = latent

    def _decode(self, batch: Batch) -> None:
        latents, conditioning = batch.carry["latent"], batch.conditioning
        for latent, out, cond in zip(latents, batch.out, conditioning, strict=True):
            rgb = np.einsum("chw,cd->hwd", latent, self._palette, optimize=False)
            frame = np.clip(np.float32(127.5) + np.float32(127.5) * rgb, 0, 255).astype(np.uint8)
            image = frame.repeat(self._scale, axis=0).repeat(self._scale, axis=1)
            seen = cond.get("frame")
            if seen is not None:  # an input image: half of every pixel is its
                k = seen.shape[0] // image.shape[0]
                image = ((image.astype(np.uint16) + seen[::k, ::k]) >> 1).astype(np.uint8)
            out[...] = image

    def _encode_prompt(self, batch: Batch) -> None:
        for row, session, cond in zip(batch.rows, batch.sessions, batch.conditioning, strict=True):
            if "prompt" not in cond:
                continue
            embedding = self._embed(cond["prompt"])
            if self.encode_cost_s:
                time.sleep(self.encode_cost_s)
            self._prompt[row] = embedding
            self.encodes.append((session, cond["prompt"]))

    def _embed(self, prompt: str) -> np.ndarray[Any, Any]:
        rng = np.random.default_rng(_digest("prompt:" + prompt))
        shape = (self._latent_shape[0], 1, 1)
        return rng.standard_normal(shape, np.float32) * np.float32(0.5)
