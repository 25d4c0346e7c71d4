/* plim_waitq.h: the intrusive FIFO wait queue and the done list (internal).
 * Every function here must be called with the owning semaphore's lock held. */
#ifndef PLIM_WAITQ_H
#define PLIM_WAITQ_H

#include "plim.h"

/* plim_waitq_push links w at the tail of sem's queue and counts it. */
void plim_waitq_push(plim_sem_t *sem, plim_waiter_t *w);

/* plim_waitq_unlink removes w, which must be linked in sem's queue. */
void plim_waitq_unlink(plim_sem_t *sem, plim_waiter_t *w);

/* plim_waitq_linked tells whether w is linked in sem's queue. */
int plim_waitq_linked(const plim_sem_t *sem, const plim_waiter_t *w);

/* plim_batch_push appends w to b's done list. */
void plim_batch_push(plim_batch_t *b, plim_waiter_t *w);

#endif /* PLIM_WAITQ_H */
