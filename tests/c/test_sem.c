/* Single-threaded semantics of the core: counter, FIFO, no barging, cancel,
 * checks, close, set_max, growing updates, unbounded mode. */
#include "plim.h"
#include "plim_test.h"

static int done_count(plim_batch_t *b)
{
    int n = 0;
    for (plim_waiter_t *w = b->done_head; w; w = w->done_next)
        n++;
    return n;
}

static void test_try_acquire_and_release(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_batch_init(&b);
    CHECK_EQ(plim_sem_init(&s, 10, 0), PLIM_OK);
    CHECK_EQ(plim_try_acquire(&s, 4), PLIM_OK);
    CHECK_EQ(plim_available(&s), 6);
    CHECK_EQ(plim_acquired(&s), 4);
    CHECK_EQ(plim_try_acquire(&s, 7), PLIM_EMPTY);
    CHECK_EQ(plim_available(&s), 6);
    CHECK_EQ(plim_try_acquire(&s, 6), PLIM_OK);
    CHECK_EQ(plim_try_acquire(&s, 1), PLIM_EMPTY);
    CHECK_EQ(plim_try_acquire(&s, 0), PLIM_OK);
    plim_release(&s, 10, &b);
    CHECK_EQ(plim_available(&s), 10);
    CHECK(b.done_head == NULL && b.check == NULL);
    plim_sem_destroy(&s);
}

static void test_fifo_no_barging(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t big, small;
    plim_sem_init(&s, 10, 0);
    plim_batch_init(&b);
    plim_waiter_init(&big, 0);
    plim_waiter_init(&small, 0);
    CHECK_EQ(plim_try_acquire(&s, 9), PLIM_OK);
    CHECK_EQ(plim_enqueue(&s, &big, 8, 8), PLIM_QUEUED);
    /* One permit is free but a request for it must not overtake `big`. */
    CHECK_EQ(plim_try_acquire(&s, 1), PLIM_EMPTY);
    CHECK_EQ(plim_try_acquire(&s, 0), PLIM_OK); /* zero never waits */
    CHECK_EQ(plim_enqueue(&s, &small, 1, 1), PLIM_QUEUED);
    CHECK_EQ(plim_queue_len(&s), 2);
    plim_release(&s, 6, &b); /* avail 7: big still does not fit */
    CHECK_EQ(done_count(&b), 0);
    CHECK_EQ(small.state, PLIM_W_QUEUED);
    plim_release(&s, 3, &b); /* avail 10: big (8) then small (1) */
    CHECK_EQ(done_count(&b), 2);
    CHECK(plim_batch_pop(&b) == &big);
    CHECK(plim_batch_pop(&b) == &small);
    CHECK_EQ(big.state, PLIM_W_GRANTED);
    CHECK_EQ(big.granted, 8);
    CHECK_EQ(plim_available(&s), 1);
    CHECK_EQ(plim_queue_len(&s), 0);
    /* Queue empty again: the fast path works. */
    CHECK_EQ(plim_try_acquire(&s, 1), PLIM_OK);
    plim_sem_destroy(&s);
}

static void test_cancel_head_reconsiders_queue(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t a, c;
    plim_sem_init(&s, 10, 0);
    plim_batch_init(&b);
    plim_waiter_init(&a, 0);
    plim_waiter_init(&c, 0);
    plim_try_acquire(&s, 5);
    CHECK_EQ(plim_enqueue(&s, &a, 8, 8), PLIM_QUEUED);
    CHECK_EQ(plim_enqueue(&s, &c, 3, 3), PLIM_QUEUED);
    CHECK_EQ(plim_cancel(&s, &a, &b), PLIM_OK);
    CHECK_EQ(a.state, PLIM_W_REMOVED);
    CHECK(plim_batch_pop(&b) == &c);
    CHECK_EQ(c.state, PLIM_W_GRANTED);
    CHECK_EQ(plim_cancel(&s, &c, &b), PLIM_GONE);
    CHECK_EQ(plim_available(&s), 2);
    plim_sem_destroy(&s);
}

static void test_cancel_middle_keeps_order(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t w[3];
    plim_sem_init(&s, 3, 0);
    plim_batch_init(&b);
    plim_try_acquire(&s, 3);
    for (int i = 0; i < 3; i++) {
        plim_waiter_init(&w[i], 0);
        CHECK_EQ(plim_enqueue(&s, &w[i], 1, 1), PLIM_QUEUED);
    }
    CHECK_EQ(plim_cancel(&s, &w[1], &b), PLIM_OK);
    CHECK(b.done_head == NULL);
    plim_release(&s, 3, &b);
    CHECK(plim_batch_pop(&b) == &w[0]);
    CHECK(plim_batch_pop(&b) == &w[2]);
    CHECK_EQ(plim_available(&s), 1);
    plim_sem_destroy(&s);
}

static void test_queue_full(void)
{
    plim_sem_t s;
    plim_waiter_t w[3];
    plim_sem_init(&s, 1, 2);
    plim_try_acquire(&s, 1);
    for (int i = 0; i < 3; i++)
        plim_waiter_init(&w[i], 0);
    CHECK_EQ(plim_enqueue(&s, &w[0], 1, 1), PLIM_QUEUED);
    CHECK_EQ(plim_enqueue(&s, &w[1], 1, 1), PLIM_QUEUED);
    CHECK_EQ(plim_enqueue(&s, &w[2], 1, 1), PLIM_FULL);
    CHECK_EQ(w[2].state, PLIM_W_IDLE);
    plim_batch_t b;
    plim_batch_init(&b);
    plim_close(&s, &b);
    CHECK_EQ(done_count(&b), 2);
    plim_sem_destroy(&s);
}

static void test_check_protocol(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t a, c;
    plim_sem_init(&s, 4, 0);
    plim_batch_init(&b);
    plim_waiter_init(&a, 1);
    plim_waiter_init(&c, 1);
    plim_try_acquire(&s, 4);
    CHECK_EQ(plim_enqueue(&s, &a, 4, 4), PLIM_QUEUED);
    CHECK_EQ(plim_enqueue(&s, &c, 1, 1), PLIM_QUEUED);
    /* Processing stops at a head with a check, even when it does not fit. */
    plim_release(&s, 1, &b);
    CHECK(b.check == &a);
    CHECK(b.done_head == NULL);
    /* Not cancelled, still does not fit: nothing moves. */
    plim_resume(&s, &a, 0, &b);
    CHECK(b.check == NULL);
    CHECK(b.done_head == NULL);
    plim_release(&s, 1, &b);
    CHECK(b.check == &a);
    /* Cancelled: `a` fails and `c` is considered next (and asks too). */
    plim_resume(&s, &a, 1, &b);
    CHECK(b.check == &c);
    CHECK(plim_batch_pop(&b) == &a);
    CHECK_EQ(a.state, PLIM_W_CANCELLED);
    plim_resume(&s, &c, 0, &b);
    CHECK(b.check == NULL);
    CHECK(plim_batch_pop(&b) == &c);
    CHECK_EQ(c.state, PLIM_W_GRANTED);
    CHECK_EQ(plim_available(&s), 1);
    /* A stale answer for a waiter that is gone is ignored. */
    plim_resume(&s, &a, 1, &b);
    CHECK(b.done_head == NULL);
    plim_sem_destroy(&s);
}

static void test_close_fails_waiters_release_still_works(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t a, c;
    plim_sem_init(&s, 2, 0);
    plim_batch_init(&b);
    plim_waiter_init(&a, 0);
    plim_waiter_init(&c, 0);
    plim_try_acquire(&s, 2);
    plim_enqueue(&s, &a, 1, 1);
    plim_enqueue(&s, &c, 2, 2);
    plim_close(&s, &b);
    CHECK(plim_closed(&s));
    CHECK(plim_batch_pop(&b) == &a);
    CHECK(plim_batch_pop(&b) == &c);
    CHECK_EQ(a.state, PLIM_W_CLOSED);
    CHECK_EQ(plim_try_acquire(&s, 0), PLIM_CLOSED);
    plim_waiter_init(&a, 0);
    CHECK_EQ(plim_enqueue(&s, &a, 1, 1), PLIM_CLOSED);
    plim_release(&s, 2, &b);
    CHECK_EQ(plim_available(&s), 2);
    plim_close(&s, &b); /* idempotent */
    CHECK(plim_closed(&s));
    plim_sem_destroy(&s);
}

static void test_set_max(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t a, c, d;
    plim_sem_init(&s, 10, 0);
    plim_batch_init(&b);
    plim_waiter_init(&a, 0);
    plim_waiter_init(&c, 0);
    plim_waiter_init(&d, 0);
    plim_try_acquire(&s, 8);
    plim_enqueue(&s, &a, 6, 6);
    plim_enqueue(&s, &c, 3, 3);
    /* Lower below what is held: avail goes negative, a (6 > 5) fails. */
    CHECK_EQ(plim_set_max(&s, 5, &b), PLIM_OK);
    CHECK_EQ(plim_available(&s), -3);
    CHECK_EQ(plim_acquired(&s), 8);
    CHECK(plim_batch_pop(&b) == &a);
    CHECK_EQ(a.state, PLIM_W_TOO_LARGE);
    CHECK(b.done_head == NULL);
    plim_release(&s, 4, &b); /* avail 1 */
    CHECK(b.done_head == NULL);
    /* Raise: c now fits. */
    CHECK_EQ(plim_set_max(&s, 7, &b), PLIM_OK);
    CHECK(plim_batch_pop(&b) == &c);
    CHECK_EQ(plim_available(&s), 0);
    /* Out of range: nothing changes. */
    CHECK_EQ(plim_set_max(&s, PLIM_MAX_PERMITS + 1, &b), -1);
    CHECK_EQ(plim_max(&s), 7);
    CHECK_EQ(plim_available(&s), 0);
    /* A request checked against the old limit and queued after a lowering
     * fails at once instead of waiting for ever. */
    CHECK_EQ(plim_set_max(&s, 2, &b), PLIM_OK);
    plim_waiter_init(&d, 0);
    CHECK_EQ(plim_enqueue(&s, &d, 3, 3), PLIM_TOO_LARGE);
    CHECK_EQ(d.state, PLIM_W_IDLE);
    CHECK_EQ(plim_queue_len(&s), 0);
    plim_sem_destroy(&s);
}

static void test_switch_to_unbounded_grants_everyone(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t w[3];
    plim_sem_init(&s, 4, 0);
    plim_batch_init(&b);
    CHECK(plim_bounded(&s));
    CHECK_EQ(plim_try_acquire(&s, 3), PLIM_OK);
    plim_waiter_init(&w[0], 0);
    plim_waiter_init(&w[1], 1); /* a check is not asked when unbounded */
    plim_waiter_init(&w[2], 0);
    CHECK_EQ(plim_enqueue(&s, &w[0], 4, 4), PLIM_QUEUED);
    CHECK_EQ(plim_enqueue(&s, &w[1], 2, 2), PLIM_QUEUED);
    CHECK_EQ(plim_enqueue(&s, &w[2], 1, 1), PLIM_QUEUED);
    CHECK_EQ(plim_set_max(&s, 0, &b), PLIM_OK);
    CHECK(!plim_bounded(&s));
    CHECK(b.check == NULL);
    for (int i = 0; i < 3; i++) {
        CHECK(plim_batch_pop(&b) == &w[i]); /* FIFO */
        CHECK_EQ(w[i].state, PLIM_W_GRANTED);
    }
    CHECK_EQ(plim_queue_len(&s), 0);
    CHECK_EQ(plim_acquired(&s), 3 + 4 + 2 + 1);
    CHECK_EQ(plim_available(&s), -10);
    CHECK_EQ(plim_max(&s), 0);
    /* The fast path is open again (QUEUED cleared) and takes anything. */
    CHECK_EQ(plim_try_acquire(&s, 100), PLIM_OK);
    plim_release(&s, 110, &b);
    CHECK_EQ(plim_acquired(&s), 0);
    plim_sem_destroy(&s);
}

static void test_switch_to_bounded_carries_what_is_held(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t w;
    plim_sem_init(&s, -3, 0);
    plim_batch_init(&b);
    CHECK(!plim_bounded(&s));
    CHECK_EQ(plim_try_acquire(&s, 50), PLIM_OK);
    CHECK_EQ(plim_set_max(&s, 20, &b), PLIM_OK);
    CHECK(plim_bounded(&s));
    CHECK_EQ(plim_max(&s), 20);
    CHECK_EQ(plim_acquired(&s), 50);
    CHECK_EQ(plim_available(&s), -30);
    CHECK_EQ(plim_try_acquire(&s, 1), PLIM_EMPTY);
    plim_waiter_init(&w, 0);
    CHECK_EQ(plim_enqueue(&s, &w, 5, 5), PLIM_QUEUED);
    plim_release(&s, 34, &b); /* avail 4: still short */
    CHECK(b.done_head == NULL);
    plim_release(&s, 1, &b); /* avail 5 */
    CHECK(plim_batch_pop(&b) == &w);
    CHECK_EQ(plim_available(&s), 0);
    /* Back and forth: the accounting survives every switch. */
    CHECK_EQ(plim_set_max(&s, 0, &b), PLIM_OK);
    CHECK_EQ(plim_acquired(&s), 20);
    CHECK_EQ(plim_set_max(&s, 7, &b), PLIM_OK);
    CHECK_EQ(plim_available(&s), -13);
    plim_release(&s, 20, &b);
    CHECK_EQ(plim_available(&s), 7);
    CHECK_EQ(plim_acquired(&s), 0);
    plim_sem_destroy(&s);
}

static void test_switch_extremes_fit_the_word(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t w;
    plim_sem_init(&s, 0, 0);
    plim_batch_init(&b);
    CHECK_EQ(plim_try_acquire(&s, PLIM_MAX_ACQUIRED), PLIM_OK);
    CHECK_EQ(plim_try_acquire(&s, 1), PLIM_OVERFLOW);
    CHECK_EQ(plim_set_max(&s, 1, &b), PLIM_OK);
    CHECK_EQ(plim_available(&s), 1 - PLIM_MAX_ACQUIRED);
    CHECK_EQ(plim_acquired(&s), PLIM_MAX_ACQUIRED);
    CHECK_EQ(plim_set_max(&s, PLIM_MAX_PERMITS, &b), PLIM_OK);
    CHECK_EQ(plim_available(&s), PLIM_MAX_PERMITS - PLIM_MAX_ACQUIRED);
    plim_release(&s, PLIM_MAX_ACQUIRED, &b);
    CHECK_EQ(plim_available(&s), PLIM_MAX_PERMITS);
    /* Switching to unbounded while a waiter would overflow: it stays
     * queued (I5) until releases make room, then is granted. */
    CHECK_EQ(plim_try_acquire(&s, PLIM_MAX_PERMITS), PLIM_OK);
    plim_waiter_init(&w, 0);
    CHECK_EQ(plim_enqueue(&s, &w, 5, 5), PLIM_QUEUED);
    CHECK_EQ(plim_set_max(&s, 0, &b), PLIM_OK);
    CHECK(b.done_head == NULL);
    CHECK_EQ(plim_queue_len(&s), 1);
    plim_release(&s, 4, &b);
    CHECK(b.done_head == NULL);
    plim_release(&s, 1, &b);
    CHECK(plim_batch_pop(&b) == &w);
    CHECK_EQ(plim_queue_len(&s), 0);
    CHECK_EQ(plim_acquired(&s), PLIM_MAX_PERMITS);
    plim_release(&s, PLIM_MAX_PERMITS, &b);
    CHECK_EQ(plim_acquired(&s), 0);
    plim_sem_destroy(&s);
}

static void test_release_growing(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t up;
    plim_sem_init(&s, 10, 0);
    plim_batch_init(&b);
    plim_waiter_init(&up, 0);
    plim_try_acquire(&s, 4); /* the permit being updated holds 4 */
    plim_try_acquire(&s, 5); /* someone else holds 5 */
    /* Update 4 -> 8 needs 4 more, only 1 free. */
    CHECK_EQ(plim_enqueue(&s, &up, 4, 8), PLIM_QUEUED);
    /* The permit is released while its update waits: it now needs all 8. */
    plim_release_growing(&s, 4, &up, &b);
    CHECK_EQ(up.need, 8);
    CHECK(b.done_head == NULL);
    CHECK_EQ(plim_available(&s), 5);
    plim_release(&s, 5, &b);
    CHECK(plim_batch_pop(&b) == &up);
    CHECK_EQ(up.granted, 8);
    CHECK_EQ(plim_available(&s), 2);
    plim_sem_destroy(&s);
}

static void test_unbounded(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t w;
    plim_sem_init(&s, 0, 0);
    plim_batch_init(&b);
    plim_waiter_init(&w, 0);
    CHECK_EQ(plim_try_acquire(&s, PLIM_MAX_PERMITS - 10), PLIM_OK);
    CHECK_EQ(plim_enqueue(&s, &w, 10, 10), PLIM_OK);
    CHECK_EQ(plim_acquired(&s), PLIM_MAX_ACQUIRED);
    CHECK_EQ(plim_try_acquire(&s, 2), PLIM_OVERFLOW);
    plim_waiter_init(&w, 0);
    CHECK_EQ(plim_enqueue(&s, &w, 1, 1), PLIM_OVERFLOW);
    plim_release(&s, PLIM_MAX_ACQUIRED, &b);
    CHECK_EQ(plim_acquired(&s), 0);
    plim_sem_destroy(&s);
    CHECK_EQ(plim_sem_init(&s, PLIM_MAX_PERMITS + 1, 0), -1);
}

static void test_forget_waiters_keeps_counts(void)
{
    plim_sem_t s;
    plim_batch_t b;
    plim_waiter_t a, c;
    plim_sem_init(&s, 4, 0);
    plim_batch_init(&b);
    plim_waiter_init(&a, 0);
    plim_waiter_init(&c, 1);
    CHECK_EQ(plim_try_acquire(&s, 3), PLIM_OK);
    CHECK_EQ(plim_enqueue(&s, &a, 2, 2), PLIM_QUEUED);
    CHECK_EQ(plim_enqueue(&s, &c, 1, 1), PLIM_QUEUED);
    plim_forget_waiters(&s, &b);
    CHECK(plim_batch_pop(&b) == &a);
    CHECK(plim_batch_pop(&b) == &c);
    CHECK(plim_batch_pop(&b) == NULL && b.check == NULL);
    CHECK_EQ(a.state, PLIM_W_REMOVED);
    CHECK_EQ(c.state, PLIM_W_REMOVED);
    CHECK_EQ(plim_queue_len(&s), 0);
    CHECK_EQ(plim_acquired(&s), 3);
    /* Nobody queues now: the fast paths work again, and what comes back is
     * not handed to the forgotten waiters. */
    CHECK_EQ(plim_try_acquire(&s, 1), PLIM_OK);
    plim_release(&s, 4, &b);
    CHECK(b.done_head == NULL);
    CHECK_EQ(plim_available(&s), 4);
    plim_sem_destroy(&s);
}

int main(void)
{
    RUN(test_try_acquire_and_release);
    RUN(test_fifo_no_barging);
    RUN(test_cancel_head_reconsiders_queue);
    RUN(test_cancel_middle_keeps_order);
    RUN(test_queue_full);
    RUN(test_check_protocol);
    RUN(test_close_fails_waiters_release_still_works);
    RUN(test_set_max);
    RUN(test_switch_to_unbounded_grants_everyone);
    RUN(test_switch_to_bounded_carries_what_is_held);
    RUN(test_switch_extremes_fit_the_word);
    RUN(test_release_growing);
    RUN(test_unbounded);
    RUN(test_forget_waiters_keeps_counts);
    TEST_EXIT();
}
