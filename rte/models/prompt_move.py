"""What the shipped world models share: a heavy ``prompt``, a cheap ``move``,
and the stage layout denoise + finalize (HOT), decode (DEFERRED),
encode_prompt (ENCODE), emitting RGB ``uint8`` frames.

A subclass sets ``max_sessions``, ``pipelined`` and ``frame_shape`` and
implements the four stage methods plus ``seed``/``detach``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rte.contract import Manifest
from rte.lanes import Lane
from rte.stages import Batch, Stage, StageModel

MAX_MOVE = 1 << 20


def check_prompt_and_move(conditioning: Mapping[str, Any]) -> None:
    """ValueError unless ``prompt`` is valid UTF-8 text and ``move`` two small ints
    (when present): what the stages could not use is refused before it reaches them."""
    if "prompt" in conditioning:
        prompt = conditioning["prompt"]
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
        try:
            prompt.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no encoder takes it
            raise ValueError(
                f"prompt must be valid UTF-8 text: {exc.reason} at character {exc.start}"
            ) from None
    if "move" in conditioning:
        move = conditioning["move"]
        ok = (
            isinstance(move, list | tuple | np.ndarray)
            and len(move) == 2
            and all(isinstance(v, int | np.integer) and abs(int(v)) < MAX_MOVE for v in move)
        )
        if not ok:
            raise ValueError(f"move must be two ints (dy, dx), got {move!r}")


class PromptMoveModel(StageModel):
    name = ""
    max_sessions: int
    pipelined: bool
    frame_shape: tuple[int, int, int]

    def manifest(self) -> Manifest:
        return Manifest(
            max_sessions=self.max_sessions,
            pipeline_depth_chunks=2 if self.pipelined else 1,
            input_latency_chunks=1,
            latent_dtype="uint8",
            latent_shape=self.frame_shape,
            model=self.name,
        )

    def stages(self) -> Sequence[Stage]:
        return (
            Stage("denoise", Lane.HOT, self._denoise),
            Stage("finalize", Lane.HOT, self._finalize),
            Stage("decode", Lane.DEFERRED, self._decode),
            Stage("encode_prompt", Lane.ENCODE, self._encode_prompt),
        )

    def heavy_keys(self) -> frozenset[str]:
        return frozenset({"prompt"})

    def conditioning_keys(self) -> frozenset[str]:
        return frozenset({"prompt", "move"})

    def check_conditioning(self, conditioning: Mapping[str, Any]) -> None:
        check_prompt_and_move(conditioning)

    @abc.abstractmethod
    def _denoise(self, batch: Batch) -> None: ...

    @abc.abstractmethod
    def _finalize(self, batch: Batch) -> None: ...

    @abc.abstractmethod
    def _decode(self, batch: Batch) -> None: ...

    @abc.abstractmethod
    def _encode_prompt(self, batch: Batch) -> None: ...
