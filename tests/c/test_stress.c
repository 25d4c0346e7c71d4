/* Multi-threaded stress of the core, with no Python in the loop.
 *
 * T threads share one semaphore.  Each repeatedly takes 1..4 permits by the
 * lock-free fast path or by queueing (some waiters carry a check, some give
 * up after a short timed wait and cancel), holds them briefly, and gives
 * them back, sometimes via a "growing update" release.  Wake-ups follow the
 * binding's rule: the caller of the core wakes the done waiters after the
 * call has returned.
 *
 * Checked throughout: the permits held (by a separate atomic tally) never
 * exceed the limit.  Checked at the end: every permit is back, the queue is
 * empty, and grants + failures add up to the requests made.
 *
 * test_switch_under_load runs the same workers while another thread keeps
 * switching the limit live (unbounded, tight, loose, below the largest
 * request): nothing may be lost or left queued across the switches.
 * Build plain, with -fsanitize=thread and with -fsanitize=address,undefined.
 */
#define _POSIX_C_SOURCE 200809L
#include "plim.h"
#include "plim_test.h"
#include <pthread.h>
#include <time.h>
#include <errno.h>
#include <sched.h>

#ifndef STRESS_THREADS
#define STRESS_THREADS 8
#endif
#ifndef STRESS_ITERS
#define STRESS_ITERS 20000
#endif
#define LIMIT 10

typedef struct tw {
    plim_waiter_t w; /* first member: container_of is a cast */
    pthread_mutex_t m;
    pthread_cond_t c;
    int woken;
    unsigned seed;
} tw_t;

static plim_sem_t sem;
static tw_t slots[STRESS_THREADS];
static _Atomic long long held;
static _Atomic long long max_seen;
static _Atomic long long grants, failures, requests, queued;

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

static void wake(plim_waiter_t *w)
{
    tw_t *t = (tw_t *)w;
    pthread_mutex_lock(&t->m);
    t->woken = 1;
    pthread_cond_signal(&t->c);
    pthread_mutex_unlock(&t->m);
}

/* settle answers pending checks (answer: cancelled 1 time in 8, decided
 * by the asking thread) and wakes every done waiter. */
static void settle(plim_batch_t *b, unsigned *seed)
{
    while (b->check != NULL)
        plim_resume(&sem, b->check, (rnd(seed) & 7) == 0, b);
    plim_waiter_t *w;
    while ((w = plim_batch_pop(b)) != NULL)
        wake(w);
}

static void note_held(long long n)
{
    long long now = atomic_fetch_add(&held, n) + n;
    long long prev = atomic_load(&max_seen);
    while (now > prev && !atomic_compare_exchange_weak(&max_seen, &prev, now)) {
    }
}

static void *worker(void *arg)
{
    tw_t *t = arg;
    plim_batch_t b;
    plim_batch_init(&b);
    for (int i = 0; i < STRESS_ITERS; i++) {
        int64_t n = 1 + (int64_t)(rnd(&t->seed) % 4);
        unsigned mode = rnd(&t->seed) % 8;
        atomic_fetch_add(&requests, 1);
        int64_t got = 0;
        if (mode < 3 && plim_try_acquire(&sem, n) == PLIM_OK) {
            got = n;
        } else {
            plim_waiter_init(&t->w, mode == 7);
            t->woken = 0;
            int r = plim_enqueue(&sem, &t->w, n, n);
            if (r == PLIM_OK) {
                got = t->w.granted;
            } else if (r == PLIM_QUEUED) {
                atomic_fetch_add(&queued, 1);
                int timed = mode == 6;
                pthread_mutex_lock(&t->m);
                if (timed) {
                    struct timespec ts;
                    clock_gettime(CLOCK_REALTIME, &ts);
                    ts.tv_nsec += 20000;
                    if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                    }
                    while (!t->woken) {
                        if (pthread_cond_timedwait(&t->c, &t->m, &ts) == ETIMEDOUT)
                            break;
                    }
                }
                int woken = t->woken;
                pthread_mutex_unlock(&t->m);
                if (timed && !woken) {
                    if (plim_cancel(&sem, &t->w, &b) == PLIM_OK) {
                        settle(&b, &t->seed);
                        atomic_fetch_add(&failures, 1);
                        continue;
                    }
                    /* GONE: a grant or failure raced with the timeout; its
                     * wake-up is on the way and must be consumed before the
                     * node is reused. */
                }
                pthread_mutex_lock(&t->m);
                while (!t->woken)
                    pthread_cond_wait(&t->c, &t->m);
                pthread_mutex_unlock(&t->m);
                if (t->w.state == PLIM_W_GRANTED)
                    got = t->w.granted;
            }
        }
        if (got == 0) {
            atomic_fetch_add(&failures, 1);
            continue;
        }
        atomic_fetch_add(&grants, 1);
        note_held(got);
        if (mode & 1)
            sched_yield(); /* hold a while so that others must queue */
        note_held(-got);
        plim_release(&sem, got, &b);
        settle(&b, &t->seed);
    }
    return NULL;
}

static void reset_counters(void)
{
    atomic_store(&held, 0);
    atomic_store(&max_seen, 0);
    atomic_store(&grants, 0);
    atomic_store(&failures, 0);
    atomic_store(&requests, 0);
    atomic_store(&queued, 0);
}

static void test_stress(void)
{
    pthread_t th[STRESS_THREADS];
    reset_counters();
    CHECK_EQ(plim_sem_init(&sem, LIMIT, 0), PLIM_OK);
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_mutex_init(&slots[i].m, NULL);
        pthread_cond_init(&slots[i].c, NULL);
        slots[i].seed = 1234u + (unsigned)i * 7919u;
        pthread_create(&th[i], NULL, worker, &slots[i]);
    }
    for (int i = 0; i < STRESS_THREADS; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(plim_available(&sem), LIMIT);
    CHECK_EQ(plim_acquired(&sem), 0);
    CHECK_EQ(plim_queue_len(&sem), 0);
    CHECK(atomic_load(&max_seen) <= LIMIT);
    CHECK_EQ(atomic_load(&grants) + atomic_load(&failures), atomic_load(&requests));
    CHECK(atomic_load(&grants) > 0);
    CHECK(atomic_load(&queued) > 0);
    printf("stress: %d threads x %d iters, grants=%lld queued=%lld failures=%lld max_held=%lld\n",
           STRESS_THREADS, STRESS_ITERS, (long long)atomic_load(&grants),
           (long long)atomic_load(&queued),
           (long long)atomic_load(&failures), (long long)atomic_load(&max_seen));
    plim_sem_destroy(&sem);
}

static _Atomic int switching;
static _Atomic long long switches;

static void *switcher(void *arg)
{
    unsigned seed = 99;
    plim_batch_t b;
    (void)arg;
    plim_batch_init(&b);
    /* 3 is below the largest request (4): those fail with TOO_LARGE. */
    static const int64_t limits[] = {0, LIMIT, 3, 2 * LIMIT, -1, 1, LIMIT};
    while (atomic_load(&switching)) {
        int64_t m = limits[rnd(&seed) % (sizeof limits / sizeof limits[0])];
        CHECK_EQ(plim_set_max(&sem, m, &b), PLIM_OK);
        settle(&b, &seed);
        atomic_fetch_add(&switches, 1);
        sched_yield();
    }
    return NULL;
}

static void test_switch_under_load(void)
{
    pthread_t th[STRESS_THREADS], sw;
    plim_batch_t b;
    unsigned seed = 5;
    reset_counters();
    plim_batch_init(&b);
    CHECK_EQ(plim_sem_init(&sem, LIMIT, 0), PLIM_OK);
    atomic_store(&switching, 1);
    pthread_create(&sw, NULL, switcher, NULL);
    for (int i = 0; i < STRESS_THREADS; i++) {
        slots[i].seed = 4321u + (unsigned)i * 104729u;
        pthread_create(&th[i], NULL, worker, &slots[i]);
    }
    for (int i = 0; i < STRESS_THREADS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&switching, 0);
    pthread_join(sw, NULL);
    /* Whatever mode it was left in, the accounting is exact. */
    CHECK_EQ(plim_acquired(&sem), 0);
    CHECK_EQ(plim_queue_len(&sem), 0);
    CHECK_EQ(plim_set_max(&sem, LIMIT, &b), PLIM_OK);
    settle(&b, &seed);
    CHECK_EQ(plim_available(&sem), LIMIT);
    CHECK_EQ(atomic_load(&held), 0);
    CHECK_EQ(atomic_load(&grants) + atomic_load(&failures), atomic_load(&requests));
    CHECK(atomic_load(&switches) > 0);
    printf("switch: %lld switches, grants=%lld queued=%lld failures=%lld\n",
           (long long)atomic_load(&switches), (long long)atomic_load(&grants),
           (long long)atomic_load(&queued), (long long)atomic_load(&failures));
    plim_sem_destroy(&sem);
}

/* Close while threads are queued: every waiter must be failed and woken. */
static void *closer_waiter(void *arg)
{
    tw_t *t = arg;
    plim_waiter_init(&t->w, 0);
    t->woken = 0;
    int r = plim_enqueue(&sem, &t->w, 1, 1);
    if (r == PLIM_QUEUED) {
        pthread_mutex_lock(&t->m);
        while (!t->woken)
            pthread_cond_wait(&t->c, &t->m);
        pthread_mutex_unlock(&t->m);
    }
    return NULL;
}

static void test_close_wakes_all_waiters(void)
{
    pthread_t th[STRESS_THREADS];
    plim_batch_t b;
    plim_batch_init(&b);
    plim_sem_init(&sem, 1, 0);
    plim_try_acquire(&sem, 1);
    for (int i = 0; i < STRESS_THREADS; i++)
        pthread_create(&th[i], NULL, closer_waiter, &slots[i]);
    while (plim_queue_len(&sem) < STRESS_THREADS) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    plim_close(&sem, &b);
    unsigned seed = 1;
    settle(&b, &seed);
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(slots[i].w.state, PLIM_W_CLOSED);
    }
    plim_release(&sem, 1, &b);
    CHECK_EQ(plim_available(&sem), 1);
    plim_sem_destroy(&sem);
}

int main(void)
{
    RUN(test_stress);
    RUN(test_switch_under_load);
    RUN(test_close_wakes_all_waiters);
    TEST_EXIT();
}
