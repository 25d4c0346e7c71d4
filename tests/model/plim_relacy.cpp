// Relacy model of the acquire / release / wake handoff in csrc/plim_sem.c,
// and of the live switch between bounded and unbounded (plim_set_max).
//
// Relacy (Debian's relacy-dev) runs the threads below under its own
// scheduler and C++11 memory model simulator: every atomic load may return
// any value the model allows for its memory order (not just the newest, as on
// x86 or under qemu), and every plain variable (rl::var) access is checked
// for data races against happens-before.  So a too-weak order shows up as a
// race on the data the permits guard, even on this x86 host.
//
// What is modelled, line for line with plim_sem.c (same word layout, same
// CAS conditions, same memory orders, named MO_* below):
//   plim_try_acquire, plim_release (fast CAS and the locked slow path),
//   plim_enqueue (fits / sets QUEUED / queues), process_locked (grant heads
//   in FIFO order, both modes, clear QUEUED when the queue empties),
//   plim_set_max (max stored, then one CAS moves avail and the mode bit,
//   then the queue is processed in the new mode), and the binding's wake
//   rule: the caller wakes granted waiters after the core call returned and
//   mu is dropped, through a per-waiter lock + flag (the PyThread lock of the
//   blocking path; asyncio's call_soon_threadsafe is also a locked handoff).
// What is not: close, cancel, resume/is_cancelled, update growing, requests
// larger than the limit (all under mu, so ordered by the mutex, and covered
// by the TSAN stress tests), and queue-size limits.
//
// Scenario 1 (handoff): LIMIT = 2 permits act as a readers/writer lock.  A
// writer takes 2 and writes `data`; readers take 1 and read it.  Any missing
// happens-before edge between a release and the next acquire is a data race
// on `data`.  Also asserted: permits held never exceed LIMIT, every waiter
// is woken exactly once with its permits (no lost wake-up: a sleeper that
// is never woken is a deadlock Relacy reports), and at the end every permit
// is back and QUEUED is clear.
//
// Scenario 2 (switch): a 1-permit semaphore; two workers each take 1 and
// wait, holding it, until both hold one, which only the switcher's
// set_max(0) (unbounded) can allow: it must grant a queued worker at once.
// Then the switcher sets the limit back to 1 (both still hold: avail -1)
// and the workers take and give back 1 more each, now bounded.  Asserted:
// no deadlock, a grant decided in bounded mode never leaves avail negative
// by itself, and at the end avail is exactly 1, bounded, nothing queued.
//
// PLIM_MODEL_WEAKEN=N compiles one order or rule deliberately wrong, to show
// the check has teeth (tests/test_memory_model.py expects those builds to
// fail):
//   1  plim_try_acquire's successful CAS: acquire -> relaxed
//   2  plim_release's fast CAS:            release -> relaxed
//   3  process_locked's grant fetch_sub:   acquire -> relaxed
//   4  not an order but the I4 rule: plim_release's fast path ignores QUEUED,
//      so permits come back without the queue being processed (a lost
//      wake-up, which Relacy reports as a deadlock)
//   5  the mode read beside the word instead of from it: plim_try_acquire
//      decides "unbounded" from a separate flag that set_max writes after
//      its CAS, so a fast grant can slip past a switch to bounded
//   6  set_max(<= 0) switches the mode but does not grant the queue (I5):
//      a queued worker is never woken (deadlock)
// relacy.hpp, not relacy_std.hpp: the latter re-exports rl:: names into
// std::, which clashes with GCC 12's <atomic>.
#include <relacy/relacy.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifndef PLIM_MODEL_WEAKEN
#define PLIM_MODEL_WEAKEN 0
#endif

static const rl::memory_order MO_TRY_ACQ =
    PLIM_MODEL_WEAKEN == 1 ? rl::mo_relaxed : rl::mo_acquire;
static const rl::memory_order MO_FAST_REL =
    PLIM_MODEL_WEAKEN == 2 ? rl::mo_relaxed : rl::mo_release;
static const rl::memory_order MO_GRANT =
    PLIM_MODEL_WEAKEN == 3 ? rl::mo_relaxed : rl::mo_acquire;
// As in plim_sem.c, not weakened here:
static const rl::memory_order MO_SLOW_REL = rl::mo_release;
static const rl::memory_order MO_ENQ_ACQ = rl::mo_acquire;

static const uint64_t WORD_QUEUED = 1, WORD_CLOSED = 2, WORD_UNBOUNDED = 4;
static const unsigned WORD_SHIFT = 3;
static const int64_t WORD_BIAS = int64_t(1) << 60;
static const int64_t MAX_ACQUIRED = (int64_t(1) << 60) - 1;
static int64_t word_avail(uint64_t w) { return int64_t(w >> WORD_SHIFT) - WORD_BIAS; }
static uint64_t word_units(int64_t n) { return uint64_t(n) << WORD_SHIFT; }
static uint64_t word_make(int64_t avail, uint64_t flags)
{
    return (uint64_t(avail + WORD_BIAS) << WORD_SHIFT) | flags;
}

enum { MAXW = 3 };
enum { ST_IDLE, ST_QUEUED, ST_GRANTED };
enum { OK, EMPTY, QUEUED_ };

struct waiter {
    // Under mu while queued, as in plim_waiter_t.
    rl::var<waiter *> prev, next;
    rl::var<int64_t> need;
    rl::var<int> state;
    // The binding's wake handoff.
    rl::mutex wm;
    rl::condition_variable wcv;
    rl::var<int> woken;
};

// plim_sem.c, modelled: the state of one plim_sem_t and its calls.
struct core_model {
    rl::atomic<uint64_t> word;
    rl::atomic<int64_t> max;
    rl::atomic<int> mode_shadow;  // WEAKEN 5 only: "unbounded" kept beside the word
    rl::mutex mu;
    rl::var<waiter *> head, tail;

    void core_init(int64_t limit)
    {
        word($).store(limit > 0 ? word_make(limit, 0) : word_make(0, WORD_UNBOUNDED),
                      rl::mo_relaxed);
        max($).store(limit, rl::mo_relaxed);
        mode_shadow($).store(limit > 0 ? 0 : 1, rl::mo_relaxed);
        head($) = nullptr;
        tail($) = nullptr;
    }

    void core_check_end(int64_t limit)
    {
        uint64_t w = word($).load(rl::mo_relaxed);
        RL_ASSERT(word_avail(w) == limit);
        RL_ASSERT((w & (WORD_QUEUED | WORD_UNBOUNDED)) == 0);
        RL_ASSERT(head($) == nullptr);
    }

    bool unbounded_for_fast_path(uint64_t cur)
    {
        if (PLIM_MODEL_WEAKEN == 5)
            return mode_shadow($).load(rl::mo_relaxed) != 0;
        return (cur & WORD_UNBOUNDED) != 0;
    }

    int try_acquire(int64_t n)
    {
        uint64_t cur = word($).load(rl::mo_relaxed);
        for (;;) {
            bool unbounded = unbounded_for_fast_path(cur);
            if (unbounded) {
                if (word_avail(cur) - n < -MAX_ACQUIRED)
                    return EMPTY;
            } else if ((cur & WORD_QUEUED) || word_avail(cur) < n) {
                return EMPTY;
            }
            uint64_t next = cur - word_units(n);
            if (word($).compare_exchange_weak(cur, next, MO_TRY_ACQ, rl::mo_relaxed)) {
                // A grant decided in bounded mode cannot overdraw by itself.
                if (!(next & WORD_UNBOUNDED))
                    RL_ASSERT(word_avail(next) >= 0);
                return OK;
            }
        }
    }

    void push(waiter *w)  // plim_waitq_push, under mu
    {
        w->prev($) = tail($);
        w->next($) = nullptr;
        if (tail($))
            tail($)->next($) = w;
        else
            head($) = w;
        tail($) = w;
    }

    void unlink(waiter *w)  // plim_waitq_unlink, under mu
    {
        waiter *p = w->prev($), *nx = w->next($);
        if (p) p->next($) = nx; else head($) = nx;
        if (nx) nx->prev($) = p; else tail($) = p;
        w->prev($) = w->next($) = nullptr;
    }

    // Granted waiters go to `done` (the batch); the caller wakes them.
    int process_locked(waiter **done)
    {
        int nd = 0;
        waiter *h;
        while ((h = head($)) != nullptr) {
            uint64_t cur = word($).load(rl::mo_relaxed);
            if (cur & WORD_UNBOUNDED) {
                if (word_avail(cur) - h->need($) < -MAX_ACQUIRED)
                    break;
            } else if (word_avail(cur) < h->need($)) {
                break;
            }
            word($).fetch_sub(word_units(h->need($)), MO_GRANT);
            unlink(h);
            h->state($) = ST_GRANTED;
            done[nd++] = h;
        }
        if (head($) == nullptr)
            word($).fetch_and(~WORD_QUEUED, rl::mo_relaxed);
        return nd;
    }

    int release(int64_t n, waiter **done)
    {
        uint64_t cur = word($).load(rl::mo_relaxed);
        while (PLIM_MODEL_WEAKEN == 4 || !(cur & WORD_QUEUED)) {
            if (word($).compare_exchange_weak(cur, cur + word_units(n), MO_FAST_REL,
                                              rl::mo_relaxed))
                return 0;
        }
        mu.lock($);
        word($).fetch_add(word_units(n), MO_SLOW_REL);
        int nd = process_locked(done);
        mu.unlock($);
        return nd;
    }

    int enqueue(waiter *w, int64_t need)
    {
        w->need($) = need;
        mu.lock($);
        uint64_t cur = word($).load(rl::mo_relaxed);
        for (;;) {
            bool fits = (cur & WORD_UNBOUNDED)
                            ? word_avail(cur) - need >= -MAX_ACQUIRED
                            : !(cur & WORD_QUEUED) && word_avail(cur) >= need;
            if (fits) {
                if (word($).compare_exchange_weak(cur, cur - word_units(need), MO_ENQ_ACQ,
                                                  rl::mo_relaxed)) {
                    w->state($) = ST_GRANTED;
                    mu.unlock($);
                    return OK;
                }
                continue;
            }
            if (cur & WORD_QUEUED)
                break;
            if (word($).compare_exchange_weak(cur, cur | WORD_QUEUED, rl::mo_relaxed,
                                              rl::mo_relaxed))
                break;
        }
        push(w);
        w->state($) = ST_QUEUED;
        mu.unlock($);
        return QUEUED_;
    }

    int set_max(int64_t m, waiter **done)
    {
        mu.lock($);
        uint64_t cur = word($).load(rl::mo_relaxed);
        int64_t old_limit = (cur & WORD_UNBOUNDED) ? 0 : max($).load(rl::mo_seq_cst);
        int64_t new_limit = m > 0 ? m : 0;
        uint64_t mode = m > 0 ? 0 : WORD_UNBOUNDED;
        max($).store(m, rl::mo_seq_cst);
        while (!word($).compare_exchange_weak(
            cur, ((cur + word_units(new_limit - old_limit)) & ~WORD_UNBOUNDED) | mode,
            rl::mo_seq_cst, rl::mo_seq_cst)) {
        }
        mode_shadow($).store(m > 0 ? 0 : 1, rl::mo_relaxed);
        int nd = 0;
        if (!(PLIM_MODEL_WEAKEN == 6 && m <= 0))
            nd = process_locked(done);
        mu.unlock($);
        return nd;
    }

    // ---- the binding's side ----------------------------------------------
    void wake(waiter *w)
    {
        w->wm.lock($);
        RL_ASSERT(w->woken($) == 0);  // exactly once
        w->woken($) = 1;
        w->wcv.notify_one($);
        w->wm.unlock($);
    }

    void wake_all(waiter **done, int nd)
    {
        for (int i = 0; i < nd; i++)  // mu is dropped: now wake
            wake(done[i]);
    }

    void acquire(waiter *w, int64_t n)
    {
        if (try_acquire(n) == OK)
            return;
        if (enqueue(w, n) == OK)
            return;
        w->wm.lock($);
        while (w->woken($) == 0)
            w->wcv.wait(w->wm, $);
        w->woken($) = 0;
        w->wm.unlock($);
        // Read after the wake: mu (granter) -> wm -> here.
        RL_ASSERT(w->state($) == ST_GRANTED);
    }

    void give_back(int64_t n)
    {
        waiter *done[MAXW];
        wake_all(done, release(n, done));
    }

    void waiters_init(waiter *ws, int n)
    {
        for (int i = 0; i < n; i++) {
            ws[i].prev($) = ws[i].next($) = nullptr;
            ws[i].state($) = ST_IDLE;
            ws[i].woken($) = 0;
        }
    }
};

// Scenario 1: the acquire/release/wake handoff as a readers/writer lock.
enum { LIMIT = 2, THREADS = 3, ROUNDS = 2 };

struct plim_model : rl::test_suite<plim_model, THREADS>, core_model {
    waiter ws[THREADS];
    rl::var<int> data;           // what the permits guard
    rl::atomic<int> held;       // checker only: permits held right now

    void before()
    {
        core_init(LIMIT);
        data($) = 0;
        held($).store(0, rl::mo_relaxed);
        waiters_init(ws, THREADS);
    }

    void after() { core_check_end(LIMIT); }

    void thread(unsigned idx)
    {
        waiter *w = &ws[idx];
        int64_t n = idx == 0 ? LIMIT : 1;  // thread 0 writes, the others read
        for (int r = 0; r < ROUNDS; r++) {
            acquire(w, n);
            int h = held($).fetch_add(int(n), rl::mo_relaxed) + int(n);
            RL_ASSERT(h <= LIMIT);
            if (n == LIMIT)
                data($) = data($) + 1;
            else
                (void)(int)data($);
            held($).fetch_sub(int(n), rl::mo_relaxed);
            give_back(n);
        }
    }
};

// Scenario 2: the live switch (thread 0 switches, 1 and 2 work).
struct switch_model : rl::test_suite<switch_model, 3>, core_model {
    waiter ws[3];
    rl::mutex bm;                // the "both hold one" barrier
    rl::condition_variable bcv;
    rl::var<int> holding;

    void before()
    {
        core_init(1);
        waiters_init(ws, 3);
        holding($) = 0;
    }

    void after() { core_check_end(1); }

    void wait_both_hold()
    {
        bm.lock($);
        while (holding($) < 2)
            bcv.wait(bm, $);
        bm.unlock($);
    }

    void thread(unsigned idx)
    {
        waiter *done[MAXW];
        if (idx == 0) {
            wake_all(done, set_max(0, done));
            wait_both_hold();
            wake_all(done, set_max(1, done));
            return;
        }
        waiter *w = &ws[idx];
        acquire(w, 1);
        bm.lock($);
        holding($) = holding($) + 1;
        bcv.notify_all($);
        bm.unlock($);
        wait_both_hold();
        give_back(1);
        acquire(w, 1);
        give_back(1);
    }
};

template <class Suite>
static bool run(const char *name, int argc, char **argv)
{
    rl::test_params p;
    // argv[1]: random schedules to run; argv[2] == "bound": instead, search
    // every schedule with at most argv[1] preemptions (exhaustive within
    // that bound).
    bool bound = argc > 2 && std::strcmp(argv[2], "bound") == 0;
    p.search_type = bound ? rl::sched_bound : rl::sched_random;
    if (bound)
        p.context_bound = argc > 1 ? unsigned(std::strtoul(argv[1], nullptr, 10)) : 1;
    else
        p.iteration_count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200000;
    p.execution_depth_limit = 20000;
    if (bound)
        std::printf("relacy model of plim_sem.c (%s), weaken=%d, all schedules with <= %u "
                    "preemptions\n", name, PLIM_MODEL_WEAKEN, p.context_bound);
    else
        std::printf("relacy model of plim_sem.c (%s), weaken=%d, %llu random schedules\n",
                    name, PLIM_MODEL_WEAKEN, (unsigned long long)p.iteration_count);
    return rl::simulate<Suite>(p);
}

int main(int argc, char **argv)
{
    bool ok = run<plim_model>("handoff", argc, argv);
    ok = run<switch_model>("switch", argc, argv) && ok;
    std::printf("model check: %s\n", ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
}
