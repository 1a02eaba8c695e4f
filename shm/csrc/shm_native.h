/* The C part of shm: atomics, the SPSC ring and the slab's slot states.
 *
 * This header is also the cffi cdef (shm/_build.py reads it), so it holds only
 * what cffi's cdef understands: enums with explicit values, fully defined
 * structs, and declarations; no macros, no includes (the .c includes
 * <stdint.h> before it). Everything a caller sees is declared here once:
 * Python reads the status codes and slot states from `lib` (lib.SHM_RING_FULL)
 * and the statistics structs field by field, by name. The layouts of a ring and
 * a slab in shared memory are private to shm_native.c; Python never touches a
 * ring's head or tail or a slot's state word except through these functions.
 */

/* -- status codes ----------------------------------------------------------
 * What every function below that can fail returns. Each negative value has one
 * meaning across the whole module, so shm/errors.py::check_rc maps a code to
 * its exception class without knowing which call returned it. Functions that
 * return a count or a length return it as a non-negative value instead. */
enum shm_status {
    SHM_OK = 0,
    SHM_WAKE = 1, /* pushed, and the consumer sleeps: ring its doorbell */
    SHM_RING_FULL = -1,
    SHM_RING_EMPTY = -2,
    SHM_RING_TOO_LARGE = -3, /* a record over max_payload: it can never fit */
    SHM_RING_CORRUPT = -4,   /* the bytes are not valid records; nothing consumed */
    SHM_RING_SHORT_BUFFER = -5, /* the caller's buffer is smaller than the record */
    SHM_SLAB_FULL = -10,
    SHM_SLAB_QUOTA = -11,
    SHM_SLAB_FOREIGN = -12, /* a release of another owner's slot */
    SHM_SLAB_RANGE = -13,   /* a slot or owner index past the slab's */
    SHM_SLAB_STALE = -14,   /* the slot is not in that state at that generation */
    SHM_LAYOUT_MISSING = -20, /* no magic there, or the region is too small */
    SHM_LAYOUT_DAMAGED = -21, /* the magic is there, the header inconsistent */
    SHM_LAYOUT_TOO_BIG = -22, /* the header says it runs past the region */
    SHM_BAD_ARGUMENT = -23
};

/* What shm_ring_pop_rows says of a record that is not one run of ready rows. */
enum shm_rows { SHM_ROWS_OTHER = -1, SHM_ROWS_SCATTERED = -2 };

/* A slab slot's state: the low two bits of its state word. */
enum shm_slot_state { SHM_SLOT_FREE = 0, SHM_SLOT_WRITING = 1, SHM_SLOT_READY = 2 };

/* -- statistics: snapshots of the counters kept in shared memory ----------- */
typedef struct {
    uint64_t capacity, head, tail, pushed, popped, bytes_pushed, bytes_popped, full_events,
        high_water, oversized, corrupt, wakeups, sleeping;
} shm_ring_stats_t;

typedef struct {
    uint64_t slots, max_owners, slot_size, quota, acquired, released, stale_refused,
        quota_refused, full_events, reclaimed, held, high_water, aborted, foreign_refused;
} shm_slab_stats_t;

typedef struct {
    uint64_t state, generation, owner, since_ns;
} shm_slot_info_t;

/* -- atomics on 8-byte words in shared memory -- */
uint64_t shm_load_acquire(const uint64_t *p);
uint64_t shm_load_relaxed(const uint64_t *p);
void shm_store_release(uint64_t *p, uint64_t v);
int shm_cas(uint64_t *p, uint64_t expected, uint64_t desired);
uint64_t shm_fetch_add(uint64_t *p, uint64_t v);
int shm_spin_until_equal(const uint64_t *p, uint64_t value, uint64_t spin_ns);
/* One to each of counts[index[k]] (or counts[index[rows[k]]] with rows), k < n:
   a client's credits for a batch's rows, in one call; see shm_native.c. */
uint64_t shm_add_ones(uint64_t *counts, uint64_t ncounts, const uint32_t *index,
                      uint64_t nindex, const int64_t *rows, uint64_t n);
/* 1 when slots[0..n) are s, s+1, ..., s+n-1 (every slot looked at), else 0 (n 0: 0). */
int shm_one_run(const uint64_t *slots, uint64_t n);
/* due[h] = 1 where bound[h] and emitted[h] - consumed[h] < credits[h], else 0,
   h < n: which of a client's sessions may step (consumed: the client's counts,
   read once each); returns how many may. */
uint64_t shm_with_credit(const int64_t *emitted, const uint64_t *consumed, const int64_t *credits,
                         const uint8_t *bound, uint8_t *due, uint64_t n);

/* -- ring: single producer, single consumer, variable-length records --
 * A ring is used through a shm_ring_t: where its header is mapped in this
 * process and the geometry checked when it was opened (shm_ring_open). The C
 * never re-reads capacity, mask or max_payload from shared memory, where the
 * peer could have changed them: every byte it touches lies in the ring as it
 * was opened. */
typedef struct {
    void *header;
    uint64_t capacity, mask, max_payload;
} shm_ring_t;

uint64_t shm_ring_header_size(void);
uint64_t shm_ring_max_payload(uint64_t capacity);
int shm_ring_init(void *header, uint64_t capacity);
int64_t shm_ring_open(shm_ring_t *ring, void *header, uint64_t region_size);
int shm_ring_push(const shm_ring_t *ring, const char *data, uint64_t len, int count_full);
/* A record of rows (a head, then six columns) written in place, stamped with
   the clock as it is pushed: see shm_native.c. */
int shm_ring_push_rows(const shm_ring_t *ring, const char *head, uint64_t head_len,
                       uint64_t stamp_at, const uint64_t *slots, const uint64_t *generations,
                       const int64_t *chunks, const int64_t *generated, uint64_t generated_stride,
                       const uint32_t *handles, const uint32_t *applied, uint64_t n,
                       int count_full, int64_t *pushed_ns);
int64_t shm_ring_pop(const shm_ring_t *ring, void *out, uint64_t out_cap);
int64_t shm_ring_pop_batch(const shm_ring_t *ring, void *out, uint64_t out_cap, uint64_t *lens,
                           uint64_t max_n);
int64_t shm_ring_peek(const shm_ring_t *ring, uint64_t skip, void *out, uint64_t out_cap);
uint64_t shm_ring_used(const shm_ring_t *ring);
uint64_t shm_ring_last_push_ns(const shm_ring_t *ring);
int64_t shm_ring_pop_spin(const shm_ring_t *ring, void *out, uint64_t out_cap, uint64_t spin_ns);
uint64_t shm_ring_wait_used(const shm_ring_t *ring, uint64_t spin_ns);
int shm_ring_prepare_sleep(const shm_ring_t *ring);
int shm_ring_wake(const shm_ring_t *ring);
void shm_ring_end_sleep(const shm_ring_t *ring);
void shm_ring_reset(const shm_ring_t *ring);
void shm_ring_stats(const shm_ring_t *ring, shm_ring_stats_t *out);

/* -- slab: per-slot state word (generation << 2 | state), owner, since --
 * A slab is used through a shm_slab_t, as a ring: its slot count, owner count,
 * slot size and quota are the ones checked when this process opened it
 * (shm_slab_open), never re-read from the header in shared memory; every slot
 * and owner index is range-checked against them. */
typedef struct {
    void *header;
    uint64_t slots, max_owners, slot_size, quota;
} shm_slab_t;

uint64_t shm_slab_meta_size(uint64_t slots, uint64_t max_owners);
int shm_slab_init(void *header, uint64_t slots, uint64_t max_owners, uint64_t slot_size,
                  uint64_t quota);
int64_t shm_slab_open(shm_slab_t *slab, void *header, uint64_t region_size);
int64_t shm_slab_acquire(const shm_slab_t *slab, uint64_t owner, uint64_t now_ns,
                         uint64_t *generation);
int shm_slab_publish(const shm_slab_t *slab, uint64_t slot, uint64_t generation);
int64_t shm_slab_acquire_batch(const shm_slab_t *slab, uint64_t owner, uint64_t n, uint64_t now_ns,
                               uint64_t *slots, uint64_t *generations);
int64_t shm_slab_publish_batch(const shm_slab_t *slab, const uint64_t *slots,
                               const uint64_t *generations, uint64_t n);
int64_t shm_slab_ready_batch(const shm_slab_t *slab, const uint64_t *slots,
                             const uint64_t *generations, uint64_t n);
int64_t shm_slab_release_batch(const shm_slab_t *slab, const uint64_t *slots,
                               const uint64_t *generations, uint64_t n, uint64_t owner,
                               uint64_t *released);
int64_t shm_slab_abort_batch(const shm_slab_t *slab, const uint64_t *slots,
                             const uint64_t *generations, uint64_t n);
int shm_slab_is_ready(const shm_slab_t *slab, uint64_t slot, uint64_t generation);
int shm_slab_release(const shm_slab_t *slab, uint64_t slot, uint64_t generation, uint64_t owner);
int shm_slab_abort(const shm_slab_t *slab, uint64_t slot, uint64_t generation);
int64_t shm_slab_reclaim(const shm_slab_t *slab, uint64_t owner);
void shm_slab_slot(const shm_slab_t *slab, uint64_t slot, shm_slot_info_t *out);
void shm_slab_stats(const shm_slab_t *slab, shm_slab_stats_t *out);
uint64_t shm_slab_held(const shm_slab_t *slab, uint64_t owner);

/* -- records of rows read back: a ring's records popped and each judged (its
   rows whole, its handles in range, its slots published) in one call: see
   shm_native.c. */
int64_t shm_ring_pop_rows(const shm_ring_t *ring, const shm_slab_t *slab, void *out,
                          uint64_t out_cap, uint64_t *lens, int64_t *info, uint64_t max_n,
                          uint64_t type, uint64_t head_len, uint64_t count_at, uint64_t nhandles);

/* -- a reader of records of rows, set up once: what its pops time and where
   its give backs go (shm/steps.py RowsReader). Pointers are into the ring's
   own segment, or NULL for none; the caller checks the segments are mapped
   before each call. */
typedef struct {
    uint64_t type;       /* the records' first byte */
    uint64_t head_len;   /* bytes of the head (8-aligned), then the columns */
    uint64_t count_at;   /* byte of the head holding the u32 row count */
    uint64_t nhandles;   /* handles below this pass the judge */
    uint64_t stamp_at;   /* byte of the head holding the int64 push time */
    uint64_t *histogram; /* nbuckets words: a judged record's push-to-pop time, or NULL */
    uint64_t nbuckets;
    uint64_t *counts;    /* one added at counts[handle] per row given back, or NULL */
    uint64_t ncounts;
    uint64_t *starved;   /* the writer's "waits for credits" word (1 -> 0), or NULL */
    uint64_t *given;     /* one word: when rows were last credited (monotonic ns), or NULL */
    uint64_t owner;      /* the slab owner whose slots are given back */
    const shm_ring_t *ring; /* the ring popped, the slab its slots lie in */
    const shm_slab_t *slab;
    void *out;           /* where records are popped to (out_cap bytes), their */
    uint64_t out_cap;    /* lengths and verdicts (max_n each) */
    uint64_t *lens;
    int64_t *info;
    uint64_t max_n;
} shm_rows_t;

/* The log-linear bucket of a duration: four per power of two from 128 ns,
   bucket 0 below, nbuckets - 1 at most (rte/protocol/latency.py's bucket). */
uint64_t shm_log_bucket(int64_t ns, uint64_t nbuckets);
int64_t shm_rows_pop(const shm_rows_t *rows);
int64_t shm_rows_give_back(const shm_rows_t *rows, const uint8_t *rec, uint64_t len,
                           const int64_t *pick, uint64_t npick, int credit);

/* -- each handle's real-time figures, counted as its rows are sent (rte's
   rte/ipc/figures.py is the layout and the NumPy reference): per handle a row
   of nwords int64 words (these indices) and two rows of nbuckets int64
   buckets, inter-arrival gaps and action-to-photon times (shm_log_bucket). */
enum shm_figure_word {
    SHM_FIGURE_FIRST_NS = 2,
    SHM_FIGURE_LAST_NS = 3,
    SHM_FIGURE_CHUNKS = 4,
    SHM_FIGURE_ON_TIME = 5,
    SHM_FIGURE_LONGEST_GAP_NS = 6,
    SHM_FIGURE_PENDING_SEQ = 8,
    SHM_FIGURE_PENDING_NS = 9,
    SHM_FIGURE_PHOTONS = 10
};

typedef struct {
    int64_t *words;   /* handles x nwords */
    int64_t *gaps;    /* handles x nbuckets */
    int64_t *photons; /* handles x nbuckets */
    uint64_t handles, nwords, nbuckets;
    int64_t late_ns;  /* a gap above this is late */
} shm_figures_t;

/* One chunk emitted at now_ns to each of handles[k] (receipts applied[k], or
   NULL: none acted), k < n: each handle's figures counted (single writer). */
void shm_figures_count(const shm_figures_t *f, const uint32_t *handles, const uint32_t *applied,
                       uint64_t n, int64_t now_ns);

/* -- a writer of records of rows, set up once (shm/steps.py RowsWriter): what
   each send counts, and where. The histogram and total are the writer's own
   words (or NULL); counts, set before each send that counts, are its own
   int64 per handle. The caller checks the segments are mapped before each call. */
typedef struct {
    const shm_ring_t *ring; /* the ring pushed, the slab its slots lie in */
    const shm_slab_t *slab;
    uint64_t stamp_at;      /* byte of the head the push time is written at */
    uint64_t *histogram;    /* nbuckets words: each record's pushed-minus-emitted time, or NULL */
    uint64_t nbuckets;
    uint64_t *total;        /* one word: the sum of those times, or NULL */
    int64_t *counts;        /* one added at counts[handle] per row pushed, or NULL */
    uint64_t ncounts;
    const shm_figures_t *figures; /* each pushed row's handle's figures, or NULL */
} shm_rows_out_t;

/* Publish a record's slots, push it in place and count it (and its figures,
   at emitted_ns): one writer's step out. */
int shm_rows_send(const shm_rows_out_t *w, const char *head, uint64_t head_len,
                  const uint64_t *slots, const uint64_t *generations, const int64_t *chunks,
                  const int64_t *generated, uint64_t generated_stride, const uint32_t *handles,
                  const uint32_t *applied, uint64_t n, int64_t emitted_ns, int64_t *pushed_ns);
