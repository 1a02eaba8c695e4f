"""The learned world (:mod:`rte.models.learned`) in torch: the same weights, on CUDA.

Selected as ``--model world --device cuda`` (and ``--model world-torch`` on any
device). The network and its weights are the NumPy model's, so a GPU user
sees the learned world; the work runs as the ``torch`` model's does (lanes,
CUDA graphs, the slab path of :mod:`rte.models.slab_copy`), so the batching
path is proven on real work:

* HOT ``denoise``: each row's view is gathered from the learned terrain at its
  moved position and refined with its cache rolled by the move, for the whole
  batch in one set of launches (the per-row numbers go up in one page-locked
  copy, :mod:`rte.models.staging`); the refined latent is the row's new cache.
  HOT ``finalize`` commits the positions (host bookkeeping).
* DEFERRED ``decode``: the per-pixel MLP conditioned on each row's prompt
  vector, rounded to uint8, and one device-to-host copy per client.
* ENCODE ``encode_prompt``: the prompt's vector (a few words: NumPy), sent to
  the row in one asynchronous copy.

Frames are within one level of the NumPy model's (float32 in another order;
``tests/test_learned_torch.py``). On CUDA every batch is padded to the arena
(as the ``torch`` model's), so frames are the same solo and batched.

``view``, ``hidden`` and ``refine`` (resolution and widths) make a larger
configuration for capacity figures: its weights are random (untrained, and
:meth:`TorchLearnedWorld.describe` says so), its frames are not a world.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rte.models import learned, worldgen
from rte.models.cost import CostDial
from rte.models.graphs import GraphSet, padded
from rte.models.prompt_move import PromptMoveModel
from rte.models.slab_copy import SlabCopy
from rte.models.staging import Staging, to_device
from rte.stages import Batch
from rte.state import ModelIdentity, RowState

INTS = 5  # per row: arena row, position (y, x) after the move, the move's (dy, dx)


def _weights(weights: str, hidden: int, refine: int) -> tuple[dict[str, np.ndarray], bool]:
    """The network's weights and whether they are the trained ones."""
    default = hidden == learned.HIDDEN and refine == learned.REFINE
    if default and weights == "trained":
        return learned.load_weights(), True
    if default and weights not in ("trained", "random"):
        return learned.load_weights(Path(weights), sha256=None), False
    rng = np.random.default_rng(20261130)
    shapes: dict[str, tuple[int, ...]] = dict(learned.SHAPES)
    latent, embed = learned.LATENT, learned.EMBED
    shapes |= {"refine1_w": (2 * latent, refine), "refine1_b": (refine,)}
    shapes |= {"refine2_w": (refine, latent), "decode1_w": (latent, hidden)}
    shapes |= {"decode1_e": (embed, hidden), "decode1_b": (hidden,)}
    shapes |= {"decode2_w": (hidden, hidden), "decode2_e": (embed, hidden)}
    shapes |= {"decode2_b": (hidden,), "decode3_w": (hidden, 3)}
    out = {}
    for name, shape in shapes.items():
        scale = 0.0 if len(shape) == 1 else 1.0 / np.sqrt(shape[0])
        out[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out, False


class TorchLearnedWorld(PromptMoveModel):
    """Args:
    max_sessions: rows in the arena.
    pipelined: decode chunk N-1 while making chunk N.
    weights: ``"trained"`` (the shipped file), ``"random"``, or a path; any other
        ``view``/``hidden``/``refine`` than the defaults takes random weights.
    device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"``; CUDA when available.
    graphs: on CUDA, HOT and DEFERRED as CUDA graphs (captured at load).
    batch_invariant: pad every batch to the arena (default: on CUDA).
    view: the frame's side in pixels (the trained world's is 32).
    hidden: the decoder's width; refine: the denoiser's.
    cost: each stage costs this many times its host work; cost_file: re-read
        factor (:mod:`rte.models.cost`, as the NumPy model's).
    """

    name = "world"

    def __init__(
        self,
        max_sessions: int = 8,
        *,
        pipelined: bool = True,
        weights: str = "trained",
        device: str | None = None,
        graphs: bool | None = None,
        batch_invariant: bool | None = None,
        view: int = worldgen.VIEW,
        hidden: int = learned.HIDDEN,
        refine: int = learned.REFINE,
        cost: float = 1.0,
        cost_file: str | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.cost = CostDial(cost, cost_file)
        self.pipelined = pipelined
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.view, self.hidden, self.refine_width = view, hidden, refine
        default = (view, hidden, refine) == (worldgen.VIEW, learned.HIDDEN, learned.REFINE)
        self.w, self.trained = _weights(weights if default else "random", hidden, refine)
        self.frame_shape = (view, view, 3)
        self.period = max(worldgen.PERIOD, view)
        grid = np.arange(self.period) * (worldgen.PERIOD / self.period)
        u, v = np.meshgrid(grid, grid, indexing="ij")
        terrain = learned.features(u, v) @ self.w["terrain_w"] + self.w["terrain_b"]
        self.t = {k: torch.from_numpy(a).to(self.device) for k, a in self.w.items()}
        self.terrain = torch.from_numpy(terrain.astype(np.float32)).to(self.device).flatten(0, 1)
        self.position = [(0, 0)] * max_sessions
        rows = max_sessions + 1  # the last: padded rows write there
        self.cache = torch.zeros((rows, view * view, learned.LATENT), device=self.device)
        self.embedding = torch.zeros((rows, learned.EMBED), device=self.device)
        self.across = torch.arange(view, device=self.device)
        self.inputs = Staging(max_sessions, INTS, 1, self.device)
        self.out = SlabCopy(self.device)
        self.encodes: list[tuple[str, str]] = []
        cuda = self.device.type == "cuda"
        self.graphs = cuda if graphs is None else graphs and cuda
        self.batch_invariant = cuda if batch_invariant is None else batch_invariant
        sizes = sorted({self._size(n) for n in range(1, max_sessions + 1)})
        self.hot_graphs = GraphSet(self._hot, self._hot_statics, sizes)
        self.decode_graphs = GraphSet(self._render, self._decode_statics, sizes)
        if self.graphs:
            self.hot_graphs.capture()
            self.decode_graphs.capture()

    def describe(self) -> dict[str, Any]:
        """The configuration, labelled trained or not (for capacity figures)."""
        return {
            "view": self.view,
            "hidden": self.hidden,
            "refine": self.refine_width,
            "trained": self.trained,
        }

    def _size(self, n: int) -> int:
        if self.batch_invariant:
            return self.max_sessions
        return padded(n, self.max_sessions) if self.device.type == "cuda" else n

    # -- the network, batched ---------------------------------------------------

    def _window(self, y: torch.Tensor, x: torch.Tensor, side: int, period: int) -> torch.Tensor:
        """Flat indices of each row's ``side`` x ``side`` torus window at (y, x)."""
        ys = (y[:, None] + self.across[:side]) % period
        xs = (x[:, None] + self.across[:side]) % period
        return (ys[:, :, None] * period + xs[:, None, :]).flatten(1)  # (B, side*side)

    def _hot(self, ints: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each row's refined latent (B, V*V, C), also written as its new cache."""
        w, v, c = self.t, self.view, learned.LATENT
        rows = ints[:, 0]
        view = self.terrain[self._window(ints[:, 1], ints[:, 2], v, self.period)]
        rolled = self._window(ints[:, 3], ints[:, 4], v, v)  # np.roll by (-dy, -dx)
        cached = self.cache.index_select(0, rows)
        previous = torch.gather(cached, 1, rolled[:, :, None].expand(-1, -1, c))
        both = torch.cat([view, previous], dim=-1)
        hidden = torch.relu(both @ w["refine1_w"] + w["refine1_b"])
        latent = view + hidden @ w["refine2_w"] + w["refine2_b"]  # NumPy's order
        self.cache.index_copy_(0, rows, latent)
        return latent

    def _render(self, latent: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """The decoder: (B, V*V, C) latents and (B, E) prompt vectors to uint8 frames."""
        w, e = self.t, embedding[:, None, :]
        h = torch.relu(latent @ w["decode1_w"] + (e @ w["decode1_e"] + w["decode1_b"]))
        h = torch.relu(h @ w["decode2_w"] + (e @ w["decode2_e"] + w["decode2_b"]))
        rgb = 255.0 / (1.0 + torch.exp(-(h @ w["decode3_w"] + w["decode3_b"])))
        return rgb.round().to(torch.uint8).view(-1, self.view, self.view, 3)

    def _hot_statics(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        ints = torch.zeros((size, INTS), dtype=torch.int64, device=self.device)
        ints[:, 0] = self.max_sessions  # warm-up runs write the spare row only
        return ints, torch.zeros((size, 1), dtype=torch.bool, device=self.device)

    def _decode_statics(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        latent = torch.zeros((size, self.view * self.view, learned.LATENT), device=self.device)
        return latent, torch.zeros((size, learned.EMBED), device=self.device)

    # -- the StageModel contract ------------------------------------------------

    @torch.inference_mode()
    def seed(self, batch: Batch) -> None:
        for row, session in zip(batch.rows, batch.sessions, strict=True):
            self.position[row] = worldgen.start(session)
            y, x = (torch.tensor([p], device=self.device) for p in self.position[row])
            window = self._window(y, x, self.view, self.period)[0]
            self.cache[row] = self.terrain[window]
        self._set_prompts(batch, every=True)

    @torch.inference_mode()
    def detach(self, row: int) -> None:
        self.cache[row] = 0.0
        self.embedding[row] = 0.0

    def state_identity(self) -> ModelIdentity:
        return learned.world_identity(self.w, self.view, self.hidden, self.refine_width)

    @torch.inference_mode()
    def export_rows(self, rows: Sequence[int]) -> list[RowState]:
        side, c = self.view, learned.LATENT
        return [
            RowState(
                {
                    "cache": self.cache[r].to("cpu", copy=True).numpy().reshape(side, side, c),
                    "embedding": self.embedding[r].to("cpu", copy=True).numpy(),
                },
                {"position": list(self.position[r])},
            )
            for r in rows
        ]

    @torch.inference_mode()
    def import_rows(self, rows: Sequence[int], states: Sequence[RowState]) -> None:
        side, c = self.view, learned.LATENT
        for row, state in zip(rows, states, strict=True):
            cache = state.array("cache", (side, side, c), np.float32).reshape(side * side, c)
            embedding = state.array("embedding", (learned.EMBED,), np.float32)
            self.cache[row].copy_(torch.from_numpy(cache))
            self.embedding[row].copy_(torch.from_numpy(embedding))
            self.position[row] = learned.world_position(state)

    def _denoise(self, batch: Batch) -> None:
        with self.cost.stage():
            self._denoise_rows(batch)

    @torch.inference_mode()
    def _denoise_rows(self, batch: Batch) -> None:
        n, size = len(batch.rows), self._size(len(batch.rows))
        ints, _ = self.inputs.host(size)
        positions = []
        for i, (row, cond) in enumerate(zip(batch.rows, batch.conditioning, strict=True)):
            move = tuple(int(m) for m in cond.get("move", (0, 0)))
            dy, dx = worldgen.delta((move[0], move[1]))
            position = worldgen.step(self.position[row], (move[0], move[1]))
            scale = self.period // worldgen.PERIOD
            ints[i] = (row, position[0] * scale, position[1] * scale, dy, dx)
            positions.append(position)
        ints[n:] = 0
        ints[n:, 0] = self.max_sessions
        statics = self.hot_graphs.inputs(size) if self.graphs else None
        if statics is not None:
            self.inputs.upload(into=statics)
            latent = self.hot_graphs.replay(size)[:n].clone()
        else:
            uploaded, mask = self.inputs.upload()
            latent = self._hot(uploaded, mask)[:n]
        batch.carry["latent"] = latent
        rows = (statics[0] if statics is not None else uploaded)[:n, 0]
        batch.carry["embedding"] = self.embedding.index_select(0, rows)  # ENCODE may rewrite
        batch.carry["position"] = positions

    @torch.inference_mode()
    def _finalize(self, batch: Batch) -> None:
        for row, position in zip(batch.rows, batch.carry["position"], strict=True):
            self.position[row] = position

    def _decode(self, batch: Batch) -> None:
        with self.cost.stage():
            self._decode_rows(batch)

    @torch.inference_mode()
    def _decode_rows(self, batch: Batch) -> None:
        latent, embedding = batch.carry["latent"], batch.carry["embedding"]
        n, size = len(batch.rows), self._size(len(batch.rows))
        statics = self.decode_graphs.inputs(size) if self.graphs else None
        if statics is not None:
            statics[0][:n].copy_(latent)
            statics[1][:n].copy_(embedding)
            frames = self.decode_graphs.replay(size)[:n]
        elif size > n:  # padded as a graph's rows are: the same kernels at every size
            frames = self._render(
                F.pad(latent, (0, 0, 0, 0, 0, size - n)), F.pad(embedding, (0, 0, 0, size - n))
            )[:n]
        else:
            frames = self._render(latent, embedding)
        self.out.write(batch, frames)

    @torch.inference_mode()
    def _encode_prompt(self, batch: Batch) -> None:
        self._set_prompts(batch, every=False)
        for session, cond in zip(batch.sessions, batch.conditioning, strict=True):
            if "prompt" in cond:
                self.encodes.append((session, cond["prompt"]))

    def _set_prompts(self, batch: Batch, *, every: bool) -> None:
        """The prompt vectors of the rows that have one (``every``: all, "" for none),
        computed on the host (a few words each) and sent in one copy."""
        picked = [
            (r, c.get("prompt", ""))
            for r, c in zip(batch.rows, batch.conditioning, strict=True)
            if every or "prompt" in c
        ]
        if not picked:
            return
        vectors = np.stack([self._embed(prompt) for _, prompt in picked])
        rows = to_device(np.array([r for r, _ in picked], np.int64), self.device)
        self.embedding.index_copy_(0, rows, to_device(vectors, self.device))

    def _embed(self, prompt: str) -> np.ndarray[Any, Any]:
        ids = learned.prompt_buckets(prompt)
        mean = self.w["words"][ids].mean(axis=0) if ids else np.zeros(learned.EMBED, np.float32)
        vector: np.ndarray[Any, Any] = np.tanh(mean @ self.w["prompt_w"] + self.w["prompt_b"])
        return vector.astype(np.float32)
