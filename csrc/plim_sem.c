/* plim_sem.c: lock-free permit counter glued to the intrusive FIFO queue.
 *
 * Implementation notes
 * ====================
 *
 * State.  All permit accounting lives in one 64-bit atomic word, so a single
 * compare-and-swap both checks and changes everything the fast paths look
 * at:
 *
 *     bit 0        WORD_QUEUED     the wait queue is non-empty
 *     bit 1        WORD_CLOSED     close() was called (never cleared)
 *     bit 2        WORD_UNBOUNDED  no limit now (set_max may switch it, live)
 *     bits 3..63   avail + BIAS, unsigned
 *
 * avail is max - acquired while bounded and -acquired while unbounded.  It
 * is signed: setting the limit below what is held makes it negative.  BIAS
 * (2^60) keeps the field non-negative, so adding or taking n permits is
 * plain unsigned arithmetic on the word (n << 3) with no sign or shift
 * pitfalls, and the flag bits are never disturbed: limits and requests are
 * capped at PLIM_MAX_PERMITS (2^60 - 1) and what is held at
 * PLIM_MAX_ACQUIRED (the same), so avail stays inside [-2^60, 2^60) in both
 * modes and across a switch (1 - PLIM_MAX_ACQUIRED at the lowest).
 *
 * The mode is a bit of the word, not a field beside it, so that every
 * lock-free decision (fits? barges? overflows?) is taken against the mode
 * that the same CAS validates: a fast acquire that read "unbounded" cannot
 * succeed after a switch to bounded, because the switch changed the word.
 *
 * Invariants.
 *   I1  QUEUED is set  <=>  the queue is non-empty.  Both change only under
 *       mu, in the same critical section.
 *   I2  While QUEUED is set, only lock holders change avail.  Fast acquirers
 *       fail on QUEUED and fast releasers divert to the lock, both decided by
 *       the same CAS that would change the word, so no stale decision can
 *       slip in: a CAS built on a word read before QUEUED was set fails.
 *   I3  No barging: a request is granted only if it is the queue head or
 *       the queue is empty (QUEUED clear, checked in the granting CAS).
 *   I4  The head is granted as soon as avail >= head->need, by whoever
 *       changed avail or the queue under mu (release, cancel, resume,
 *       set_max).  So a released permit never sits idle while the head fits.
 *   I5  Unbounded, the queue holds only waiters that would take more than
 *       PLIM_MAX_ACQUIRED outstanding (possible only right after a switch
 *       from bounded); every other request is granted at once, checks and
 *       FIFO position notwithstanding, since nothing is being rationed.
 *
 * Fairness.  Strict FIFO.  A head that does not fit blocks everyone behind
 * it, even requests that would fit.  Scenario: 10 permits, 9 held; a request
 * for 8 queues, then a stream of requests for 1 arrives.  If the small ones
 * could overtake, each release would be eaten by a newcomer and the 8 would
 * never be served.  With FIFO the 8 is served after the first 7 permits come
 * back, and the newcomers follow it in order.
 *
 * Cancellation checks are not evaluated here.  Processing stops at a head
 * whose has_check is set and reports it in batch->check; the caller answers
 * through plim_resume() with no lock held.  Calling out under mu would let a
 * callback block or re-enter while every other slow path waits on mu.
 *
 * Switching (set_max).  Under mu, one CAS moves avail by the difference of
 * the two limits (an unbounded one counts as 0) and flips WORD_UNBOUNDED;
 * max is stored before it, so a reader that sees the new word sees the new
 * max.  Then the queue is processed in the new mode: bounded, requests
 * larger than the limit fail and the rest are granted as they fit;
 * unbounded, everyone is granted (I5).
 *
 * Memory orders.  Permits act like a lock on what they guard, so taking
 * permits is an acquire and giving them back is a release: a holder sees
 * everything the previous holder wrote before releasing.  Under mu the mutex
 * orders the queue itself; the atomics there only need to keep the word
 * consistent for lock-free readers, and the orders used say why at each
 * site.  Rare state changes (close, set_max) use seq_cst.
 *
 * Why these orders hold on ARM too.  x86 makes every RMW a full barrier, so
 * a too-weak order here would pass every x86 test; AArch64 does not (relaxed
 * CAS is a plain LDXR/STXR loop or CAS, acquire adds LDAXR/CASA, release
 * STLXR/CASL).  The handoffs that carry data between holders are exactly:
 *   release CAS/fetch_add (release)  ->  try_acquire / enqueue CAS (acquire)
 *   release under mu (release)       ->  process_locked fetch_sub (acquire),
 *                                        then mu and the caller's wake to
 *                                        the grantee
 * and every other atomic either runs under mu (ordered by the mutex) or
 * only steers a later RMW (relaxed is enough: RMWs on one word always read
 * the latest value, so a flag set relaxed is still seen by the next CAS).
 * tests/model/plim_relacy.cpp checks this in Relacy's C++11 memory model:
 * weakening any one of the three data-carrying orders produces a data race
 * there, and the faithful model passes (tests/test_memory_model.py).
 *
 * Locking rules.
 *   - mu guards head/tail, every waiter's fields while it is queued,
 *     max_queue, max, and the QUEUED and UNBOUNDED bit transitions.
 *   - mu is a leaf lock: nothing here calls out while holding it, and the
 *     caller must not call into the same semaphore from inside a batch walk
 *     that it does while holding its own locks (it holds none of ours).
 *   - Waking is the caller's job, after the call returns (mu dropped): a
 *     woken thread that immediately calls in again would otherwise find mu
 *     still held and stall, and a Python binding must not run Python code
 *     (which may drop the GIL) while mu is held.
 */
#include "plim.h"
#include "plim_fast.h"   /* the word's parts (WORD_*) and the lock-free fast paths */
#include "plim_waitq.h"

int plim_sem_init(plim_sem_t *sem, int64_t max_permits, int64_t max_queue)
{
    if (max_permits > PLIM_MAX_PERMITS)
        return -1;
    if (max_permits > 0)
        atomic_init(&sem->word, word_make(max_permits, 0));
    else
        atomic_init(&sem->word, word_make(0, WORD_UNBOUNDED));
    atomic_init(&sem->max, max_permits);
    atomic_init(&sem->qlen, 0);
    sem->max_queue = max_queue;
    sem->head = sem->tail = NULL;
    if (plim_mutex_init(&sem->mu) != 0)
        return -1;
    return PLIM_OK;
}

void plim_sem_destroy(plim_sem_t *sem)
{
    PLIM_ASSERT(sem->head == NULL);
    plim_mutex_destroy(&sem->mu);
}

void plim_batch_init(plim_batch_t *b)
{
    plim_batch_init_inline(b);
}

plim_waiter_t *plim_batch_pop(plim_batch_t *b)
{
    plim_waiter_t *w = b->done_head;
    if (w != NULL) {
        b->done_head = w->done_next;
        if (b->done_head == NULL)
            b->done_tail = NULL;
        w->done_next = NULL;
    }
    return w;
}

void plim_waiter_init(plim_waiter_t *w, int has_check)
{
    w->prev = w->next = w->done_next = NULL;
    w->need = w->total = w->granted = 0;
    w->has_check = has_check;
    w->state = PLIM_W_IDLE;
}

/* ---- lock-free readers ------------------------------------------------ */

int64_t plim_available(plim_sem_t *sem)
{
    /* relaxed: a statistics snapshot, not a decision anybody acts on. */
    return word_avail(atomic_load_explicit(&sem->word, memory_order_relaxed));
}

int64_t plim_max(plim_sem_t *sem)
{
    return plim_max_inline(sem);
}

int plim_bounded(plim_sem_t *sem)
{
    /* relaxed: a snapshot; callers that act on the mode recheck it in
     * their CAS. */
    return (atomic_load_explicit(&sem->word, memory_order_relaxed) & WORD_UNBOUNDED) == 0;
}

int64_t plim_acquired(plim_sem_t *sem)
{
    uint64_t w, again;
    int64_t max;
    do {
        /* acquire: pairs with set_max's switch CAS, so a word of the new
         * mode comes with the new max (stored before it). */
        w = atomic_load_explicit(&sem->word, memory_order_acquire);
        /* relaxed: ordered by the acquire load above. */
        max = atomic_load_explicit(&sem->max, memory_order_relaxed);
        /* relaxed: only compared, to retry when a switch ran between. */
        again = atomic_load_explicit(&sem->word, memory_order_relaxed);
    } while (w != again);
    if (w & WORD_UNBOUNDED)
        return -word_avail(w);
    return max - word_avail(w);
}

int64_t plim_queue_len(plim_sem_t *sem)
{
    /* relaxed: a snapshot of a value written under mu. */
    return atomic_load_explicit(&sem->qlen, memory_order_relaxed);
}

int plim_closed(plim_sem_t *sem)
{
    return plim_closed_inline(sem);
}

/* ---- fast paths --------------------------------------------------------- */

int plim_try_acquire(plim_sem_t *sem, int64_t n)
{
    return plim_try_acquire_inline(sem, n);
}

/* leave_locked takes w out of the queue for good: unlinks it, gives it its
 * final state and appends it to b's done list, so the caller wakes it after
 * mu is dropped.  Every way out of the queue but the owner's own plim_cancel
 * goes through here.  Requires mu. */
static void leave_locked(plim_sem_t *sem, plim_waiter_t *w, int state, plim_batch_t *b)
{
    PLIM_ASSERT(w->state == PLIM_W_QUEUED && state != PLIM_W_QUEUED);
    plim_waitq_unlink(sem, w);
    w->state = state;
    plim_batch_push(b, w);
}

/* process_locked grants queue heads while they fit (I4), stopping at a head
 * that carries a check unless it is `checked`, whose answer the caller just
 * gave; unbounded, it grants without asking (I5).  Clears QUEUED when the
 * queue empties (I1).  Requires mu. */
static void process_locked(plim_sem_t *sem, plim_waiter_t *checked, plim_batch_t *b)
{
    plim_waiter_t *h;
    while ((h = sem->head) != NULL) {
        /* relaxed: under mu with QUEUED set nobody else changes avail or
         * the mode (I2); the taking RMW below is the acquire. */
        uint64_t cur = atomic_load_explicit(&sem->word, memory_order_relaxed);
        if (cur & WORD_UNBOUNDED) {
            if (word_overflows(cur, h->need))
                break;
        } else {
            if (h->has_check && h != checked) {
                b->check = h;
                return; /* QUEUED stays set: h is still queued */
            }
            if (word_avail(cur) < h->need)
                break;
        }
        /* acquire: the grantee may touch what the releaser guarded. */
        atomic_fetch_sub_explicit(&sem->word, word_units(h->need), memory_order_acquire);
        h->granted = h->need;
        leave_locked(sem, h, PLIM_W_GRANTED, b);
        checked = NULL; /* an answer covers one grant only */
    }
    if (sem->head == NULL) {
        /* relaxed: the flag only steers later CASes onto or off the lock,
         * and every RMW reads the latest word whatever its order. */
        atomic_fetch_and_explicit(&sem->word, ~WORD_QUEUED, memory_order_relaxed);
    }
}

int plim_release(plim_sem_t *sem, int64_t n, plim_batch_t *b)
{
    return plim_release_inline(sem, n, b);
}

int plim_release_queued(plim_sem_t *sem, int64_t n, plim_batch_t *b)
{
    /* Waiters exist: the permits must go to the head under mu.  Adding them
     * without the lock and leaving would break I4 (a head that now fits
     * would sleep until some later release happened to process the queue). */
    plim_mutex_lock(&sem->mu);
    /* release: as in the fast path. */
    atomic_fetch_add_explicit(&sem->word, word_units(n), memory_order_release);
    process_locked(sem, NULL, b);
    plim_mutex_unlock(&sem->mu);
    return PLIM_OK;
}

/* ---- slow paths (mu) ----------------------------------------------------- */

int plim_enqueue(plim_sem_t *sem, plim_waiter_t *w, int64_t need, int64_t total)
{
    w->need = need;
    w->total = total;
    w->granted = 0;
    w->prev = w->next = w->done_next = NULL;
    plim_mutex_lock(&sem->mu);
    /* relaxed: only a guess for the CASes below. */
    uint64_t cur = atomic_load_explicit(&sem->word, memory_order_relaxed);
    for (;;) {
        if (cur & WORD_CLOSED) {
            plim_mutex_unlock(&sem->mu);
            return PLIM_CLOSED;
        }
        int fits;
        if (cur & WORD_UNBOUNDED) {
            if (word_overflows(cur, need)) {
                plim_mutex_unlock(&sem->mu);
                return PLIM_OVERFLOW;
            }
            fits = 1;
        } else {
            /* relaxed: max is written under mu, which we hold. */
            if (total > atomic_load_explicit(&sem->max, memory_order_relaxed)) {
                plim_mutex_unlock(&sem->mu);
                return PLIM_TOO_LARGE;
            }
            fits = !(cur & WORD_QUEUED) && word_avail(cur) >= need;
        }
        if (fits) {
            /* acquire/relaxed: as in plim_try_acquire. */
            if (atomic_compare_exchange_weak_explicit(&sem->word, &cur,
                                                      cur - word_units(need),
                                                      memory_order_acquire,
                                                      memory_order_relaxed)) {
                w->granted = need;
                w->state = PLIM_W_GRANTED;
                plim_mutex_unlock(&sem->mu);
                return PLIM_OK;
            }
            continue;
        }
        if (sem->max_queue > 0 && plim_queue_len(sem) >= sem->max_queue) {
            plim_mutex_unlock(&sem->mu);
            return PLIM_FULL;
        }
        if (cur & WORD_QUEUED)
            break;
        /* Set QUEUED in the same CAS that saw "does not fit": a release that
         * lands between our read and this CAS makes it fail, and we look
         * again instead of sleeping on permits that are already back (I2).
         * relaxed: the flag is ordered by RMW atomicity on the word and the
         * queue itself by mu. */
        if (atomic_compare_exchange_weak_explicit(&sem->word, &cur, cur | WORD_QUEUED,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed))
            break;
    }
    plim_waitq_push(sem, w);
    w->state = PLIM_W_QUEUED;
    plim_mutex_unlock(&sem->mu);
    return PLIM_QUEUED;
}

int plim_cancel(plim_sem_t *sem, plim_waiter_t *w, plim_batch_t *b)
{
    b->check = NULL;
    plim_mutex_lock(&sem->mu);
    if (w->state != PLIM_W_QUEUED) {
        plim_mutex_unlock(&sem->mu);
        return PLIM_GONE;
    }
    int was_head = sem->head == w;
    plim_waitq_unlink(sem, w);
    w->state = PLIM_W_REMOVED;
    /* Only the head can block others, so only its removal can let the
     * requests behind it through; they are reconsidered at once. */
    if (was_head)
        process_locked(sem, NULL, b);
    plim_mutex_unlock(&sem->mu);
    return PLIM_OK;
}

int plim_resume(plim_sem_t *sem, plim_waiter_t *w, int cancelled, plim_batch_t *b)
{
    b->check = NULL;
    plim_mutex_lock(&sem->mu);
    /* Compare before dereferencing: the caller guarantees w is alive, but it
     * may have left the queue while the check ran without the lock. */
    if (sem->head == w && w->state == PLIM_W_QUEUED) {
        if (cancelled) {
            leave_locked(sem, w, PLIM_W_CANCELLED, b);
            process_locked(sem, NULL, b);
        } else {
            process_locked(sem, w, b);
        }
    } else {
        process_locked(sem, NULL, b);
    }
    plim_mutex_unlock(&sem->mu);
    return PLIM_OK;
}

int plim_release_growing(plim_sem_t *sem, int64_t n, plim_waiter_t *w, plim_batch_t *b)
{
    b->check = NULL;
    plim_mutex_lock(&sem->mu);
    if (w->state == PLIM_W_QUEUED)
        w->need += n;
    /* release: as in plim_release. */
    atomic_fetch_add_explicit(&sem->word, word_units(n), memory_order_release);
    process_locked(sem, NULL, b);
    plim_mutex_unlock(&sem->mu);
    return PLIM_OK;
}

int plim_close(plim_sem_t *sem, plim_batch_t *b)
{
    b->check = NULL;
    plim_mutex_lock(&sem->mu);
    atomic_fetch_or(&sem->word, WORD_CLOSED);
    plim_waiter_t *h;
    while ((h = sem->head) != NULL)
        leave_locked(sem, h, PLIM_W_CLOSED, b);
    atomic_fetch_and(&sem->word, ~WORD_QUEUED);
    plim_mutex_unlock(&sem->mu);
    return PLIM_OK;
}

int plim_forget_waiters(plim_sem_t *sem, plim_batch_t *b)
{
    b->check = NULL;
    plim_mutex_lock(&sem->mu);
    plim_waiter_t *h;
    while ((h = sem->head) != NULL)
        leave_locked(sem, h, PLIM_W_REMOVED, b);
    /* relaxed: as in process_locked; the permits are not touched (I1). */
    atomic_fetch_and_explicit(&sem->word, ~WORD_QUEUED, memory_order_relaxed);
    plim_mutex_unlock(&sem->mu);
    return PLIM_OK;
}

int plim_set_max(plim_sem_t *sem, int64_t max, plim_batch_t *b)
{
    b->check = NULL;
    if (max > PLIM_MAX_PERMITS)
        return -1;
    plim_mutex_lock(&sem->mu);
    /* relaxed: only a guess for the CAS, which validates it. */
    uint64_t cur = atomic_load_explicit(&sem->word, memory_order_relaxed);
    int64_t old_limit = (cur & WORD_UNBOUNDED) ? 0 : atomic_load(&sem->max);
    int64_t new_limit = max > 0 ? max : 0;
    uint64_t mode = max > 0 ? 0 : WORD_UNBOUNDED;
    /* Before the word: a reader that sees the new mode sees this max. */
    atomic_store(&sem->max, max);
    /* One CAS moves avail and the mode together: a lock-free acquire either
     * decided on the old word (and its CAS fails now) or sees both new. */
    while (!atomic_compare_exchange_weak(
        &sem->word, &cur,
        ((cur + word_units(new_limit - old_limit)) & ~WORD_UNBOUNDED) | mode)) {
    }
    if (max > 0) {
        /* Requests that can never fit under the new limit fail now rather
         * than block the queue forever. */
        plim_waiter_t *h = sem->head;
        while (h != NULL) {
            plim_waiter_t *next = h->next;
            if (h->total > max)
                leave_locked(sem, h, PLIM_W_TOO_LARGE, b);
            h = next;
        }
    }
    process_locked(sem, NULL, b);
    plim_mutex_unlock(&sem->mu);
    return PLIM_OK;
}
