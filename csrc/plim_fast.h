/* plim_fast.h: the core's lock-free fast paths as inline functions.
 *
 * For a caller that wants the uncontended acquire and release without a
 * call into another translation unit (the Python binding: five such calls
 * were a few percent of an uncontended await).  plim_sem.c defines its
 * exported plim_try_acquire, plim_release, plim_closed, plim_max and
 * plim_batch_init through these, so there is one copy of the logic; the
 * word layout, the invariants (I1-I5), the memory orders and the locking
 * rules are documented there and hold here unchanged.  Nothing here takes
 * the lock: plim_release_inline hands a release that finds waiters to
 * plim_release_queued (plim_sem.c), which does.
 */
#ifndef PLIM_FAST_H
#define PLIM_FAST_H

#include "plim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The counter word (layout above).  WORD_* names the word's parts; the
 * PLIM_W_* states in plim.h are a waiter's, unrelated. */
#define WORD_QUEUED ((uint64_t)1)       /* bit 0: the queue is non-empty (I1) */
#define WORD_CLOSED ((uint64_t)2)       /* bit 1: close() was called */
#define WORD_UNBOUNDED ((uint64_t)4)    /* bit 2: no limit now */
#define WORD_SHIFT 3                    /* avail + WORD_BIAS sits above the flags */
#define WORD_BIAS ((int64_t)1 << 60)    /* keeps the avail field non-negative */

PLIM_INLINE int64_t word_avail(uint64_t w)
{
    return (int64_t)(w >> WORD_SHIFT) - WORD_BIAS;
}

/* word_units converts a permit delta (any sign) to its word delta.  Unsigned
 * wrap-around makes negative deltas work with plain addition. */
PLIM_INLINE uint64_t word_units(int64_t n)
{
    return ((uint64_t)n) << WORD_SHIFT;
}

PLIM_INLINE uint64_t word_make(int64_t avail, uint64_t flags)
{
    return (((uint64_t)(avail + WORD_BIAS)) << WORD_SHIFT) | flags;
}

/* word_overflows tells whether taking n more in unbounded mode would hold
 * more than PLIM_MAX_ACQUIRED. */
PLIM_INLINE int word_overflows(uint64_t w, int64_t n)
{
    return word_avail(w) - n < -PLIM_MAX_ACQUIRED;
}

/* plim_release_queued: the locked part of plim_release, for a release that
 * saw WORD_QUEUED (plim_sem.c). */
int plim_release_queued(plim_sem_t *sem, int64_t n, plim_batch_t *b);

PLIM_INLINE void plim_batch_init_inline(plim_batch_t *b)
{
    b->done_head = b->done_tail = NULL;
    b->check = NULL;
}

PLIM_INLINE int64_t plim_max_inline(plim_sem_t *sem)
{
    /* relaxed: a snapshot; set_max writes it under mu. */
    return atomic_load_explicit(&sem->max, memory_order_relaxed);
}

PLIM_INLINE int plim_closed_inline(plim_sem_t *sem)
{
    /* relaxed: callers that act on "closed" recheck it in their CAS. */
    return (atomic_load_explicit(&sem->word, memory_order_relaxed) & WORD_CLOSED) != 0;
}

PLIM_INLINE int plim_try_acquire_inline(plim_sem_t *sem, int64_t n)
{
    /* relaxed: only a guess for the CAS, which validates it. */
    uint64_t cur = atomic_load_explicit(&sem->word, memory_order_relaxed);
    for (;;) {
        if (cur & WORD_CLOSED)
            return PLIM_CLOSED;
        if (n == 0)
            return PLIM_OK; /* takes nothing, so it cannot overtake anyone */
        if (cur & WORD_UNBOUNDED) {
            if (word_overflows(cur, n))
                return PLIM_OVERFLOW;
        } else if ((cur & WORD_QUEUED) || word_avail(cur) < n) {
            /* QUEUED: others were first; taking now would barge (I3). */
            return PLIM_EMPTY;
        }
        /* acquire on success: pairs with the release in plim_release so the
         * new holder sees what the previous holder wrote.  relaxed on
         * failure: we only reread the word and decide again. */
        if (atomic_compare_exchange_weak_explicit(&sem->word, &cur, cur - word_units(n),
                                                  memory_order_acquire,
                                                  memory_order_relaxed))
            return PLIM_OK;
    }
}

PLIM_INLINE int plim_release_inline(plim_sem_t *sem, int64_t n, plim_batch_t *b)
{
    b->check = NULL;
    if (n == 0)
        return PLIM_OK;
    /* relaxed: only a guess for the CAS, which validates it. */
    uint64_t cur = atomic_load_explicit(&sem->word, memory_order_relaxed);
    while (!(cur & WORD_QUEUED)) {
        /* release: publishes the holder's writes to the next taker.
         * relaxed on failure: we reread and decide again. */
        if (atomic_compare_exchange_weak_explicit(&sem->word, &cur, cur + word_units(n),
                                                  memory_order_release,
                                                  memory_order_relaxed))
            return PLIM_OK;
    }
    return plim_release_queued(sem, n, b);
}

#ifdef __cplusplus
}
#endif

#endif /* PLIM_FAST_H */
