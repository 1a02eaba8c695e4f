"""A small causal video world model in torch, behind ComposedEngine.

Selected as ``--model torch``. It exists so that the lanes, the pipelining and
the zero-copy slab are exercised by real tensor work:

* HOT ``denoise``: a 2-layer transformer refines noise (seeded by session and
  chunk) into the next chunk's 16 latent tokens, attending to the row's own KV
  cache of its last chunks, conditioned on the row's prompt embedding and its
  ``move`` action; HOT ``finalize``: run the finished chunk through the blocks
  once more and append its keys and values to the row's cache (a sliding
  window of ``window`` chunks).
* DEFERRED ``decode``: a transposed-convolution decoder from the 4x4 token grid
  to a 32x32 RGB frame, copied straight into the chunk's slab slot (on CUDA an
  asynchronous device-to-host copy on the DEFERRED stream, into pinned memory).
* ENCODE ``encode_prompt``: a byte-level prompt encoder for the heavy
  ``prompt`` key.

Weights are deterministic from a fixed seed: no downloads, no files. Every
tensor of state is per row (row-indexed caches, per-row attention), so a
session never sees another's data.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F
from torch import nn

from rte.models.prompt_move import PromptMoveModel
from rte.stages import Batch

GRID = 4
TOKENS = GRID * GRID
DIM = 64
HEADS = 4
HEAD_DIM = DIM // HEADS
LAYERS = 2
PROMPT_BYTES = 32


def _seed(*parts: object) -> int:
    text = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


class _Block(nn.Module):
    """Pre-norm attention over [the row's cache; this chunk], then an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(DIM, dim=-1)
        q, k, v = (z.view(b, t, HEADS, HEAD_DIM).transpose(1, 2) for z in (q, k, v))
        keys = torch.cat([past_k, k], dim=2)
        values = torch.cat([past_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.proj(out.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.norm2(x)), k, v


class _Decoder(nn.Module):
    """4x4 tokens of DIM channels to a 32x32 RGB frame in [0, 255]."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.ConvTranspose2d(DIM, 32, 4, stride=2, padding=1),
            nn.GELU(),
            nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1),
            nn.GELU(),
            nn.ConvTranspose2d(16, 3, 4, stride=2, padding=1),
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        grid = tokens.transpose(1, 2).reshape(-1, DIM, GRID, GRID)
        raw = self.net(grid)
        mean = raw.mean(dim=(1, 2, 3), keepdim=True)  # per frame: rows never mix
        std = raw.std(dim=(1, 2, 3), keepdim=True) + 1e-5
        rgb = torch.sigmoid((raw - mean) / std * 1.5) * 255.0
        return rgb.round().to(torch.uint8).permute(0, 2, 3, 1)  # (B, 32, 32, 3)


class TorchWorldModel(PromptMoveModel):
    """Args:
    max_sessions: rows in the arena (and in every per-row state tensor).
    pipelined: decode chunk N-1 while making chunk N.
    window: chunks of context each row's KV cache keeps.
    steps: denoising iterations per chunk.
    device: "cuda" when available, else "cpu", unless given.
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
    ) -> None:
        self.max_sessions = max_sessions
        self.pipelined = pipelined
        self.steps = steps
        self.frame_shape = (GRID * 8, GRID * 8, 3)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(20261129)
            self.blocks = nn.ModuleList(_Block() for _ in range(LAYERS))
            self.position = nn.Parameter(torch.randn(TOKENS, DIM) * 0.1)
            self.head = nn.Linear(DIM, DIM)
            self.action = nn.Linear(2, DIM)
            self.bytes = nn.Embedding(257, DIM)
            self.prompt_proj = nn.Linear(DIM, DIM)
            self.decoder = _Decoder()
        self.modules_ = (
            nn.ModuleDict(
                {
                    "blocks": self.blocks,
                    "head": self.head,
                    "action": self.action,
                    "bytes": self.bytes,
                    "prompt_proj": self.prompt_proj,
                    "decoder": self.decoder,
                }
            )
            .to(self.device)
            .eval()
        )
        self.position.data = self.position.data.to(self.device)
        capacity = window * TOKENS
        shape = (max_sessions, LAYERS, HEADS, capacity, HEAD_DIM)
        self.cache_k = torch.zeros(shape, device=self.device)
        self.cache_v = torch.zeros(shape, device=self.device)
        self.cache_len = [0] * max_sessions
        self.prompt = torch.zeros(max_sessions, DIM, device=self.device)
        self.encodes: list[tuple[str, str]] = []

    # -- the StageModel contract -------------------------------------------

    @torch.inference_mode()
    def seed(self, batch: Batch) -> None:
        for row, cond in zip(batch.rows, batch.conditioning, strict=True):
            self.cache_len[row] = 0
            self.prompt[row] = self._embed(cond.get("prompt", ""))

    def detach(self, row: int) -> None:
        self.cache_len[row] = 0

    # -- stages --------------------------------------------------------------

    def _context(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each row's cache and the mask that hides its unused positions."""
        index = torch.tensor(rows, device=self.device)
        capacity = self.cache_k.shape[3]
        used = torch.tensor([self.cache_len[r] for r in rows], device=self.device)
        visible = torch.arange(capacity, device=self.device)[None, :] < used[:, None]
        mask = torch.cat([visible, visible.new_ones(len(rows), TOKENS)], dim=1)
        return self.cache_k[index], self.cache_v[index], mask[:, None, None, :]

    def _run(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        kv = []
        for layer, block in enumerate(self.blocks):
            x, k, v = block(x, past_k[:, layer], past_v[:, layer], mask)
            kv.append((k, v))
        return x, kv

    @torch.inference_mode()
    def _denoise(self, batch: Batch) -> None:
        noise = torch.stack(
            [
                torch.randn(TOKENS, DIM, generator=torch.Generator().manual_seed(_seed(s, c)))
                for s, c in zip(batch.sessions, batch.chunks, strict=True)
            ]
        ).to(self.device, non_blocking=True)
        moves = torch.tensor(
            [list(c.get("move", (0, 0))) for c in batch.conditioning], dtype=torch.float32
        ).to(self.device, non_blocking=True)
        index = torch.tensor(batch.rows, device=self.device)
        condition = (self.prompt[index] + self.action(moves))[:, None, :] + self.position
        past_k, past_v, mask = self._context(batch.rows)
        x = noise
        for _ in range(self.steps):
            h, _ = self._run(x + condition, past_k, past_v, mask)
            x = x - 0.5 * torch.tanh(self.head(h))
        batch.carry["latent"] = x

    @torch.inference_mode()
    def _finalize(self, batch: Batch) -> None:
        past_k, past_v, mask = self._context(batch.rows)
        _, kv = self._run(batch.carry["latent"], past_k, past_v, mask)
        capacity = self.cache_k.shape[3]
        for i, row in enumerate(batch.rows):
            n = self.cache_len[row]
            if n + TOKENS > capacity:  # slide the window: drop the oldest chunk
                self.cache_k[row] = torch.roll(self.cache_k[row], -TOKENS, dims=2)
                self.cache_v[row] = torch.roll(self.cache_v[row], -TOKENS, dims=2)
                n -= TOKENS
            for layer, (k, v) in enumerate(kv):
                self.cache_k[row, layer, :, n : n + TOKENS] = k[i]
                self.cache_v[row, layer, :, n : n + TOKENS] = v[i]
            self.cache_len[row] = n + TOKENS

    @torch.inference_mode()
    def _decode(self, batch: Batch) -> None:
        frames = self.decoder(batch.carry["latent"])
        asynchronous = self.device.type == "cuda"
        for out, frame in zip(batch.out, frames, strict=True):
            # The one write: device to the slab slot (pinned: an async copy on
            # the DEFERRED stream; the engine publishes after its event).
            torch.from_numpy(out).copy_(frame, non_blocking=asynchronous)

    @torch.inference_mode()
    def _encode_prompt(self, batch: Batch) -> None:
        for row, session, cond in zip(batch.rows, batch.sessions, batch.conditioning, strict=True):
            if "prompt" in cond:
                self.prompt[row] = self._embed(cond["prompt"])
                self.encodes.append((session, cond["prompt"]))

    def _embed(self, prompt: str) -> torch.Tensor:
        ids = list(prompt.encode()[:PROMPT_BYTES]) or [-1]
        tokens = torch.tensor([i + 1 for i in ids], device=self.device)
        return torch.tanh(self.prompt_proj(self.bytes(tokens).mean(dim=0)))
