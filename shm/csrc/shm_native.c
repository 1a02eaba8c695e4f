/* shm_native.c: atomics, the SPSC ring and the slab's slot states, in C.
 *
 * Memory ordering is explicit (GCC/Clang __atomic builtins) because plain
 * Python stores are no ordering guarantee: x86 hides a missing barrier, ARM
 * does not. Every acquire names the release it pairs with. Counters that only
 * inspectors read (pushed, full_events, ...) are relaxed: each has one writer,
 * and a tool reading a live ring needs untorn values, not ordering.
 *
 * Builds on: DPDK lib/ring (free-running u64 head/tail masked on access,
 * producer and consumer on separate lines) and crossbeam's CachePadded (128-byte
 * lines, which also keep adjacent-line prefetch from false sharing).
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "shm_native.h"

_Static_assert(__atomic_always_lock_free(8, 0), "8-byte atomics must be lock-free");
_Static_assert(sizeof(uint64_t) == 8, "uint64_t is 8 bytes");

#define LINE_WORDS 16 /* 128 bytes */
#define RING_MAGIC 0x31676e6972657472ULL /* "rtering1" */
#define SLAB_MAGIC 0x31626c7365747274ULL /* "rtrselb1" */
#define WRAP_MARK UINT64_MAX
#define RECORD_HEADER 8u

/* -- atomics ------------------------------------------------------------ */

uint64_t shm_load_acquire(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
uint64_t shm_load_relaxed(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
void shm_store_release(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

int shm_cas(uint64_t *p, uint64_t expected, uint64_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

uint64_t shm_fetch_add(uint64_t *p, uint64_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}

/* -- bounded spinning -------------------------------------------------------
 * Spinning is done here rather than in Python: a poll costs nanoseconds, the
 * CPU is told it spins (pause/yield), and cffi releases the GIL for the call.
 * Every spin is bounded by a deadline; the caller decides what comes after. */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Returns 1 once *p == value (acquire: pairs with the writer's release), 0
   when spin_ns pass first. */
int shm_spin_until_equal(const uint64_t *p, uint64_t value, uint64_t spin_ns) {
    const uint64_t deadline = now_ns() + spin_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (__atomic_load_n(p, __ATOMIC_ACQUIRE) == value) return 1;
            cpu_relax();
        }
        if (now_ns() >= deadline) return 0;
    }
}

/* Adds one to counts[index[k]] for each k < n, or to counts[index[rows[k]]]
   when rows is not NULL; an index or row out of range is skipped. Returns how
   many were added. Each add is a release (pairs with the acquire of whoever
   reads the count: what was written before, the slot releases of the same
   rows, is visible with it); one call lays a whole batch's credits down within
   nanoseconds, so a reader polling the counts sees a step's rows back together,
   not one at a time as a Python loop would hand them over. */
uint64_t shm_add_ones(uint64_t *counts, uint64_t ncounts, const uint32_t *index,
                      uint64_t nindex, const int64_t *rows, uint64_t n) {
    uint64_t added = 0;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t at = k;
        if (rows != NULL) {
            if (rows[k] < 0) continue;
            at = (uint64_t)rows[k];
        }
        if (at >= nindex || index[at] >= ncounts) continue;
        __atomic_fetch_add(&counts[index[at]], 1, __ATOMIC_RELEASE);
        added++;
    }
    return added;
}

int shm_one_run(const uint64_t *slots, uint64_t n) {
    if (n == 0)
        return 0;
    for (uint64_t k = 1; k < n; k++)
        if (slots[k] != slots[0] + k)
            return 0;
    return 1;
}

/* A client writes its consumed counts as it pleases: a count read torn or
   hostile only decides whether its own sessions step (the slab quota still
   bounds what they hold). */
uint64_t shm_with_credit(const int64_t *emitted, const uint64_t *consumed, const int64_t *credits,
                         const uint8_t *bound, uint8_t *due, uint64_t n) {
    uint64_t count = 0;
    for (uint64_t h = 0; h < n; h++) {
        const int64_t seen = (int64_t)__atomic_load_n(&consumed[h], __ATOMIC_ACQUIRE);
        const uint8_t ok = bound[h] && emitted[h] - seen < credits[h];
        due[h] = ok;
        count += ok;
    }
    return count;
}

static inline void bump(uint64_t *p, uint64_t v) {
    /* single-writer counter: relaxed is enough, the store just must not tear */
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

/* -- ring ------------------------------------------------------------------
 *
 * Layout: a 512-byte header of four 128-byte lines, then `capacity` bytes of
 * records. A record is an 8-byte length then the payload, padded to 8 bytes.
 * A record never straddles the end: when it would, the producer writes a wrap
 * marker (length WRAP_MARK) and starts the record at offset 0. A record is at
 * most capacity / 2 bytes, so an empty ring always has room for the largest.
 */

typedef struct {
    /* line 0: written once by init */
    uint64_t magic, capacity, mask, max_payload;
    uint64_t _pad0[LINE_WORDS - 4];
    /* line 1: producer's */
    uint64_t head; /* bytes ever pushed, incl. padding and wrap skips */
    uint64_t pushed, bytes_pushed, full_events, high_water, oversized, wakeups;
    uint64_t last_push_ns; /* when the newest record was published (CLOCK_MONOTONIC) */
    uint64_t _pad1[LINE_WORDS - 8];
    /* line 2: consumer's */
    uint64_t tail;
    uint64_t popped, bytes_popped, corrupt;
    uint64_t _pad2[LINE_WORDS - 4];
    /* line 3: the doorbell's sleeper flag, written by both sides */
    uint64_t sleeping;
    uint64_t _pad3[LINE_WORDS - 1];
} ring_t;

_Static_assert(sizeof(ring_t) == 512, "ring header is four 128-byte lines");

static inline uint8_t *ring_data(ring_t *r) { return (uint8_t *)r + sizeof(ring_t); }
static inline uint64_t align8(uint64_t n) { return (n + 7u) & ~(uint64_t)7u; }

uint64_t shm_ring_header_size(void) { return sizeof(ring_t); }
uint64_t shm_ring_max_payload(uint64_t capacity) { return capacity / 2 - RECORD_HEADER; }

int shm_ring_init(void *header, uint64_t capacity) {
    ring_t *r = (ring_t *)header;
    if (capacity < 64 || (capacity & (capacity - 1)) != 0) return SHM_BAD_ARGUMENT;
    memset(r, 0, sizeof(ring_t));
    r->capacity = capacity;
    r->mask = capacity - 1;
    r->max_payload = shm_ring_max_payload(capacity);
    /* release: the fields above are visible before anyone sees the magic;
       pairs with the acquire in shm_ring_open */
    __atomic_store_n(&r->magic, RING_MAGIC, __ATOMIC_RELEASE);
    return SHM_OK;
}

/* Checks the ring at `header` (in a region of region_size bytes) and fills
   *ring with its geometry, which every later call uses instead of the header's
   (a peer may scribble on that). Returns the capacity, or SHM_LAYOUT_MISSING /
   _DAMAGED / _TOO_BIG (then *ring is untouched). */
int64_t shm_ring_open(shm_ring_t *ring, void *header, uint64_t region_size) {
    ring_t *r = (ring_t *)header;
    if (region_size < sizeof(ring_t)) return SHM_LAYOUT_MISSING;
    /* acquire of the magic, pairs with the release in init: the fields below
       are the ones init wrote */
    if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != RING_MAGIC) return SHM_LAYOUT_MISSING;
    uint64_t cap = r->capacity;
    if (cap < 64 || (cap & (cap - 1)) != 0 || r->mask != cap - 1) return SHM_LAYOUT_DAMAGED;
    if (r->max_payload != shm_ring_max_payload(cap)) return SHM_LAYOUT_DAMAGED;
    if (sizeof(ring_t) + cap > region_size) return SHM_LAYOUT_TOO_BIG;
    ring->header = header;
    ring->capacity = cap;
    ring->mask = cap - 1;
    ring->max_payload = shm_ring_max_payload(cap);
    return (int64_t)cap;
}

/* Room for a record of `len` payload bytes at the head: where its payload goes
   (*payload) and the head to publish once it is written (*new_head). Writes
   the wrap marker and the record's length, nothing else; nothing is visible
   to the consumer until ring_commit. Returns SHM_OK, SHM_RING_FULL,
   SHM_RING_TOO_LARGE or SHM_RING_CORRUPT, as shm_ring_push. */
static int ring_reserve(const shm_ring_t *ring, uint64_t len, int count_full, uint8_t **payload,
                        uint64_t *new_head, uint64_t *tail_seen) {
    ring_t *r = (ring_t *)ring->header;
    const uint64_t cap = ring->capacity, mask = ring->mask;
    if (len > ring->max_payload) {
        bump(&r->oversized, 1);
        return SHM_RING_TOO_LARGE;
    }
    const uint64_t need = RECORD_HEADER + align8(len);
    const uint64_t head = __atomic_load_n(&r->head, __ATOMIC_RELAXED); /* ours alone */
    /* acquire of tail, pairs with the release in pop: the consumer is done
       reading the bytes we are about to overwrite */
    const uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
    if (head & 7) return SHM_RING_CORRUPT; /* not ours: push keeps it 8-aligned */
    const uint64_t pos = head & mask;
    const uint64_t contiguous = cap - pos;
    const uint64_t total = contiguous < need ? contiguous + need : need;
    if (cap - (head - tail) < total) {
        if (count_full) bump(&r->full_events, 1);
        return SHM_RING_FULL;
    }
    uint64_t at = head;
    if (contiguous < need) {
        *(uint64_t *)(ring_data(r) + pos) = WRAP_MARK;
        at += contiguous;
    }
    uint8_t *slot = ring_data(r) + (at & mask);
    *(uint64_t *)slot = len;
    *payload = slot + RECORD_HEADER;
    *new_head = at + need;
    *tail_seen = tail;
    return SHM_OK;
}

/* Publishes a record ring_reserve made room for and its payload was written
   into; returns SHM_WAKE or SHM_OK, as shm_ring_wake. */
static int ring_commit(const shm_ring_t *ring, uint64_t new_head, uint64_t tail, uint64_t len,
                       uint64_t now) {
    ring_t *r = (ring_t *)ring->header;
    /* the stamp before the head: a consumer that sees the record sees this stamp
       or a later one (a waiter learns when its record came, not when it woke) */
    __atomic_store_n(&r->last_push_ns, now, __ATOMIC_RELAXED);
    /* release of head, pairs with the acquire in pop/used/prepare_sleep: the
       record's bytes are visible before the consumer can see the new head */
    __atomic_store_n(&r->head, new_head, __ATOMIC_RELEASE);
    bump(&r->pushed, 1);
    bump(&r->bytes_pushed, len);
    if (new_head - tail > __atomic_load_n(&r->high_water, __ATOMIC_RELAXED))
        __atomic_store_n(&r->high_water, new_head - tail, __ATOMIC_RELAXED);
    return shm_ring_wake(ring);
}

/* Returns SHM_OK when pushed, SHM_WAKE when pushed and the consumer sleeps
   (ring its doorbell), SHM_RING_FULL, or SHM_RING_TOO_LARGE when the record is
   larger than max_payload. */
int shm_ring_push(const shm_ring_t *ring, const char *data, uint64_t len, int count_full) {
    uint8_t *payload;
    uint64_t new_head, tail;
    int rc = ring_reserve(ring, len, count_full, &payload, &new_head, &tail);
    if (rc != SHM_OK) return rc;
    memcpy(payload, data, len);
    return ring_commit(ring, new_head, tail, len, now_ns());
}

/* A record of rows written straight into the ring (no copy of it made first):
   `head` (head_len bytes, 8-aligned), then the columns slots u64[n] |
   generations u64[n] | chunks i64[n] | generated i64[n] | handles u32[n] |
   applied u32[n]. `generated` is one value for every row when
   generated_stride is 0 (else 1: one per row); `applied` NULL writes zeros.
   Just before the head is published, the clock (CLOCK_MONOTONIC, as Python's
   time.monotonic_ns) is written at byte stamp_at of the record (stamp_at + 8
   <= head_len) and into *pushed_ns. The byte layout is the caller's (rte's STEP
   record, rte/protocol/wire.py): this knows columns, not what they mean.
   Returns as shm_ring_push, or SHM_BAD_ARGUMENT for n == 0, a head not
   8-aligned or a stamp outside it. */
int shm_ring_push_rows(const shm_ring_t *ring, const char *head, uint64_t head_len,
                       uint64_t stamp_at, const uint64_t *slots, const uint64_t *generations,
                       const int64_t *chunks, const int64_t *generated, uint64_t generated_stride,
                       const uint32_t *handles, const uint32_t *applied, uint64_t n,
                       int count_full, int64_t *pushed_ns) {
    if (n == 0 || n > UINT32_MAX || (head_len & 7) || stamp_at + 8 > head_len ||
        generated_stride > 1)
        return SHM_BAD_ARGUMENT;
    const uint64_t len = head_len + n * (8 + 8 + 8 + 8 + 4 + 4);
    uint8_t *out;
    uint64_t new_head, tail;
    int rc = ring_reserve(ring, len, count_full, &out, &new_head, &tail);
    if (rc != SHM_OK) return rc;
    memcpy(out, head, head_len);
    uint8_t *col = out + head_len;
    memcpy(col, slots, 8 * n);
    memcpy(col + 8 * n, generations, 8 * n);
    memcpy(col + 16 * n, chunks, 8 * n);
    int64_t *gen = (int64_t *)(col + 24 * n);
    if (generated_stride)
        memcpy(gen, generated, 8 * n);
    else
        for (uint64_t k = 0; k < n; k++) gen[k] = generated[0];
    memcpy(col + 32 * n, handles, 4 * n);
    if (applied)
        memcpy(col + 36 * n, applied, 4 * n);
    else
        memset(col + 36 * n, 0, 4 * n);
    const int64_t now = (int64_t)now_ns();
    memcpy(out + stamp_at, &now, 8);
    *pushed_ns = now;
    return ring_commit(ring, new_head, tail, len, (uint64_t)now);
}

/* Whether to ring the consumer's doorbell after publishing something it waits
   for (a record, or anything else it re-checks after prepare_sleep). Dekker
   with prepare_sleep: our publishing store, then a full fence, then the load of
   the flag; the consumer stores the flag, fences, then re-checks. At least one
   of us sees the other, so a wake-up is never lost. Clearing the flag makes one
   sleep get one post. Returns SHM_WAKE (ring it) or SHM_OK. */
int shm_ring_wake(const shm_ring_t *ring) {
    ring_t *r = (ring_t *)ring->header;
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* pairs with the fence in prepare_sleep */
    if (__atomic_load_n(&r->sleeping, __ATOMIC_RELAXED) &&
        __atomic_exchange_n(&r->sleeping, 0, __ATOMIC_ACQ_REL)) {
        bump(&r->wakeups, 1);
        return SHM_WAKE;
    }
    return SHM_OK;
}

/* The record at `tail`, skipping a wrap marker. Returns its payload length and
   sets *at to the record's position, or SHM_RING_EMPTY, or SHM_RING_CORRUPT
   when the bytes are not a valid record (something other than push wrote them:
   head, tail and lengths come from shared memory, so a record must also lie
   whole inside the ring's bytes before anything is copied out of it). */
static int64_t ring_next(const shm_ring_t *ring, uint64_t tail, uint64_t head, uint64_t *at) {
    if (tail == head) return SHM_RING_EMPTY;
    if (tail & 7) return SHM_RING_CORRUPT; /* records are 8-aligned */
    const uint8_t *data = ring_data((ring_t *)ring->header);
    uint64_t pos = tail & ring->mask;
    uint64_t len = *(const uint64_t *)(data + pos);
    if (len == WRAP_MARK) {
        tail += ring->capacity - pos;
        if (tail >= head) return SHM_RING_CORRUPT;
        pos = 0;
        len = *(const uint64_t *)data;
    }
    if (len > ring->max_payload || pos + RECORD_HEADER + align8(len) > ring->capacity ||
        tail + RECORD_HEADER + align8(len) > head)
        return SHM_RING_CORRUPT;
    *at = tail;
    return (int64_t)len;
}

static int64_t ring_fail(ring_t *r, int64_t code) {
    if (code == SHM_RING_CORRUPT) bump(&r->corrupt, 1);
    return code;
}

/* Returns the payload length, SHM_RING_EMPTY, SHM_RING_SHORT_BUFFER when out_cap
   is too small (the record stays), or SHM_RING_CORRUPT (nothing is consumed). */
int64_t shm_ring_pop(const shm_ring_t *ring, void *out, uint64_t out_cap) {
    ring_t *r = (ring_t *)ring->header;
    const uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_RELAXED); /* ours alone */
    /* acquire of head, pairs with the release in push: the record is whole */
    const uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
    uint64_t at;
    int64_t len = ring_next(ring, tail, head, &at);
    if (len < 0) return ring_fail(r, len);
    if ((uint64_t)len > out_cap) return SHM_RING_SHORT_BUFFER;
    memcpy(out, ring_data(r) + (at & ring->mask) + RECORD_HEADER, (size_t)len);
    /* release of tail, pairs with the acquire in push: our reads of the
       record are done before the producer may overwrite it */
    __atomic_store_n(&r->tail, at + RECORD_HEADER + align8((uint64_t)len), __ATOMIC_RELEASE);
    bump(&r->popped, 1);
    bump(&r->bytes_popped, (uint64_t)len);
    return len;
}

/* Drains up to max_n records into `out`, packed back to back, their lengths in
   `lens`; publishes the tail once. Returns the count (0 when empty), or
   SHM_RING_SHORT_BUFFER / SHM_RING_CORRUPT as pop when not even the first
   record could be taken. */
int64_t shm_ring_pop_batch(const shm_ring_t *ring, void *out, uint64_t out_cap, uint64_t *lens,
                           uint64_t max_n) {
    ring_t *r = (ring_t *)ring->header;
    uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_RELAXED); /* ours alone */
    /* acquire of head, pairs with the release in push: the records are whole */
    const uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
    uint64_t n = 0, used = 0, bytes = 0;
    while (n < max_n) {
        uint64_t at;
        int64_t len = ring_next(ring, tail, head, &at);
        if (len == SHM_RING_EMPTY) break;
        if (len < 0) {
            if (n == 0) return ring_fail(r, len);
            break; /* hand out what was good; the next call reports the damage */
        }
        if (used + (uint64_t)len > out_cap) {
            if (n == 0) return SHM_RING_SHORT_BUFFER;
            break;
        }
        memcpy((uint8_t *)out + used, ring_data(r) + (at & ring->mask) + RECORD_HEADER, (size_t)len);
        lens[n++] = (uint64_t)len;
        used += (uint64_t)len;
        bytes += (uint64_t)len;
        tail = at + RECORD_HEADER + align8((uint64_t)len);
    }
    if (n) {
        /* release of tail, pairs with the acquire in push (as in pop) */
        __atomic_store_n(&r->tail, tail, __ATOMIC_RELEASE);
        bump(&r->popped, n);
        bump(&r->bytes_popped, bytes);
    }
    return (int64_t)n;
}

/* Copies the record `skip` records past the tail without consuming anything
   (for inspectors; racy against a live consumer by nature, never unsafe:
   everything read is bounds-checked). Same returns as pop. */
int64_t shm_ring_peek(const shm_ring_t *ring, uint64_t skip, void *out, uint64_t out_cap) {
    ring_t *r = (ring_t *)ring->header;
    /* acquires of tail (pairs with pop's release) and head (pairs with push's):
       a snapshot no newer than what each side has published */
    uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
    const uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
    for (uint64_t i = 0;; i++) {
        uint64_t at;
        int64_t len = ring_next(ring, tail, head, &at);
        if (len < 0) return len;
        if (i == skip) {
            if ((uint64_t)len > out_cap) return SHM_RING_SHORT_BUFFER;
            memcpy(out, ring_data(r) + (at & ring->mask) + RECORD_HEADER, (size_t)len);
            return len;
        }
        tail = at + RECORD_HEADER + align8((uint64_t)len);
    }
}

/* When the newest record was pushed (CLOCK_MONOTONIC ns, as Python's
   time.monotonic_ns), 0 before the first: what a waiter that slept learns from
   (its wait lasted until it woke, its record came when it was pushed). */
uint64_t shm_ring_last_push_ns(const shm_ring_t *ring) {
    return __atomic_load_n(&((ring_t *)ring->header)->last_push_ns, __ATOMIC_RELAXED);
}

uint64_t shm_ring_used(const shm_ring_t *ring) {
    ring_t *r = (ring_t *)ring->header;
    /* acquire of head pairs with push; tail is the caller's own or a snapshot */
    uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
    return head - tail;
}

/* pop, polling for up to spin_ns while the ring is empty. Same returns. */
int64_t shm_ring_pop_spin(const shm_ring_t *ring, void *out, uint64_t out_cap, uint64_t spin_ns) {
    int64_t n = shm_ring_pop(ring, out, out_cap);
    if (n != SHM_RING_EMPTY || spin_ns == 0) return n;
    if (shm_ring_wait_used(ring, spin_ns) == 0) return SHM_RING_EMPTY;
    return shm_ring_pop(ring, out, out_cap);
}

/* Polls for up to spin_ns until the ring holds something; returns the bytes used. */
uint64_t shm_ring_wait_used(const shm_ring_t *ring, uint64_t spin_ns) {
    const uint64_t deadline = now_ns() + spin_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            uint64_t used = shm_ring_used(ring);
            if (used) return used;
            cpu_relax();
        }
        if (now_ns() >= deadline) return 0;
    }
}

/* The consumer announces that it will sleep. Returns 1 when records arrived
   meanwhile (do not sleep; the flag is cleared), else 0 (sleep, and call
   end_sleep on waking). */
int shm_ring_prepare_sleep(const shm_ring_t *ring) {
    ring_t *r = (ring_t *)ring->header;
    __atomic_store_n(&r->sleeping, 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* pairs with the fence in push */
    if (__atomic_load_n(&r->head, __ATOMIC_ACQUIRE) != __atomic_load_n(&r->tail, __ATOMIC_RELAXED)) {
        __atomic_store_n(&r->sleeping, 0, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

void shm_ring_end_sleep(const shm_ring_t *ring) {
    __atomic_store_n(&((ring_t *)ring->header)->sleeping, 0, __ATOMIC_RELEASE);
}

/* Empties the ring for a new producer/consumer pair. Only when neither side is
   running (the peer is dead or gone); counters are kept. */
void shm_ring_reset(const shm_ring_t *ring) {
    ring_t *r = (ring_t *)ring->header;
    uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
    __atomic_store_n(&r->tail, head, __ATOMIC_RELEASE);
    __atomic_store_n(&r->sleeping, 0, __ATOMIC_RELEASE);
}

/* A snapshot of the counters. Relaxed loads: each is untorn, and an inspector
   needs no ordering between them (a live ring moves while it reads). */
#define LOAD(from, field) out->field = __atomic_load_n(&(from)->field, __ATOMIC_RELAXED)
void shm_ring_stats(const shm_ring_t *ring, shm_ring_stats_t *out) {
    const ring_t *r = (const ring_t *)ring->header;
    out->capacity = ring->capacity;
    LOAD(r, head);
    LOAD(r, tail);
    LOAD(r, pushed);
    LOAD(r, popped);
    LOAD(r, bytes_pushed);
    LOAD(r, bytes_popped);
    LOAD(r, full_events);
    LOAD(r, high_water);
    LOAD(r, oversized);
    LOAD(r, corrupt);
    LOAD(r, wakeups);
    LOAD(r, sleeping);
}

/* -- slab ------------------------------------------------------------------
 *
 * Metadata only: the slots' bytes live elsewhere in the segment. Each slot has
 * one state word, generation << 2 | state, so that a state change and the
 * generation check are one compare-and-swap: a release with a stale generation
 * can never free a slot that has since been reused.
 */

typedef struct {
    uint64_t magic, slots, max_owners, slot_size, quota, hint;
    uint64_t _pad0[LINE_WORDS - 6];
    uint64_t acquired, released, stale_refused, quota_refused, full_events, reclaimed, held,
        high_water, aborted, foreign_refused;
    uint64_t _pad1[LINE_WORDS - 10];
} slab_t;

typedef struct {
    uint64_t word, owner, since_ns, _pad;
} slot_t;

_Static_assert(sizeof(slab_t) == 256, "slab header is two 128-byte lines");

static inline uint64_t owners_words(uint64_t max_owners) { return (max_owners + 15) & ~(uint64_t)15; }
static inline slab_t *slab_header(const shm_slab_t *slab) { return (slab_t *)slab->header; }
static inline uint64_t *slab_held(const shm_slab_t *slab) {
    return (uint64_t *)(slab_header(slab) + 1);
}
/* where the slot words begin: from the owner count this process opened with */
static inline slot_t *slab_slots(const shm_slab_t *slab) {
    return (slot_t *)(slab_held(slab) + owners_words(slab->max_owners));
}

uint64_t shm_slab_meta_size(uint64_t slots, uint64_t max_owners) {
    return sizeof(slab_t) + 8 * owners_words(max_owners) + sizeof(slot_t) * slots;
}

int shm_slab_init(void *header, uint64_t slots, uint64_t max_owners, uint64_t slot_size,
                  uint64_t quota) {
    slab_t *s = (slab_t *)header;
    if (slots == 0 || max_owners == 0 || slot_size == 0) return SHM_BAD_ARGUMENT;
    memset(s, 0, shm_slab_meta_size(slots, max_owners));
    s->slots = slots;
    s->max_owners = max_owners;
    s->slot_size = slot_size;
    s->quota = quota ? quota : slots;
    /* release: layout visible before the magic; pairs with shm_slab_open */
    __atomic_store_n(&s->magic, SLAB_MAGIC, __ATOMIC_RELEASE);
    return SHM_OK;
}

/* Checks the slab header at `header` (in a region of region_size bytes) and
   fills *slab with its geometry, read once: every later call uses that, never
   the header again (a peer that maps the header writable may scribble on it).
   Returns the slot count, or SHM_LAYOUT_MISSING / _DAMAGED / _TOO_BIG. */
int64_t shm_slab_open(shm_slab_t *slab, void *header, uint64_t region_size) {
    slab_t *s = (slab_t *)header;
    if (region_size < sizeof(slab_t)) return SHM_LAYOUT_MISSING;
    /* acquire of the magic, pairs with the release in init */
    if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != SLAB_MAGIC) return SHM_LAYOUT_MISSING;
    const uint64_t slots = s->slots, max_owners = s->max_owners, slot_size = s->slot_size,
                   quota = s->quota;
    if (slots == 0 || max_owners == 0 || slot_size == 0 || slots > (1ULL << 32) ||
        max_owners > (1ULL << 20) || quota == 0)
        return SHM_LAYOUT_DAMAGED;
    if (shm_slab_meta_size(slots, max_owners) > region_size) return SHM_LAYOUT_TOO_BIG;
    slab->header = header;
    slab->slots = slots;
    slab->max_owners = max_owners;
    slab->slot_size = slot_size;
    slab->quota = quota;
    return (int64_t)slots;
}

static void slab_unhold(const shm_slab_t *slab, uint64_t owner) {
    slab_t *s = slab_header(slab);
    __atomic_fetch_sub(&slab_held(slab)[owner], 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_sub(&s->held, 1, __ATOMIC_RELAXED);
}

/* Takes a free slot for `owner` (FREE -> WRITING). Returns its index and sets
   *generation, or SHM_SLAB_FULL when no slot is free, SHM_SLAB_QUOTA when the
   owner holds its quota, SHM_SLAB_RANGE for an owner out of range. */
int64_t shm_slab_acquire(const shm_slab_t *slab, uint64_t owner, uint64_t now_ns,
                         uint64_t *generation) {
    slab_t *s = slab_header(slab);
    if (owner >= slab->max_owners) return SHM_SLAB_RANGE;
    uint64_t *held = &slab_held(slab)[owner];
    if (__atomic_fetch_add(held, 1, __ATOMIC_ACQ_REL) >= slab->quota) {
        __atomic_fetch_sub(held, 1, __ATOMIC_ACQ_REL);
        __atomic_fetch_add(&s->quota_refused, 1, __ATOMIC_RELAXED);
        return SHM_SLAB_QUOTA;
    }
    slot_t *slots = slab_slots(slab);
    const uint64_t n = slab->slots;
    const uint64_t start = __atomic_load_n(&s->hint, __ATOMIC_RELAXED) % n;
    for (uint64_t k = 0; k < n; k++) {
        const uint64_t i = (start + k) % n;
        uint64_t word = __atomic_load_n(&slots[i].word, __ATOMIC_ACQUIRE);
        if ((word & 3) != SHM_SLOT_FREE) continue;
        /* acq_rel CAS: takes the slot; pairs with the release/CAS that freed it */
        if (!__atomic_compare_exchange_n(&slots[i].word, &word, (word & ~3ULL) | SHM_SLOT_WRITING, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        __atomic_store_n(&slots[i].owner, owner, __ATOMIC_RELAXED);
        __atomic_store_n(&slots[i].since_ns, now_ns, __ATOMIC_RELAXED);
        __atomic_store_n(&s->hint, i + 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&s->acquired, 1, __ATOMIC_RELAXED);
        uint64_t total = __atomic_add_fetch(&s->held, 1, __ATOMIC_RELAXED);
        if (total > __atomic_load_n(&s->high_water, __ATOMIC_RELAXED))
            __atomic_store_n(&s->high_water, total, __ATOMIC_RELAXED);
        *generation = word >> 2;
        return (int64_t)i;
    }
    __atomic_fetch_sub(held, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&s->full_events, 1, __ATOMIC_RELAXED);
    return SHM_SLAB_FULL;
}

static int slab_move(const shm_slab_t *slab, uint64_t slot, uint64_t generation, uint64_t from,
                     uint64_t to) {
    slab_t *s = slab_header(slab);
    if (slot >= slab->slots) return SHM_SLAB_RANGE;
    uint64_t expected = (generation << 2) | from;
    /* the release half publishes the slot's bytes (WRITING -> READY) or hands
       the slot back (-> FREE); pairs with the acquire in acquire/slot */
    if (__atomic_compare_exchange_n(&slab_slots(slab)[slot].word, &expected, to, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return SHM_OK;
    __atomic_fetch_add(&s->stale_refused, 1, __ATOMIC_RELAXED);
    return SHM_SLAB_STALE;
}

/* WRITING -> READY at the same generation. SHM_OK, SHM_SLAB_STALE or _RANGE. */
int shm_slab_publish(const shm_slab_t *slab, uint64_t slot, uint64_t generation) {
    return slab_move(slab, slot, generation, SHM_SLOT_WRITING, (generation << 2) | SHM_SLOT_READY);
}

/* 1 when the slot is published at `generation` (acquire: its bytes are
   visible; pairs with the release in publish). */
int shm_slab_is_ready(const shm_slab_t *slab, uint64_t slot, uint64_t generation) {
    if (slot >= slab->slots) return 0;
    return __atomic_load_n(&slab_slots(slab)[slot].word, __ATOMIC_ACQUIRE) ==
           ((generation << 2) | SHM_SLOT_READY);
}

/* READY -> FREE with the next generation. SHM_OK, SHM_SLAB_STALE,
   SHM_SLAB_FOREIGN for another owner's slot, or SHM_SLAB_RANGE. */
int shm_slab_release(const shm_slab_t *slab, uint64_t slot, uint64_t generation, uint64_t owner) {
    slab_t *s = slab_header(slab);
    if (slot >= slab->slots || owner >= slab->max_owners) return SHM_SLAB_RANGE;
    /* this generation's owner was stored before publish's release, which the
       reader's acquire in is_ready saw; had the slot been reused since, the
       generation in slab_move's CAS refuses the release */
    if (__atomic_load_n(&slab_slots(slab)[slot].owner, __ATOMIC_ACQUIRE) != owner) {
        __atomic_fetch_add(&s->foreign_refused, 1, __ATOMIC_RELAXED);
        return SHM_SLAB_FOREIGN;
    }
    int rc = slab_move(slab, slot, generation, SHM_SLOT_READY, ((generation + 1) << 2) | SHM_SLOT_FREE);
    if (rc == SHM_OK) {
        slab_unhold(slab, owner);
        __atomic_fetch_add(&s->released, 1, __ATOMIC_RELAXED);
    }
    return rc;
}

/* WRITING -> FREE: the writer gives up a slot it never published. SHM_OK,
   SHM_SLAB_STALE or SHM_SLAB_RANGE. */
int shm_slab_abort(const shm_slab_t *slab, uint64_t slot, uint64_t generation) {
    slab_t *s = slab_header(slab);
    if (slot >= slab->slots) return SHM_SLAB_RANGE;
    uint64_t owner = __atomic_load_n(&slab_slots(slab)[slot].owner, __ATOMIC_ACQUIRE);
    int rc = slab_move(slab, slot, generation, SHM_SLOT_WRITING, ((generation + 1) << 2) | SHM_SLOT_FREE);
    if (rc == SHM_OK) {
        /* the owner word is shared: a scribbled one is refused, never indexed past */
        if (owner < slab->max_owners) slab_unhold(slab, owner);
        __atomic_fetch_add(&s->aborted, 1, __ATOMIC_RELAXED);
    }
    return rc;
}

/* -- batches: one call for a step's slots ----------------------------------
 *
 * A writer that emits several chunks to one reader at once takes their slots
 * in one call, publishes them in one call, and the reader checks and releases
 * them in one call each: the boundary costs per step, not per chunk. */

/* Takes slot i for `owner` if it is free: 1 when taken (sets *generation). */
static int slab_take(const shm_slab_t *slab, uint64_t i, uint64_t owner, uint64_t now_ns,
                     uint64_t *generation) {
    slot_t *t = &slab_slots(slab)[i];
    uint64_t word = __atomic_load_n(&t->word, __ATOMIC_ACQUIRE);
    if ((word & 3) != SHM_SLOT_FREE) return 0;
    /* acq_rel CAS as in acquire: pairs with the release/CAS that freed it */
    if (!__atomic_compare_exchange_n(&t->word, &word, (word & ~3ULL) | SHM_SLOT_WRITING, 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0;
    __atomic_store_n(&t->owner, owner, __ATOMIC_RELAXED);
    __atomic_store_n(&t->since_ns, now_ns, __ATOMIC_RELAXED);
    *generation = word >> 2;
    return 1;
}

/* Gives back slots taken by slab_take that were never handed out (same
   generation: nobody saw them WRITING for this owner). */
static void slab_untake(const shm_slab_t *slab, const uint64_t *slots, const uint64_t *generations,
                        uint64_t n) {
    for (uint64_t k = 0; k < n; k++)
        __atomic_store_n(&slab_slots(slab)[slots[k]].word, (generations[k] << 2) | SHM_SLOT_FREE,
                         __ATOMIC_RELEASE);
}

/* Whether slots i .. i+n-1 all look free (a hint: slab_take decides). */
static int slab_run_free(const shm_slab_t *slab, uint64_t i, uint64_t n) {
    slot_t *slots = slab_slots(slab);
    for (uint64_t k = 0; k < n; k++)
        if ((__atomic_load_n(&slots[i + k].word, __ATOMIC_RELAXED) & 3) != SHM_SLOT_FREE) return 0;
    return 1;
}

/* Takes n slots for `owner`, all or none: a run of n adjacent slots when one is
   free (searched from the hint, never wrapping past the last slot, so the run's
   bytes are contiguous), otherwise any n free slots in ascending order. Fills
   slots[] and generations[]. Returns 1 when they form one run, 0 when not,
   SHM_SLAB_QUOTA when the owner would hold more than its quota, SHM_SLAB_FULL
   when fewer than n are free, SHM_SLAB_RANGE for an owner out of range, and
   SHM_BAD_ARGUMENT for n == 0. */
int64_t shm_slab_acquire_batch(const shm_slab_t *slab, uint64_t owner, uint64_t n, uint64_t now_ns,
                               uint64_t *slots, uint64_t *generations) {
    slab_t *s = slab_header(slab);
    if (owner >= slab->max_owners) return SHM_SLAB_RANGE;
    if (n == 0 || n > slab->slots) return n == 0 ? SHM_BAD_ARGUMENT : SHM_SLAB_FULL;
    uint64_t *held = &slab_held(slab)[owner];
    if (__atomic_fetch_add(held, n, __ATOMIC_ACQ_REL) + n > slab->quota) {
        __atomic_fetch_sub(held, n, __ATOMIC_ACQ_REL);
        __atomic_fetch_add(&s->quota_refused, 1, __ATOMIC_RELAXED);
        return SHM_SLAB_QUOTA;
    }
    const uint64_t total = slab->slots;
    const uint64_t hint = __atomic_load_n(&s->hint, __ATOMIC_RELAXED) % total;
    uint64_t got = 0;
    int64_t run = 0;
    /* a run: candidate starts from the hint to the last that fits, then from 0 */
    for (uint64_t pass = 0; pass < 2 && !run; pass++) {
        uint64_t from = pass ? 0 : hint, to = pass ? (hint < total - n + 1 ? hint : total - n + 1)
                                                   : total - n + 1;
        for (uint64_t i = from; i < to && !run; i++) {
            if (!slab_run_free(slab, i, n)) continue;
            for (got = 0; got < n; got++) {
                slots[got] = i + got;
                if (!slab_take(slab, i + got, owner, now_ns, &generations[got])) break;
            }
            if (got == n) {
                run = 1;
                break;
            }
            slab_untake(slab, slots, generations, got); /* raced: give back, look on */
            got = 0;
        }
    }
    /* no run: any free slots */
    for (uint64_t i = 0; !run && i < total && got < n; i++) {
        if (slab_take(slab, i, owner, now_ns, &generations[got])) slots[got++] = i;
    }
    if (got < n) {
        slab_untake(slab, slots, generations, got);
        __atomic_fetch_sub(held, n, __ATOMIC_ACQ_REL);
        __atomic_fetch_add(&s->full_events, 1, __ATOMIC_RELAXED);
        return SHM_SLAB_FULL;
    }
    __atomic_store_n(&s->hint, slots[n - 1] + 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->acquired, n, __ATOMIC_RELAXED);
    uint64_t sum = __atomic_add_fetch(&s->held, n, __ATOMIC_RELAXED);
    if (sum > __atomic_load_n(&s->high_water, __ATOMIC_RELAXED))
        __atomic_store_n(&s->high_water, sum, __ATOMIC_RELAXED);
    return run;
}

/* Applies `move` (publish or abort) to each slot. Returns SHM_OK, or the first
   refusal's code; every other slot is still moved. */
static int64_t slab_each(const shm_slab_t *slab, const uint64_t *slots, const uint64_t *generations,
                         uint64_t n, int (*move)(const shm_slab_t *, uint64_t, uint64_t)) {
    int64_t first = SHM_OK;
    for (uint64_t k = 0; k < n; k++) {
        int rc = move(slab, slots[k], generations[k]);
        if (rc && first == SHM_OK) first = rc;
    }
    return first;
}

/* Publishes each slot (WRITING -> READY): SHM_OK or the first refusal's code. */
int64_t shm_slab_publish_batch(const shm_slab_t *slab, const uint64_t *slots,
                               const uint64_t *generations, uint64_t n) {
    return slab_each(slab, slots, generations, n, shm_slab_publish);
}

/* How many of the slots, from the first, are published at their generation
   (n when all are; acquire: their bytes are visible). */
int64_t shm_slab_ready_batch(const shm_slab_t *slab, const uint64_t *slots,
                             const uint64_t *generations, uint64_t n) {
    for (uint64_t k = 0; k < n; k++)
        if (!shm_slab_is_ready(slab, slots[k], generations[k])) return (int64_t)k;
    return (int64_t)n;
}

/* Releases each slot (READY -> FREE) for `owner`; sets *released to how many
   were. Returns SHM_OK, or the first refusal's code (stale, foreign, range);
   every other slot is still released. */
int64_t shm_slab_release_batch(const shm_slab_t *slab, const uint64_t *slots,
                               const uint64_t *generations, uint64_t n, uint64_t owner,
                               uint64_t *released) {
    int64_t first = SHM_OK;
    uint64_t done = 0;
    for (uint64_t k = 0; k < n; k++) {
        int rc = shm_slab_release(slab, slots[k], generations[k], owner);
        if (rc == SHM_OK)
            done++;
        else if (first == SHM_OK)
            first = rc;
    }
    *released = done;
    return first;
}

/* Aborts each slot (WRITING -> FREE): SHM_OK or the first refusal's code. */
int64_t shm_slab_abort_batch(const shm_slab_t *slab, const uint64_t *slots,
                             const uint64_t *generations, uint64_t n) {
    return slab_each(slab, slots, generations, n, shm_slab_abort);
}

/* Frees every slot `owner` holds (a dead client's). Returns how many, or
   SHM_SLAB_RANGE. */
int64_t shm_slab_reclaim(const shm_slab_t *slab, uint64_t owner) {
    slab_t *s = slab_header(slab);
    if (owner >= slab->max_owners) return SHM_SLAB_RANGE;
    slot_t *slots = slab_slots(slab);
    int64_t n = 0;
    for (uint64_t i = 0; i < slab->slots; i++) {
        uint64_t word = __atomic_load_n(&slots[i].word, __ATOMIC_ACQUIRE);
        while ((word & 3) != SHM_SLOT_FREE &&
               __atomic_load_n(&slots[i].owner, __ATOMIC_ACQUIRE) == owner) {
            uint64_t next = (((word >> 2) + 1) << 2) | SHM_SLOT_FREE;
            if (__atomic_compare_exchange_n(&slots[i].word, &word, next, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                slab_unhold(slab, owner);
                n++;
                break;
            }
        }
    }
    __atomic_fetch_add(&s->reclaimed, (uint64_t)n, __ATOMIC_RELAXED);
    return n;
}

/* One slot's state, generation, owner and since_ns (slot 0's for an index out
   of range: callers check the index first). */
void shm_slab_slot(const shm_slab_t *slab, uint64_t slot, shm_slot_info_t *out) {
    slot_t *t = &slab_slots(slab)[slot < slab->slots ? slot : 0];
    /* acquire of the state word, pairs with the release half of slab_move */
    uint64_t word = __atomic_load_n(&t->word, __ATOMIC_ACQUIRE);
    out->state = word & 3;
    out->generation = word >> 2;
    out->owner = __atomic_load_n(&t->owner, __ATOMIC_RELAXED);
    out->since_ns = __atomic_load_n(&t->since_ns, __ATOMIC_RELAXED);
}

/* A snapshot of the slab's counters; relaxed, as shm_ring_stats. */
void shm_slab_stats(const shm_slab_t *slab, shm_slab_stats_t *out) {
    const slab_t *s = slab_header(slab);
    out->slots = slab->slots; /* the geometry as opened, not as the header says now */
    out->max_owners = slab->max_owners;
    out->slot_size = slab->slot_size;
    out->quota = slab->quota;
    LOAD(s, acquired);
    LOAD(s, released);
    LOAD(s, stale_refused);
    LOAD(s, quota_refused);
    LOAD(s, full_events);
    LOAD(s, reclaimed);
    LOAD(s, held);
    LOAD(s, high_water);
    LOAD(s, aborted);
    LOAD(s, foreign_refused);
}
#undef LOAD

uint64_t shm_slab_held(const shm_slab_t *slab, uint64_t owner) {
    return owner < slab->max_owners ? __atomic_load_n(&slab_held(slab)[owner], __ATOMIC_ACQUIRE)
                                    : 0;
}

/* -- records of rows, popped and judged in one call ------------------------ */

/* Drains up to max_n records as shm_ring_pop_batch does (same return), then
   judges each as a record of rows, push_rows's layout read back: a head of
   head_len bytes whose first byte is `type` and whose row count n is the u32 at
   count_at, then the six columns of n rows, nothing after. info[k] is, for
   record k: its first slot when n >= 1, the length is exactly that, every
   handle is below nhandles, every slot is published at its generation in
   `slab` (acquire: the slots' bytes are visible) and the slots are one
   ascending run; SHM_ROWS_SCATTERED when all but the run holds; SHM_ROWS_OTHER
   for any other record and for rows that fail a check (the reader judges
   those the slow way, which says what is wrong). The columns are read with
   memcpy: records lie back to back in `out`, not 8-aligned after a notice. */
int64_t shm_ring_pop_rows(const shm_ring_t *ring, const shm_slab_t *slab, void *out,
                          uint64_t out_cap, uint64_t *lens, int64_t *info, uint64_t max_n,
                          uint64_t type, uint64_t head_len, uint64_t count_at, uint64_t nhandles) {
    int64_t got = shm_ring_pop_batch(ring, out, out_cap, lens, max_n);
    const uint8_t *rec = (const uint8_t *)out;
    for (int64_t k = 0; k < got; rec += lens[k], k++) {
        info[k] = SHM_ROWS_OTHER;
        const uint64_t len = lens[k];
        uint32_t n32;
        if (len < head_len || count_at + 4 > head_len || rec[0] != type) continue;
        memcpy(&n32, rec + count_at, 4);
        const uint64_t n = n32;
        if (n == 0 || len != head_len + n * (8 + 8 + 8 + 8 + 4 + 4)) continue;
        const uint8_t *col = rec + head_len;
        int ok = 1, run = 1;
        uint64_t first = 0;
        for (uint64_t i = 0; i < n && ok; i++) {
            uint64_t slot, generation;
            uint32_t handle;
            memcpy(&slot, col + 8 * i, 8);
            memcpy(&generation, col + 8 * (n + i), 8);
            memcpy(&handle, col + 32 * n + 4 * i, 4);
            if (i == 0) first = slot;
            else if (slot != first + i) run = 0;
            ok = handle < nhandles && shm_slab_is_ready(slab, slot, generation);
        }
        if (ok) info[k] = run && first <= INT64_MAX ? (int64_t)first : SHM_ROWS_SCATTERED;
    }
    return got;
}

/* -- a reader of records of rows: its pops timed, its give backs one call ----- */

uint64_t shm_log_bucket(int64_t ns, uint64_t nbuckets) {
    if (ns <= 0 || nbuckets == 0) return 0;
    const uint64_t v = (uint64_t)ns;
    const uint64_t bits = 64u - (uint64_t)__builtin_clzll(v);
    if (bits <= 7) return 0;
    const uint64_t index = 4u * (bits - 7u) + ((v >> (bits - 3u)) & 3u);
    return index < nbuckets ? index : nbuckets - 1;
}

/* shm_ring_pop_rows with the reader's settings and buffers; then, for every record judged
   ready (info[k] != SHM_ROWS_OTHER), adds the time from its push stamp to now
   to the reader's histogram (single writer: plain adds). Same return. */
int64_t shm_rows_pop(const shm_rows_t *r) {
    const uint64_t *lens = r->lens;
    const int64_t *info = r->info;
    const int64_t got = shm_ring_pop_rows(r->ring, r->slab, r->out, r->out_cap, r->lens, r->info,
                                          r->max_n, r->type, r->head_len, r->count_at,
                                          r->nhandles);
    if (got <= 0 || r->histogram == NULL || r->stamp_at + 8 > r->head_len) return got;
    const int64_t now = (int64_t)now_ns();
    const uint8_t *rec = (const uint8_t *)r->out;
    for (int64_t k = 0; k < got; rec += lens[k], k++) {
        if (info[k] == SHM_ROWS_OTHER) continue;
        int64_t stamp;
        memcpy(&stamp, rec + r->stamp_at, 8);
        bump(&r->histogram[shm_log_bucket(now - stamp, r->nbuckets)], 1);
    }
    return got;
}

/* Gives back rows of a record this reader judged (`rec`, `len` bytes): the
   slot of each row (all of them when pick is NULL, else rows pick[0..npick),
   positions out of range skipped) released for r->owner, every other slot
   still released after a refusal. When every one was released and `credit`:
   one to counts[handle] of each (a release add, as shm_add_ones), the clock
   stamped in the given word, then the starved word cleared. Returns the
   first refusal's code (nothing credited), else 2 * released + 1 when the
   starved word was set (the caller rings the writer), 2 * released when not;
   SHM_BAD_ARGUMENT for a record that is not one of rows of this reader's head. */
int64_t shm_rows_give_back(const shm_rows_t *r, const uint8_t *rec, uint64_t len,
                           const int64_t *pick, uint64_t npick, int credit) {
    const shm_slab_t *slab = r->slab;
    uint32_t n32;
    if (len < r->head_len || r->count_at + 4 > r->head_len) return SHM_BAD_ARGUMENT;
    memcpy(&n32, rec + r->count_at, 4);
    const uint64_t n = n32;
    if (len != r->head_len + n * (8 + 8 + 8 + 8 + 4 + 4)) return SHM_BAD_ARGUMENT;
    const uint8_t *col = rec + r->head_len;
    const uint64_t m = pick == NULL ? n : npick;
    int64_t first = SHM_OK;
    uint64_t done = 0;
    for (uint64_t k = 0; k < m; k++) {
        uint64_t i = k, slot, generation;
        if (pick != NULL) {
            if (pick[k] < 0 || (uint64_t)pick[k] >= n) continue;
            i = (uint64_t)pick[k];
        }
        memcpy(&slot, col + 8 * i, 8);
        memcpy(&generation, col + 8 * (n + i), 8);
        const int rc = shm_slab_release(slab, slot, generation, r->owner);
        if (rc == SHM_OK)
            done++;
        else if (first == SHM_OK)
            first = rc;
    }
    if (first != SHM_OK) return first;
    int64_t out = (int64_t)(2 * done);
    if (!credit) return out;
    if (r->counts != NULL) {
        for (uint64_t k = 0; k < m; k++) {
            uint64_t i = k;
            uint32_t handle;
            if (pick != NULL) {
                if (pick[k] < 0 || (uint64_t)pick[k] >= n) continue;
                i = (uint64_t)pick[k];
            }
            memcpy(&handle, col + 32 * n + 4 * i, 4);
            if (handle < r->ncounts) __atomic_fetch_add(&r->counts[handle], 1, __ATOMIC_RELEASE);
        }
    }
    /* when the credits came: a writer that waited for them learns that, not its wake-up */
    if (r->given != NULL) __atomic_store_n(r->given, now_ns(), __ATOMIC_RELEASE);
    if (r->starved != NULL) {
        uint64_t expected = 1;
        /* full barrier after the counts, as ClientBlock.feed's cas */
        if (__atomic_compare_exchange_n(r->starved, &expected, 0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            out += 1;
    }
    return out;
}

/* -- a writer of records of rows: publish, push and count in one call ------- */

void shm_figures_count(const shm_figures_t *f, const uint32_t *handles, const uint32_t *applied,
                       uint64_t n, int64_t now_ns) {
    for (uint64_t k = 0; k < n; k++) {
        const uint64_t h = handles[k];
        if (h >= f->handles) continue;
        int64_t *row = f->words + h * f->nwords;
        const int64_t before = row[SHM_FIGURE_LAST_NS];
        if (before == 0) { /* the session's first chunk: on time, no gap */
            row[SHM_FIGURE_FIRST_NS] = now_ns;
            row[SHM_FIGURE_ON_TIME] += 1;
        } else {
            const int64_t gap = now_ns - before;
            row[SHM_FIGURE_ON_TIME] += gap <= f->late_ns;
            if (gap > row[SHM_FIGURE_LONGEST_GAP_NS]) row[SHM_FIGURE_LONGEST_GAP_NS] = gap;
            f->gaps[h * f->nbuckets + shm_log_bucket(gap, f->nbuckets)] += 1;
        }
        row[SHM_FIGURE_CHUNKS] += 1;
        row[SHM_FIGURE_LAST_NS] = now_ns;
        const int64_t pending = row[SHM_FIGURE_PENDING_SEQ];
        if (applied != NULL && pending > 0 && (int64_t)applied[k] >= pending) {
            const int64_t waited = now_ns - row[SHM_FIGURE_PENDING_NS];
            f->photons[h * f->nbuckets + shm_log_bucket(waited, f->nbuckets)] += 1;
            row[SHM_FIGURE_PHOTONS] += 1;
            row[SHM_FIGURE_PENDING_SEQ] = 0;
        }
    }
}

/* One record of rows out, as a writer's three steps would send it: publish
   every slot (WRITING -> READY), then push the record in place
   (shm_ring_push_rows, count_full 0), then count it: its pushed-minus-emitted
   time into the histogram (and the total), one at counts[handles[k]] per row.
   A slot the writer does not hold any more (reclaimed) refuses its publish:
   then nothing is pushed or counted, *pushed_ns is -1 and its code returned
   (the other slots are published all the same, as shm_slab_publish_batch).
   Otherwise returns shm_ring_push_rows' code: SHM_OK or SHM_WAKE (pushed and
   counted, *pushed_ns its stamp), or a refusal (SHM_RING_FULL...: published,
   not pushed, *pushed_ns 0: the caller sends the record its own way). */
int shm_rows_send(const shm_rows_out_t *w, const char *head, uint64_t head_len,
                  const uint64_t *slots, const uint64_t *generations, const int64_t *chunks,
                  const int64_t *generated, uint64_t generated_stride, const uint32_t *handles,
                  const uint32_t *applied, uint64_t n, int64_t emitted_ns, int64_t *pushed_ns) {
    *pushed_ns = 0;
    if (n == 0) return SHM_BAD_ARGUMENT;
    const int64_t refused = shm_slab_publish_batch(w->slab, slots, generations, n);
    if (refused != SHM_OK) {
        *pushed_ns = -1;
        return (int)refused;
    }
    int64_t pushed = 0;
    const int rc = shm_ring_push_rows(w->ring, head, head_len, w->stamp_at, slots, generations,
                                      chunks, generated, generated_stride, handles, applied, n,
                                      0, &pushed);
    if (rc != SHM_OK && rc != SHM_WAKE) return rc;
    *pushed_ns = pushed;
    const int64_t took = pushed - emitted_ns;
    if (w->histogram != NULL) bump(&w->histogram[shm_log_bucket(took, w->nbuckets)], 1);
    if (w->total != NULL && took > 0) bump(w->total, (uint64_t)took);
    if (w->counts != NULL)
        for (uint64_t k = 0; k < n; k++)
            if (handles[k] < w->ncounts) w->counts[handles[k]] += 1;
    if (w->figures != NULL) shm_figures_count(w->figures, handles, applied, n, emitted_ns);
    return rc;
}
