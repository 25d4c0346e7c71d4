/* plim.h: the public C API of the pylimiter core.
 *
 * A plim_sem_t is a counting semaphore with weighted, strictly FIFO waiters.
 * The core holds state and algorithm only: it never allocates, never sleeps
 * and never wakes anybody.  Waiter nodes (plim_waiter_t) are intrusive: the
 * caller embeds them in its own objects and keeps them alive while they are
 * queued.  Every call that may move waiters out of the queue fills a
 * plim_batch_t; the caller wakes the waiters listed there after the call has
 * returned, that is, after the core's lock is dropped.
 *
 * Cancellation checks: a waiter may carry a check (has_check).  The core
 * never calls out while it holds its lock (a callback could block, re-enter,
 * or in a Python binding lose the GIL while the lock is held).  Instead,
 * queue processing stops at a head that has a check and reports it in
 * batch->check; the caller evaluates the check with no lock held and calls
 * plim_resume() with the answer.  Until plim_resume() is called the queue
 * is not processed past that head.
 */
#ifndef PLIM_H
#define PLIM_H

#include "plim_platform.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest max_permits and the largest single request.  Requests and
 * limits are bounded so that the counter word below can never overflow. */
#define PLIM_MAX_PERMITS ((((int64_t)1) << 60) - 1)
/* The most that can be held at once, bounded or not.  Equal to
 * PLIM_MAX_PERMITS so that switching an unbounded semaphore that holds the
 * most to a limit of 1 still fits the counter (see plim_sem.c). */
#define PLIM_MAX_ACQUIRED PLIM_MAX_PERMITS

/* Status codes returned by the calls below. */
typedef enum plim_status {
    PLIM_OK = 0,       /* done: permits granted / released / waiter removed */
    PLIM_EMPTY = 1,    /* try_acquire: does not fit now, or others queue first */
    PLIM_CLOSED = 2,   /* the semaphore is closed */
    PLIM_QUEUED = 3,   /* enqueue: the waiter is now in the queue */
    PLIM_FULL = 4,     /* enqueue: the queue is at max_queue */
    PLIM_OVERFLOW = 5, /* unbounded semaphore: more than PLIM_MAX_ACQUIRED held */
    PLIM_GONE = 6,     /* cancel: the waiter had already left the queue */
    PLIM_TOO_LARGE = 7 /* enqueue: the request's total exceeds max_permits */
} plim_status_t;

/* Where a waiter stands.  A waiter leaves PLIM_W_QUEUED exactly once, under
 * the semaphore's lock, for one of the final states. */
typedef enum plim_wstate {
    PLIM_W_IDLE = 0,      /* not queued yet */
    PLIM_W_QUEUED = 1,    /* linked in the queue */
    PLIM_W_GRANTED = 2,   /* got `need` permits (recorded in `granted`) */
    PLIM_W_CLOSED = 3,    /* failed: the semaphore was closed */
    PLIM_W_TOO_LARGE = 4, /* failed: set_max set a limit below `total` */
    PLIM_W_CANCELLED = 5, /* failed: its check said cancelled (plim_resume) */
    PLIM_W_REMOVED = 6    /* removed by its owner (plim_cancel: timeout, task cancel) */
} plim_wstate_t;

/* plim_waiter_t is one queued request, embedded in the caller's object.
 * Locking: every field is read and written under the owning semaphore's lock
 * while the waiter is queued; after it has left the queue (state is final)
 * only the owner touches it. */
typedef struct plim_waiter {
    struct plim_waiter *prev;      /* queue links; NULL when not queued */
    struct plim_waiter *next;
    struct plim_waiter *done_next; /* link in a plim_batch_t done list */
    int64_t need;    /* permits still to take from the pool */
    int64_t total;   /* size the request asks to hold in the end (checked
                        against a lowered max_permits) */
    int64_t granted; /* permits taken from the pool when granted */
    int has_check;   /* non-zero: ask the caller before granting or skipping */
    int state;       /* a plim_wstate_t */
} plim_waiter_t;

/* plim_batch_t collects what one call did to the queue.
 * done: waiters that left the queue during the call, FIFO order, each in a
 *       final state; the caller wakes them.  Cleared by plim_batch_init only,
 *       so one batch can gather the results of several calls.
 * check: when non-NULL, queue processing stopped at this head waiter; the
 *       caller must evaluate its check and call plim_resume(). */
typedef struct plim_batch {
    plim_waiter_t *done_head;
    plim_waiter_t *done_tail;
    plim_waiter_t *check;
} plim_batch_t;

/* plim_sem_t.  See plim_sem.c for the counter word layout and the rules. */
typedef struct plim_sem {
    _Atomic uint64_t word;      /* available permits, mode and flags; lock-free */
    _Atomic int64_t max;        /* configured limit (<= 0: unbounded); written
                                   under mu, before the word changes mode */
    _Atomic int64_t qlen;       /* queue length; written under mu only */
    int64_t max_queue;          /* <= 0: unbounded queue. Locking: mu */
    plim_mutex_t mu;            /* guards the queue and every slow path */
    plim_waiter_t *head;        /* FIFO queue. Locking: mu */
    plim_waiter_t *tail;        /* Locking: mu */
} plim_sem_t;

/* plim_sem_init prepares sem with max_permits (<= 0: unbounded) and
 * max_queue (<= 0: unbounded queue).  Returns PLIM_OK, or -1 when
 * max_permits exceeds PLIM_MAX_PERMITS or the mutex cannot be created. */
int plim_sem_init(plim_sem_t *sem, int64_t max_permits, int64_t max_queue);

/* plim_sem_destroy frees the mutex.  The queue must be empty. */
void plim_sem_destroy(plim_sem_t *sem);

/* plim_batch_init empties a batch. */
void plim_batch_init(plim_batch_t *b);

/* plim_batch_pop removes and returns the first done waiter, or NULL. */
plim_waiter_t *plim_batch_pop(plim_batch_t *b);

/* plim_waiter_init resets a waiter to PLIM_W_IDLE. */
void plim_waiter_init(plim_waiter_t *w, int has_check);

/* plim_available returns max - acquired for a bounded semaphore (negative
 * after the limit was set below what is held) and -acquired for an
 * unbounded one.  A snapshot: it may be stale by the time it returns. */
int64_t plim_available(plim_sem_t *sem);

/* plim_acquired returns the permits currently held (granted, not released).
 * A consistent snapshot unless set_max runs concurrently and the counter
 * word returns to the very same value meanwhile. */
int64_t plim_acquired(plim_sem_t *sem);

/* plim_max returns the limit last set (<= 0: unbounded). */
int64_t plim_max(plim_sem_t *sem);

/* plim_bounded tells whether the semaphore has a limit now. */
int plim_bounded(plim_sem_t *sem);

int64_t plim_queue_len(plim_sem_t *sem);
int plim_closed(plim_sem_t *sem);

/* plim_try_acquire takes n permits without blocking and without a lock.
 * Returns PLIM_OK, or PLIM_EMPTY (not enough available, or waiters are
 * queued: it never barges) or PLIM_CLOSED or PLIM_OVERFLOW, and leaves the
 * semaphore unchanged on failure.  n must be in [0, PLIM_MAX_PERMITS];
 * n == 0 succeeds whenever the semaphore is open, queue or not. */
int plim_try_acquire(plim_sem_t *sem, int64_t n);

/* plim_release returns n permits.  Lock-free when nobody queues; otherwise
 * it takes the lock and grants the waiters that now fit, into b.
 * Works after close.  Always returns PLIM_OK. */
int plim_release(plim_sem_t *sem, int64_t n, plim_batch_t *b);

/* plim_enqueue asks for w->need more permits (w->total: the size the
 * request holds in the end).  If nobody queues and they fit, takes them and
 * returns PLIM_OK with w GRANTED.  Else links w at the tail and returns
 * PLIM_QUEUED, or fails with PLIM_CLOSED / PLIM_FULL / PLIM_OVERFLOW /
 * PLIM_TOO_LARGE (bounded and total > max: the limit was lowered since the
 * caller checked it) leaving w IDLE.  The caller must have checked w's
 * cancellation already. */
int plim_enqueue(plim_sem_t *sem, plim_waiter_t *w, int64_t need, int64_t total);

/* plim_cancel removes w from the queue (timeout, task cancellation) and
 * reconsiders the requests behind it, into b.  Returns PLIM_OK with w
 * REMOVED, or PLIM_GONE when w had already left the queue (its final state
 * says why; if GRANTED, the caller owns w->granted permits). */
int plim_cancel(plim_sem_t *sem, plim_waiter_t *w, plim_batch_t *b);

/* plim_resume answers a batch->check: if cancelled, w fails with
 * PLIM_W_CANCELLED; else w may be granted.  Then the queue is processed on,
 * which may set batch->check again.  If w is no longer the queued head the
 * answer is ignored.  The caller must keep w alive (not reuse its memory for
 * another waiter) from the call that reported it until this returns.
 * Returns PLIM_OK. */
int plim_resume(plim_sem_t *sem, plim_waiter_t *w, int cancelled, plim_batch_t *b);

/* plim_release_growing releases n permits held by a permit whose growing
 * update w is queued, and makes w need n more (the update must now take the
 * whole new size).  If w is not queued it is a plain plim_release. */
int plim_release_growing(plim_sem_t *sem, int64_t n, plim_waiter_t *w, plim_batch_t *b);

/* plim_close marks sem closed (idempotent) and fails every queued waiter
 * with PLIM_W_CLOSED, into b.  Returns PLIM_OK. */
int plim_close(plim_sem_t *sem, plim_batch_t *b);

/* plim_forget_waiters empties the queue without granting or failing
 * anybody: every queued waiter leaves it as PLIM_W_REMOVED, into b, and the
 * permits are left as they are.  For a child process after fork(), whose
 * queue lists waiters of the parent's threads: it starts with the parent's
 * counts and an empty queue, as a threading.Semaphore does.  It takes the
 * mutex: the caller must know that no thread of the parent held it at the
 * fork (the Python binding holds the GIL across every core call, and fork()
 * runs holding it).  Returns PLIM_OK. */
int plim_forget_waiters(plim_sem_t *sem, plim_batch_t *b);

/* plim_set_max sets the limit, on any semaphore, live.  max > 0 bounds it
 * (an unbounded one too): what is held carries over, so available may go
 * negative; queued waiters whose total exceeds max fail with
 * PLIM_W_TOO_LARGE and the others that now fit are granted, into b.
 * max <= 0 makes it unbounded: every queued waiter is granted at once (no
 * checks asked), except any that would take more than PLIM_MAX_ACQUIRED
 * outstanding, which wait for releases.  Returns PLIM_OK, or -1 for
 * max > PLIM_MAX_PERMITS (nothing changed). */
int plim_set_max(plim_sem_t *sem, int64_t max, plim_batch_t *b);

#ifdef __cplusplus
}
#endif

#endif /* PLIM_H */
