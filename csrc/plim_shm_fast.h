/* plim_shm_fast.h: the host-wide limiter's lock-free paths, inline.
 *
 * The binding's uncontended acquire and release: one CAS on the pool's
 * counter word, bracketed by this process's in-flight mark, with no call
 * into another translation unit and no lock.  The layout, the invariants,
 * the memory-order argument and the hostile-bytes rules are plim_shm.c's
 * ("The counter word and the lock-free paths") and hold here unchanged.
 * Whatever these paths cannot decide alone (a queue to respect or to
 * serve, a repair or set_max under way, a count out of range) they leave
 * untouched and report PLIM_SHM_EMPTY: the caller then takes the host's
 * lock and uses plim_shm.c.
 *
 * Calling rule (plim_shm.h): on one handle these run one at a time, and
 * not at the same time as plim_shm_give_back_locked or
 * plim_shm_detach_locked on that handle.
 */
#ifndef PLIM_SHM_FAST_H
#define PLIM_SHM_FAST_H

#include "plim_shm.h"

#include <signal.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PLIM_SHM_INLINE static inline
#define PLIM_SHM_MU_WAITERS 0x80000000u
#define PLIM_SHM_LD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define PLIM_SHM_ST(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

/* Tests (`_crash_after`): SIGKILL this process at the n-th crash point, a
 * place between two stores of a critical section or of a lock-free path. */
#define PLIM_SHM_CRASH(h)                                                \
    do {                                                                 \
        if (__builtin_expect((h)->crash != 0, 0) && --(h)->crash == 0)   \
            kill(getpid(), SIGKILL);                                     \
    } while (0)

/* plim_shm_wake_lock: the unlock's FUTEX_WAKE (plim_shm.c). */
void plim_shm_wake_lock(plim_shm_t *h);

PLIM_SHM_INLINE int64_t plim_shm_sat_add(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

PLIM_SHM_INLINE int64_t plim_shm_sat_sub(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r))
        return b < 0 ? INT64_MAX : INT64_MIN;
    return r;
}

PLIM_SHM_INLINE plim_shm_header_t *plim_shm_hdr(plim_shm_t *h)
{
    return (plim_shm_header_t *)(void *)h->base;
}

/* The index must have been checked against the handle. */
PLIM_SHM_INLINE plim_shm_pool_t *plim_shm_pool_at(plim_shm_t *h, uint32_t p)
{
    return (plim_shm_pool_t *)(void *)(h->base + h->off_pools +
                                       (size_t)p * sizeof(plim_shm_pool_t));
}

PLIM_SHM_INLINE plim_shm_slot_t *plim_shm_slot_at(plim_shm_t *h, uint32_t s)
{
    return (plim_shm_slot_t *)(void *)(h->base + h->off_slots +
                                       (size_t)s * sizeof(plim_shm_slot_t));
}

/* The counter word's avail: any 64 bits decode to [-2^60, 2^60). */
PLIM_SHM_INLINE int64_t plim_shm_word_avail(uint64_t w)
{
    return (int64_t)(w >> PLIM_SHM_W_SHIFT) - PLIM_SHM_W_BIAS;
}

/* avail must lie in [-PLIM_SHM_MAX_PERMITS, PLIM_SHM_MAX_PERMITS]. */
PLIM_SHM_INLINE uint64_t plim_shm_word_make(int64_t avail, uint64_t flags)
{
    return ((uint64_t)(avail + PLIM_SHM_W_BIAS) << PLIM_SHM_W_SHIFT) | (flags & PLIM_SHM_W_FLAGS);
}

/* a + b wrapping (a ledger or a counter that hostile bytes may have set
 * anywhere: no signed overflow, and no branch on the uncontended path). */
PLIM_SHM_INLINE int64_t plim_shm_wrap_add(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

PLIM_SHM_INLINE int64_t plim_shm_max_inline(plim_shm_t *h, uint32_t p)
{
    return PLIM_SHM_LD(plim_shm_pool_at(h, p)->max);
}

/* plim_shm_hwm_raise: the high-water mark to at least v.  An RMW: the
 * lock-free paths of several processes raise it at once.  Bounded (a
 * hostile writer could make every CAS fail). */
PLIM_SHM_INLINE void plim_shm_hwm_raise(plim_shm_pool_t *P, int64_t v)
{
    int64_t cur = PLIM_SHM_LD(P->hwm);
    for (int i = 0; i < 64 && v > cur; i++)
        if (atomic_compare_exchange_weak_explicit(&P->hwm, &cur, v, memory_order_relaxed,
                                                  memory_order_relaxed))
            break;
}

PLIM_SHM_INLINE uint32_t plim_shm_mu_id(plim_shm_t *h)
{
    return ((uint32_t)(h->slot + 1) & 0xFFFFu) | ((h->gen & 0x7FFFu) << 16);
}

PLIM_SHM_INLINE int plim_shm_trylock_inline(plim_shm_t *h)
{
    uint32_t z = 0;
    /* acquire: the holder sees everything the previous holder wrote. */
    return atomic_compare_exchange_strong_explicit(&plim_shm_hdr(h)->mutex, &z,
                                                   plim_shm_mu_id(h), memory_order_acquire,
                                                   memory_order_relaxed);
}

/* plim_shm_unlock_inline: plim_shm_unlock when nothing is to be woken. */
PLIM_SHM_INLINE void plim_shm_unlock_inline(plim_shm_t *h)
{
    if (h->wk.nrec | h->wk.nslot | h->wk.ndirect | h->wk.all || h->wk.own_loops) {
        plim_shm_unlock(h);
        return;
    }
    /* release: publishes this critical section to the next holder. */
    uint32_t old = atomic_exchange_explicit(&plim_shm_hdr(h)->mutex, 0u, memory_order_release);
    if (old & PLIM_SHM_MU_WAITERS)
        plim_shm_wake_lock(h);
}

/* plim_shm_fast_take: n (1..PLIM_SHM_MAX_PERMITS) permits of pool p
 * (< npools) of a registered handle with one CAS, if nobody queues, no repair runs, and they fit.  OK, or EMPTY:
 * nothing was done (take the lock and ask plim_shm_take_locked). */
PLIM_SHM_INLINE int plim_shm_fast_take(plim_shm_t *h, uint32_t p, int64_t n)
{
    plim_shm_pool_t *P = h->pool[p];
    plim_shm_slot_t *S = h->me;
    uint64_t w, nw;
    /* relaxed: the CAS below is a release and publishes the mark with it
     * (plim_shm.c, "Memory orders", site F1). */
    PLIM_SHM_ST(S->inflight, 1u);
    w = PLIM_SHM_LD(P->word);
    do {
        if (w & (PLIM_SHM_W_QUEUED | PLIM_SHM_W_RECOVERING))
            goto refuse;   /* S3 (nobody barges), or a repair: the lock */
        int64_t avail = plim_shm_word_avail(w);
        if (w & PLIM_SHM_W_UNBOUNDED ? n - avail > PLIM_SHM_MAX_PERMITS : avail < n)
            goto refuse;
        nw = w - ((uint64_t)n << PLIM_SHM_W_SHIFT);
        /* acq_rel: acquire takes the permits (what their last holder wrote
         * before giving them back is visible), release publishes the mark
         * (F1, F2). */
    } while (!atomic_compare_exchange_weak_explicit(&P->word, &w, nw, memory_order_acq_rel,
                                                    memory_order_relaxed));
    PLIM_SHM_CRASH(h);
    PLIM_SHM_ST(S->fheld[p], plim_shm_wrap_add(PLIM_SHM_LD(S->fheld[p]), n));
    PLIM_SHM_ST(S->fcount[p], plim_shm_wrap_add(PLIM_SHM_LD(S->fcount[p]), 1));
    {
        /* max is exact for this CAS (F3): no set_max runs while we are in
         * flight after a CAS that succeeded. */
        int64_t left = plim_shm_word_avail(nw);
        int64_t acquired = nw & PLIM_SHM_W_UNBOUNDED
                               ? -left
                               : plim_shm_sat_sub(PLIM_SHM_LD(P->max), left);
        if (acquired > PLIM_SHM_LD(P->hwm))
            plim_shm_hwm_raise(P, acquired);
    }
    /* release: a repair that reads the cleared mark sees fheld (F2). */
    atomic_store_explicit(&S->inflight, 0u, memory_order_release);
    return PLIM_SHM_OK;
refuse:
    atomic_store_explicit(&S->inflight, 0u, memory_order_release);
    return PLIM_SHM_EMPTY;
}

/* plim_shm_fast_give: this process gives back n (>= 1) permits of pool p
 * with one CAS, if nobody queues (nobody to serve) and no repair runs.  OK,
 * or EMPTY: nothing was done (take the lock and ask
 * plim_shm_give_back_locked). */
PLIM_SHM_INLINE int plim_shm_fast_give(plim_shm_t *h, uint32_t p, int64_t n)
{
    plim_shm_pool_t *P = h->pool[p];
    plim_shm_slot_t *S = h->me;
    uint64_t w, nw;
    /* Never more than the segment says we hold (the locked path clamps). */
    if (n > PLIM_SHM_MAX_PERMITS ||
        n > plim_shm_sat_add(PLIM_SHM_LD(S->fheld[p]), PLIM_SHM_LD(S->held[p])))
        return PLIM_SHM_EMPTY;
    PLIM_SHM_ST(S->inflight, 1u);   /* relaxed: F1, as in fast_take */
    w = PLIM_SHM_LD(P->word);
    do {
        if (w & (PLIM_SHM_W_QUEUED | PLIM_SHM_W_RECOVERING) ||
            plim_shm_word_avail(w) > PLIM_SHM_MAX_PERMITS - n)
            goto refuse;
        nw = w + ((uint64_t)n << PLIM_SHM_W_SHIFT);
        /* acq_rel: release hands the permits (and what we wrote while
         * holding them) to their next taker; F1, F2 as in fast_take. */
    } while (!atomic_compare_exchange_weak_explicit(&P->word, &w, nw, memory_order_acq_rel,
                                                    memory_order_relaxed));
    PLIM_SHM_CRASH(h);
    PLIM_SHM_ST(S->fheld[p], plim_shm_wrap_add(PLIM_SHM_LD(S->fheld[p]), -n));
    atomic_store_explicit(&S->inflight, 0u, memory_order_release);   /* F2 */
    return PLIM_SHM_OK;
refuse:
    atomic_store_explicit(&S->inflight, 0u, memory_order_release);
    return PLIM_SHM_EMPTY;
}

#ifdef __cplusplus
}
#endif

#endif /* PLIM_SHM_FAST_H */
