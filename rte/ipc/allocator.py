"""SlabAllocator: the engine's output buffers are loans of slab slots.

The engine's DEFERRED lane writes each chunk into the buffer the allocator
hands it (:class:`rte.composed.OutputAllocator`); here that buffer is a slot of
the shared slab, loaned for the session's owner, so the chunk is written once,
in place, where its reader will look at it. The daemon core takes the loan
back when the chunk is emitted (to publish it and name it in a record); a
failed step's chunks are discarded, and their loans aborted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rte.contract import Manifest
from shm import Loan, Slab


class SlabAllocator:
    """Loans slab slots as output buffers; ``owner_of(session)`` names the slab
    owner (the client slot) a session's chunks are charged to."""

    def __init__(self, slab: Slab, manifest: Manifest, owner_of: Callable[[str], int]) -> None:
        self.slab = slab
        self.shape = manifest.latent_shape
        self.dtype = np.dtype(manifest.latent_dtype)
        self.owner_of = owner_of
        self.loans: dict[tuple[str, int], Loan] = {}

    def allocate(self, session: str, chunk: int) -> np.ndarray[Any, Any]:
        loan = self.slab.loan(self.owner_of(session), self.dtype, self.shape)
        self.loans[(session, chunk)] = loan
        return loan.array

    def discard(self, session: str, chunk: int, buffer: np.ndarray[Any, Any]) -> None:
        loan = self.loans.pop((session, chunk), None)
        if loan is not None:
            loan.abort()

    def take(self, session: str, chunk: int) -> Loan:
        """The loan holding an emitted chunk: the caller publishes or aborts it."""
        return self.loans.pop((session, chunk))
