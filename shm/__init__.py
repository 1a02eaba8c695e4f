"""shm: lock-free shared-memory transport (rings, doorbells, slab)."""
