"""Train the ``world`` model (rte.models.learned) on the procedural world; write its weights.

    python -m tools.train_world [--steps 3000] [--out world_weights.npz]
    python -m tools.train_world --replace-shipped   # the shipped file and its pin

It writes ``--out`` (default ``world_weights.npz`` in the current directory) and
never the shipped ``rte/models/world_weights.npz``, unless ``--replace-shipped``
says so: then it writes that file and the sha256 :mod:`rte.models.learned` pins
(:data:`~rte.models.learned.WEIGHTS_SHA256`), the two together, so the package
never holds weights its own check refuses. Load other weights by path:
``LearnedWorldModel(weights=PATH)``, or ``rte serve --model world
--model-setting weights=PATH``.

Bit-reproducible: seeded, float32, deterministic algorithms, one thread, and
the CPU kernels pinned to code paths that x86-64 CPUs compute alike: oneMKL's
``COMPATIBLE`` branch (``MKL_CBWR``: its default picks AVX2 or AVX-512 code by
CPU, Intel or AMD, with other roundings) and ATen's ``default`` capability
(``ATEN_CPU_CAPABILITY``: AVX2 and AVX-512 agree, the baseline kernels do
not). Both are read once, when torch loads, so the command runs itself again
with them set when they are not. What the bytes still depend on: torch's
version (the ``torch`` extra pins it), NumPy's random generator and arithmetic
(the shipped file: numpy 2.4.6), and one CPU we met: an Intel Xeon with AMX and
AVX512-FP16 makes other bytes even so (oneMKL's branch, oneDNN's ISA, glibc's
and NumPy's dispatch each pinned lower changed nothing; the cause is not
found). 10 to 20 minutes on one core.

Each step draws a batch of views of :mod:`rte.models.worldgen`
(a random look from a random prompt, a random camera, a random move since the
previous chunk) and fits the network of :mod:`rte.models.learned`, written
here again in torch with the same names and shapes:

* the terrain (Fourier features of world coordinates to a latent per pixel)
  and the prompt encoder (hashed words to the look's vector) are learned
  through the decoder: only pixels are supervised;
* the denoiser learns to remove noise (random strength, none for a quarter
  of the batch) from the view's latent, given the previous chunk's latent
  shifted by the move, as the model's cache holds it;
* the decoder learns each look's palette and light.

Prints the file's sha256, whether it is the shipped one, and the mean pixel
error on fresh views.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rte.models import learned, worldgen

SEED = 20261130
# The kernels every x86-64 CPU computes alike, and one thread (read when torch loads).
PINNED = {
    "MKL_CBWR": "COMPATIBLE",
    "ATEN_CPU_CAPABILITY": "default",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
SHIPPED_PIN = re.compile(r'^WEIGHTS_SHA256 = "[0-9a-f]{64}"$', re.MULTILINE)
Array = np.ndarray[Any, Any]
TEMPLATES = (
    "{b}",
    "a {b}",
    "an {b}",
    "the {b}",
    "{w} {b}",
    "a {w} {b}",
    "{b} {w}",
    "{b} at {w}",
    "a {b} at {w}",
    "the {b} in the {w}",
    "{b} world",
    "{w}",
    "",
)


def _prompts(rng: np.random.Generator, n: int) -> tuple[list[str], list[tuple[str, str]]]:
    """``n`` prompts (some with a weather word, some with neither word) and their looks."""
    by_kind: dict[str, list[str]] = {}
    for word, kind in worldgen.SYNONYMS.items():
        by_kind.setdefault(kind, []).append(word)
    prompts = []
    for _ in range(n):
        template = TEMPLATES[rng.integers(len(TEMPLATES))]
        biome = rng.choice(sorted(worldgen.BIOMES))
        weather = rng.choice(worldgen.WEATHERS)
        prompts.append(
            template.format(b=rng.choice(by_kind[biome]), w=rng.choice(by_kind[weather]))
        )
    return prompts, [worldgen.look(p) for p in prompts]


class Network(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        init = learned.random_weights(SEED)
        params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in init.items()}
        self.p = torch.nn.ParameterDict(params)
        u, v = np.meshgrid(np.arange(worldgen.PERIOD), np.arange(worldgen.PERIOD), indexing="ij")
        self.phi = torch.tensor(learned.features(u, v))  # (P, P, features)

    def embed(self, buckets: list[list[int]]) -> torch.Tensor:
        rows = []
        for ids in buckets:
            rows.append(self.p["words"][ids].mean(0) if ids else torch.zeros(learned.EMBED))
        return torch.tanh(torch.stack(rows) @ self.p["prompt_w"] + self.p["prompt_b"])

    def forward(
        self, buckets: list[list[int]], positions: Array, moves: Array, noise: torch.Tensor
    ) -> torch.Tensor:
        p = self.p
        terrain = self.phi @ p["terrain_w"] + p["terrain_b"]  # (P, P, C)
        rows = (positions[:, 0:1] + np.arange(worldgen.VIEW)) % worldgen.PERIOD
        cols = (positions[:, 1:2] + np.arange(worldgen.VIEW)) % worldgen.PERIOD
        view = terrain[rows[:, :, None], cols[:, None, :]]  # (B, V, V, C)
        back = positions - moves
        rows = (back[:, 0:1] + np.arange(worldgen.VIEW)) % worldgen.PERIOD
        cols = (back[:, 1:2] + np.arange(worldgen.VIEW)) % worldgen.PERIOD
        before = terrain[rows[:, :, None], cols[:, None, :]]
        pairs = zip(before, moves, strict=True)
        previous = torch.stack([torch.roll(b, (-int(m[0]), -int(m[1])), (0, 1)) for b, m in pairs])
        noisy = view + noise
        hidden = F.relu(torch.cat([noisy, previous], -1) @ p["refine1_w"] + p["refine1_b"])
        latent = noisy + hidden @ p["refine2_w"] + p["refine2_b"]
        e = self.embed(buckets)[:, None, None, :]
        h = F.relu(latent @ p["decode1_w"] + e @ p["decode1_e"] + p["decode1_b"])
        h = F.relu(h @ p["decode2_w"] + e @ p["decode2_e"] + p["decode2_b"])
        return torch.sigmoid(h @ p["decode3_w"] + p["decode3_b"])  # (B, V, V, 3) in [0, 1]


def _batch(rng: np.random.Generator, n: int) -> tuple[list[str], Array, Array, Array]:
    prompts, looks = _prompts(rng, n)
    positions = rng.integers(0, worldgen.PERIOD, (n, 2))
    moves = rng.integers(-2, 3, (n, 2))
    images = {look: worldgen.world(*look) for look in set(looks)}
    at = zip(looks, positions, strict=True)
    targets = np.stack([worldgen.crop(images[look], (int(y), int(x))) for look, (y, x) in at])
    return prompts, positions, moves, (targets / 255.0).astype(np.float32)


def train(steps: int, batch: int = 32, log_every: int = 250) -> tuple[dict[str, Array], float]:
    """The trained weights and the seconds it took (deterministic algorithms only,
    for this call). The same steps give the same bytes on every x86-64 CPU in a
    process whose kernels are pinned (:data:`PINNED`, as the command runs)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # (index_put's accumulation, above all)
    try:
        return _train(steps, batch, log_every)
    finally:
        torch.use_deterministic_algorithms(before)


def _train(steps: int, batch: int, log_every: int) -> tuple[dict[str, Array], float]:
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    net = Network()
    optimiser = torch.optim.Adam(net.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=6e-3, total_steps=steps)
    began = time.monotonic()
    for step in range(steps):
        prompts, positions, moves, targets = _batch(rng, batch)
        strength = torch.tensor(rng.uniform(0, 0.6, batch) * (rng.uniform(0, 1, batch) > 0.25))
        noise = (
            torch.randn(batch, worldgen.VIEW, worldgen.VIEW, learned.LATENT)
            * strength.float()[:, None, None, None]
        )
        out = net([learned.prompt_buckets(p) for p in prompts], positions, moves, noise)
        loss = F.mse_loss(out, torch.tensor(targets))
        optimiser.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimiser.step()
        schedule.step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            error = float(np.sqrt(loss.item()) * 255)
            print(f"step {step:5d}  rms error {error:6.2f}/255  ({time.monotonic() - began:.0f} s)")
    weights = {k: v.detach().numpy().astype(np.float32) for k, v in net.p.items()}
    return weights, time.monotonic() - began


def evaluate(weights: dict[str, np.ndarray], n: int = 64) -> float:
    """The mean absolute pixel error (of 255) of the NumPy model on fresh clean views."""
    model = learned.LearnedWorldModel(1, weights="random")
    model.w = weights
    u, v = np.meshgrid(np.arange(worldgen.PERIOD), np.arange(worldgen.PERIOD), indexing="ij")
    model.terrain = learned.features(u, v) @ weights["terrain_w"] + weights["terrain_b"]
    rng = np.random.default_rng(SEED + 1)
    prompts, looks = _prompts(rng, n)
    errors = []
    for prompt, look in zip(prompts, looks, strict=True):
        position = (int(rng.integers(worldgen.PERIOD)), int(rng.integers(worldgen.PERIOD)))
        latent = worldgen.crop(model.terrain, position)
        frame = model.render(model.refine(latent, latent), model.embed(prompt))
        truth = worldgen.crop(worldgen.world(*look), position)
        errors.append(np.abs(frame.astype(np.float64) - truth).mean())
    return float(np.mean(errors))


def save(weights: dict[str, np.ndarray], path: Path) -> str:
    """Write the weights (bytes that depend on them alone, the file replaced whole);
    their sha256."""
    buffer = io.BytesIO()
    savez: Any = np.savez  # (its stubs take the keywords for its own flags)
    savez(buffer, **{k: weights[k] for k in sorted(weights)})
    data = buffer.getvalue()
    _replace(path, data)
    return hashlib.sha256(data).hexdigest()


def _replace(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.replace(path)


def pin(digest: str, source: Path) -> None:
    """Set the sha256 that ``source`` (rte/models/learned.py) pins to ``digest``."""
    text = source.read_text()
    _replace(source, SHIPPED_PIN.sub(f'WEIGHTS_SHA256 = "{digest}"', text).encode())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.train_world", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=3000, help="(default 3000)")
    parser.add_argument("--batch", type=int, default=48, help="(default 48)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        type=Path,
        default=Path("world_weights.npz"),
        help="the weights file to write (default world_weights.npz, here)",
    )
    where.add_argument(
        "--replace-shipped",
        action="store_true",
        help=f"write the shipped {learned.WEIGHTS.name} and the sha256 rte/models/learned.py "
        "pins, together (for a maintainer; commit both)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    source = Path(learned.__file__)
    if args.replace_shipped:
        if len(SHIPPED_PIN.findall(source.read_text())) != 1:
            parser.error(f"{source}: no single WEIGHTS_SHA256 line to update")
        args.out = learned.WEIGHTS
    elif args.out.resolve() == learned.WEIGHTS.resolve():
        parser.error(
            f"--out {args.out} is the shipped file, checked against the sha256 "
            "rte/models/learned.py pins: --replace-shipped replaces both"
        )
    torch.set_num_threads(1)
    pinned = " ".join(f"{k}={v}" for k, v in PINNED.items())
    print(f"kernels: {pinned}, capability {torch.backends.cpu.get_cpu_capability()}")
    weights, seconds = train(args.steps, args.batch)
    print(f"trained in {seconds:.0f} s; mean error {evaluate(weights):.2f}/255 on fresh views")
    shipped = learned.WEIGHTS_SHA256
    digest = save(weights, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes), sha256 {digest}")
    if args.replace_shipped:
        pin(digest, source)
        same = " (unchanged)" if digest == shipped else f", was {shipped[:16]}..."
        print(f"pinned it in {source}{same}: commit both files")
    elif digest == shipped:
        print("the shipped weights, bit for bit")
    else:
        print(
            f"not the shipped weights (sha256 {shipped[:16]}...); load these by path: "
            f"LearnedWorldModel(weights={str(args.out)!r}), or rte serve --model world "
            f"--model-setting weights={args.out.resolve()}"
        )


def _run_pinned() -> None:
    """Run this command again with :data:`PINNED` set, unless it is set already."""
    if any(os.environ.get(k) != v for k, v in PINNED.items()):
        command = [sys.executable, "-m", "tools.train_world", *sys.argv[1:]]
        os.execve(sys.executable, command, {**os.environ, **PINNED})


if __name__ == "__main__":
    _run_pinned()
    main()
