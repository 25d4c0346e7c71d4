/* plim_cacheq.h: the broker entry cache's removal queue and position index
 * (Apache Pulsar PIP-430), for pylimiter.pulsar.cache.  No Python here.
 *
 * Three structures, all intrusive or caller-owned, none thread-safe: the
 * caller serialises every call on one queue and the indexes whose entries it
 * holds (the binding holds the GIL and never releases it around these calls).
 *
 *   plim_cq_entry_t   one cached entry: queue links, position, size, the
 *                     timestamp and the PIP-430 read-count state.  Embedded
 *                     in the binding's CacheEntry object.
 *   plim_cq_t         the removal queue: a doubly linked FIFO of entries in
 *                     global insertion order, and the two eviction walks.
 *   plim_cq_index_t   one EntryCache's entries by (ledger_id, entry_id):
 *                     sorted pages, each covering PLIM_CQ_PAGE_SIZE
 *                     consecutive entry ids of one ledger and holding
 *                     pointers to the entries present only (an occupancy
 *                     mask and a packed array), so a dense run costs about
 *                     8.5 bytes of index per entry and a lone entry about 48.
 *
 * Ownership: the core never frees an entry.  A walk or an invalidation that
 * takes entries out returns them on a "gone" chain (linked through `next`)
 * for the binding to release after the call; the core has stopped touching
 * them by then.  Pages belong to their index and are freed by it.
 */
#ifndef PLIM_CACHEQ_H
#define PLIM_CACHEQ_H

#include <stddef.h>
#include <stdint.h>

#define PLIM_CQ_PAGE_SHIFT 6
#define PLIM_CQ_PAGE_SIZE (1 << PLIM_CQ_PAGE_SHIFT)

/* Entry flags. */
#define PLIM_CQ_ACCESSED 1u  /* a hit since the last requeue */
#define PLIM_CQ_REMOVED 2u   /* evicted or invalidated; never queued again */
#define PLIM_CQ_TRACKED 4u   /* has read-count tracking (created with > 0) */
#define PLIM_CQ_QUEUED 8u    /* linked in a queue */
#define PLIM_CQ_INIT 16u     /* went through plim_cq_entry_init (a zeroed
                                entry, as a fresh allocation is, has not) */

/* The largest byte total a queue or an index accounts: sizes are int64 and
 * their sums must stay so.  plim_cq_push and plim_cq_index_put refuse an
 * entry that would take a total past it. */
#define PLIM_CQ_MAX_BYTES INT64_MAX

typedef struct plim_cq_entry plim_cq_entry_t;
typedef struct plim_cq_index plim_cq_index_t;

struct plim_cq_entry {
    plim_cq_entry_t *prev;    /* toward the head; NULL at the head */
    plim_cq_entry_t *next;    /* toward the tail; after removal, the gone chain */
    plim_cq_index_t *owner;   /* the index holding it, or NULL */
    int64_t ledger, entry;    /* position, meaningful while owner != NULL */
    int64_t size;             /* bytes accounted, >= 0 */
    int64_t timestamp_ns;     /* creation, reset by every requeue */
    int64_t expected_reads;   /* meaningful with PLIM_CQ_TRACKED; no floor */
    uint32_t requeue_count;   /* requeues by either walk, saturating */
    uint32_t flags;           /* PLIM_CQ_* */
};

typedef struct plim_cq {
    plim_cq_entry_t *head, *tail;
    int64_t entries;           /* queued entries */
    int64_t bytes;             /* their sizes */
    uint64_t requeues;         /* every requeue by either walk */
    uint64_t evicted_entries;  /* removals by the walks (not unlinks) */
    uint64_t evicted_bytes;    /* saturates at UINT64_MAX */
    uint32_t max_requeue;      /* ...ExtendTTLOfEntriesWithRemainingExpectedReadsMaxTimes */
    int extend_ttl;            /* ...ExtendTTLOfRecentlyAccessed */
} plim_cq_t;

typedef struct plim_cq_page plim_cq_page_t;

struct plim_cq_index {
    plim_cq_page_t **pages;  /* sorted by (ledger, first entry id) */
    size_t npages, cap;
    size_t hint;             /* page of the last lookup: sequential access is O(1) */
    int64_t entries, bytes;
};

/* What a walk or an invalidation took out. */
typedef struct plim_cq_gone {
    plim_cq_entry_t *first;  /* chained through next, in removal order */
    plim_cq_entry_t *last;
    int64_t entries, bytes;  /* bytes saturates at INT64_MAX */
} plim_cq_gone_t;

/* ---- entries and the queue ---------------------------------------------- */

/* plim_cq_entry_init sets up a detached entry (flags: PLIM_CQ_INIT, and
 * PLIM_CQ_TRACKED when expected_reads > 0; <= 0 means no read-count
 * tracking).  size must be in [0, INT64_MAX]. */
void plim_cq_entry_init(plim_cq_entry_t *e, int64_t size, int64_t timestamp_ns,
                        int64_t expected_reads);

/* plim_cq_init sets up an empty queue. */
void plim_cq_init(plim_cq_t *q, uint32_t max_requeue, int extend_ttl);

/* plim_cq_fits says whether e's size can be added to the queue's total
 * without passing PLIM_CQ_MAX_BYTES. */
int plim_cq_fits(const plim_cq_t *q, const plim_cq_entry_t *e);

/* plim_cq_push appends e, which must be initialised, neither queued nor
 * removed, and fit (plim_cq_fits), at the tail. */
void plim_cq_push(plim_cq_t *q, plim_cq_entry_t *e);

/* plim_cq_unlink takes e, which must be queued in q, out of it.  Nothing
 * else changes (its owner index keeps it; the caller decides). */
void plim_cq_unlink(plim_cq_t *q, plim_cq_entry_t *e);

/* plim_cq_should_requeue is PIP-430's rule: (extend_ttl and accessed) or
 * (has expected reads and requeue_count < max_requeue). */
int plim_cq_should_requeue(const plim_cq_t *q, const plim_cq_entry_t *e);

/* plim_cq_evict_before walks from the head over entries whose timestamp is
 * below before_ns: each is requeued (to the tail, timestamp = *now_ns,
 * accessed cleared, requeue_count + 1) or removed (out of the queue and out
 * of its owner index, flagged REMOVED, appended to gone).  The first entry
 * not older stops the walk.  now_ns is NULL until the caller has read its
 * clock: a requeue then sets *need_now and stops the walk before it, so the
 * caller reads the clock once and calls again with it.  (Every int64 is a
 * valid reading: "no reading yet" is the NULL pointer, not a value.) */
void plim_cq_evict_before(plim_cq_t *q, int64_t before_ns, const int64_t *now_ns,
                          plim_cq_gone_t *gone, int *need_now);

/* plim_cq_evict_size walks from the head, requeueing or removing each entry
 * by the same rule and cycling past the tail, until gone->bytes reaches
 * size_to_free or the queue is empty.  It ends: a requeue clears accessed and
 * counts toward max_requeue, so no entry is requeued more than max_requeue+1
 * times in one walk.  *need_now as for plim_cq_evict_before. */
void plim_cq_evict_size(plim_cq_t *q, int64_t size_to_free, const int64_t *now_ns,
                        plim_cq_gone_t *gone, int *need_now);

/* plim_cq_non_evictable counts the queued entries with expected reads. */
void plim_cq_non_evictable(const plim_cq_t *q, int64_t *entries, int64_t *bytes);

/* plim_cq_gone_init empties a gone chain. */
void plim_cq_gone_init(plim_cq_gone_t *g);

/* ---- the position index ---------------------------------------------------- */

void plim_cq_index_init(plim_cq_index_t *ix);

/* plim_cq_index_free frees the pages; the index must be empty. */
void plim_cq_index_free(plim_cq_index_t *ix);

/* plim_cq_index_get returns the entry at (ledger, entry), or NULL. */
plim_cq_entry_t *plim_cq_index_get(plim_cq_index_t *ix, int64_t ledger, int64_t entry);

/* plim_cq_index_put stores e (detached from any index, ids >= 0) at
 * (ledger, entry).  Returns 0, 1 when the position is taken, -1 when memory
 * ran out, or -2 when the index's byte total would pass PLIM_CQ_MAX_BYTES;
 * nothing changes unless it returns 0. */
int plim_cq_index_put(plim_cq_index_t *ix, plim_cq_entry_t *e, int64_t ledger, int64_t entry);

/* plim_cq_index_remove takes e out of its owner index (owner set to NULL). */
void plim_cq_index_remove(plim_cq_entry_t *e);

/* plim_cq_index_range calls fn(e, arg) for every entry with
 * (l1, e1) <= position <= (l2, e2), in position order.  fn must not change
 * the index. */
void plim_cq_index_range(plim_cq_index_t *ix, int64_t l1, int64_t e1, int64_t l2, int64_t e2,
                         void (*fn)(plim_cq_entry_t *, void *), void *arg);

/* plim_cq_index_drop_upto takes every entry at or before (ledger, entry) out
 * of the index and, if queued, out of q (flagged REMOVED, not counted as
 * evictions), appending them to gone in position order. */
void plim_cq_index_drop_upto(plim_cq_index_t *ix, plim_cq_t *q, int64_t ledger, int64_t entry,
                             plim_cq_gone_t *gone);

#endif /* PLIM_CACHEQ_H */
