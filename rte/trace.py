"""A session's trace: what it was given and what it made, as JSON lines.

rte's engine is deterministic (a session's frames are the same solo, batched,
in process and in a daemon, bit for bit), so a session is reproduced by its
attach, its actions and the chunk index each applied at; a hash of every chunk
says whether a reproduction is the same. A trace is one session, one JSON
object a line, each with its ``kind``, in the order a replay needs them:

- ``header`` (the first line): ``format`` ``"rte-trace"``, ``version``
  (:data:`TRACE_VERSION`; a newer one is refused), the ``rte`` version, the
  ``engine`` recorded, the ``model`` (``name``, ``identity`` when known: the
  model's state identity, see :class:`rte.state.ModelIdentity`), the
  ``device`` when known, the ``manifest`` (``shape``, ``dtype``,
  ``max_sessions``, ``pipeline_depth_chunks``, ``input_latency_chunks``) and
  ``heavy_keys`` when known.
- ``attach``: ``session``, ``conditioning`` (encoded, below), ``credits``,
  ``priority``, ``seeds`` (the session id: the shipped models draw their noise
  from it; a model that takes a seed has it in its conditioning).
- ``act``: ``seq`` (as the recording client numbered it), ``conditioning``,
  ``chunk`` (the first chunk whose receipt, ``applied``, reached ``seq``: the
  chunk the action applied at; null if none did), ``t`` (seconds since the
  attach) and ``refused`` (the engine's words) for an action it refused. An
  act line comes before the chunk it applied at.
- ``chunk``: ``index``, ``blake2b`` (hex BLAKE2b-128 of the chunk's bytes, C
  order), ``applied`` (its receipt) and ``t`` (when this client took it).
- ``end`` (optional: a trace cut short is replayable up to its last line):
  ``chunks`` and ``seconds``.

Conditioning is JSON where JSON holds it exactly (str, int, float, bool, None,
lists, dicts of str keys); everything else is one object with a ``$`` key:
``{"$tuple": [...]}``, ``{"$bytes": BASE64}``, ``{"$array": {"dtype", "shape",
"base64"}}`` (C-order bytes), ``{"$float": "nan" | "inf" | "-inf"}``, and
``{"$dict": [[key, value], ...]}`` for a dict whose keys are not all plain
strings (or one that could be mistaken for these). NumPy scalars become
Python's. :class:`Recorder` writes a trace from any client, :func:`read_trace`
reads one (a garbled line is a :class:`TraceError` naming its number), and
:mod:`rte.replay` reproduces one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

import rte
from rte.contract import Manifest
from rte.errors import RteError
from rte.protocol.wire import MAX_PRIORITY

TRACE_FORMAT = "rte-trace"
TRACE_VERSION = 1
MAX_CHUNK_GAP = 4096  # a chunk index further past the one before is a garbled trace's
MAX_TRACE_ROWS = 4096  # a header's max_sessions past this is a garbled trace's


class TraceError(RteError, ValueError):
    """A trace that cannot be read: not JSON lines, a line of a kind or with fields
    it cannot have, or written by a newer rte. Says which file and line."""


# -- values --------------------------------------------------------------------


def encode_value(value: Any) -> Any:
    """A conditioning value as JSON (see the module's docstring); TraceError for a
    value it has no encoding for."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        if array.dtype.hasobject:
            raise TraceError(f"an array of dtype {array.dtype} cannot be written to a trace")
        data = base64.b64encode(array.tobytes()).decode("ascii")
        return {"$array": {"dtype": array.dtype.str, "shape": list(array.shape), "base64": data}}
    if isinstance(value, np.generic):
        return encode_value(value.item())
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return {"$tuple": [encode_value(v) for v in value]}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, Mapping):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode_value(v) for k, v in value.items()}
        return {"$dict": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    raise TraceError(f"a value of type {type(value).__name__} cannot be written to a trace")


def decode_value(value: Any) -> Any:
    """The value :func:`encode_value` encoded; TraceError for one it never writes."""
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((key, inner),) = value.items()
        if key.startswith("$"):
            return _decode_tagged(key, inner)
    return {k: decode_value(v) for k, v in value.items()}


def _decode_tagged(tag: str, inner: Any) -> Any:
    try:
        if tag == "$tuple":
            return tuple(decode_value(v) for v in inner)
        if tag == "$bytes":
            return base64.b64decode(inner, validate=True)
        if tag == "$float":
            if inner not in ("nan", "inf", "-inf"):
                raise ValueError(f"{inner!r} is not nan, inf or -inf")
            return float(inner)
        if tag == "$dict":
            return {_hashable(decode_value(k)): decode_value(v) for k, v in inner}
        if tag == "$array":
            data = base64.b64decode(inner["base64"], validate=True)
            dtype, shape = np.dtype(inner["dtype"]), tuple(int(n) for n in inner["shape"])
            return np.frombuffer(data, dtype).reshape(shape).copy()
    except (TypeError, ValueError, KeyError) as exc:
        raise TraceError(f"a {tag} value that cannot be decoded: {exc}") from None
    raise TraceError(f"{tag}: not a value a trace holds ($tuple, $bytes, $float, $dict, $array)")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key


def chunk_hash(latent: np.ndarray[Any, Any]) -> str:
    """A chunk's hash as a trace holds it: hex BLAKE2b-128 of its C-order bytes."""
    return hashlib.blake2b(np.ascontiguousarray(latent).data, digest_size=16).hexdigest()


# -- records ---------------------------------------------------------------------


@dataclass(frozen=True)
class ActRecord:
    """One action: its ``seq``, conditioning (decoded), and where it applied."""

    seq: int
    conditioning: dict[str, Any]
    chunk: int | None
    t: float
    refused: str | None = None


@dataclass(frozen=True)
class ChunkRecord:
    """One chunk: its index, hash and receipt."""

    index: int
    blake2b: str
    applied: int
    t: float


@dataclass
class Trace:
    """A whole trace, read (:func:`read_trace`) or being written (:class:`Recorder`)."""

    header: dict[str, Any]
    session: str
    conditioning: dict[str, Any]
    credits: int = 0
    priority: int = 1
    acts: list[ActRecord] = field(default_factory=list)
    chunks: list[ChunkRecord] = field(default_factory=list)
    seconds: float | None = None  # from its end line: None when it has none

    @property
    def manifest(self) -> dict[str, Any]:
        return dict(self.header["manifest"])

    @property
    def model(self) -> str:
        return str(self.header["model"]["name"])

    def pace(self) -> float | None:
        """The recorded chunks a second (first chunk to last), None under two chunks."""
        if len(self.chunks) < 2 or self.chunks[-1].t <= self.chunks[0].t:
            return None
        return (len(self.chunks) - 1) / (self.chunks[-1].t - self.chunks[0].t)


def header_of(
    manifest: Manifest,
    engine: str,
    *,
    identity: Mapping[str, Any] | None = None,
    device: str | None = None,
    heavy_keys: list[str] | None = None,
) -> dict[str, Any]:
    """A trace's header line for a session of an engine with ``manifest``."""
    return {
        "kind": "header",
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "rte": rte.__version__,
        "engine": engine,
        "model": {"name": manifest.model, "identity": dict(identity) if identity else None},
        "device": device,
        "manifest": {
            "shape": list(manifest.latent_shape),
            "dtype": manifest.latent_dtype,
            "max_sessions": manifest.max_sessions,
            "pipeline_depth_chunks": manifest.pipeline_depth_chunks,
            "input_latency_chunks": manifest.input_latency_chunks,
        },
        "heavy_keys": heavy_keys,
    }


class TraceWriter:
    """Writes a trace's lines as they happen (each flushed: a crash keeps them)."""

    def __init__(self, out: Path | IO[str]) -> None:
        self._own = isinstance(out, Path)
        self._file: IO[str] = out.open("w", encoding="utf-8") if isinstance(out, Path) else out

    def write(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._own:
            self._file.close()


# -- reading ---------------------------------------------------------------------


def read_trace(path: Path) -> Trace:
    """The trace in ``path``; TraceError (its line) for one that is garbled."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a trace (not UTF-8 text: {exc.reason})") from None
    lines = text.splitlines()
    if not lines:
        raise TraceError(f"{path}: empty, not a trace (its first line is its header)")
    reader = _Reader(path)
    for number, line in enumerate(lines, 1):
        reader.line = number
        reader.take(line)
    return reader.finish()


class _Reader:
    """Reads a trace line by line, checking each line's kind and fields."""

    def __init__(self, path: Path) -> None:
        self.path, self.line = path, 0
        self.header: dict[str, Any] | None = None
        self.trace: Trace | None = None
        self.ended = False

    def fail(self, what: str) -> TraceError:
        return TraceError(f"{self.path} line {self.line}: {what}")

    def take(self, line: str) -> None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise self.fail(f"not JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise self.fail("JSON nested too deep for a trace") from None
        if not isinstance(record, dict):
            raise self.fail(f"a JSON {type(record).__name__}, not an object with a 'kind'")
        kind = _shown(record.get("kind"))
        if self.ended:
            raise self.fail(f"a {kind} line after the trace's end line")
        if self.header is None:
            self._header(record)
            return
        try:
            self._record(record.get("kind"), record)
        except TraceError as exc:
            raise self.fail(str(exc)) from None
        except RecursionError:
            raise self.fail(f"a {kind} line nested too deep for a trace") from None
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise self.fail(f"a {kind} line with a field missing or wrong ({exc!r:.200})") from None

    def _header(self, record: dict[str, Any]) -> None:
        if record.get("kind") != "header" or record.get("format") != TRACE_FORMAT:
            raise self.fail(f"not a trace: its first line must be the {TRACE_FORMAT} header")
        version = record.get("version")
        if not isinstance(version, int) or version < 1:
            raise self.fail(f"a header of version {version!r}, not a trace version")
        if version > TRACE_VERSION:
            raise self.fail(
                f"a trace of version {version}, written by a newer rte: this one "
                f"({rte.__version__}) reads version {TRACE_VERSION}; upgrade rte"
            )
        manifest, model = record.get("manifest"), record.get("model")
        if not isinstance(manifest, dict) or not isinstance(model, dict) or "name" not in model:
            raise self.fail("a header without its manifest or model")
        for key in ("shape", "dtype", "max_sessions", "pipeline_depth_chunks"):
            if key not in manifest:
                raise self.fail(f"a header whose manifest has no {key!r}")
        wrong = _wrong_header(record, manifest, model)
        if wrong:
            raise self.fail(f"a header whose {wrong}")
        self.header = record

    def _record(self, kind: Any, record: dict[str, Any]) -> None:
        if kind == "attach":
            if self.trace is not None:
                raise TraceError("a second attach line (a trace is one session)")
            assert self.header is not None
            cond = decode_value(record["conditioning"])
            if not isinstance(cond, dict) or not isinstance(record["session"], str):
                raise TraceError("an attach line needs a session and a conditioning object")
            credits, priority = record["credits"], record["priority"]
            if not _whole(credits, 0, 1 << 62) or not _whole(priority, 0, MAX_PRIORITY):
                raise TraceError(
                    f"an attach line's credits (a count) or priority (0 to {MAX_PRIORITY}) "
                    f"out of range: {_shown(credits)}, {_shown(priority)}"
                )
            self.trace = Trace(self.header, record["session"], cond, credits, priority)
            return
        trace = self.trace
        if trace is None:
            raise TraceError(f"a {kind!r} line before the attach line")
        if kind == "act":
            chunk, refused = record["chunk"], record.get("refused")
            cond = decode_value(record["conditioning"])
            if not isinstance(cond, dict):
                raise TraceError("an act line's conditioning must be an object")
            if chunk is not None and (not isinstance(chunk, int) or chunk < 0):
                raise TraceError(f"an act line's chunk must be an index or null, not {chunk!r}")
            trace.acts.append(ActRecord(int(record["seq"]), cond, chunk, _t(record), refused))
        elif kind == "chunk":
            index, digest = record["index"], record["blake2b"]
            if not isinstance(index, int) or index < 0 or not isinstance(digest, str):
                raise TraceError("a chunk line needs an index and a blake2b hash")
            before = trace.chunks[-1].index if trace.chunks else -1
            if index <= before:
                raise TraceError(f"chunk {index} after chunk {before}")
            if index - before > MAX_CHUNK_GAP:  # a replay would make every chunk between
                raise TraceError(
                    f"chunk {index} after chunk {before}: a gap of {index - before - 1} "
                    f"chunks, more than a recorder leaves ({MAX_CHUNK_GAP}): a garbled index"
                )
            trace.chunks.append(ChunkRecord(index, digest, int(record["applied"]), _t(record)))
        elif kind == "end":
            trace.seconds = _t(record, "seconds")
            self.ended = True
        else:
            raise TraceError(
                f"a line of kind {_shown(kind)} (a trace has header, attach, act, chunk, end)"
            )

    def finish(self) -> Trace:
        if self.trace is None:
            raise TraceError(f"{self.path}: a header and no attach line: no session to replay")
        return self.trace


def _shown(value: Any) -> str:
    """A value of a trace's line as a message quotes it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:36]}...{text[-1]}"


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _t(record: dict[str, Any], key: str = "t") -> float:
    """A line's seconds: a finite number (ValueError else)."""
    value = float(record[key])
    if not math.isfinite(value):
        raise ValueError(f"{key} is {value}, not a number of seconds")
    return value


def _wrong_header(record: dict[str, Any], manifest: dict[str, Any], model: dict[str, Any]) -> str:
    """What is wrong in a header's fields, as :func:`header_of` writes them ("": none)."""
    shape, rows, depth = (
        manifest["shape"],
        manifest["max_sessions"],
        manifest["pipeline_depth_chunks"],
    )
    checks = (
        (isinstance(model["name"], str), "model name", model["name"]),
        (isinstance(model.get("identity"), dict | None), "model identity", model.get("identity")),
        (isinstance(record.get("device"), str | None), "device", record.get("device")),
        (isinstance(record.get("heavy_keys"), list | None), "heavy_keys", record.get("heavy_keys")),
        (isinstance(manifest["dtype"], str), "dtype", manifest["dtype"]),
        (isinstance(shape, list) and all(_whole(n, 0, 1 << 31) for n in shape), "shape", shape),
        (_whole(rows, 1, MAX_TRACE_ROWS), f"max_sessions (1 to {MAX_TRACE_ROWS})", rows),
        (_whole(depth, 1, 64), "pipeline_depth_chunks (1 to 64)", depth),
    )
    for fine, what, value in checks:
        if not fine:
            return f"{what} is not one ({_shown(value)})"
    return ""
