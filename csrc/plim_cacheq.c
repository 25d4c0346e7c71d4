/* plim_cacheq.c: the broker entry cache's removal queue and position index.
 *
 * Implementation notes
 * --------------------
 * Invariants (checked under PLIM_DEBUG):
 *   - an entry is QUEUED iff it is linked in exactly one queue; q->entries
 *     and q->bytes are the count and the sum of sizes of the linked entries,
 *     and q->bytes never passes PLIM_CQ_MAX_BYTES (push is only called for
 *     an entry that fits);
 *   - an entry has owner != NULL iff it sits in that index's slot for its
 *     (ledger, entry); ix->entries/bytes count and sum the slotted entries;
 *     a page with no slotted entry does not exist;
 *   - a REMOVED entry is neither queued nor in an index, and never will be.
 * For an EntryCache entry both hold or neither does: the binding puts it in
 * the index and the queue together, and every removal path (a walk here,
 * plim_cq_index_drop_upto) takes it out of both.
 *
 * The eviction rule is PIP-430's as merged: an entry met by either walk is
 * requeued when (extend_ttl and accessed) or (expected reads > 0 and
 * requeue_count < max_requeue), else removed.  A requeue clears ACCESSED and
 * counts, and nothing sets ACCESSED during a walk (callers are serialised),
 * so an entry is requeued at most max_requeue + 1 times per walk and the
 * size walk, which cycles past the tail, always ends.  A walk that needs the
 * time for a requeue returns to the caller instead of using a made-up value:
 * "no reading yet" is a NULL pointer, so every int64 is a valid time (an
 * in-band sentinel such as INT64_MIN once made a walk with that reading
 * return "need the time" for ever).
 *
 * Pages: an index keeps its pages in an array sorted by (ledger, first id),
 * found by binary search behind a one-page hint.  A page covers
 * PLIM_CQ_PAGE_SIZE (64) consecutive ids; a 64-bit mask says which are
 * present.  A page has two layouts, told apart by its capacity:
 *   - packed (cap < 64): slots[] holds the present entries in id order, slot
 *     s at index popcount(mask & ((1 << s) - 1)); the array grows by
 *     doubling and shrinks when a quarter full, so scattered positions cost
 *     one small page each (a lone entry: 40 bytes) instead of 64 slots;
 *   - direct (cap == 64): slot s at index s, as a dense run fills a page;
 *     removing an entry clears its slot without moving the others, so FIFO
 *     eviction of dense entries costs what it did with plain arrays.
 * A packed page that fills becomes direct when it grows to 64; a direct page
 * that falls to 16 entries is compacted back (the gap between the two
 * thresholds keeps a page from switching at every insert and remove).
 * Tailing inserts and reads touch the hinted page (O(1)); a new page costs a
 * memmove of the page pointers after it.
 *
 * Locking: none.  The caller serialises all calls on a queue and on the
 * indexes of its entries (the binding runs every call holding the GIL).
 */
#include "plim_cacheq.h"

#include <stdlib.h>
#include <string.h>

#ifdef PLIM_DEBUG
#  include <assert.h>
#  define CQ_ASSERT(x) assert(x)
#else
#  define CQ_ASSERT(x) ((void)0)
#endif

struct plim_cq_page {
    int64_t ledger;
    int64_t first;     /* entry id of slot 0, a multiple of PLIM_CQ_PAGE_SIZE */
    uint64_t mask;     /* bit s: slot s (id first + s) is present; never 0 */
    uint32_t cap;      /* room in slots[], a power of two <= PLIM_CQ_PAGE_SIZE */
    uint32_t pad_;
    plim_cq_entry_t *slots[];   /* popcount(mask) entries, in id order */
};

#define SLOT_MASK ((int64_t)PLIM_CQ_PAGE_SIZE - 1)

#if defined(__GNUC__) || defined(__clang__)
static inline unsigned popcount64(uint64_t x) { return (unsigned)__builtin_popcountll(x); }
static inline unsigned ctz64(uint64_t x) { return (unsigned)__builtin_ctzll(x); }
#else
static inline unsigned popcount64(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (unsigned)((x * 0x0101010101010101ull) >> 56);
}
static inline unsigned ctz64(uint64_t x) {   /* x != 0 */
    unsigned n = 0;
    while (!(x & 1u)) {
        x >>= 1;
        n++;
    }
    return n;
}
#endif

/* Index in slots[] of slot s (whether or not s is present). */
static inline unsigned rank_of(const plim_cq_page_t *p, unsigned s) {
    return popcount64(p->mask & ((UINT64_C(1) << s) - 1));
}

static inline size_t page_bytes(uint32_t cap) {
    return sizeof(plim_cq_page_t) + (size_t)cap * sizeof(plim_cq_entry_t *);
}

#define DIRECT_CAP ((uint32_t)PLIM_CQ_PAGE_SIZE)
#define COMPACT_AT (PLIM_CQ_PAGE_SIZE / 4)   /* a direct page this sparse is packed again */

static inline int is_direct(const plim_cq_page_t *p) {
    return p->cap == DIRECT_CAP;
}

/* The entry in slot s, which must be present. */
static inline plim_cq_entry_t *page_at(const plim_cq_page_t *p, unsigned s) {
    return is_direct(p) ? p->slots[s] : p->slots[rank_of(p, s)];
}

/* ======================================================================== */
/* entries and the queue                                                     */
/* ======================================================================== */

void plim_cq_entry_init(plim_cq_entry_t *e, int64_t size, int64_t timestamp_ns,
                        int64_t expected_reads) {
    e->prev = e->next = NULL;
    e->owner = NULL;
    e->ledger = e->entry = 0;
    e->size = size;
    e->timestamp_ns = timestamp_ns;
    e->requeue_count = 0;
    if (expected_reads > 0) {
        e->expected_reads = expected_reads;
        e->flags = PLIM_CQ_INIT | PLIM_CQ_TRACKED;
    } else {
        e->expected_reads = 0;
        e->flags = PLIM_CQ_INIT;
    }
}

void plim_cq_init(plim_cq_t *q, uint32_t max_requeue, int extend_ttl) {
    memset(q, 0, sizeof(*q));
    q->max_requeue = max_requeue;
    q->extend_ttl = extend_ttl;
}

void plim_cq_gone_init(plim_cq_gone_t *g) {
    memset(g, 0, sizeof(*g));
}

int plim_cq_fits(const plim_cq_t *q, const plim_cq_entry_t *e) {
    return e->size <= PLIM_CQ_MAX_BYTES - q->bytes;
}

void plim_cq_push(plim_cq_t *q, plim_cq_entry_t *e) {
    CQ_ASSERT(e->flags & PLIM_CQ_INIT);
    CQ_ASSERT(!(e->flags & (PLIM_CQ_QUEUED | PLIM_CQ_REMOVED)));
    CQ_ASSERT(plim_cq_fits(q, e));
    e->next = NULL;
    e->prev = q->tail;
    if (q->tail)
        q->tail->next = e;
    else
        q->head = e;
    q->tail = e;
    e->flags |= PLIM_CQ_QUEUED;
    q->entries++;
    q->bytes += e->size;
}

void plim_cq_unlink(plim_cq_t *q, plim_cq_entry_t *e) {
    CQ_ASSERT(e->flags & PLIM_CQ_QUEUED);
    if (e->prev)
        e->prev->next = e->next;
    else
        q->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        q->tail = e->prev;
    e->prev = e->next = NULL;
    e->flags &= ~PLIM_CQ_QUEUED;
    q->entries--;
    q->bytes -= e->size;
    CQ_ASSERT(q->entries >= 0 && q->bytes >= 0);
    CQ_ASSERT((q->entries == 0) == (q->head == NULL));
}

int plim_cq_should_requeue(const plim_cq_t *q, const plim_cq_entry_t *e) {
    if (q->extend_ttl && (e->flags & PLIM_CQ_ACCESSED))
        return 1;
    return (e->flags & PLIM_CQ_TRACKED) && e->expected_reads > 0
           && e->requeue_count < q->max_requeue;
}

static void gone_append(plim_cq_gone_t *g, plim_cq_entry_t *e) {
    e->next = NULL;
    if (g->last)
        g->last->next = e;
    else
        g->first = e;
    g->last = e;
    g->entries++;
    /* Saturating: a walk whose clock re-enters the cache can take out more
     * than one queue's worth of bytes. */
    g->bytes = e->size > INT64_MAX - g->bytes ? INT64_MAX : g->bytes + e->size;
}

/* Move the head entry e to the tail as a requeue. */
static void requeue(plim_cq_t *q, plim_cq_entry_t *e, int64_t now_ns) {
    if (e != q->tail) {
        /* e is the head: unlink it there and link it at the tail, without
         * touching the counts. */
        q->head = e->next;
        q->head->prev = NULL;
        e->prev = q->tail;
        e->next = NULL;
        q->tail->next = e;
        q->tail = e;
    }
    e->timestamp_ns = now_ns;
    e->flags &= ~PLIM_CQ_ACCESSED;
    if (e->requeue_count != UINT32_MAX)
        e->requeue_count++;
    q->requeues++;
}

/* Evict e from q and from its owner index. */
static void evict(plim_cq_t *q, plim_cq_entry_t *e, plim_cq_gone_t *gone) {
    plim_cq_unlink(q, e);
    if (e->owner)
        plim_cq_index_remove(e);
    e->flags |= PLIM_CQ_REMOVED;
    q->evicted_entries++;
    if ((uint64_t)e->size > UINT64_MAX - q->evicted_bytes)
        q->evicted_bytes = UINT64_MAX;
    else
        q->evicted_bytes += (uint64_t)e->size;
    gone_append(gone, e);
}

/* One step of a walk on the head entry e.  Returns 0 to go on, 1 when a
 * requeue needs a clock reading first. */
static int step(plim_cq_t *q, plim_cq_entry_t *e, const int64_t *now_ns,
                plim_cq_gone_t *gone) {
    if (plim_cq_should_requeue(q, e)) {
        if (now_ns == NULL)
            return 1;
        requeue(q, e, *now_ns);
    } else {
        evict(q, e, gone);
    }
    return 0;
}

void plim_cq_evict_before(plim_cq_t *q, int64_t before_ns, const int64_t *now_ns,
                          plim_cq_gone_t *gone, int *need_now) {
    plim_cq_entry_t *e;
    *need_now = 0;
    while ((e = q->head) != NULL && e->timestamp_ns < before_ns) {
        if (step(q, e, now_ns, gone)) {
            *need_now = 1;
            return;
        }
    }
}

void plim_cq_evict_size(plim_cq_t *q, int64_t size_to_free, const int64_t *now_ns,
                        plim_cq_gone_t *gone, int *need_now) {
    plim_cq_entry_t *e;
    *need_now = 0;
    while (gone->bytes < size_to_free && (e = q->head) != NULL) {
        if (step(q, e, now_ns, gone)) {
            *need_now = 1;
            return;
        }
    }
}

void plim_cq_non_evictable(const plim_cq_t *q, int64_t *entries, int64_t *bytes) {
    int64_t n = 0, b = 0;
    for (const plim_cq_entry_t *e = q->head; e; e = e->next) {
        if ((e->flags & PLIM_CQ_TRACKED) && e->expected_reads > 0) {
            n++;
            b += e->size;
        }
    }
    *entries = n;
    *bytes = b;
}

/* ======================================================================== */
/* the position index                                                        */
/* ======================================================================== */

void plim_cq_index_init(plim_cq_index_t *ix) {
    memset(ix, 0, sizeof(*ix));
}

void plim_cq_index_free(plim_cq_index_t *ix) {
    CQ_ASSERT(ix->entries == 0);
    for (size_t i = 0; i < ix->npages; i++)
        free(ix->pages[i]);
    free(ix->pages);
    memset(ix, 0, sizeof(*ix));
}

static int page_cmp(const plim_cq_page_t *p, int64_t ledger, int64_t first) {
    if (p->ledger != ledger)
        return p->ledger < ledger ? -1 : 1;
    if (p->first != first)
        return p->first < first ? -1 : 1;
    return 0;
}

/* The first page at or after (ledger, first). */
static size_t lower_bound(const plim_cq_index_t *ix, int64_t ledger, int64_t first) {
    size_t lo = 0, hi = ix->npages;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (page_cmp(ix->pages[mid], ledger, first) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of the page (ledger, first), or npages when there is none. */
static size_t find_page(plim_cq_index_t *ix, int64_t ledger, int64_t first) {
    size_t i = ix->hint;
    if (i < ix->npages && page_cmp(ix->pages[i], ledger, first) == 0)
        return i;
    if (i + 1 < ix->npages && page_cmp(ix->pages[i + 1], ledger, first) == 0) {
        ix->hint = i + 1;
        return i + 1;
    }
    i = lower_bound(ix, ledger, first);
    if (i < ix->npages && page_cmp(ix->pages[i], ledger, first) == 0) {
        ix->hint = i;
        return i;
    }
    return ix->npages;
}

plim_cq_entry_t *plim_cq_index_get(plim_cq_index_t *ix, int64_t ledger, int64_t entry) {
    if (ledger < 0 || entry < 0)
        return NULL;
    size_t i = find_page(ix, ledger, entry & ~SLOT_MASK);
    if (i == ix->npages)
        return NULL;
    plim_cq_page_t *p = ix->pages[i];
    unsigned s = (unsigned)(entry & SLOT_MASK);
    if (!(p->mask & (UINT64_C(1) << s)))
        return NULL;
    return page_at(p, s);
}

/* Turn a full packed page, already reallocated to DIRECT_CAP slots, into the
 * direct layout: each entry moves from its rank to its slot.  Slots only move
 * up (s >= rank), so going from the highest rank down overwrites nothing
 * that still has to move. */
static void spread(plim_cq_page_t *p) {
    unsigned pos[PLIM_CQ_PAGE_SIZE];
    unsigned n = 0;
    for (uint64_t m = p->mask; m; m &= m - 1)
        pos[n++] = ctz64(m);
    while (n-- > 0)
        p->slots[pos[n]] = p->slots[n];
    p->cap = DIRECT_CAP;
}

/* After entries left page i (which still has some): a direct page at or
 * below COMPACT_AT entries is packed again, and a packed page at most a
 * quarter full shrinks; either way to the smallest power of two that holds
 * what is left, so a page that drains entry by entry reallocates a few times,
 * not at every halving.  A failed realloc keeps the bigger block: nothing is
 * lost but memory. */
static void settle(plim_cq_index_t *ix, size_t i) {
    plim_cq_page_t *p = ix->pages[i];
    unsigned n = popcount64(p->mask);
    int was_direct = is_direct(p);
    if (was_direct) {
        if (n > COMPACT_AT)
            return;
        unsigned k = 0;
        for (uint64_t m = p->mask; m; m &= m - 1)
            p->slots[k++] = p->slots[ctz64(m)];   /* k <= slot: moves only down */
    } else if (n > p->cap / 4) {
        return;
    }
    uint32_t cap = 1;
    while (cap < n)
        cap *= 2;
    p->cap = cap;                       /* packed from here (cap <= COMPACT_AT) */
    plim_cq_page_t *smaller = realloc(p, page_bytes(cap));
    if (smaller)
        ix->pages[i] = smaller;
}

int plim_cq_index_put(plim_cq_index_t *ix, plim_cq_entry_t *e, int64_t ledger, int64_t entry) {
    CQ_ASSERT(e->owner == NULL && ledger >= 0 && entry >= 0);
    int64_t first = entry & ~SLOT_MASK;
    unsigned s = (unsigned)(entry & SLOT_MASK);
    uint64_t bit = UINT64_C(1) << s;
    if (e->size > PLIM_CQ_MAX_BYTES - ix->bytes)
        return -2;
    size_t i = find_page(ix, ledger, first);
    plim_cq_page_t *p;
    if (i < ix->npages) {
        p = ix->pages[i];
        if (p->mask & bit)
            return 1;
        if (is_direct(p)) {
            p->slots[s] = e;
        } else {
            unsigned n = popcount64(p->mask);
            if (n == p->cap) {
                /* Grow by doubling; n < PLIM_CQ_PAGE_SIZE since slot s is free. */
                plim_cq_page_t *bigger = realloc(p, page_bytes(p->cap * 2));
                if (!bigger)
                    return -1;
                p = ix->pages[i] = bigger;
                if (p->cap * 2 == DIRECT_CAP) {
                    spread(p);
                    p->slots[s] = e;
                    goto placed;
                }
                p->cap *= 2;
            }
            unsigned r = rank_of(p, s);
            memmove(&p->slots[r + 1], &p->slots[r], (n - r) * sizeof(p->slots[0]));
            p->slots[r] = e;
        }
    placed:
        p->mask |= bit;
    } else {
        if (ix->npages == ix->cap) {
            size_t cap = ix->cap ? ix->cap * 2 : 4;
            plim_cq_page_t **pages = realloc(ix->pages, cap * sizeof(*pages));
            if (!pages)
                return -1;
            ix->pages = pages;
            ix->cap = cap;
        }
        p = malloc(page_bytes(1));
        if (!p)
            return -1;
        p->ledger = ledger;
        p->first = first;
        p->mask = bit;
        p->cap = 1;
        p->pad_ = 0;
        p->slots[0] = e;
        i = lower_bound(ix, ledger, first);
        memmove(&ix->pages[i + 1], &ix->pages[i], (ix->npages - i) * sizeof(*ix->pages));
        ix->pages[i] = p;
        ix->npages++;
        ix->hint = i;
    }
    e->owner = ix;
    e->ledger = ledger;
    e->entry = entry;
    ix->entries++;
    ix->bytes += e->size;
    return 0;
}

/* Free page i, which has no entry left. */
static void drop_page(plim_cq_index_t *ix, size_t i) {
    CQ_ASSERT(ix->pages[i]->mask == 0);
    free(ix->pages[i]);
    memmove(&ix->pages[i], &ix->pages[i + 1], (ix->npages - i - 1) * sizeof(*ix->pages));
    ix->npages--;
    if (ix->hint >= ix->npages)
        ix->hint = ix->npages ? ix->npages - 1 : 0;
}

void plim_cq_index_remove(plim_cq_entry_t *e) {
    plim_cq_index_t *ix = e->owner;
    CQ_ASSERT(ix != NULL);
    size_t i = find_page(ix, e->ledger, e->entry & ~SLOT_MASK);
    CQ_ASSERT(i < ix->npages);
    plim_cq_page_t *p = ix->pages[i];
    unsigned s = (unsigned)(e->entry & SLOT_MASK);
    CQ_ASSERT((p->mask >> s) & 1u);
    CQ_ASSERT(page_at(p, s) == e);
    if (!is_direct(p)) {
        unsigned r = rank_of(p, s);
        unsigned n = popcount64(p->mask);
        memmove(&p->slots[r], &p->slots[r + 1], (n - r - 1) * sizeof(p->slots[0]));
    }
    p->mask &= ~(UINT64_C(1) << s);
    e->owner = NULL;
    ix->entries--;
    ix->bytes -= e->size;
    if (p->mask == 0)
        drop_page(ix, i);
    else
        settle(ix, i);
}

static int pos_le(int64_t l1, int64_t e1, int64_t l2, int64_t e2) {
    return l1 < l2 || (l1 == l2 && e1 <= e2);
}

void plim_cq_index_range(plim_cq_index_t *ix, int64_t l1, int64_t e1, int64_t l2, int64_t e2,
                         void (*fn)(plim_cq_entry_t *, void *), void *arg) {
    if (!pos_le(l1, e1, l2, e2))
        return;
    /* Positions have ids >= 0, so a lower bound below that starts at 0. */
    if (l1 < 0) {
        l1 = 0;
        e1 = 0;
    } else if (e1 < 0) {
        e1 = 0;
    }
    for (size_t i = lower_bound(ix, l1, e1 & ~SLOT_MASK); i < ix->npages; i++) {
        plim_cq_page_t *p = ix->pages[i];
        if (!pos_le(p->ledger, p->first, l2, e2))
            break;
        int direct = is_direct(p);
        unsigned r = 0;
        for (uint64_t m = p->mask; m; m &= m - 1, r++) {
            unsigned s = ctz64(m);
            int64_t id = p->first + (int64_t)s;
            if (pos_le(l1, e1, p->ledger, id) && pos_le(p->ledger, id, l2, e2))
                fn(p->slots[direct ? s : r], arg);
        }
    }
}

void plim_cq_index_drop_upto(plim_cq_index_t *ix, plim_cq_t *q, int64_t ledger, int64_t entry,
                             plim_cq_gone_t *gone) {
    size_t emptied = 0;  /* pages [0, emptied) lost every entry */
    for (size_t i = 0; i < ix->npages; i++) {
        plim_cq_page_t *p = ix->pages[i];
        if (!pos_le(p->ledger, p->first, ledger, entry))
            break;
        /* The entries at or before the bound are the lowest slots: a prefix
         * of slots[] in a packed page. */
        int direct = is_direct(p);
        unsigned k = 0;
        for (uint64_t m = p->mask; m; m &= m - 1, k++) {
            unsigned s = ctz64(m);
            if (!pos_le(p->ledger, p->first + (int64_t)s, ledger, entry))
                break;
            plim_cq_entry_t *e = p->slots[direct ? s : k];
            p->mask &= ~(UINT64_C(1) << s);
            e->owner = NULL;
            ix->entries--;
            ix->bytes -= e->size;
            if (e->flags & PLIM_CQ_QUEUED)
                plim_cq_unlink(q, e);
            e->flags |= PLIM_CQ_REMOVED;
            gone_append(gone, e);
        }
        if (p->mask == 0) {
            emptied = i + 1;
        } else {
            if (!direct)
                memmove(&p->slots[0], &p->slots[k], popcount64(p->mask) * sizeof(p->slots[0]));
            settle(ix, i);
            break;  /* a page with survivors ends the prefix: later ones are beyond */
        }
    }
    /* Pages emptied form a prefix (sorted, and we stop at the first page with
     * survivors); free them with one memmove. */
    if (emptied) {
        for (size_t i = 0; i < emptied; i++)
            free(ix->pages[i]);
        memmove(&ix->pages[0], &ix->pages[emptied],
                (ix->npages - emptied) * sizeof(*ix->pages));
        ix->npages -= emptied;
        ix->hint = 0;
    }
}
