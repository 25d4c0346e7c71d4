/* plim_waitq.c: intrusive doubly linked FIFO queue of plim_waiter_t.
 *
 * Implementation notes
 * --------------------
 * Invariants (all under sem->mu):
 *   - head == NULL  <=>  tail == NULL  <=>  qlen == 0.
 *   - A waiter is linked iff its state is PLIM_W_QUEUED; prev/next are NULL
 *     otherwise, so a stray second unlink is caught by PLIM_ASSERT in debug
 *     builds instead of corrupting a neighbour.
 *   - Nodes live in the caller's memory; the queue never allocates.  The
 *     caller keeps a node alive while it is linked or sits in a done list.
 *
 * Memory orders: qlen is the only atomic here.  It is written only under
 * sem->mu and read without the lock by plim_queue_len() for statistics, so
 * relaxed stores suffice: a reader needs a value that was true at some
 * moment, not one ordered with any other memory.
 *
 * Locking: every function in this file requires sem->mu held.  The done
 * list (plim_batch_t) belongs to the single caller that passed it in and
 * needs no lock.
 */
#include "plim_waitq.h"

void plim_waitq_push(plim_sem_t *sem, plim_waiter_t *w)
{
    PLIM_ASSERT(w->prev == NULL && w->next == NULL);
    w->next = NULL;
    w->prev = sem->tail;
    if (sem->tail != NULL)
        sem->tail->next = w;
    else
        sem->head = w;
    sem->tail = w;
    /* relaxed: written under mu; lock-free readers only want a snapshot. */
    atomic_store_explicit(&sem->qlen,
                          atomic_load_explicit(&sem->qlen, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

void plim_waitq_unlink(plim_sem_t *sem, plim_waiter_t *w)
{
    PLIM_ASSERT(plim_waitq_linked(sem, w));
    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        sem->head = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    else
        sem->tail = w->prev;
    w->prev = w->next = NULL;
    /* relaxed: as in plim_waitq_push. */
    atomic_store_explicit(&sem->qlen,
                          atomic_load_explicit(&sem->qlen, memory_order_relaxed) - 1,
                          memory_order_relaxed);
}

int plim_waitq_linked(const plim_sem_t *sem, const plim_waiter_t *w)
{
    /* A linked node has a neighbour, or is the only node. */
    return w->prev != NULL || w->next != NULL || sem->head == w;
}

void plim_batch_push(plim_batch_t *b, plim_waiter_t *w)
{
    w->done_next = NULL;
    if (b->done_tail != NULL)
        b->done_tail->done_next = w;
    else
        b->done_head = w;
    b->done_tail = w;
}
