"""The ``world`` model learned its world: measured against the generator's ground
truth, and against the same network untrained."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from daemon_harness import DaemonProcess, Deadline

from rte import ComposedEngine
from rte.cli.sheet import GUTTER, LABEL, TEXT_SCALE, contact_sheet
from rte.contract import Action
from rte.models import load_model, worldgen
from rte.models.learned import SHAPES, WEIGHTS, WEIGHTS_SHA256, LearnedWorldModel, load_weights

STEPS = 24
TRAINED_BOUND = 6.0  # mean absolute error, of 255, along a walk


def walk(
    weights: str, moves: dict[str, tuple[int, int]], prompts: dict[str, str], steps: int = STEPS
) -> dict[str, list[np.ndarray]]:
    """Each session's frames over ``steps`` steps, moving as ``moves`` says from the first."""
    engine = ComposedEngine(LearnedWorldModel(len(prompts), weights=weights))
    for session, prompt in prompts.items():
        engine.attach(session, {"prompt": prompt})
    actions = {s: Action({"move": m}) for s, m in moves.items()}
    frames: dict[str, list[np.ndarray]] = {s: [] for s in prompts}
    for i in range(steps + 2):
        for result in engine.step(list(prompts), actions if i == 0 else None):
            if result.latent is not None:
                frames[result.session].append(result.latent.copy())
    engine.close()
    return {s: f[:steps] for s, f in frames.items()}


def truth(session: str, prompt: str, move: tuple[int, int], steps: int = STEPS) -> list[np.ndarray]:
    position, out = worldgen.start(session), []
    for _ in range(steps):
        position = worldgen.step(position, move)
        out.append(worldgen.view(prompt, position))
    return out


def error(frames: list[np.ndarray], expected: list[np.ndarray]) -> float:
    pairs = zip(frames, expected, strict=True)
    return float(np.mean([np.abs(f.astype(float) - e).mean() for f, e in pairs]))


def test_pressing_right_moves_the_scene_as_the_world_does() -> None:
    prompt = "a forest"
    expected = truth("walker", prompt, (0, 1))
    trained = error(walk("trained", {"walker": (0, 1)}, {"walker": prompt})["walker"], expected)
    untrained = error(walk("random", {"walker": (0, 1)}, {"walker": prompt})["walker"], expected)
    assert trained < TRAINED_BOUND, trained
    assert untrained > 5 * TRAINED_BOUND, untrained
    # the scene slides left under a camera panning right: frame t+4 is frame t, 4 pixels on
    frames = walk("trained", {"walker": (0, 1)}, {"walker": prompt})["walker"]
    shifted = np.abs(frames[12][:, :-4].astype(float) - frames[8][:, 4:]).mean()
    still = np.abs(frames[8].astype(float) - frames[12]).mean()
    assert shifted < TRAINED_BOUND < still


def test_every_direction_and_every_look_is_learned() -> None:
    prompts = {"n": "snow at night", "s": "a misty desert", "e": "ocean", "w": "lava volcano"}
    moves = {"n": (-1, 0), "s": (2, 0), "e": (0, 3), "w": (-1, -2)}
    frames = walk("trained", moves, prompts)
    for session, prompt in prompts.items():
        assert error(frames[session], truth(session, prompt, moves[session])) < TRAINED_BOUND


def test_two_prompts_give_visibly_different_worlds() -> None:
    frames = walk("trained", {}, {"a": "a desert", "b": "an ocean at night"})
    a, b = frames["a"][-1].astype(float), frames["b"][-1].astype(float)
    assert np.abs(a.mean(axis=(0, 1)) - b.mean(axis=(0, 1))).max() > 60  # another palette


def test_one_sessions_moves_never_change_anothers_frames() -> None:
    alone = walk("trained", {}, {"still": "meadow"})["still"]
    beside = walk("trained", {"mover": (1, -1)}, {"still": "meadow", "mover": "meadow"})
    assert all(np.array_equal(x, y) for x, y in zip(alone, beside["still"], strict=True))
    assert not np.array_equal(beside["mover"][-1], beside["mover"][0])


def test_a_daemon_serves_the_same_frames_as_in_process(shm_prefix: str) -> None:
    local = walk("trained", {"a": (0, 1)}, {"a": "sand dunes", "b": "woods"}, steps=8)
    daemon = DaemonProcess(f"{shm_prefix}w", "--model", "world", "--max-sessions", "2")
    try:
        with daemon.client() as client:
            client.attach("a", {"prompt": "sand dunes", "move": (0, 1)})  # from its first step
            client.attach("b", {"prompt": "woods"})
            got: dict[str, list[np.ndarray]] = {"a": [], "b": []}
            limit = Deadline(what="8 chunks of each session")
            while min(map(len, got.values())) < 8:
                limit.check()
                chunk = client.poll(timeout=1.0)
                if chunk is not None:
                    with chunk:  # copied before the slot goes back
                        got[chunk.session].append(chunk.latent.copy())
            got = {s: frames[:8] for s, frames in got.items()}
    finally:
        assert daemon.stop() == 0, daemon.stderr
    for session in ("a", "b"):
        pairs = zip(got[session], local[session], strict=True)
        assert all(np.array_equal(x, y) for x, y in pairs), session


@pytest.fixture
def corrupt(tmp_path: Path) -> Iterator[Path]:
    copy = tmp_path / "weights.npz"
    shutil.copy(WEIGHTS, copy)
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    yield copy


def test_the_shipped_weights_are_checked(corrupt: Path) -> None:
    assert WEIGHTS.stat().st_size < 1_000_000
    load_weights()  # the shipped file passes
    with pytest.raises(ValueError, match="checksum"):
        load_weights(corrupt, sha256=WEIGHTS_SHA256)
    assert load_model("world", max_sessions=1).name == "world"


def test_a_checksum_refusal_says_how_to_restore_and_how_to_load_other_weights(
    corrupt: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="checksum") as refused:
        load_weights(corrupt, sha256=WEIGHTS_SHA256)
    message = str(refused.value)
    assert f"git checkout -- {corrupt}" in message and "reinstall rte" in message
    assert "--model-setting weights=PATH" in message
    assert "retrain with" not in message  # retraining never gives back the shipped file
    # and what it says works: other weights, as a retraining writes them, load by path
    retrained = tmp_path / "retrained.npz"
    np.savez(retrained, **{k: v + 1 for k, v in load_weights().items()})
    assert LearnedWorldModel(1, weights=str(retrained)).w.keys() == SHAPES.keys()


def test_the_demo_sheet_labels_each_walk_and_shows_it_moving() -> None:
    frames = walk("trained", {"a": (0, 1)}, {"a": "a forest"}, steps=32)["a"][::4]
    sheet = contact_sheet([frames, frames], ["session-0: a forest, walking right", "x"])
    assert sheet is not None
    band = sheet[: LABEL - 2, : 4 * 4 * TEXT_SCALE * 10]
    assert (band == 235).all(axis=-1).sum() > 100  # the label is written
    y, tile = LABEL, 32 * 4 + GUTTER
    first = sheet[y : y + 128, GUTTER : GUTTER + 128].astype(float)
    second = sheet[y : y + 128, GUTTER + tile : GUTTER + tile + 128].astype(float)
    # the next frame is the same scene 4 px (16 on the sheet) further right
    assert np.abs(first[:, 16:] - second[:, :-16]).mean() < TRAINED_BOUND
    assert np.abs(first - second).mean() > TRAINED_BOUND
