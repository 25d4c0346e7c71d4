/* plim_shm_fast.h: the host-wide limiter's uncontended paths, inline.
 *
 * For the binding's uncontended acquire and release (one CAS to lock, the
 * take or the give-back, one exchange to unlock) without a call into
 * another translation unit.  plim_shm.c defines its exported
 * plim_shm_take_locked / plim_shm_trylock through these, so there is one
 * copy of the logic; the layout, the invariants, the memory orders and
 * the hostile-bytes rules are plim_shm.c's and hold here unchanged.
 * Anything that may have to decide a waiter (a give-back that finds the
 * queue non-empty) or wake one (an unlock with wake-ups pending) goes to
 * plim_shm.c.
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
 * place between two stores of a critical section. */
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

PLIM_SHM_INLINE int64_t plim_shm_max_inline(plim_shm_t *h, uint32_t p)
{
    return PLIM_SHM_LD(plim_shm_pool_at(h, p)->max);
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
    if (h->wk.nrec | h->wk.nslot | h->wk.all || h->wk.own_loops) {
        plim_shm_unlock(h);
        return;
    }
    /* release: publishes this critical section to the next holder. */
    uint32_t old = atomic_exchange_explicit(&plim_shm_hdr(h)->mutex, 0u, memory_order_release);
    if (old & PLIM_SHM_MU_WAITERS)
        plim_shm_wake_lock(h);
}

/* plim_shm_count_grant: an immediate grant in the counters (0 s wait). */
PLIM_SHM_INLINE void plim_shm_count_grant(plim_shm_pool_t *P, int64_t acquired)
{
    PLIM_SHM_ST(P->acquired_total, plim_shm_sat_add(PLIM_SHM_LD(P->acquired_total), 1));
    PLIM_SHM_ST(P->buckets[0], plim_shm_sat_add(PLIM_SHM_LD(P->buckets[0]), 1));
    if (acquired > PLIM_SHM_LD(P->hwm))
        PLIM_SHM_ST(P->hwm, acquired);
}

/* plim_shm_take_inline: plim_shm_take_locked (plim_shm.h). */
PLIM_SHM_INLINE int plim_shm_take_inline(plim_shm_t *h, uint32_t p, int64_t n)
{
    plim_shm_pool_t *P = plim_shm_pool_at(h, p);
    int64_t m = PLIM_SHM_LD(P->max), avail = PLIM_SHM_LD(P->avail);
    if (m > 0) {
        if (n != 0 && (PLIM_SHM_LD(P->qlen) != 0 || PLIM_SHM_LD(P->head) != PLIM_SHM_NIL ||
                       avail < n))
            return PLIM_SHM_EMPTY;   /* S3: nobody barges */
    } else if (plim_shm_sat_sub(n, avail) > PLIM_SHM_MAX_PERMITS) {
        return PLIM_SHM_OVERFLOW;
    }
    int64_t left = plim_shm_sat_sub(avail, n);
    PLIM_SHM_ST(P->avail, left);
    PLIM_SHM_CRASH(h);
    plim_shm_slot_t *S = plim_shm_slot_at(h, (uint32_t)h->slot);
    PLIM_SHM_ST(S->held[p], plim_shm_sat_add(PLIM_SHM_LD(S->held[p]), n));
    plim_shm_count_grant(P, m > 0 ? plim_shm_sat_sub(m, left) : plim_shm_sat_sub(0, left));
    return PLIM_SHM_OK;
}

/* plim_shm_give_back_inline: plim_shm_give_back_locked with no update
 * pending, done here when nobody queues (nobody to decide). */
PLIM_SHM_INLINE int plim_shm_give_back_inline(plim_shm_t *h, uint32_t p, int64_t n)
{
    plim_shm_pool_t *P = plim_shm_pool_at(h, p);
    if (PLIM_SHM_LD(P->head) != PLIM_SHM_NIL || PLIM_SHM_LD(P->qlen) != 0)
        return plim_shm_give_back_locked(h, p, n, PLIM_SHM_NIL, 0);
    plim_shm_slot_t *S = plim_shm_slot_at(h, (uint32_t)h->slot);
    int64_t held = PLIM_SHM_LD(S->held[p]);
    if (held < 0)
        held = 0;
    if (n > held)
        n = held;   /* never more than the segment says we hold */
    PLIM_SHM_ST(S->held[p], held - n);
    PLIM_SHM_CRASH(h);
    PLIM_SHM_ST(P->avail, plim_shm_sat_add(PLIM_SHM_LD(P->avail), n));
    return PLIM_SHM_OK;
}

#ifdef __cplusplus
}
#endif

#endif /* PLIM_SHM_FAST_H */
