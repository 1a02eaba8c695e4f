"""The network of the ``torch`` world model (:mod:`rte.models.world`): its weights
as one ``nn.Module``, random from a fixed seed, and the arithmetic of its lanes.

:class:`WorldNet` holds every weight and the table of noise chunks HOT starts
from; it holds no session's state. The model keeps the per-row state (caches,
prompts, ring positions) and hands the net the rows' slices:
:meth:`WorldNet.denoise` refines a batch's noise into its next latents (HOT),
:attr:`WorldNet.decoder` turns latents into frames (DEFERRED), and
:meth:`WorldNet.embed_prompts` turns prompt bytes into prompt vectors (ENCODE).

The weights are drawn in one order under one seed, so they are the same in
every process; :meth:`WorldNet.hashed` lists them (and the noise) in the order
the model's state identity hashes them. Every operation treats rows apart (no
reduction across the batch, no algorithm picked by batch size), so a row's
arithmetic is the same solo and batched.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

GRID = 4
TOKENS = GRID * GRID
DIM = 64
HEADS = 4
HEAD_DIM = DIM // HEADS
LAYERS = 2
PROMPT_BYTES = 32
PATCH = 8  # each token decodes to an 8x8 patch: frames are 32x32
NOISE_TABLE = 2048  # Gaussian noise chunks; a row's chunk c takes entry base + c * stride
NOISE_STRIDE = 7919
WEIGHTS_SEED = 20261129


class _Block(nn.Module):
    """Pre-norm attention over [the row's cache; this chunk], then an MLP. The
    residual adds are fused into the output projections (``addmm``)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM, bias=False)
        self.norm2 = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(
        self, x: torch.Tensor, past: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: (B, T, DIM); ``past``: (B, 2, heads, cached tokens, head dim), keys
        then values. Returns the new x and this chunk's keys and values, like ``past``."""
        b, t, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, HEAD_DIM)
        q = qkv[:, :, 0].transpose(1, 2)
        new = qkv[:, :, 1:].permute(0, 2, 3, 1, 4)  # (B, 2, heads, T, head dim): a view
        kv = torch.cat([past, new], dim=3)  # keys and values in one copy
        out = F.scaled_dot_product_attention(q, kv[:, 0], kv[:, 1], attn_mask=mask)
        flat = torch.addmm(
            x.view(b * t, DIM), out.transpose(1, 2).reshape(b * t, DIM), self.proj.weight.t()
        )
        hidden = F.gelu(self.up(self.norm2(flat)))
        return torch.addmm(flat, hidden, self.down.weight.t()).view(b, t, DIM), new


class _Decoder(nn.Module):
    """Each token of the 4x4 grid to an 8x8 RGB patch of the 32x32 frame: an MLP,
    normalised per frame (rows never mix) and contrast-stretched into [0, 255].

    Matrix products only, no convolution: oneDNN picks its convolution algorithm
    by batch size, and a frame must decode the same solo and batched."""

    contrast: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM)
        self.out = nn.Linear(2 * DIM, PATCH * PATCH * 3)
        self.register_buffer("contrast", torch.full((TOKENS, PATCH * PATCH * 3), 1.5))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        raw = self.out(F.gelu(self.up(tokens)))  # (B, T, patch pixels)
        normal = F.layer_norm(raw, raw.shape[1:], self.contrast, eps=1e-5)
        rgb = (torch.sigmoid(normal) * 255.0).to(torch.uint8)
        patches = rgb.view(b, GRID, GRID, PATCH, PATCH, 3).permute(0, 1, 3, 2, 4, 5)
        return patches.reshape(b, GRID * PATCH, GRID * PATCH, 3)  # (B, 32, 32, 3)


class WorldNet(nn.Module):
    """The world model's weights and noise table on ``device``, in eval mode.

    Args:
        device: where the weights live.
    """

    noise: torch.Tensor
    offset: torch.Tensor

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the draw order is the weights' identity
            torch.manual_seed(WEIGHTS_SEED)
            self.blocks = nn.ModuleList(_Block() for _ in range(LAYERS))
            self.position = nn.Parameter(torch.randn(TOKENS, DIM) * 0.1)
            self.head = nn.Linear(DIM, DIM)
            self.action = nn.Linear(2, DIM)
            self.bytes = nn.Embedding(257, DIM)
            self.prompt_proj = nn.Linear(DIM, DIM)
            self.decoder = _Decoder()
            noise = torch.randn(NOISE_TABLE, TOKENS, DIM)
        self.register_buffer("noise", noise, persistent=False)
        self.to(device).eval()
        # every row's position and action bias, added once
        self.register_buffer("offset", (self.position + self.action.bias).detach(), False)

    def hashed(self) -> list[np.ndarray]:
        """The weights, then the position table and the noise, on the host, in the order
        the model's state identity hashes them."""
        parts = (self.blocks, self.head, self.action, self.bytes, self.prompt_proj, self.decoder)
        tensors = [t for part in parts for t in part.state_dict().values()]
        return [t.detach().cpu().numpy() for t in (*tensors, self.position, self.noise)]

    def denoise(
        self,
        ints: torch.Tensor,
        mask: torch.Tensor,
        prompts: torch.Tensor,
        past: torch.Tensor,
        steps: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next latent of each row, and the keys and values its cache takes.

        Args:
            ints: (B, 5): row, noise entry, dy, dx, cache slot (the model's inputs).
            mask: (B, cached tokens + TOKENS): what each row's tokens may attend to.
            prompts: (B, DIM): each row's prompt vector.
            past: (B, LAYERS, 2, heads, cached tokens, head dim): each row's cache.
            steps: refinement passes.
        """
        moves = ints[:, 2:4].to(torch.float32)
        condition = torch.addmm(prompts, moves, self.action.weight.t())[:, None] + self.offset
        mask = mask[:, None, None, :]
        x = self.noise.index_select(0, ints[:, 1])
        new: list[torch.Tensor] = []
        for _ in range(steps):
            h = x + condition
            new = []
            for layer, block in enumerate(self.blocks):
                h, kv = block(h, past[:, layer], mask)
                new.append(kv)
            x = x.sub(torch.tanh(self.head(h)), alpha=0.5)
        return x, torch.stack(new, dim=1)  # the last pass's keys and values

    def embed_prompts(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, PROMPT_BYTES) byte ids (byte + 1; 0: none) to (B, DIM) prompt vectors."""
        used = tokens > 0
        lengths = used.sum(dim=1, keepdim=True).clamp(min=1)
        embedded = (self.bytes(tokens) * used[..., None]).sum(dim=1) / lengths
        # a product and a sum per row, not a matmul: BLAS takes another path for one
        # row than for several, and a prompt must embed the same solo and batched
        weight, bias = self.prompt_proj.weight, self.prompt_proj.bias
        return torch.tanh((embedded[:, None, :] * weight).sum(dim=-1) + bias)
