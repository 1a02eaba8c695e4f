"""The shape of a causal video world model in torch, with random weights: a lane exerciser.

Selected as ``--model torch``. It is untrained (its weights come from a fixed
seed; no file, no download), so its frames are noise: for a world that looks
like one, run ``world`` (:mod:`rte.models.learned`). It exists so that the
lanes, the pipelining, CUDA streams and graphs and the zero-copy slab are
exercised by real tensor work of a world model's shape:

* HOT ``denoise``: a 2-layer transformer refines noise (an entry of a fixed
  table, picked by session and chunk) into the next chunk's 16 latent tokens,
  attending to the row's own KV cache of its last chunks, conditioned on the
  row's prompt embedding and its ``move`` action; HOT ``finalize``: write the
  keys and values of the chunk's last refinement pass into the row's cache, a
  ring of ``window`` chunks, for every row of the batch in one write.
* DEFERRED ``decode``: an MLP from each token of the 4x4 grid to an 8x8 patch
  of a 32x32 RGB frame; a step's frames go into the step's slab slots in one
  device-to-host copy per client (:mod:`rte.models.slab_copy`: on CUDA
  asynchronous, on the DEFERRED stream, into pinned memory).
* ENCODE ``encode_prompt``: a byte-level prompt encoder for the heavy
  ``prompt`` key.

The network, its random weights the same in every process, is
:class:`~rte.models.world_net.WorldNet`; the model holds the rows. Every tensor of state is
per row and lives on the device (row-indexed caches and prompts, per-row
attention masks), so a session never sees another's data and a step issues the
same few dozen launches whatever its batch size: the per-row numbers go up in
one page-locked copy (:mod:`rte.models.staging`), and nothing in a step waits
for the device.

On CUDA every batch is padded to the arena's rows (``batch_invariant``): cuBLAS
picks its kernel by the matrix sizes, so a row computed in a batch of 1 and of
8 would differ by an ulp, and the decoder's rounding to uint8 turns an ulp into
a level. Padded, every step runs the same kernels on the same shapes, and a
session's frames are the same solo and batched, to the bit; one graph per lane
is captured, at load. ``batch_invariant=False`` pads to powers of two instead
(cheaper for small batches in a large arena, frames within a level).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rte.models.graphs import GraphSet, padded
from rte.models.prompt_move import PromptMoveModel
from rte.models.slab_copy import SlabCopy
from rte.models.staging import Staging, to_device
from rte.models.world_net import (
    DIM,
    GRID,
    HEAD_DIM,
    HEADS,
    LAYERS,
    NOISE_STRIDE,
    NOISE_TABLE,
    PATCH,
    PROMPT_BYTES,
    TOKENS,
    WorldNet,
)
from rte.stages import Batch
from rte.state import ModelIdentity, RowState, digest_of


def _seed(*parts: object) -> int:
    text = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


class TorchWorldModel(PromptMoveModel):
    """A world model's lanes on real tensors, its weights random (untrained: frames
    of noise); see the module's docstring.

    Args:
    max_sessions: rows in the arena (and in every per-row state tensor).
    pipelined: decode chunk N-1 while making chunk N.
    window: chunks of context each row's KV cache keeps.
    steps: denoising iterations per chunk.
    device: "cuda", "cuda:N" or "cpu"; CUDA when available, unless given.
    graphs: on CUDA, run each step as CUDA graphs (HOT and DEFERRED, one per
        padded batch size, captured when the model loads); default: on CUDA, yes.
    batch_invariant: pad every batch to the arena's rows, so a row's arithmetic
        is the same at every batch size; default: on CUDA, yes (the CPU's is
        already, unpadded).
    """

    name = "torch"

    def __init__(
        self,
        max_sessions: int = 8,
        *,
        pipelined: bool = True,
        window: int = 4,
        steps: int = 2,
        device: str | None = None,
        graphs: bool | None = None,
        batch_invariant: bool | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.pipelined = pipelined
        self.steps = steps
        self.window = window
        self.frame_shape = (GRID * PATCH, GRID * PATCH, 3)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.net = WorldNet(self.device)  # the weights, and the noise HOT starts from
        self.noise = self.net.noise  # (a lane-alone timing decodes its entries)
        # Per-row state lives on the device, one tensor each, row-indexed; the
        # host keeps only the bookkeeping that says where to write next.
        # (one more row than the arena: padded graph rows write there)
        self.cache = torch.zeros(
            (max_sessions + 1, LAYERS, 2, HEADS, window, TOKENS, HEAD_DIM), device=self.device
        )
        self.prompt = torch.zeros(max_sessions + 1, DIM, device=self.device)
        self.filled = [0] * max_sessions  # chunks in each row's cache, up to ``window``
        self.next_slot = [0] * max_sessions  # where each row's next chunk goes (a ring)
        self.noise_base = [0] * max_sessions
        visible = np.arange(window * TOKENS + TOKENS) // TOKENS  # token -> cache slot
        self._masks = np.stack([(visible < f) | (visible == window) for f in range(window + 1)])
        self.inputs = Staging(max_sessions, 5, window * TOKENS + TOKENS, self.device)
        self.encodes: list[tuple[str, str]] = []
        self._identity: ModelIdentity | None = None
        self.out = SlabCopy(self.device)
        cuda = self.device.type == "cuda"
        self.graphs = cuda if graphs is None else graphs and cuda
        self.batch_invariant = cuda if batch_invariant is None else batch_invariant
        sizes = sorted({self._size(n) for n in range(1, max_sessions + 1)})
        self.hot_graphs = GraphSet(self._hot_step, self._hot_statics, sizes)
        self.decode_graphs = GraphSet(self.net.decoder, self._decode_statics, sizes)
        if self.graphs:  # at load: a capture synchronizes the device
            self.hot_graphs.capture()
            self.decode_graphs.capture()

    def _size(self, n: int) -> int:
        """The rows a batch of ``n`` runs as: the arena's when batch-invariant, else
        the graph size on CUDA, else ``n`` (the CPU runs what it has)."""
        if self.batch_invariant:
            return self.max_sessions
        return padded(n, self.max_sessions) if self.device.type == "cuda" else n

    # -- the StageModel contract -------------------------------------------

    @torch.inference_mode()
    def seed(self, batch: Batch) -> None:
        for row, session in zip(batch.rows, batch.sessions, strict=True):
            self.filled[row] = self.next_slot[row] = 0
            self.noise_base[row] = _seed(session) % NOISE_TABLE
        self._set_prompts(batch)

    def detach(self, row: int) -> None:
        self.filled[row] = self.next_slot[row] = 0

    def state_identity(self) -> ModelIdentity:
        if self._identity is None:  # the weights, hashed once (on the host)
            config = (self.window, self.steps, TOKENS, DIM, LAYERS)
            self._identity = ModelIdentity(self.name, digest_of(*config, *self.net.hashed()))
        return self._identity

    @torch.inference_mode()
    def export_rows(self, rows: Sequence[int]) -> list[RowState]:
        return [
            RowState(
                {
                    "cache": self.cache[r].to("cpu", copy=True).numpy(),
                    "prompt": self.prompt[r].to("cpu", copy=True).numpy(),
                },
                {
                    "filled": self.filled[r],
                    "next_slot": self.next_slot[r],
                    "noise": self.noise_base[r],
                },
            )
            for r in rows
        ]

    @torch.inference_mode()
    def import_rows(self, rows: Sequence[int], states: Sequence[RowState]) -> None:
        for row, state in zip(rows, states, strict=True):
            cache = state.array("cache", self.cache.shape[1:], np.float32)
            prompt = state.array("prompt", (DIM,), np.float32)
            self.cache[row].copy_(torch.from_numpy(cache))
            self.prompt[row].copy_(torch.from_numpy(prompt))
            self.filled[row] = state.number("filled")
            self.next_slot[row] = state.number("next_slot")
            self.noise_base[row] = state.number("noise")

    # -- stages --------------------------------------------------------------

    def _upload(
        self, batch: Batch, size: int, into: tuple[torch.Tensor, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's per-row inputs, on the device, in two copies whatever its size:
        (rows, 5) ints (row, noise entry, dy, dx, cache slot to write) and the mask,
        for ``size`` rows (rows past the batch go to the spare row)."""
        n = len(batch.rows)
        ints, mask = self.inputs.host(size)
        ints[:n, 0] = batch.rows
        ints[:n, 1] = [
            (self.noise_base[r] + NOISE_STRIDE * c) % NOISE_TABLE
            for r, c in zip(batch.rows, batch.chunks, strict=True)
        ]
        ints[:n, 2:4] = [c.get("move", (0, 0)) for c in batch.conditioning]
        ints[:n, 4] = [self.next_slot[r] for r in batch.rows]
        mask[:n] = self._masks[[self.filled[r] for r in batch.rows]]
        ints[n:], ints[n:, 0], mask[n:] = 0, self.max_sessions, True
        return self.inputs.upload(into)

    def _hot(self, ints: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The next latent of each row, and the keys and values its cache takes."""
        rows = ints[:, 0]
        prompts = self.prompt.index_select(0, rows)
        past = self.cache.index_select(0, rows).flatten(4, 5)  # (B, L, 2, H, W*T, D)
        return self.net.denoise(ints, mask, prompts, past, self.steps)

    def _write_cache(self, ints: torch.Tensor, kv: torch.Tensor) -> None:
        self.cache[ints[:, 0], :, :, :, ints[:, 4]] = kv  # one write, every row's slot

    def _hot_step(self, ints: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """HOT whole, as one graph captures it."""
        x, kv = self._hot(ints, mask)
        self._write_cache(ints, kv)
        return x

    def _hot_statics(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        ints = torch.zeros((size, 5), dtype=torch.int64, device=self.device)
        ints[:, 0] = self.max_sessions  # warm-up runs write the spare row only
        mask = torch.ones(
            (size, self.window * TOKENS + TOKENS), dtype=torch.bool, device=self.device
        )
        return ints, mask

    def _decode_statics(self, size: int) -> tuple[torch.Tensor]:
        return (torch.zeros((size, TOKENS, DIM), device=self.device),)

    @torch.inference_mode()
    def _denoise(self, batch: Batch) -> None:
        n = len(batch.rows)
        size = self._size(n)
        statics = self.hot_graphs.inputs(size) if self.graphs else None
        if statics is not None:  # one graph: HOT and the cache write
            self._upload(batch, size, into=statics)
            batch.carry["latent"] = self.hot_graphs.replay(size)[:n].clone()
            return
        ints, mask = self._upload(batch, size)  # padded rows write the spare row only
        latent, batch.carry["kv"] = self._hot(ints, mask)
        batch.carry["latent"] = latent[:n]
        batch.carry["ints"] = ints

    @torch.inference_mode()
    def _finalize(self, batch: Batch) -> None:
        carry = batch.carry  # what HOT alone uses leaves it: DEFERRED gets the latent
        if "kv" in carry:  # (a graph wrote the cache already)
            self._write_cache(carry.pop("ints"), carry.pop("kv"))
        for row in batch.rows:  # the bookkeeping of the ring, on the host
            self.filled[row] = min(self.filled[row] + 1, self.window)
            self.next_slot[row] = (self.next_slot[row] + 1) % self.window

    @torch.inference_mode()
    def _decode(self, batch: Batch) -> None:
        latent = batch.carry["latent"]
        n = len(batch.rows)
        size = self._size(n)
        statics = self.decode_graphs.inputs(size) if self.graphs else None
        if statics is not None:
            statics[0][:n].copy_(latent)
            frames = self.decode_graphs.replay(size)[:n]
        elif size > n:  # the rows past the batch decode zeros, as a graph's would
            frames = self.net.decoder(F.pad(latent, (0, 0, 0, 0, 0, size - n)))[:n]
        else:
            frames = self.net.decoder(latent)
        self.out.write(batch, frames)

    @torch.inference_mode()
    def _encode_prompt(self, batch: Batch) -> None:
        self._set_prompts(batch)
        for session, cond in zip(batch.sessions, batch.conditioning, strict=True):
            if "prompt" in cond:
                self.encodes.append((session, cond["prompt"]))

    def _set_prompts(self, batch: Batch) -> None:
        """Embed the prompts of the rows that have one (all of them at seed: "" for
        none) into their rows: their bytes in one copy, their embeddings in one write."""
        picked = [
            (r, c.get("prompt", "")) for r, c in zip(batch.rows, batch.conditioning, strict=True)
        ]
        ids = np.zeros((len(picked), 1 + PROMPT_BYTES), np.int64)
        for i, (row, prompt) in enumerate(picked):
            raw = np.frombuffer(prompt.encode()[:PROMPT_BYTES], np.uint8)
            ids[i, 0] = row
            ids[i, 1 : 1 + len(raw)] = raw.astype(np.int64) + 1
        tokens = to_device(ids, self.device)
        self.prompt.index_copy_(0, tokens[:, 0], self.net.embed_prompts(tokens[:, 1:]))
