/* plim_shm.h: the host-wide limiter's core (issue 33): a weighted, strictly
 * FIFO semaphore whose state lives in a file mapped MAP_SHARED by every
 * process that uses it.  Linux only (futexes, OFD locks).
 *
 * The layout below is also written by pylimiter/_shared_common.py (which
 * creates and validates the file) and read by the pure-Python twin; the
 * offsets are pinned by static assertions in plim_shm.c.  The design, the
 * invariants, who repairs what after which death and why hostile bytes
 * cannot make this code misbehave are in plim_shm.c's implementation notes.
 *
 * Calling convention.  Every plim_shm_*_locked function must be called
 * between plim_shm_lock (or a successful plim_shm_trylock) and
 * plim_shm_unlock on the same handle.  The lock is the host's, not the
 * process's: one holder at a time in the whole host.  Nothing here takes
 * the GIL or calls back; plim_shm_lock may sleep (bounded) and is meant to
 * be called without the GIL.  Wake-ups decided inside a critical section
 * are delivered by plim_shm_unlock, after the lock is dropped.
 *
 * The lock-free paths (plim_shm_fast.h: plim_shm_fast_take/_give) run
 * without the host's lock.  On one handle they must run one at a time,
 * and not at the same time as plim_shm_give_back_locked or
 * plim_shm_detach_locked on that handle (the binding: all of them hold
 * the GIL).  They may run at the same time as anything else, here or in
 * other processes.
 */
#ifndef PLIM_SHM_H
#define PLIM_SHM_H

#include <stdint.h>
#include <stddef.h>
#include <stdatomic.h>
#include <pthread.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PLIM_SHM_MAX_PERMITS ((((int64_t)1) << 60) - 1)
#define PLIM_SHM_NIL 0xFFFFFFFFu
#define PLIM_SHM_NBUCKETS 16
#define PLIM_SHM_MAX_POOLS 2
#define PLIM_SHM_LOCK_BASE (((int64_t)1) << 40)   /* OFD byte of slot 0 */
#define PLIM_SHM_IMPL_C 1
#define PLIM_SHM_NLOOPS 64                         /* loop bits per process */

/* A pool's counter word (plim_shm.c, "The counter word"): three flags and
 * avail + BIAS above them, so that one CAS checks and changes everything
 * the uncontended paths look at. */
#define PLIM_SHM_W_QUEUED 1u        /* the pool's queue is not empty */
#define PLIM_SHM_W_RECOVERING 2u    /* a repair or set_max rewrites the word */
#define PLIM_SHM_W_UNBOUNDED 4u     /* max <= 0 */
#define PLIM_SHM_W_FLAGS 7u
#define PLIM_SHM_W_SHIFT 3
#define PLIM_SHM_W_BIAS (((int64_t)1) << 60)

/* Status codes. */
enum {
    PLIM_SHM_OK = 0,
    PLIM_SHM_EMPTY = 1,     /* take: does not fit now, or others queue first */
    PLIM_SHM_OVERFLOW = 2,  /* unbounded pool: too many permits outstanding */
    PLIM_SHM_QUEUED = 3,    /* enqueue: the record is in the queue */
    PLIM_SHM_FULL = 4,      /* enqueue: the queue (or the record table) is full */
    PLIM_SHM_TOO_LARGE = 5, /* enqueue: total exceeds the bounded limit */
    PLIM_SHM_GONE = 6,      /* the record is no longer this request's */
    PLIM_SHM_STUCK = 7,     /* lock: a live process held it past the bound */
    PLIM_SHM_CORRUPT = 8,   /* the segment stays inconsistent after repairs */
    PLIM_SHM_NOSLOT = 9,    /* register: max_processes live processes */
    PLIM_SHM_TIMEDOUT = 10, /* wait: the deadline passed */
    PLIM_SHM_INTR = 11,     /* wait: a signal arrived (check it, then wait again) */
    PLIM_SHM_DECIDED = 12,  /* wait / abandon: the record left the queue */
    PLIM_SHM_REMOVED = 13,  /* abandon: taken out of the queue */
    PLIM_SHM_KEPT = 14,     /* abandon (timeout): granted meanwhile; collect it */
    PLIM_SHM_GAVE_BACK = 15,/* abandon (cancel): granted meanwhile; given back */
    PLIM_SHM_ERRNO = 16     /* a system call failed: see errno */
};

/* A record's state: pylimiter's waiter states (plim.h, _common.W_*). */
enum {
    PLIM_SHM_R_FREE = 0,
    PLIM_SHM_R_QUEUED = 1,
    PLIM_SHM_R_GRANTED = 2,
    PLIM_SHM_R_CLOSED = 3,
    PLIM_SHM_R_TOO_LARGE = 4,
    PLIM_SHM_R_CANCELLED = 5,
    PLIM_SHM_R_REMOVED = 6
};

enum { PLIM_SHM_SLOT_FREE = 0, PLIM_SHM_SLOT_LIVE = 1 };

/* ---- the segment (shared; every field may hold hostile bytes) ---------- */

typedef struct plim_shm_header {
    uint8_t magic[8];             /* written and checked by the opener only */
    uint32_t version;
    uint32_t impl;
    uint64_t size;
    uint32_t kind;
    uint32_t npools;
    int64_t cfg_max[2];           /* creation settings */
    int64_t cfg_queue;
    uint32_t max_processes;
    uint32_t nrec;
    _Atomic uint32_t mutex;       /* the host's lock: 0, or owner | WAITERS */
    _Atomic uint32_t dirty;       /* the pure twin's; unused here */
    _Atomic uint64_t seq;         /* arrival counter (FIFO order) */
    _Atomic uint32_t free_head;   /* free record list */
    _Atomic uint32_t bump;        /* records >= bump were never used */
    _Atomic uint32_t epoch;
    _Atomic uint32_t ticket;      /* record tickets */
    _Atomic int64_t last_sweep;   /* CLOCK_MONOTONIC ns of the last sweep */
    _Atomic int64_t repair_at;    /* != 0: a repair could not rebuild the
                                   * words; try again from this time (ns) */
    uint8_t reserved[144];
} plim_shm_header_t;

typedef struct plim_shm_pool {
    _Atomic int64_t max;          /* the live limit; <= 0: unbounded (a fact) */
    _Atomic uint64_t word;        /* flags | (avail + BIAS) << 3; avail is
                                   * max - acquired, or -acquired (derived) */
    _Atomic uint32_t head;        /* queue, oldest first (derived) */
    _Atomic uint32_t tail;
    _Atomic int64_t qlen;         /* (derived) */
    _Atomic int64_t acquired_total;
    _Atomic int64_t timeout_total;
    _Atomic int64_t queue_full_total;
    _Atomic int64_t cancelled_total;
    _Atomic int64_t wait_ns;      /* sum of waits */
    _Atomic int64_t hwm;          /* the most acquired at once */
    _Atomic int64_t buckets[PLIM_SHM_NBUCKETS];
    uint8_t reserved[48];
} plim_shm_pool_t;

typedef struct plim_shm_slot {
    /* First line: read and written by other processes too. */
    _Atomic uint32_t state;       /* FREE / LIVE (a fact, with the OFD lock) */
    _Atomic uint32_t gen;         /* bumped at each registration and death */
    _Atomic int32_t pid;
    _Atomic uint32_t wake;        /* the process's waker futex */
    _Atomic uint64_t loopmask;    /* its loops with a decided record */
    _Atomic int64_t held[2];      /* permits it holds through critical
                                   * sections (a fact; only it writes) */
    _Atomic uint64_t direct;      /* its loops with a wake socket */
    uint8_t reserved0[16];
    /* Second line: written by the owner's lock-free paths only. */
    _Atomic uint32_t inflight;    /* nonzero inside a lock-free path */
    uint32_t pad;
    _Atomic int64_t fheld[2];     /* permits it holds through lock-free
                                   * paths (a fact; only they write) */
    _Atomic int64_t fcount[2];    /* lock-free grants ever made through
                                   * this slot (statistics; kept across
                                   * the slot's owners) */
    uint8_t reserved1[24];
} plim_shm_slot_t;

typedef struct plim_shm_rec {
    _Atomic uint32_t state;       /* the fact; also the futex a thread waits on */
    _Atomic uint32_t owner;       /* slot */
    _Atomic uint32_t owner_gen;
    _Atomic uint32_t ticket;
    _Atomic uint32_t pool;
    _Atomic uint32_t tag;         /* 0: a blocking thread; else loop bit + 1 */
    _Atomic uint32_t prev;        /* queue links (derived) */
    _Atomic uint32_t next;
    _Atomic int64_t need;
    _Atomic int64_t total;
    _Atomic int64_t granted;      /* written before state becomes GRANTED */
    _Atomic uint64_t seq;
    _Atomic int64_t enq_ns;
    _Atomic int64_t limit;        /* the limit that made it TOO_LARGE */
    uint8_t reserved[16];
} plim_shm_rec_t;

/* ---- this process's handle ------------------------------------------------ */

/* The wake-ups one critical section decided, delivered by plim_shm_unlock. */
#define PLIM_SHM_WAKES 128
typedef struct plim_shm_direct {
    uint32_t slot, gen, bit;        /* another process's loop with a socket */
} plim_shm_direct_t;
typedef struct plim_shm_wake {
    uint32_t rec[PLIM_SHM_WAKES];   /* records whose thread waits on state */
    uint32_t slot[PLIM_SHM_WAKES];  /* other processes whose waker to wake */
    plim_shm_direct_t direct[PLIM_SHM_WAKES];   /* loops to wake directly */
    int nrec, nslot, ndirect;
    int all;                        /* too many: wake everything */
    uint64_t own_loops;             /* this process's loop bits */
} plim_shm_wake_t;

typedef struct plim_shm {
    uint8_t *base;                /* the mapping */
    size_t size;
    int fd;                       /* the mapping's description: never locks */
    int lockfd;                   /* ours: the slot's OFD lock */
    uint32_t npools, maxp, nrec;
    size_t off_pools, off_slots, off_recs;
    int64_t max_queue;            /* <= 0: unbounded (the table bounds it) */
    int32_t slot;                 /* -1: not registered */
    uint32_t gen;
    plim_shm_pool_t *pool[PLIM_SHM_MAX_POOLS];   /* the pools (attach) */
    plim_shm_slot_t *me;          /* our slot (register; NULL: none) */
    int64_t lock_timeout_ns;      /* the bound on waiting for a live holder */
    int crash;                    /* tests: SIGKILL at the crash-th point */
    int repairs;                  /* repairs run (statistics, tests) */
    plim_shm_wake_t wk;           /* Locking: the host's lock */
    /* The waker thread (asyncio): its eventfds, one per loop bit. */
    pthread_mutex_t wmu;
    int efd[PLIM_SHM_NLOOPS];     /* Locking: wmu */
    /* Direct wakes (plim_shm.c, "Who wakes whom"): our loops' sockets, and
     * the unbound one we send from (-1: none yet).  The segment's file
     * (st_dev, st_ino) names the sockets: from our fstat, not the file. */
    int lsock[PLIM_SHM_NLOOPS];   /* Locking: the binding's (the GIL) */
    int dsock;                    /* Locking: the host's lock (sent after
                                   * it is dropped, by its last holder) */
    uint64_t dev, ino;
    int waker_running;            /* Locking: the GIL (the binding's) */
    _Atomic int waker_stop;
    pthread_t waker;
} plim_shm_t;

typedef struct plim_shm_stats {
    int64_t max, avail, qlen, acquired_total, timeout_total, queue_full_total;
    int64_t cancelled_total, wait_ns, hwm;
    int64_t buckets[PLIM_SHM_NBUCKETS];
} plim_shm_stats_t;

/* plim_shm_attach maps the file open on fd (validated by the opener, with
 * these creation settings) and prepares h.  lockfd is this process's own
 * description of the file.  Returns PLIM_SHM_OK or PLIM_SHM_ERRNO. */
int plim_shm_attach(plim_shm_t *h, int fd, int lockfd, size_t size, uint32_t npools,
                    uint32_t maxp, uint32_t nrec, int64_t max_queue);

/* plim_shm_detach_map unmaps (the waker must be stopped). */
void plim_shm_unmap(plim_shm_t *h);

/* plim_shm_register claims a free slot for pid (the opener holds the open
 * lock): its OFD lock first, then the slot.  PLIM_SHM_OK, PLIM_SHM_NOSLOT,
 * or a lock failure. */
int plim_shm_register(plim_shm_t *h, int32_t pid);

/* plim_shm_after_fork: in a forked child, h is the parent's; forget the
 * slot, the waker and its eventfds (the child registers anew). */
void plim_shm_after_fork(plim_shm_t *h);

/* The host's lock.  trylock: one attempt (a few spins), no sleeping; 1 if
 * taken.  lock: waits (futex, bounded by lock_timeout_ns), takes the lock
 * over from a dead holder and repairs.  PLIM_SHM_OK / PLIM_SHM_STUCK /
 * PLIM_SHM_CORRUPT. */
int plim_shm_trylock(plim_shm_t *h);
int plim_shm_lock(plim_shm_t *h);
void plim_shm_unlock(plim_shm_t *h);

/* Lock-free snapshots (may be stale when they return). */
int64_t plim_shm_max(plim_shm_t *h, uint32_t p);
int64_t plim_shm_avail(plim_shm_t *h, uint32_t p);
int64_t plim_shm_acquired(plim_shm_t *h, uint32_t p);
int64_t plim_shm_qlen(plim_shm_t *h, uint32_t p);
int64_t plim_shm_hwm(plim_shm_t *h, uint32_t p);
int plim_shm_sweep_due(plim_shm_t *h);
/* plim_shm_any_dead: whether a process attached to the segment has died
 * (its slot is taken, its lock gone), asked without the host's lock: the
 * observing calls and the refusals ask it so that what a dead process held
 * returns as soon as the next of them runs, not at the next timed sweep. */
int plim_shm_any_dead(plim_shm_t *h);
/* plim_shm_peek: the state of this process's record rec (ticket), or -1 if
 * it is no longer this request's. */
int plim_shm_peek(plim_shm_t *h, uint32_t rec, uint32_t ticket);

/* ---- critical sections (the host's lock held) ---------------------------- */

/* take: n permits now if nobody queues (bounded) and they fit.  OK / EMPTY /
 * OVERFLOW.  n == 0 always fits. */
int plim_shm_take_locked(plim_shm_t *h, uint32_t p, int64_t n);
/* enqueue: a record for `need` more permits (the request holds `total` in
 * the end) at the tail.  QUEUED (*rec, *ticket set) / TOO_LARGE (*limit) /
 * FULL, or OK: the permits came back meanwhile (a lock-free release in
 * another process) and were taken, as plim_shm_take_locked would. */
int plim_shm_enqueue_locked(plim_shm_t *h, uint32_t p, int64_t need, int64_t total,
                            uint32_t tag, uint32_t *rec, uint32_t *ticket, int64_t *limit);
/* give_back: this process returns n permits of pool p (never more than it
 * holds); a queued growing update (rec/ticket, or NIL) now needs n more. */
int plim_shm_give_back_locked(plim_shm_t *h, uint32_t p, int64_t n, uint32_t rec,
                              uint32_t ticket);
/* collect: the outcome of this process's decided record; a grant moves into
 * its held permits; the record is freed.  OK (*state, *granted, *limit) or
 * GONE (no longer ours: dropped by a repair). */
int plim_shm_collect_locked(plim_shm_t *h, uint32_t rec, uint32_t ticket, int *state,
                            int64_t *granted, int64_t *limit);
/* abandon: the requester stops waiting.  REMOVED (it was queued), KEPT (a
 * timeout found it granted: collect it), GAVE_BACK (a cancel found it
 * granted: the permits went back, the record is freed), DECIDED (failed
 * otherwise: collect it), GONE. */
int plim_shm_abandon_locked(plim_shm_t *h, uint32_t rec, uint32_t ticket, int timed_out);
/* set_max: OK, CORRUPT, or STUCK (a live process stayed inside a lock-free
 * path for lock_timeout_ns: nothing changed). */
int plim_shm_set_max_locked(plim_shm_t *h, uint32_t p, int64_t max);
/* count: bump a counter (1 timeout, 2 queue full, 3 cancelled). */
void plim_shm_count_locked(plim_shm_t *h, uint32_t p, int which);
/* detach: free this process's slot; what it holds and its uncollected
 * grants go back.  Then plim_shm_unlock and plim_shm_release_slot. */
int plim_shm_detach_locked(plim_shm_t *h);
void plim_shm_release_slot(plim_shm_t *h, int32_t slot);
/* sweep: look for dead processes (force, or when due) and repair. */
int plim_shm_sweep_locked(plim_shm_t *h, int force);
int plim_shm_stats_locked(plim_shm_t *h, uint32_t p, plim_shm_stats_t *out);
/* holders: pids[i], held[i * npools + p] for each live slot; returns the count. */
int plim_shm_holders_locked(plim_shm_t *h, int32_t *pids, int64_t *held);
/* audit (tests): acquired, held, granted, qlen, queued, linked. */
int plim_shm_audit_locked(plim_shm_t *h, uint32_t p, int64_t out[6]);

/* ---- waiting ----------------------------------------------------------------- */

/* wait_rec: block (no GIL) while this process's record rec is queued, at
 * most until deadline_ns (CLOCK_MONOTONIC; < 0: no deadline); sweeps for
 * dead processes every 250 ms meanwhile.  DECIDED / TIMEDOUT / INTR /
 * STUCK / CORRUPT. */
int plim_shm_wait_rec(plim_shm_t *h, uint32_t rec, uint32_t ticket, int64_t deadline_ns);
/* wait_collect: wait_rec, then collect (plim_shm_collect_locked) under the
 * host's lock, all without the GIL.  DECIDED (*state, *granted, *limit
 * set), GONE, or wait_rec's other statuses. */
int plim_shm_wait_collect(plim_shm_t *h, uint32_t rec, uint32_t ticket, int64_t deadline_ns,
                          int *state, int64_t *granted, int64_t *limit);

/* The asyncio side: loop bits with an eventfd each, written by the waker
 * thread (decisions by other processes) and by plim_shm_unlock (ours). */
int plim_shm_loop_add(plim_shm_t *h, int bit);  /* returns the eventfd or -1 */
void plim_shm_loop_remove(plim_shm_t *h, int bit);
/* loop_direct: a datagram socket for loop `bit` that other processes'
 * decisions write to directly (no waker thread in between); -1 with errno
 * if it cannot be had (the name is taken: the waker path serves the loop).
 * loop_direct_close undoes it.  loop_drain empties such a socket
 * (is_socket) or an eventfd, in one system call: how much it read. */
int plim_shm_loop_direct(plim_shm_t *h, int bit);
void plim_shm_loop_direct_close(plim_shm_t *h, int bit);
int plim_shm_loop_drain(int fd, int is_socket);
int plim_shm_waker_start(plim_shm_t *h);
void plim_shm_waker_stop(plim_shm_t *h);

int64_t plim_shm_now_ns(void);

#ifdef __cplusplus
}
#endif

#endif /* PLIM_SHM_H */
