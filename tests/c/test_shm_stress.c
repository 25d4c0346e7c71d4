/* test_shm_stress.c: the host-wide limiter's core (csrc/plim_shm.c) with
 * no Python: several processes, threads in each, over one segment file.
 * Run plain, under ThreadSanitizer and under AddressSanitizer+UBSan by
 * tests/shared/test_c_tier.py.
 *
 *   test_hammer      P processes x T threads take (lock-free first, as the
 *                    binding does, then under the lock), queue (thread
 *                    waiters on the record futex, collecting without the
 *                    process's "GIL" as the binding does, and "loop"
 *                    waiters on an eventfd the waker thread writes), time
 *                    out, release (lock-free first), for a while; the
 *                    permits in use, counted in a separate shared page,
 *                    never exceed the limit; at the end the books balance
 *                    and every grant, lock-free or not, is counted.
 *   test_kills       the same while the parent SIGKILLs children at random
 *                    moments and starts new ones; after each kill the dead
 *                    one's permits come back and the books balance.
 *   test_lock_death  a child dies holding the host's lock: the next locker
 *                    takes it over and repairs.
 *   test_fast_death  children die at every crash point of the lock-free
 *                    paths and of the critical sections (between a CAS on
 *                    the counter word and the ledger store included): the
 *                    books balance after each.
 *   test_stalled     a live process stays inside a lock-free path (its mark
 *                    set, as if stopped there) while another dies holding
 *                    permits: the repair cannot rebuild the word and says
 *                    so, the lock-free paths keep working meanwhile, and
 *                    once the mark clears a later sweep returns the dead
 *                    one's permits.
 *   test_hostile     random bytes over the live segment's state while a
 *                    child works: it finishes (no crash, no hang).
 */
#define _GNU_SOURCE
#include "plim_shm.h"
#include "plim_shm_fast.h"
#include "plim_test.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LIMIT 6
#define MAXQ 32
#define MAXPROC 16

static char g_path[256];
static size_t g_size;
static uint32_t g_nrec;

/* What the processes account in: permits in use right now, the most seen. */
typedef struct {
    _Atomic int64_t inuse;
    _Atomic int64_t peak;
    _Atomic int64_t over;     /* times the limit was found exceeded */
    _Atomic int64_t ops;
} shared_books_t;
static shared_books_t *g_books;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The segment as pylimiter/_shared_common.py's init_state writes it. */
static void make_segment(const char *dir)
{
    snprintf(g_path, sizeof g_path, "%s/pylimiter-test-stress", dir);
    uint32_t npools = 1, maxp = MAXPROC;
    g_nrec = npools * 2 * MAXQ + 2 * maxp;
    size_t raw = sizeof(plim_shm_header_t) + npools * sizeof(plim_shm_pool_t) +
                 maxp * sizeof(plim_shm_slot_t) + g_nrec * sizeof(plim_shm_rec_t);
    g_size = (raw + 4095) / 4096 * 4096;
    unlink(g_path);
    int fd = open(g_path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)g_size) != 0) {
        perror("segment");
        exit(2);
    }
    plim_shm_header_t *H = mmap(NULL, g_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    memcpy(H->magic, "PLIMSHM\001", 8);
    H->version = 2;
    H->impl = PLIM_SHM_IMPL_C;
    H->size = g_size;
    H->kind = 1;
    H->npools = npools;
    H->cfg_max[0] = LIMIT;
    H->cfg_queue = MAXQ;
    H->max_processes = maxp;
    H->nrec = g_nrec;
    atomic_store(&H->free_head, PLIM_SHM_NIL);
    plim_shm_pool_t *P = (plim_shm_pool_t *)(void *)((char *)H + sizeof *H);
    atomic_store(&P->max, LIMIT);
    atomic_store(&P->word, plim_shm_word_make(LIMIT, 0));
    atomic_store(&P->head, PLIM_SHM_NIL);
    atomic_store(&P->tail, PLIM_SHM_NIL);
    munmap(H, g_size);
    close(fd);
}

static void attach(plim_shm_t *h)
{
    int fd = open(g_path, O_RDWR | O_CLOEXEC);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int lockfd = open(proc, O_RDWR | O_CLOEXEC);
    if (fd < 0 || lockfd < 0 ||
        plim_shm_attach(h, fd, lockfd, g_size, 1, MAXPROC, g_nrec, MAXQ) != PLIM_SHM_OK) {
        perror("attach");
        exit(2);
    }
    if (plim_shm_register(h, getpid()) != PLIM_SHM_OK) {
        fprintf(stderr, "register failed\n");
        exit(2);
    }
}

static void detach(plim_shm_t *h)
{
    plim_shm_waker_stop(h);
    if (plim_shm_lock(h) == PLIM_SHM_OK) {
        plim_shm_detach_locked(h);
        int32_t slot = h->slot;
        plim_shm_unlock(h);
        plim_shm_release_slot(h, slot);
    }
    for (int b = 0; b < PLIM_SHM_NLOOPS; b++)
        plim_shm_loop_remove(h, b);
    plim_shm_unmap(h);
    close(h->lockfd);
    close(h->fd);
}

static void account(int64_t n)
{
    int64_t now = atomic_fetch_add(&g_books->inuse, n) + n;
    if (now > LIMIT)
        atomic_fetch_add(&g_books->over, 1);
    int64_t peak = atomic_load(&g_books->peak);
    while (now > peak && !atomic_compare_exchange_weak(&g_books->peak, &peak, now)) {
    }
}

/* The process's "GIL": what the binding runs holding the GIL (the
 * lock-free paths, give-back, the critical sections it starts) runs
 * holding this; what it runs without (waiting, and collecting a thread's
 * grant) runs without. */
static pthread_mutex_t g_gil = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    plim_shm_t *h;
    uint64_t seed;
    int iters;
    int loop_bit;    /* >= 0: wait like an event loop, on this eventfd */
    int efd;
} worker_t;

/* One acquire of n: lock-free, else take or queue under the lock and wait
 * (futex or eventfd), maybe time out.  Returns the permits obtained (0 on
 * a timeout). */
static int64_t acquire(worker_t *w, int64_t n, int64_t timeout_ns)
{
    plim_shm_t *h = w->h;
    uint32_t rec, ticket;
    int64_t limit;
    pthread_mutex_lock(&g_gil);
    if (plim_shm_fast_take(h, 0, n) == PLIM_SHM_OK) {
        pthread_mutex_unlock(&g_gil);
        return n;
    }
    if (plim_shm_lock(h) != PLIM_SHM_OK) {
        pthread_mutex_unlock(&g_gil);
        return 0;
    }
    if (plim_shm_take_locked(h, 0, n) == PLIM_SHM_OK) {
        plim_shm_unlock(h);
        pthread_mutex_unlock(&g_gil);
        return n;
    }
    uint32_t tag = w->loop_bit >= 0 ? (uint32_t)w->loop_bit + 1u : 0u;
    int st = plim_shm_enqueue_locked(h, 0, n, n, tag, &rec, &ticket, &limit);
    plim_shm_unlock(h);
    pthread_mutex_unlock(&g_gil);
    if (st == PLIM_SHM_OK)
        return n;   /* a lock-free release gave them back meanwhile */
    if (st != PLIM_SHM_QUEUED)
        return 0;   /* full */
    if (w->loop_bit < 0) {
        /* A thread: wait and collect without the GIL (plim_shm_wait_collect,
         * as the binding), then abandon with it after a timeout. */
        int64_t deadline = plim_shm_now_ns() + timeout_ns;
        for (;;) {
            int state = 0;
            int64_t granted = 0;
            st = plim_shm_wait_collect(h, rec, ticket, deadline, &state, &granted, &limit);
            if (st == PLIM_SHM_INTR)
                continue;
            if (st == PLIM_SHM_DECIDED)
                return state == PLIM_SHM_R_GRANTED ? granted : 0;
            if (st != PLIM_SHM_TIMEDOUT)
                return 0;
            pthread_mutex_lock(&g_gil);
            if (plim_shm_lock(h) != PLIM_SHM_OK) {
                pthread_mutex_unlock(&g_gil);
                return 0;
            }
            st = plim_shm_abandon_locked(h, rec, ticket, 1);
            plim_shm_unlock(h);
            pthread_mutex_unlock(&g_gil);
            if (st == PLIM_SHM_REMOVED || st == PLIM_SHM_GONE)
                return 0;
            deadline = -1;   /* granted meanwhile: collect it */
        }
    }
    int64_t deadline = plim_shm_now_ns() + timeout_ns;
    for (;;) {
        if (w->loop_bit >= 0) {
            while (plim_shm_peek(h, rec, ticket) == PLIM_SHM_R_QUEUED) {
                int64_t left = deadline - plim_shm_now_ns();
                if (left <= 0)
                    break;
                struct pollfd pfd = {w->efd, POLLIN, 0};
                if (poll(&pfd, 1, (int)(left / 1000000 + 1)) > 0) {
                    uint64_t v;
                    ssize_t r = read(w->efd, &v, sizeof v);
                    (void)r;
                }
            }
            st = plim_shm_peek(h, rec, ticket) == PLIM_SHM_R_QUEUED ? PLIM_SHM_TIMEDOUT
                                                                     : PLIM_SHM_DECIDED;
        } else {
            st = plim_shm_wait_rec(h, rec, ticket, deadline);
        }
        if (st == PLIM_SHM_INTR)
            continue;
        pthread_mutex_lock(&g_gil);
        if (plim_shm_lock(h) != PLIM_SHM_OK) {
            pthread_mutex_unlock(&g_gil);
            return 0;
        }
        if (st == PLIM_SHM_TIMEDOUT) {
            st = plim_shm_abandon_locked(h, rec, ticket, 1);
            if (st == PLIM_SHM_REMOVED || st == PLIM_SHM_GONE) {
                plim_shm_unlock(h);
                pthread_mutex_unlock(&g_gil);
                return 0;
            }
        }
        int state = 0;
        int64_t granted = 0;
        st = plim_shm_collect_locked(h, rec, ticket, &state, &granted, &limit);
        plim_shm_unlock(h);
        pthread_mutex_unlock(&g_gil);
        if (st == PLIM_SHM_QUEUED)
            continue;
        return st == PLIM_SHM_OK && state == PLIM_SHM_R_GRANTED ? granted : 0;
    }
}

static void release(plim_shm_t *h, int64_t n)
{
    pthread_mutex_lock(&g_gil);
    if (plim_shm_fast_give(h, 0, n) != PLIM_SHM_OK && plim_shm_lock(h) == PLIM_SHM_OK) {
        plim_shm_give_back_locked(h, 0, n, PLIM_SHM_NIL, 0);
        plim_shm_unlock(h);
    }
    pthread_mutex_unlock(&g_gil);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    for (int i = 0; i < w->iters; i++) {
        int64_t n = (int64_t)(rng_next(&w->seed) % 3) + 1;
        int64_t timeout = (rng_next(&w->seed) % 4 == 0) ? 200000 : 200000000;
        int64_t got = acquire(w, n, timeout);
        if (got == 0)
            continue;
        account(got);
        if (rng_next(&w->seed) % 4 == 0)
            usleep((useconds_t)(rng_next(&w->seed) % 300));
        account(-got);
        release(w->h, got);
        atomic_fetch_add(&g_books->ops, 1);
    }
    return NULL;
}

/* A child: T threads (the last one waits like an event loop), iters each. */
static void child_run(int idx, int threads, int iters)
{
    plim_shm_t h;
    attach(&h);
    pthread_t tid[8];
    worker_t w[8];
    int efd = plim_shm_loop_add(&h, 0);
    if (efd < 0 || plim_shm_waker_start(&h) != PLIM_SHM_OK)
        exit(3);
    for (int t = 0; t < threads; t++) {
        w[t].h = &h;
        w[t].seed = UINT64_C(0x9E3779B97F4A7C15) ^ (uint64_t)(idx * 131 + t + 1);
        w[t].iters = iters;
        w[t].loop_bit = t == threads - 1 ? 0 : -1;
        w[t].efd = efd;
        pthread_create(&tid[t], NULL, worker_main, &w[t]);
    }
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    detach(&h);
}

static int64_t audit_ok(plim_shm_t *h)
{
    int64_t a[6];
    if (plim_shm_lock(h) != PLIM_SHM_OK)
        return -1;
    plim_shm_sweep_locked(h, 1);
    plim_shm_audit_locked(h, 0, a);
    plim_shm_unlock(h);
    CHECK_EQ(a[0], a[1] + a[2]);
    CHECK_EQ(a[3], a[4]);
    CHECK_EQ(a[4], a[5]);
    return a[0];
}

static void test_hammer(void)
{
    atomic_store(&g_books->inuse, 0);
    atomic_store(&g_books->peak, 0);
    atomic_store(&g_books->over, 0);
    enum { PROCS = 4 };
    pid_t pids[PROCS];
    for (int i = 0; i < PROCS; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            child_run(i, 3, 3000);
            _exit(0);
        }
    }
    for (int i = 0; i < PROCS; i++) {
        int status = 0;
        waitpid(pids[i], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    CHECK_EQ(atomic_load(&g_books->over), 0);
    CHECK(atomic_load(&g_books->peak) <= LIMIT);
    CHECK(atomic_load(&g_books->ops) > 0);
    plim_shm_t h;
    {
        int fd = open(g_path, O_RDONLY);
        uint32_t word = 1;
        pread(fd, &word, sizeof word, 64);
        close(fd);
        CHECK_EQ(word, 0);   /* every child left the lock free */
    }
    attach(&h);
    CHECK_EQ(audit_ok(&h), 0);
    CHECK_EQ(plim_shm_qlen(&h, 0), 0);
    CHECK(plim_shm_hwm(&h, 0) <= LIMIT);
    plim_shm_stats_t st;
    plim_shm_stats_locked(&h, 0, &st);
    /* Every grant counted once, lock-free ones (in their slots) included. */
    CHECK_EQ(st.acquired_total, atomic_load(&g_books->ops));
    CHECK_EQ(st.buckets[0] + st.buckets[1] + st.buckets[2] + st.buckets[3] + st.buckets[4] +
                 st.buckets[5] + st.buckets[6] + st.buckets[7] + st.buckets[8] + st.buckets[9] +
                 st.buckets[10] + st.buckets[11] + st.buckets[12] + st.buckets[13] +
                 st.buckets[14] + st.buckets[15],
             st.acquired_total);
    printf("hammer: %lld acquire/release pairs, peak %lld of %d, %lld timeouts\n",
           (long long)atomic_load(&g_books->ops), (long long)atomic_load(&g_books->peak), LIMIT,
           (long long)st.timeout_total);
    detach(&h);
}

static void test_kills(void)
{
    int64_t ops0 = atomic_load(&g_books->ops);
    enum { PROCS = 3, KILLS = 12 };
    uint64_t seed = 42;
    pid_t pids[PROCS];
    plim_shm_t h;
    attach(&h);
    for (int i = 0; i < PROCS; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            child_run(100 + i, 2, 1000000);
            _exit(0);
        }
    }
    for (int k = 0; k < KILLS; k++) {
        usleep((useconds_t)(rng_next(&seed) % 20000 + 2000));
        int j = (int)(rng_next(&seed) % PROCS);
        kill(pids[j], SIGKILL);
        int status = 0;
        waitpid(pids[j], &status, 0);
        CHECK(WIFSIGNALED(status));
        audit_ok(&h);
        pids[j] = fork();
        if (pids[j] == 0) {
            child_run(200 + k, 2, 1000000);
            _exit(0);
        }
    }
    for (int i = 0; i < PROCS; i++) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
    }
    CHECK_EQ(audit_ok(&h), 0);
    /* Every permit came back: the whole budget can be taken. */
    CHECK_EQ(plim_shm_lock(&h), PLIM_SHM_OK);
    CHECK_EQ(plim_shm_take_locked(&h, 0, LIMIT), PLIM_SHM_OK);
    CHECK_EQ(plim_shm_give_back_locked(&h, 0, LIMIT, PLIM_SHM_NIL, 0), PLIM_SHM_OK);
    plim_shm_unlock(&h);
    printf("kills: %d, %lld pairs meanwhile, %d repairs seen here\n", KILLS,
           (long long)(atomic_load(&g_books->ops) - ops0), h.repairs);
    CHECK(atomic_load(&g_books->ops) > ops0);
    detach(&h);
}

static void test_lock_death(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        plim_shm_t c;
        attach(&c);
        plim_shm_lock(&c);
        plim_shm_take_locked(&c, 0, 2);
        kill(getpid(), SIGKILL);   /* dies holding the lock and 2 permits */
        _exit(1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    plim_shm_t h;
    attach(&h);   /* registering takes the lock: over from the dead holder */
    CHECK(h.repairs >= 1);
    CHECK_EQ(plim_shm_avail(&h, 0), LIMIT);
    CHECK_EQ(audit_ok(&h), 0);
    detach(&h);
}

/* A child that runs lock-free and locked operations, single-threaded,
 * and is SIGKILLed by its own crash-th crash point. */
static void crash_child(int crash)
{
    plim_shm_t c;
    attach(&c);
    c.crash = crash;
    for (int i = 0; i < 4; i++) {
        if (plim_shm_fast_take(&c, 0, 2) == PLIM_SHM_OK)
            plim_shm_fast_give(&c, 0, 2);
        plim_shm_lock(&c);
        int st = plim_shm_take_locked(&c, 0, 3);
        plim_shm_unlock(&c);
        if (st == PLIM_SHM_OK && plim_shm_fast_give(&c, 0, 1) == PLIM_SHM_OK) {
            plim_shm_lock(&c);
            plim_shm_give_back_locked(&c, 0, 2, PLIM_SHM_NIL, 0);
            plim_shm_unlock(&c);
        }
    }
    _exit(0);   /* fewer crash points than asked: survived */
}

static void test_fast_death(void)
{
    fflush(stdout);   /* children must not print our buffer again */
    plim_shm_t h;
    attach(&h);
    int died = 0;
    for (int k = 1; k <= 16; k++) {
        pid_t pid = fork();
        if (pid == 0)
            crash_child(k);
        int status = 0;
        waitpid(pid, &status, 0);
        died += WIFSIGNALED(status);
        CHECK_EQ(audit_ok(&h), 0);   /* its permits came back (a repair) */
        CHECK_EQ(plim_shm_avail(&h, 0), LIMIT);
    }
    CHECK(died >= 12);
    /* And the lock-free paths work on the repaired word. */
    CHECK_EQ(plim_shm_fast_take(&h, 0, LIMIT), PLIM_SHM_OK);
    CHECK_EQ(plim_shm_fast_give(&h, 0, LIMIT), PLIM_SHM_OK);
    printf("fast death: %d of 16 children killed at a crash point, books balanced after each\n",
           died);
    detach(&h);
}

static void test_stalled(void)
{
    int to_a[2], from_a[2], to_b[2], from_b[2];
    char c = 0;
    fflush(stdout);
    if (pipe(to_a) || pipe(from_a) || pipe(to_b) || pipe(from_b)) {
        perror("pipe");
        exit(2);
    }
    plim_shm_t h;
    attach(&h);
    pid_t a = fork();
    if (a == 0) {   /* holds 3 permits, then is killed */
        plim_shm_t x;
        attach(&x);
        if (plim_shm_fast_take(&x, 0, 3) != PLIM_SHM_OK)
            _exit(3);
        if (write(from_a[1], "a", 1) != 1 || read(to_a[0], &c, 1) != 1)
            _exit(4);
        _exit(5);
    }
    pid_t b = fork();
    if (b == 0) {   /* stays "inside a lock-free path" until told */
        plim_shm_t x;
        attach(&x);
        atomic_store(&x.me->inflight, 1u);
        if (write(from_b[1], "b", 1) != 1 || read(to_b[0], &c, 1) != 1)
            _exit(4);
        atomic_store_explicit(&x.me->inflight, 0u, memory_order_release);
        if (write(from_b[1], "b", 1) != 1 || read(to_b[0], &c, 1) != 1)
            _exit(4);
        detach(&x);
        _exit(0);
    }
    CHECK_EQ(read(from_a[0], &c, 1), 1);
    CHECK_EQ(read(from_b[0], &c, 1), 1);
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    int64_t t0 = plim_shm_now_ns();
    CHECK_EQ(plim_shm_lock(&h), PLIM_SHM_OK);
    plim_shm_sweep_locked(&h, 1);   /* finds a dead: repairs, cannot quiesce */
    plim_shm_unlock(&h);
    int64_t took = plim_shm_now_ns() - t0;
    CHECK(took < 2000000000LL);   /* bounded (20 ms, plus a loaded machine) */
    CHECK(atomic_load(&plim_shm_hdr(&h)->repair_at) != 0);
    CHECK_EQ(plim_shm_avail(&h, 0), LIMIT - 3);   /* the word stood: never too high */
    CHECK_EQ(plim_shm_fast_take(&h, 0, 2), PLIM_SHM_OK);   /* lock-free still works */
    CHECK_EQ(plim_shm_fast_give(&h, 0, 2), PLIM_SHM_OK);
    CHECK_EQ(write(to_b[1], "go", 1), 1);   /* b goes on */
    CHECK_EQ(read(from_b[0], &c, 1), 1);
    usleep(120000);   /* the retry is due */
    CHECK(plim_shm_sweep_due(&h));
    CHECK_EQ(plim_shm_lock(&h), PLIM_SHM_OK);
    plim_shm_sweep_locked(&h, 0);
    plim_shm_unlock(&h);
    CHECK_EQ(atomic_load(&plim_shm_hdr(&h)->repair_at), 0);
    CHECK_EQ(plim_shm_avail(&h, 0), LIMIT);   /* a's permits are back */
    CHECK_EQ(write(to_b[1], "go", 1), 1);
    int status = 0;
    waitpid(b, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ(audit_ok(&h), 0);
    printf("stalled: the failed repair round took %lld us; retried and rebuilt\n",
           (long long)(took / 1000));
    detach(&h);
    close(to_a[0]);
    close(to_a[1]);
    close(from_a[0]);
    close(from_a[1]);
    close(to_b[0]);
    close(to_b[1]);
    close(from_b[0]);
    close(from_b[1]);
}

static void test_hostile(void)
{
    fflush(stdout);   /* children must not print our buffer again (TSan's _exit) */
    pid_t pid = fork();
    if (pid == 0) {
        child_run(300, 2, 3000);
        _exit(0);
    }
    int fd = open(g_path, O_RDWR);
    uint64_t seed = 7;
    size_t hot = sizeof(plim_shm_header_t) + sizeof(plim_shm_pool_t) +
                 MAXPROC * sizeof(plim_shm_slot_t) + 16 * sizeof(plim_shm_rec_t);
    int status = 0;
    int64_t start = plim_shm_now_ns();
    while (waitpid(pid, &status, WNOHANG) == 0) {
        uint32_t v = (uint32_t)rng_next(&seed);
        size_t off = 64 + (size_t)(rng_next(&seed) % (hot - 64 - 4));
        off &= ~(size_t)3;
        if (off != 64)   /* not the lock word: a stuck lock only times out (10 s) */
            pwrite(fd, &v, sizeof v, (off_t)off);
        usleep(200);
        if (plim_shm_now_ns() - start > 60LL * 1000000000LL) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "hostile: the child hung\n");
            CHECK(0);
            break;
        }
    }
    close(fd);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    char dir[] = "/tmp/plim_shm_stress_XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    g_books = mmap(NULL, sizeof *g_books, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    make_segment(dir);
    RUN(test_hammer);
    RUN(test_lock_death);
    RUN(test_fast_death);
    RUN(test_stalled);
    RUN(test_kills);
    make_segment(dir);
    RUN(test_hostile);
    unlink(g_path);
    rmdir(dir);
    TEST_EXIT();
}
