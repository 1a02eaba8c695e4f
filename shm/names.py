"""Names of shared objects: the one place they are made, listed and removed.

Every segment and semaphore shm creates is named ``/rte.<uid>.<part>.<part>...``
(:func:`shm_name`): per user, so another user's daemon of the same name owns
other objects. On Linux both kinds live in :data:`SHM_DIR`: a segment
``/rte.1000.x`` as the file ``rte.1000.x``, a semaphore of that name as
``sem.rte.1000.x`` (glibc's convention). :func:`objects` lists this user's
objects under a name prefix and :func:`unlink_objects` removes them, each by the
call for its kind (``shm_unlink`` or ``sem_unlink``), so callers never glob
``/dev/shm`` or re-derive names with f-strings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from pathlib import Path

import posix_ipc

SHM_DIR = Path("/dev/shm")
_SEMAPHORE = "sem."  # the file-name prefix glibc gives a named semaphore in SHM_DIR
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def shm_name(*parts: str) -> str:
    """The POSIX name of one object of this user: ``/rte.<uid>.<part>.<part>...``.

    Raises:
        ValueError: a part is empty, longer than 128 characters, or holds
            anything but letters, digits, ``_``, ``.`` and ``-``.
    """
    for part in parts:
        if not _PART.match(part):
            raise ValueError(
                f"name part {part!r} must be 1-128 characters of letters, digits, '_', '.', '-'"
            )
    return "/rte." + ".".join((str(os.getuid()), *parts))


def objects(prefix: str) -> list[str]:
    """The POSIX names of this user's segments and semaphores that start with ``prefix``.

    Args:
        prefix: the start of a POSIX name, leading ``/`` included, e.g.
            ``shm_name("daemon1") + "."`` for every object of that daemon (the
            trailing dot keeps ``daemon10``'s out).

    Returns:
        The names, sorted, each once (a segment and a semaphore may share one).
        Empty where the system keeps no :data:`SHM_DIR`.
    """
    return sorted({name for name, _ in _scan(prefix)})


def unlink_objects(prefix: str, *, keep: Collection[str] = ()) -> list[str]:
    """Unlink every object :func:`objects` lists for ``prefix`` but those named in
    ``keep``; return the names removed.

    Each is removed by the call for its kind; one already gone (its owner
    unlinked it meanwhile) is skipped. Mappings and open semaphores that
    processes still hold stay valid until they close them.
    """
    removed = set()
    for name, semaphore in _scan(prefix):
        if name in keep:
            continue
        if unlink_semaphore(name) if semaphore else unlink_segment(name):
            removed.add(name)
    return sorted(removed)


def unlink_segment(name: str) -> bool:
    """Remove segment ``name`` if it exists; True when something was removed."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True


def unlink_semaphore(name: str) -> bool:
    """Remove semaphore ``name`` if it exists; True when something was removed."""
    try:
        posix_ipc.unlink_semaphore(name)
    except posix_ipc.ExistentialError:
        return False
    return True


def _scan(prefix: str) -> list[tuple[str, bool]]:
    """(POSIX name, is a semaphore) of this user's objects under ``prefix``."""
    if not prefix.startswith("/"):
        raise ValueError(f"prefix {prefix!r} must be the start of a POSIX name, with its '/'")
    mine = shm_name()  # "/rte.<uid>": only this user's names, never another's
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        semaphore = entry.startswith(_SEMAPHORE)
        name = "/" + (entry[len(_SEMAPHORE) :] if semaphore else entry)
        if name.startswith(prefix) and name.startswith(mine + "."):
            found.append((name, semaphore))
    return found
