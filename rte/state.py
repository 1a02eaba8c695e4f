"""A session's state, out of its engine: what suspend returns and resume takes back.

A world model's session is state, not a cache (a KV history, a camera, a
prompt's encoding, a chunk index). :class:`SessionState` holds all of it at a
chunk boundary, apart from any engine, so that a session can be suspended
(its row freed), resumed (in the same engine or another: a migration), and
later written to a checkpoint; a resumed session's frames are those of a twin
that was never suspended, bit for bit.

It has three parts:

* the engine's: the session's next chunk index, whether it was seeded, its
  conditioning, the heavy changes staged for an encode, and the chunks it made
  but had not emitted yet (pipelined, DEFERRED's chunk N-1, decoded at suspend
  and emitted by the resumed engine's next step, as the twin emits it);
* the model's: one :class:`RowState` (arrays plus small metadata) that the
  model exported from its row (:meth:`rte.stages.StageModel.export_rows`) and
  imports again, labelled with the model's :class:`ModelIdentity` (its name, a
  digest of what its state means: configuration and weights, and its own
  format version), so a state of another model, configuration or version is
  refused, never loaded;
* the host's (:class:`HostHalf`, in ``SessionState.host``): what the serving
  loop keeps for the session beside its engine (its priority, the actions
  queued for its next step and their seq, its receipts), filled by an export
  and a checkpoint and restored by an attach with the state, so that a moved
  session's queued action applies at the chunk it would have on its old host.
  A state made by an engine alone (``ComposedEngine.suspend``) has none: {}.

As bytes (:meth:`SessionState.to_bytes`) it is a small header (magic, format
version, body length, a BLAKE2b digest of the body) and one value of the
conditioning codec (:mod:`rte.protocol.values`: MessagePack, arrays as raw
bytes with their dtype and shape): no pickle, so bytes from host memory, a
slab or a checkpoint file are only ever parsed. Torn or garbled bytes are a
:class:`~rte.errors.StateError` saying which check failed.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rte.errors import StateError, WireError
from rte.overload import LOWEST
from rte.protocol.values import decode_value, encode_value

FORMAT = 1  # the version of the SessionState layout (the engine's half, and the header)
MAGIC = b"RTESTATE"
_HEADER = struct.Struct("<8sIIQ16s")  # magic, format, reserved (0), body bytes, digest


def digest_of(*parts: object) -> str:
    """A short hex digest of ``parts``: arrays by dtype, shape and bytes, the rest by
    ``repr`` (what a model's identity hashes: its configuration and weights)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if isinstance(part, np.ndarray):
            h.update(f"{part.dtype.str}{part.shape}".encode())
            h.update(np.ascontiguousarray(part).tobytes())
        else:
            h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class ModelIdentity:
    """Whose row state a :class:`RowState` is: only the same identity imports it.

    Attributes:
        name: the model's name (``world``, ``reference``).
        digest: a digest of what gives its state meaning, its configuration and
            weights (:func:`digest_of`); two models of one name and digest read
            each other's states (the NumPy and the torch ``world`` do).
        version: the model's own state format version (bumped when its arrays change).
    """

    name: str
    digest: str
    version: int = 1

    def __str__(self) -> str:
        return f"{self.name} (state v{self.version}, digest {self.digest[:12]})"


@dataclass
class RowState:
    """One row of a model's state: named arrays and small metadata (str keys; JSON-like
    values: None, bool, int, float, str, lists, dicts)."""

    arrays: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def array(self, name: str, shape: Sequence[int], dtype: Any) -> np.ndarray[Any, Any]:
        """The array ``name``; StateError unless it has ``shape`` and ``dtype``."""
        value = self.arrays.get(name)
        want = (tuple(shape), np.dtype(dtype))
        if not isinstance(value, np.ndarray) or (value.shape, value.dtype) != want:
            got = f"{value.dtype}{value.shape}" if isinstance(value, np.ndarray) else "nothing"
            raise StateError(f"row state {name!r}: expected {want[1]}{want[0]}, got {got}")
        return value

    def number(self, name: str) -> int:
        """The int ``name`` of the metadata; StateError if it is not one."""
        value = self.meta.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise StateError(f"row state {name!r}: expected an int, got {value!r}")
        return value


@dataclass(frozen=True)
class SessionState:
    """One session at a chunk boundary, out of its engine (see the module's docstring).

    Attributes:
        session: the session id it was suspended as (it resumes as the same).
        model: the identity of the model whose row state ``row`` is.
        chunk: the next chunk index the session makes.
        armed: whether it was seeded (False: it resumes pending, and is seeded then).
        conditioning: its conditioning, as an action last left it.
        staged: heavy changes sent but not yet encoding (encoded after resume).
        row: the model's state of its row (None when not seeded).
        pending: chunks made but not yet emitted, in order, the last being
            ``chunk - 1`` (pipelined: the one DEFERRED had in flight).
        latent: the chunks' ``(dtype, shape)`` (the manifest's).
        host: what the host serving the session carries with it: a
            :meth:`HostHalf.to_value` ({} for none), checked when it is restored.
    """

    session: str
    model: ModelIdentity
    chunk: int
    armed: bool
    conditioning: dict[str, Any]
    staged: dict[str, Any]
    row: RowState | None
    pending: tuple[np.ndarray[Any, Any], ...]
    latent: tuple[str, tuple[int, ...]]
    host: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """The bytes of its arrays (the row's and the pending chunks'): what it costs to hold."""
        arrays = [*self.pending, *(self.row.arrays.values() if self.row else ())]
        return sum(int(a.nbytes) for a in arrays)

    def to_bytes(self) -> bytes:
        """The state as bytes :meth:`from_bytes` reads back; StateError when a value
        of it cannot be carried (a conditioning value the codec does not take)."""
        value = {
            "session": self.session,
            "model": {"name": self.model.name, "digest": self.model.digest},
            "model_version": self.model.version,
            "chunk": self.chunk,
            "armed": self.armed,
            "conditioning": self.conditioning,
            "staged": self.staged,
            "row": None if self.row is None else {"arrays": self.row.arrays, "meta": self.row.meta},
            "pending": list(self.pending),
            "latent": {"dtype": self.latent[0], "shape": list(self.latent[1])},
            "host": self.host,
        }
        try:
            body = encode_value(value)
        except WireError as exc:
            raise StateError(f"session {self.session!r}'s state cannot be written: {exc}") from None
        digest = hashlib.blake2b(body, digest_size=16).digest()
        return _HEADER.pack(MAGIC, FORMAT, 0, len(body), digest) + body

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> SessionState:
        """The state :meth:`to_bytes` wrote; StateError for any other bytes (torn,
        garbled, another format version), saying which."""
        view = memoryview(data).cast("B")
        if len(view) < _HEADER.size:
            raise StateError(f"not a session state: {len(view)} bytes, less than its header")
        magic, version, _, length, digest = _HEADER.unpack_from(view)
        if magic != MAGIC:
            raise StateError("not a session state: its first bytes are not rte's state magic")
        if version != FORMAT:
            raise StateError(
                f"a session state of format {version}; this rte reads format {FORMAT} "
                "(resume it with the rte version that suspended it)"
            )
        body = view[_HEADER.size :]
        if len(body) != length:
            raise StateError(
                f"a torn session state: its header says {length} bytes follow, {len(body)} do"
            )
        if hashlib.blake2b(body, digest_size=16).digest() != digest:
            raise StateError("a garbled session state: its bytes do not match their digest")
        try:
            return _state_of(decode_value(body))
        except (WireError, KeyError, TypeError, ValueError) as exc:
            raise StateError(f"a session state that does not parse: {exc}") from None


def _state_of(value: Any) -> SessionState:
    """A SessionState from its decoded value (lists arrive as tuples)."""
    if not isinstance(value, Mapping):
        raise TypeError("the body is not a map")
    model, latent, row = value["model"], value["latent"], value["row"]
    state = SessionState(
        session=_typed(value["session"], str),
        model=ModelIdentity(
            _typed(model["name"], str), _typed(model["digest"], str), value["model_version"]
        ),
        chunk=_typed(value["chunk"], int),
        armed=_typed(value["armed"], bool),
        conditioning=dict(_typed(value["conditioning"], dict)),
        staged=dict(_typed(value["staged"], dict)),
        row=None if row is None else RowState(dict(row["arrays"]), dict(row["meta"])),
        pending=tuple(_typed(a, np.ndarray) for a in value["pending"]),
        latent=(_typed(latent["dtype"], str), tuple(int(n) for n in latent["shape"])),
        host=dict(_typed(value["host"], dict)),
    )
    if state.row is not None and not all(
        isinstance(a, np.ndarray) for a in state.row.arrays.values()
    ):
        raise TypeError("a row state's arrays are not all arrays")
    return state


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected a {kind.__name__}, got {type(value).__name__}")
    return value


MAX_SEQ = 0xFFFFFFFF  # a request's seq is a u32 (0: none)


@dataclass(frozen=True)
class HostHalf:
    """What a serving loop keeps for a session beside its engine state, as it moves
    in ``SessionState.host`` (credits do not move: they are the new attach's own).

    Attributes:
        priority: its class under overload, 0 to 3 (None: not carried; the attach's).
        actions: the actions that arrived since its last step, merged, that its
            next step applies (the keys its client set, and their values).
        act_seq: the seq of the last of them (0: none).
        applied: the seq its last emitted chunk applied (its receipts go on from it).
        marks: ``(first chunk, seq)`` of each action handed to its engine that no
            emitted chunk has reached yet (:class:`rte.receipts.Receipts`).
        suspended: whether its client had suspended it (it moves in suspended).
    """

    priority: int | None = None
    actions: dict[str, Any] = field(default_factory=dict)
    act_seq: int = 0
    applied: int = 0
    marks: tuple[tuple[int, int], ...] = ()
    suspended: bool = False

    def to_value(self) -> dict[str, Any]:
        """The half as ``SessionState.host`` holds it (what :meth:`of` reads)."""
        value: dict[str, Any] = {
            "actions": dict(self.actions),
            "act_seq": self.act_seq,
            "applied": self.applied,
            "marks": [list(mark) for mark in self.marks],
        }
        if self.priority is not None:
            value["priority"] = self.priority
        if self.suspended:
            value["suspended"] = True
        return value

    @classmethod
    def of(cls, host: object, session: str = "") -> HostHalf:
        """The half in ``host`` (each key optional); StateError naming the field for
        one that is not of its kind, or a key that is not one of them."""

        def refused(what: str) -> StateError:
            return StateError(
                f"session {session!r} cannot move in: its state's host half is refused: {what} "
                "(export it again from a host of this rte)"
            )

        if not isinstance(host, Mapping):
            raise refused(f"host is a {type(host).__name__}, not a map")
        unknown = sorted(str(k) for k in host if k not in _HOST_KEYS)
        if unknown:
            raise refused(
                f"unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(_HOST_KEYS)})"
            )
        priority = host.get("priority")
        if priority is not None and not (_whole(priority) and 0 <= priority <= LOWEST):
            raise refused(f"host.priority must be a whole number 0 to {LOWEST}, not {priority!r}")
        actions = host.get("actions", {})
        if not isinstance(actions, Mapping) or not all(isinstance(k, str) for k in actions):
            raise refused(f"host.actions must be a map of conditioning keys, not {actions!r}")
        seqs = {name: host.get(name, 0) for name in ("act_seq", "applied")}
        for name, seq in seqs.items():
            if not (_whole(seq) and 0 <= seq <= MAX_SEQ):
                raise refused(f"host.{name} must be a seq, 0 to {MAX_SEQ}, not {seq!r}")
        marks = host.get("marks", ())
        if not isinstance(marks, list | tuple) or not all(_mark(m) for m in marks):
            raise refused(f"host.marks must be (first chunk, seq) pairs, not {marks!r}")
        suspended = host.get("suspended", False)
        if not isinstance(suspended, bool):
            raise refused(f"host.suspended must be True or False, not {suspended!r}")
        return cls(
            priority,
            dict(actions),
            seqs["act_seq"],
            seqs["applied"],
            tuple((int(m[0]), int(m[1])) for m in marks),
            suspended,
        )


_HOST_KEYS = ("priority", "actions", "act_seq", "applied", "marks", "suspended")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mark(mark: object) -> bool:
    return (
        isinstance(mark, list | tuple)
        and len(mark) == 2
        and all(_whole(n) and n >= 0 for n in mark)
        and mark[1] <= MAX_SEQ
    )
