/* The C part of shm: atomics, the SPSC ring and the slab's slot states.
 *
 * This header is also the cffi cdef (shm/_build.py reads it), so it holds only
 * declarations cffi understands: no macros, no includes, no struct bodies.
 * Layouts live in shm_native.c; Python never touches a ring's head or tail or a
 * slot's state word except through these functions.
 */

/* -- atomics on 8-byte words in shared memory -- */
uint64_t shm_load_acquire(const uint64_t *p);
uint64_t shm_load_relaxed(const uint64_t *p);
void shm_store_release(uint64_t *p, uint64_t v);
int shm_cas(uint64_t *p, uint64_t expected, uint64_t desired);
uint64_t shm_fetch_add(uint64_t *p, uint64_t v);
int shm_spin_until_equal(const uint64_t *p, uint64_t value, uint64_t spin_ns);

/* -- ring: single producer, single consumer, variable-length records -- */
uint64_t shm_ring_header_size(void);
uint64_t shm_ring_max_payload(uint64_t capacity);
int shm_ring_init(void *ring, uint64_t capacity);
int64_t shm_ring_check(void *ring, uint64_t region_size);
int shm_ring_push(void *ring, const char *data, uint64_t len, int count_full);
int64_t shm_ring_pop(void *ring, void *out, uint64_t out_cap);
int64_t shm_ring_pop_batch(void *ring, void *out, uint64_t out_cap, uint64_t *lens, uint64_t max_n);
int64_t shm_ring_peek(void *ring, uint64_t skip, void *out, uint64_t out_cap);
uint64_t shm_ring_used(void *ring);
int64_t shm_ring_pop_spin(void *ring, void *out, uint64_t out_cap, uint64_t spin_ns);
uint64_t shm_ring_wait_used(void *ring, uint64_t spin_ns);
int shm_ring_prepare_sleep(void *ring);
int shm_ring_wake(void *ring);
void shm_ring_end_sleep(void *ring);
void shm_ring_reset(void *ring);
void shm_ring_stats(void *ring, uint64_t *out);

/* -- slab: per-slot state word (generation << 2 | state), owner, since -- */
uint64_t shm_slab_meta_size(uint64_t slots, uint64_t max_owners);
int shm_slab_init(void *meta, uint64_t slots, uint64_t max_owners, uint64_t slot_size, uint64_t quota);
int64_t shm_slab_check(void *meta, uint64_t region_size);
int64_t shm_slab_acquire(void *meta, uint64_t owner, uint64_t now_ns, uint64_t *generation);
int shm_slab_publish(void *meta, uint64_t slot, uint64_t generation);
int shm_slab_is_ready(void *meta, uint64_t slot, uint64_t generation);
int shm_slab_release(void *meta, uint64_t slot, uint64_t generation, uint64_t owner);
int shm_slab_abort(void *meta, uint64_t slot, uint64_t generation);
int64_t shm_slab_reclaim(void *meta, uint64_t owner);
void shm_slab_slot(void *meta, uint64_t slot, uint64_t *out);
void shm_slab_stats(void *meta, uint64_t *out);
uint64_t shm_slab_held(void *meta, uint64_t owner);
