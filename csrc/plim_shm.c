/* plim_shm.c: the host-wide limiter's core (issue 33).
 *
 * Implementation notes
 * ====================
 *
 * One file, mapped MAP_SHARED by every process of the host that opens the
 * semaphore, holds the whole state (layout: plim_shm.h; created, validated
 * and re-initialised by pylimiter/_shared_common.py):
 *
 *   header   the host's lock word, the arrival counter, the free-record
 *            list, the sweep time, the time of a repair still due
 *   pools    per pool (1, or 2 for the dual limiter): the live limit, the
 *            counter word (available count and flags), the FIFO queue
 *            (head, tail, length), counters, the wait histogram and the
 *            high-water mark of acquired permits
 *   slots    one per attached process (max_processes): LIVE/FREE, pid,
 *            generation, the permits it holds per pool (two ledgers, below),
 *            its waker futex; on a line of its own, its in-flight mark and
 *            what its lock-free paths write
 *   records  one per request that had to queue: owner slot and generation,
 *            ticket, pool, need/total/granted, arrival number, the queue
 *            links; its state word is also the futex its thread sleeps on
 *
 * Facts and derived fields.  The design rests on one split.  The FACTS are:
 * which slots are LIVE (a slot is live exactly while its process holds an
 * OFD lock on byte LOCK_BASE + slot: the kernel drops it when the process
 * dies, whatever kills it, so liveness needs no pid and has no pid-reuse
 * race), what each live slot holds per pool, held[] + fheld[] (held[] is
 * written by its critical sections, fheld[] by its lock-free paths, each
 * only by that process: two ledgers, so that a thread collecting a grant
 * under the lock without the GIL never races the lock-free path of
 * another thread of the process, and only their sum means anything), each
 * record's state (with granted written before a state becomes GRANTED),
 * and each pool's max.  Everything else is DERIVED: the counter word
 * (avail = max - sum(held + fheld of live slots) - sum(granted of GRANTED
 * records), and QUEUED), the queue links and lengths (the QUEUED records
 * in arrival order), the free list (the FREE records).  repair_locked()
 * recomputes every derived field from the facts, so any state the facts
 * describe consistently can be repaired, whatever the derived fields say
 * (the word only once no live process is inside a lock-free path: below).
 *
 * Invariants (between critical sections):
 *   S1  outside every live process's lock-free path: avail == (max > 0 ?
 *       max : 0) - (held + fheld)(live) - granted(GRANTED).
 *   S1' whatever died where: avail never counts as free a permit that a
 *       live process holds or a GRANTED record carries (below: a death
 *       can only leave the word too low, never too high).
 *   S2  a pool's queue holds exactly its QUEUED records, oldest first by
 *       arrival number; qlen is their count; the word's QUEUED flag is set
 *       exactly when the queue is not empty.
 *   S3  no barging: a request is granted at once only if its pool's queue
 *       is empty (or it asks for 0); else it queues at the tail.
 *   S4  the head is granted as soon as it fits, by whoever changed avail,
 *       max or the queue (release, cancel, timeout, set_max, close, repair).
 *   S5  held[] and fheld[] of a slot are written only by the process that
 *       owns the slot (and zeroed by a repair once that process is dead).
 *
 * The counter word.  A pool's available count lives in one 64-bit word
 * with three flags below it, as plim_sem.c's word:
 *
 *     bit 0        QUEUED      the queue is not empty (S2)
 *     bit 1        RECOVERING  a repair or set_max is rewriting the word
 *     bit 2        UNBOUNDED   max <= 0 (a CAS validates the mode with avail)
 *     bits 3..63   avail + 2^60
 *
 * avail stays in [-(2^60 - 1), 2^60 - 1] (every writer saturates there),
 * and any 64 bits decode into [-2^60, 2^60), so hostile bytes cannot make
 * the arithmetic overflow.  Every write of the word is an RMW (CAS,
 * fetch_or/fetch_and, exchange), never a plain store: the release
 * sequences below rely on it.
 *
 * The lock-free paths (plim_shm_fast.h).  Uncontended, an acquire is one
 * CAS on the word (avail -= n, only if neither QUEUED nor RECOVERING is set
 * and n fits), then fheld += n; a release is one CAS (avail += n, same
 * conditions), then fheld -= n.  Each is bracketed by the slot's in-flight
 * mark (set before the CAS, cleared after the fheld store).  Anything else
 * takes the lock.  So while QUEUED is set only lock holders change avail,
 * and the queue is served by whoever does (S4), as plim_sem.c's I2.  The
 * enqueue under the lock sets QUEUED with a CAS that re-checks the fit: if
 * a lock-free release gave the permits back after the take under the lock
 * failed, the enqueue takes them instead.  So no wake-up is lost: a
 * lock-free release either comes before that CAS in the word's order (the
 * CAS sees its permits) or after (it sees QUEUED and goes to the lock).
 * A lock-free grant is counted in its slot (fcount, kept across the slot's
 * owners; stats() adds the slots up), not in the pool's counters, which
 * only lock holders write; the high-water mark is raised by a bounded CAS
 * loop (both paths).  Measured against taking the lock for the same work
 * (benchmarks/README.md, "Host-wide limiter"), this saves the lock's
 * exchange on every uncontended acquire and release.
 *
 * A death between the CAS and the fheld store.  The dying process's facts
 * are discarded with it (S5), so for the dead the order does not matter:
 * the repair rebuilds the word from the facts of the living.  What must
 * never happen is a rebuild that reads the facts of a LIVE process whose
 * CAS is done and whose fheld store is not: its permits would be counted
 * free (an acquire) and handed out twice, or counted held twice (a
 * release) and lost.  So a repair QUIESCES first: (a) it sets RECOVERING
 * on every pool's word (fetch_or); from then on no lock-free CAS succeeds,
 * its expected value lacking the flag; (b) it waits until the mark of
 * every live slot is clear; (c) it rebuilds the word and publishes it with
 * an exchange that clears RECOVERING.  After (b) every CAS that succeeded
 * before (a) has had its fheld store, and none succeeds until (c).  The
 * wait is bounded (QUIESCE_NS): a process stopped inside its path
 * (SIGSTOP, a debugger) or a hostile mark must not hang the repair.  That
 * round then rebuilds everything but the word's avail, clears RECOVERING
 * and sets repair_at: a sweep tries again (at most every REPAIR_RETRY_NS).
 * Serving from the old avail meanwhile is safe by S1': every critical
 * section lowers the word BEFORE the facts that use the permits (take:
 * the word, then held; a grant: the word, then granted and the commit;
 * set_max lowering the limit: the word, then max) and raises it only AFTER
 * the facts that free them (give-back: held, then the word; a cancelled
 * grant, a detach: the record or held, then the word), and a lock-free
 * path moves only its own process's permits, which die with it.  So a
 * death leaves the word too low, never too high: the permits of the dead
 * stay unused until a round succeeds, and none is handed out twice.
 * set_max quiesces the same way (bounded by lock_timeout_ns, STUCK after),
 * because it rewrites the word's avail and mode, and the limit the
 * lock-free acquire reads for the high-water mark.
 *
 * The lock.  Every other change happens under the host's lock: a futex
 * word in the header holding (slot + 1) | (generation & 0x7fff) << 16 and
 * a WAITERS bit.  Uncontended, it costs one CAS to take and one exchange
 * to drop, and no system call; the uncontended acquire and release do not
 * take it at all (above).
 *
 * Who repairs what after which death.  Each critical section writes its
 * facts so that every prefix of it is consistent, given that the dying
 * process's own facts are discarded with it (S5):
 *   - a process dies outside a critical section: its slot's OFD lock is
 *     gone.  The next sweep finds the LIVE slot without a lock: at once in
 *     a process that reads the host's numbers or would be refused or queued
 *     (plim_shm_any_dead asks every taken slot's lock first, without the
 *     host's lock), and at most every 250 ms, host-wide, in one that waits
 *     in a queue, opens, or whose waker thread runs.  It takes the lock
 *     and repairs: the slot becomes FREE (generation bumped), its held[]
 *     and fheld[] are dropped, its records are freed (QUEUED ones leave the
 *     queue, GRANTED ones give their permits back), and S1/S2 are rebuilt
 *     (S1 once the repair has quiesced the lock-free paths, above).
 *   - a process dies inside a lock-free path: its mark stays set, but it
 *     is dead, so a quiescing repair does not wait for it; its facts go
 *     as above, and the word is rebuilt without them.
 *   - a process dies inside a critical section, holding the lock: a waiter
 *     of the lock sleeps at most 2 ms at a time, then checks the owner's OFD
 *     lock; dead (or a slot number out of range, or our own slot with
 *     another generation: we registered in the dead holder's slot), it
 *     takes the word over with a CAS from the exact value it saw and
 *     repairs as above.  What
 *     the dead process wrote half-way is either its own facts (discarded) or
 *     a decision about another process's record, which it commits with ONE
 *     store (the record's state) after the data that goes with it (granted,
 *     limit): the record is QUEUED (nothing happened) or decided (it all
 *     happened).  The derived fields it left half-written are rebuilt.
 *     Its own facts it writes in the order that never counts a permit
 *     twice: collect frees the record (a fact) before it adds the grant to
 *     held[]; take and give-back change held[] only on their own slot.
 *     (The spin model found the other order of collect's two stores.)
 *     And it changes the word in the order of S1' (above), so a repair
 *     that cannot quiesce may serve from the word it left.
 *   - a repairer dies: RECOVERING stays set, so the lock-free paths keep
 *     going to the lock, whose next taker takes it over and repairs.
 *   - a process dies between dropping the lock and waking the waiters it
 *     decided: a repair wakes every decided record and every process.
 *   - a process closes (detaches): its queued records fail CLOSED, its
 *     uncollected grants and held[] go back, its slot becomes FREE, all in
 *     one critical section; then it drops its slot's OFD lock.
 * Who wakes whom: a decision's thread waiter sleeps on its record's state
 * (FUTEX_WAIT, shared: the mapping is a file), woken with FUTEX_WAKE on that
 * address after the lock is dropped.  An asyncio waiter's event loop
 * watches a datagram socket of its own (plim_shm_loop_direct), bound to an
 * abstract name made of the segment file's device and inode (from each
 * process's own fstat, never from the file's bytes), the slot, its
 * generation and the loop's bit; its slot's `direct` mask says which loops
 * have one.  The decider sends one byte to it after dropping the lock: one
 * hop, from the releasing process straight into the waiting loop.  Loops
 * without a socket (the name was taken, bit 63 shared by many loops, a
 * send that failed) go through the process's waker thread instead: it
 * sleeps on its slot's wake futex, which the decider bumps after setting
 * the loop's bit in loopmask, and writes that loop's eventfd (no GIL, no
 * polling).  Decisions for this very process write the eventfd directly.
 * A wake-up that reaches a record, slot or loop reused meanwhile is
 * spurious and harmless: every waiter rechecks its record (ticket, owner)
 * in a loop.  What another process can do with the sockets: abstract
 * names have no permissions, so any process in the network namespace can
 * send to a loop's socket (a spurious wake-up: the loop drains it and
 * rechecks its records) or bind a name first (that loop then uses the
 * waker); it receives nothing of ours, and no descriptor of ours ever
 * leaves this process.  Hostile bytes in `direct` or loopmask only choose
 * which of the two paths wakes a loop, or wake it for nothing.
 *
 * Memory orders.  Every shared field is an _Atomic.  Under the lock,
 * fields are accessed with relaxed loads and stores; the lock's CAS
 * (acquire) and its exchange on unlock (release) order them between
 * holders, and so carry what one holder of permits wrote to the next (a
 * release's unlock happens before the grantee's lock when it collects).
 * Counters are updated with a relaxed load and store, not an RMW: only the
 * lock holder writes them (the lock-free grants count in their own slot).
 * Lock-free readers (the properties, a waiter peeking at its record) read
 * relaxed snapshots and act only after taking the lock (collect), or only
 * report (a property).  FUTEX_WAIT/WAKE are full barriers.  The word and
 * the marks, which lock-free paths touch without the lock, need more; the
 * sites, each with why it suffices:
 *   F1  a lock-free path stores its mark (relaxed) before its CAS
 *       (acq_rel); a repair's fetch_or(RECOVERING) is acq_rel.  If the CAS
 *       comes first in the word's modification order, the fetch_or reads
 *       its value or a later one, all written by RMWs, so it reads from
 *       the CAS's release sequence and synchronizes with it: the repair's
 *       load of the mark then sees 1, or the store that cleared it.  If the
 *       fetch_or comes first, the CAS fails (the flag), or comes after the
 *       rebuild's exchange and is then consistent with the rebuilt word
 *       (the facts it changes after its CAS were not read yet).  This is
 *       not a Dekker pair of a store and a load on two locations: both
 *       sides make an RMW on the word, and RMWs on one location are totally
 *       ordered, so release/acquire suffices and the lock-free path needs
 *       no seq_cst store or fence (on x86, its CAS is its only locked
 *       instruction).
 *   F2  the mark is cleared with a release store (also when the path
 *       refuses) and a repair loads it with acquire: a repair that reads 0
 *       sees every fheld store made before it.
 *   F3  the lock-free acquire reads max after its CAS, for the high-water
 *       mark.  Its CAS (acquire) reads from the release sequence of the
 *       last set_max's final RMW on the word, so it sees that max or a
 *       later one; a later set_max quiesces first, i.e. waits until our
 *       mark is cleared (release, after our read): our read happens before
 *       its store.  The read is exact, so the mark never over-reports.
 *   F4  permits: a lock-free take is an acquire and a give a release, as
 *       in plim_sem.c; the RMWs of the locked paths on the word are acq_rel
 *       too (a lock-free taker may take what a locked give-back returned,
 *       and the reverse).
 * The model tests/model/plim_shm.pml checks the protocol, process death
 * after any step included (between a lock-free CAS and its fheld store
 * too, and a live process in flight during a repair), under sequential
 * consistency; F1-F4 are why the protocol sees no weaker model.
 *
 * Hostile bytes.  Any process of the same uid can write anything into the
 * file at any time (that uid can also ptrace us, so truncating the file
 * under our mapping, a SIGBUS, is out of scope).  This code never trusts
 * a byte it reads there:
 *   - every offset is computed from the creation settings this process
 *     validated at open and keeps in its handle, never from the file;
 *   - every record index, slot index and pool index read from the file is
 *     checked against the handle's bounds before it is used as one;
 *   - every walk is bounded (a queue walk by the record count, a repair by
 *     the table sizes); a walk that finds a link, state or value out of
 *     place calls for a repair, and three in one operation make it fail
 *     with PLIM_SHM_CORRUPT (SharedLimiterError) instead of looping;
 *   - arithmetic on values read from the file saturates (no signed
 *     overflow), and permit counts are range-checked;
 *   - every wait is bounded: a lock held by a live process longer than
 *     lock_timeout_ns fails with PLIM_SHM_STUCK; the futex waits time out;
 *     a repair waits for in-flight marks at most QUIESCE_NS (a hostile
 *     mark makes its rounds fail: the word stays as it was), set_max at
 *     most lock_timeout_ns (STUCK);
 *   - nothing is asserted about the file's content (PLIM_ASSERT only checks
 *     this process's own state).
 * So hostile bytes can refuse service (wrong counts, refusals, errors), but
 * cannot make this code read or write outside the mapping, loop without
 * bound, hang, or crash.
 *
 * Locking rules (this process).  The binding holds the GIL across every
 * critical section it starts, and never takes the GIL inside one; the
 * waker thread takes the host's lock without the GIL.  wmu guards the
 * eventfd table (the waker writes, the binding adds and removes).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "plim_shm.h"
#include "plim_shm_fast.h"
#include "plim_glibc_pin.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifdef PLIM_DEBUG
#include <assert.h>
#define PLIM_SHM_ASSERT(x) assert(x)
#else
#define PLIM_SHM_ASSERT(x) ((void)0)
#endif

#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MAXP PLIM_SHM_MAX_PERMITS

/* The layout is shared with pylimiter/_shared_common.py: pin it. */
_Static_assert(sizeof(plim_shm_header_t) == 256, "header size");
_Static_assert(offsetof(plim_shm_header_t, mutex) == 64, "H_MUTEX");
_Static_assert(offsetof(plim_shm_header_t, seq) == 72, "H_SEQ");
_Static_assert(offsetof(plim_shm_header_t, free_head) == 80, "H_FREE");
_Static_assert(offsetof(plim_shm_header_t, last_sweep) == 96, "H_SWEEP");
_Static_assert(sizeof(plim_shm_pool_t) == 256, "pool size");
_Static_assert(offsetof(plim_shm_pool_t, qlen) == 24, "P_QLEN");
_Static_assert(offsetof(plim_shm_pool_t, hwm) == 72, "P_HWM");
_Static_assert(offsetof(plim_shm_pool_t, buckets) == 80, "P_BUCKETS");
_Static_assert(offsetof(plim_shm_header_t, repair_at) == 104, "H_REPAIR_AT");
_Static_assert(offsetof(plim_shm_pool_t, word) == 8, "P_AVAIL (the word)");
_Static_assert(sizeof(plim_shm_slot_t) == 128, "slot size");
_Static_assert(offsetof(plim_shm_slot_t, held) == 24, "S_HELD");
_Static_assert(offsetof(plim_shm_slot_t, direct) == 40, "S_DIRECT");
_Static_assert(offsetof(plim_shm_slot_t, inflight) == 64, "S_INFLIGHT");
_Static_assert(offsetof(plim_shm_slot_t, fheld) == 72, "S_FHELD");
_Static_assert(offsetof(plim_shm_slot_t, fcount) == 88, "S_FCOUNT");
_Static_assert(sizeof(plim_shm_rec_t) == 96, "record size");
_Static_assert(offsetof(plim_shm_rec_t, need) == 32, "R_NEED");
_Static_assert(offsetof(plim_shm_rec_t, seq) == 56, "R_SEQ");
_Static_assert(offsetof(plim_shm_rec_t, limit) == 72, "R_LIMIT");
_Static_assert(sizeof(_Atomic uint64_t) == 8 && sizeof(_Atomic uint32_t) == 4, "atomics");

#define LD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define ST(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

#define MU_WAITERS PLIM_SHM_MU_WAITERS
#define SWEEP_NS 250000000LL   /* a sweep at most this often, host-wide */
#define QUIESCE_NS 20000000LL  /* a repair waits this long for in-flight marks */
#define REPAIR_RETRY_NS 100000000LL   /* then tries again this much later */
#define SPIN_NS 2000000LL      /* a lock waiter checks the holder this often */
#define MAX_REPAIRS 3

#define CRASH PLIM_SHM_CRASH

static const int64_t BOUNDS_NS[PLIM_SHM_NBUCKETS] = {
    100000LL, 1000000LL, 5000000LL, 10000000LL, 25000000LL, 50000000LL,
    100000000LL, 250000000LL, 500000000LL, 1000000000LL, 2500000000LL,
    5000000000LL, 10000000000LL, 25000000000LL, 60000000000LL, INT64_MAX};

/* ======================================================================== */
/*  small helpers                                                           */
/* ======================================================================== */

int64_t plim_shm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define sat_add plim_shm_sat_add
#define sat_sub plim_shm_sat_sub

static int64_t clamp_permits(int64_t v)
{
    return v < 0 ? 0 : v > MAXP ? MAXP : v;
}

static int in_permits(int64_t v)
{
    return v >= 0 && v <= MAXP;
}

#define hdr plim_shm_hdr

/* pool/slot/rec: the index must have been checked against the handle. */
static plim_shm_pool_t *pool_at(plim_shm_t *h, uint32_t p)
{
    PLIM_SHM_ASSERT(p < h->npools);
    return plim_shm_pool_at(h, p);
}

static plim_shm_slot_t *slot_at(plim_shm_t *h, uint32_t s)
{
    PLIM_SHM_ASSERT(s < h->maxp);
    return plim_shm_slot_at(h, s);
}

static plim_shm_rec_t *rec_at(plim_shm_t *h, uint32_t r)
{
    PLIM_SHM_ASSERT(r < h->nrec);
    return (plim_shm_rec_t *)(void *)(h->base + h->off_recs + (size_t)r * sizeof(plim_shm_rec_t));
}

static long futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t timeout_ns)
{
    struct timespec ts;
    if (timeout_ns < 0)
        timeout_ns = 0;
    ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
    ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
    /* Not FUTEX_PRIVATE_FLAG: the word is in a shared file mapping, and
     * waiters and wakers are different processes. */
    return syscall(SYS_futex, (uint32_t *)(void *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n)
{
    syscall(SYS_futex, (uint32_t *)(void *)addr, FUTEX_WAKE, n, NULL, NULL, 0);
}

static int ofd_cmd(int fd, int cmd, short type, int64_t byte, struct flock *out)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)byte;
    fl.l_len = 1;
    int rc = fcntl(fd, cmd, &fl);
    if (out != NULL)
        *out = fl;
    return rc;
}

/* slot_alive: whether slot s's process lives (holds its OFD lock).  Asked
 * through the mapping's description, which never holds a lock, so our own
 * slot lock (another description) shows as held.  A failing fcntl counts as
 * alive: never drop a live process's permits on a system call's error. */
static int slot_alive(plim_shm_t *h, uint32_t s)
{
    if ((int32_t)s == h->slot)
        return 1;
    struct flock fl;
    if (ofd_cmd(h->fd, F_OFD_GETLK, F_WRLCK, PLIM_SHM_LOCK_BASE + (int64_t)s, &fl) != 0)
        return 1;
    return fl.l_type != F_UNLCK;
}

#define mu_id plim_shm_mu_id

/* ======================================================================== */
/*  the counter word (the notes' "The counter word")                        */
/* ======================================================================== */

#define W_QUEUED PLIM_SHM_W_QUEUED
#define W_RECOVERING PLIM_SHM_W_RECOVERING
#define W_UNBOUNDED PLIM_SHM_W_UNBOUNDED
#define CAS_TRIES 4096   /* a CAS loop on the word gives up after this many */

static int64_t clamp_avail(int64_t v)
{
    return v < -MAXP ? -MAXP : v > MAXP ? MAXP : v;
}

/* The current avail (acquire: F4, as a taker would read it). */
static int64_t avail_now(plim_shm_pool_t *P)
{
    return plim_shm_word_avail(atomic_load_explicit(&P->word, memory_order_acquire));
}

/* word_add: avail += delta, one RMW that keeps the flags (lock-free paths
 * of other processes may CAS the word meanwhile).  acq_rel: F4.  The
 * callers keep avail in range (a give-back never exceeds what is held, a
 * take never what fits); with hostile bytes it wraps within the word,
 * never into the flags' arithmetic (unsigned, no UB). */
static void word_add(plim_shm_pool_t *P, int64_t delta)
{
    atomic_fetch_add_explicit(&P->word, (uint64_t)delta << PLIM_SHM_W_SHIFT,
                              memory_order_acq_rel);
}

static void word_flag(plim_shm_pool_t *P, uint64_t flag, int on)
{
    /* acq_rel: an RMW in the word's release sequences (F1). */
    if (on)
        atomic_fetch_or_explicit(&P->word, flag, memory_order_acq_rel);
    else
        atomic_fetch_and_explicit(&P->word, ~flag, memory_order_acq_rel);
}

/* fits: n more permits are grantable against word w (S3 aside). */
static int fits(uint64_t w, int64_t n)
{
    int64_t avail = plim_shm_word_avail(w);
    return w & W_UNBOUNDED ? sat_sub(n, avail) <= MAXP : avail >= n;
}

/* word_take: avail -= n if n fits, checked against the value the CAS
 * replaces.  0: it does not fit (or a writer never lets a CAS land). */
static int word_take(plim_shm_pool_t *P, int64_t n)
{
    uint64_t w = atomic_load_explicit(&P->word, memory_order_acquire);
    for (int i = 0; i < CAS_TRIES; i++) {
        if (!fits(w, n))
            return 0;
        /* acq_rel: F4 (takes permits a lock-free release gave back). */
        if (atomic_compare_exchange_weak_explicit(&P->word, &w,
                                                  w - ((uint64_t)n << PLIM_SHM_W_SHIFT),
                                                  memory_order_acq_rel, memory_order_acquire))
            return 1;
    }
    return 0;
}

/* quiesce (the notes' (a) and (b)): RECOVERING on the words of the pools
 * in `pools` (a bit each), then wait until no live process is inside a
 * lock-free path, at most bound_ns.  1: quiet (no lock-free CAS on those
 * words succeeds until the flag is cleared); 0: a live slot kept its mark
 * (stopped, or hostile bytes).  RECOVERING stays set either way: the
 * caller clears it. */
static int quiesce(plim_shm_t *h, int64_t bound_ns, unsigned pools)
{
    for (uint32_t p = 0; p < h->npools; p++)
        if (pools >> p & 1u)
            word_flag(pool_at(h, p), W_RECOVERING, 1);   /* F1 */
    int64_t start = 0;
    for (uint32_t s = 0; s < h->maxp; s++) {
        plim_shm_slot_t *S = slot_at(h, s);
        unsigned spins = 0;
        /* acquire: F2, the fheld stores before the clearing are visible. */
        while (atomic_load_explicit(&S->inflight, memory_order_acquire) != 0) {
            /* A dead process's mark stays set: its facts are dropped. */
            if ((spins & 255u) == 0 && !slot_alive(h, s))
                break;
            if (spins == 0 && start == 0)
                start = plim_shm_now_ns();
            spins++;
            if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#elif defined(__aarch64__)
                __asm__ __volatile__("yield");
#endif
                continue;
            }
            /* Preempted inside its path (a few instructions): let it run. */
            if (spins < 256) {
                sched_yield();
            } else {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            }
            if (plim_shm_now_ns() - start > bound_ns)
                return 0;
        }
    }
    return 1;
}

/* ======================================================================== */
/*  wake-ups                                                                */
/* ======================================================================== */

/* note_decided: record r left the queue (granted or failed); its waiter is
 * woken after the lock is dropped. */
static void note_decided(plim_shm_t *h, uint32_t r)
{
    plim_shm_wake_t *w = &h->wk;
    plim_shm_rec_t *R = rec_at(h, r);
    uint32_t tag = LD(R->tag);
    uint32_t owner = LD(R->owner);
    if (tag == 0) {
        if (w->nrec < PLIM_SHM_WAKES)
            w->rec[w->nrec++] = r;
        else
            w->all = 1;
        return;
    }
    uint32_t bit = tag - 1 < 63 ? tag - 1 : 63;
    if ((int32_t)owner == h->slot) {
        w->own_loops |= (uint64_t)1 << bit;
        return;
    }
    if (owner >= h->maxp)
        return;
    /* A loop with a socket of its own: written directly after the unlock
     * (bit 63 stands for many loops: those go through the waker). */
    plim_shm_slot_t *O = slot_at(h, owner);
    uint32_t gen = LD(R->owner_gen);
    if (bit < 63 && (LD(O->direct) >> bit & 1u) && gen == LD(O->gen)) {
        for (int i = 0; i < w->ndirect; i++)
            if (w->direct[i].slot == owner && w->direct[i].bit == bit)
                return;
        if (w->ndirect < PLIM_SHM_WAKES) {
            if (h->dsock < 0)   /* under the host's lock: one creator at a time */
                h->dsock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            if (h->dsock >= 0) {
                w->direct[w->ndirect].slot = owner;
                w->direct[w->ndirect].gen = gen;
                w->direct[w->ndirect].bit = bit;
                w->ndirect++;
                return;
            }
        }
    }
    /* relaxed: published to the waker by the unlock and the futex. */
    atomic_fetch_or_explicit(&slot_at(h, owner)->loopmask, (uint64_t)1 << bit,
                             memory_order_relaxed);
    for (int i = 0; i < w->nslot; i++)
        if (w->slot[i] == owner)
            return;
    if (w->nslot < PLIM_SHM_WAKES)
        w->slot[w->nslot++] = owner;
    else
        w->all = 1;
}

static void deliver_loops(plim_shm_t *h, uint64_t mask)
{
    uint64_t one = 1;
    pthread_mutex_lock(&h->wmu);
    for (int b = 0; b < PLIM_SHM_NLOOPS; b++) {
        /* Bit 63 stands for every loop beyond the 63rd: wake them all. */
        int hit = (mask >> b) & 1u;
        if (!hit && !((mask >> 63) & 1u))
            continue;
        int fd = h->efd[b];
        if (fd >= 0) {
            ssize_t n = write(fd, &one, sizeof one);
            (void)n;   /* EAGAIN: the counter is full, the loop is awake anyway */
        }
    }
    pthread_mutex_unlock(&h->wmu);
}

/* direct_name: the abstract socket name of loop `bit` of the process in
 * slot `slot` at generation `gen`, in the name space of this segment's
 * file (our fstat's device and inode, never bytes of the file). */
static socklen_t direct_name(plim_shm_t *h, uint32_t slot, uint32_t gen, uint32_t bit,
                             struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "pylimiter/%llx/%llx/%u/%u/%u",
                     (unsigned long long)h->dev, (unsigned long long)h->ino, slot, gen, bit);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof a->sun_path - 2)
        n = (int)(sizeof a->sun_path - 2);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void wake_slot(plim_shm_t *h, uint32_t s);

/* send_direct: one datagram to another process's loop.  A full queue
 * (EAGAIN) means that loop has not drained yet: it will recheck anyway.
 * Anything else (the socket gone meanwhile, another network namespace):
 * the waker path. */
static void send_direct(plim_shm_t *h, const plim_shm_direct_t *d)
{
    struct sockaddr_un a;
    socklen_t len = direct_name(h, d->slot, d->gen, d->bit, &a);
    char b = 0;
    if (sendto(h->dsock, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)(void *)&a,
               len) == 1 || errno == EAGAIN || errno == EWOULDBLOCK)
        return;
    if (d->slot < h->maxp) {
        atomic_fetch_or_explicit(&slot_at(h, d->slot)->loopmask, (uint64_t)1 << d->bit,
                                 memory_order_relaxed);
        wake_slot(h, d->slot);
    }
}

static void wake_slot(plim_shm_t *h, uint32_t s)
{
    plim_shm_slot_t *S = slot_at(h, s);
    /* relaxed: the futex call is a full barrier. */
    atomic_fetch_add_explicit(&S->wake, 1u, memory_order_relaxed);
    futex_wake(&S->wake, 1);
}

static void deliver(plim_shm_t *h, const plim_shm_wake_t *w)
{
    for (int i = 0; i < w->nrec; i++)
        futex_wake(&rec_at(h, w->rec[i])->state, INT_MAX);
    for (int i = 0; i < w->nslot; i++)
        wake_slot(h, w->slot[i]);
    for (int i = 0; i < w->ndirect; i++)
        send_direct(h, &w->direct[i]);
    if (w->all) {
        /* Too many, or after a repair: everyone rechecks. */
        uint32_t bump = LD(hdr(h)->bump);
        if (bump > h->nrec)
            bump = h->nrec;
        for (uint32_t r = 0; r < bump; r++) {
            uint32_t st = LD(rec_at(h, r)->state);
            if (st != PLIM_SHM_R_FREE && st != PLIM_SHM_R_QUEUED)
                futex_wake(&rec_at(h, r)->state, INT_MAX);
        }
        for (uint32_t s = 0; s < h->maxp; s++) {
            if ((int32_t)s == h->slot || LD(slot_at(h, s)->state) != PLIM_SHM_SLOT_LIVE)
                continue;
            atomic_fetch_or_explicit(&slot_at(h, s)->loopmask, ~(uint64_t)0,
                                     memory_order_relaxed);
            wake_slot(h, s);
        }
        deliver_loops(h, ~(uint64_t)0);
    } else if (w->own_loops) {
        deliver_loops(h, w->own_loops);
    }
}

/* ======================================================================== */
/*  repair                                                                  */
/* ======================================================================== */

static int process_locked(plim_shm_t *h, uint32_t p, int may_repair);

typedef struct { uint64_t seq; uint32_t pool, rec; } qent_t;

static int qent_cmp(const void *a, const void *b)
{
    const qent_t *x = a, *y = b;
    if (x->pool != y->pool)
        return x->pool < y->pool ? -1 : 1;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->rec < y->rec ? -1 : x->rec > y->rec;
}

/* repair_locked rebuilds every derived field from the facts (the notes'
 * "Facts and derived fields"); the words only if it could quiesce the
 * lock-free paths (else they keep their avail, and repair_at asks for
 * another round).  Slot `exclude` is treated as dead (a registering
 * process takes over a dead process's slot).  Bounded: the quiesce, one
 * pass over the slots (an fcntl each), two over the used records, a sort. */
static void repair_locked(plim_shm_t *h, int32_t exclude)
{
    plim_shm_header_t *H = hdr(h);
    uint8_t alive[4096 / 8];
    int64_t held[PLIM_SHM_MAX_POOLS] = {0, 0}, granted[PLIM_SHM_MAX_POOLS] = {0, 0};
    memset(alive, 0, sizeof alive);
    h->repairs++;
    /* (a) and (b) before any fact is read; (c) below. */
    int quiet = quiesce(h, QUIESCE_NS, ~0u);
    for (uint32_t s = 0; s < h->maxp; s++) {
        plim_shm_slot_t *S = slot_at(h, s);
        if ((int32_t)s != exclude && slot_alive(h, s)) {
            alive[s >> 3] |= (uint8_t)(1u << (s & 7));
            if (LD(S->state) != PLIM_SHM_SLOT_LIVE)
                ST(S->state, PLIM_SHM_SLOT_LIVE);
            /* Its two ledgers are its own (S5): read, never rewritten. */
            for (uint32_t p = 0; p < h->npools; p++)
                held[p] = sat_add(held[p],
                                  clamp_permits(sat_add(LD(S->held[p]), LD(S->fheld[p]))));
        } else if (LD(S->state) != PLIM_SHM_SLOT_FREE || LD(S->held[0]) || LD(S->held[1]) ||
                   LD(S->fheld[0]) || LD(S->fheld[1]) || LD(S->inflight)) {
            /* A dead process: what it held goes back with it. */
            ST(S->gen, LD(S->gen) + 1u);
            ST(S->held[0], 0);
            ST(S->held[1], 0);
            ST(S->fheld[0], 0);
            ST(S->fheld[1], 0);
            ST(S->inflight, 0u);
            ST(S->direct, 0u);
            ST(S->state, PLIM_SHM_SLOT_FREE);
        }
    }
    uint32_t bump = LD(H->bump);
    if (bump > h->nrec) {
        bump = h->nrec;
        ST(H->bump, bump);
    }
    qent_t *q = malloc((size_t)(bump ? bump : 1) * sizeof(qent_t));
    size_t nq = 0;
    for (uint32_t r = 0; r < bump; r++) {
        plim_shm_rec_t *R = rec_at(h, r);
        uint32_t st = LD(R->state);
        if (st == PLIM_SHM_R_FREE)
            continue;
        uint32_t owner = LD(R->owner), p = LD(R->pool);
        int64_t g = LD(R->granted);
        int ok = st >= PLIM_SHM_R_QUEUED && st <= PLIM_SHM_R_REMOVED && owner < h->maxp &&
                 (((unsigned)alive[owner >> 3] >> (owner & 7u)) & 1u) &&
                 LD(R->owner_gen) == LD(slot_at(h, owner)->gen) && p < h->npools &&
                 in_permits(LD(R->need)) && in_permits(LD(R->total)) && in_permits(g);
        if (!ok) {
            ST(R->state, PLIM_SHM_R_FREE);
            continue;
        }
        if (st == PLIM_SHM_R_QUEUED) {
            if (q != NULL) {
                q[nq].seq = LD(R->seq);
                q[nq].pool = p;
                q[nq].rec = r;
                nq++;
            } else {
                /* No memory to sort: queue it in index order (FIFO degrades,
                 * the books stay right). */
                ST(R->state, PLIM_SHM_R_QUEUED);
            }
        } else if (st == PLIM_SHM_R_GRANTED) {
            granted[p] = sat_add(granted[p], g);
        }
    }
    if (q != NULL)
        qsort(q, nq, sizeof *q, qent_cmp);
    for (uint32_t p = 0; p < h->npools; p++) {
        plim_shm_pool_t *P = pool_at(h, p);
        uint32_t prev = PLIM_SHM_NIL, first = PLIM_SHM_NIL;
        int64_t n = 0;
        if (q != NULL) {
            for (size_t i = 0; i < nq; i++) {
                if (q[i].pool != p)
                    continue;
                uint32_t r = q[i].rec;
                ST(rec_at(h, r)->prev, prev);
                ST(rec_at(h, r)->next, PLIM_SHM_NIL);
                if (prev != PLIM_SHM_NIL)
                    ST(rec_at(h, prev)->next, r);
                else
                    first = r;
                prev = r;
                n++;
            }
        } else {
            for (uint32_t r = 0; r < bump; r++) {
                plim_shm_rec_t *R = rec_at(h, r);
                if (LD(R->state) != PLIM_SHM_R_QUEUED || LD(R->pool) != p)
                    continue;
                ST(R->prev, prev);
                ST(R->next, PLIM_SHM_NIL);
                if (prev != PLIM_SHM_NIL)
                    ST(rec_at(h, prev)->next, r);
                else
                    first = r;
                prev = r;
                n++;
            }
        }
        ST(P->head, first);
        ST(P->tail, prev);
        ST(P->qlen, n);
        int64_t m = LD(P->max);
        if (m > MAXP) {
            m = MAXP;
            ST(P->max, m);
        }
        uint64_t flags = (n ? W_QUEUED : 0u) | (m > 0 ? 0u : W_UNBOUNDED);
        int64_t avail;
        if (quiet) {
            int64_t acquired = sat_add(held[p], granted[p]);
            if (acquired > 2 * MAXP)
                acquired = 2 * MAXP;
            avail = (m > 0 ? m : 0) - acquired;
        } else {
            /* Not quiet: the old avail stands (S1': never too high). */
            avail = plim_shm_word_avail(LD(P->word));
        }
        /* (c) release: the rebuilt word, RECOVERING cleared; lock-free
         * paths that read it see the facts it was built from (F1). */
        atomic_exchange_explicit(&P->word, plim_shm_word_make(clamp_avail(avail), flags),
                                 memory_order_release);
    }
    ST(H->repair_at, quiet ? 0 : sat_add(plim_shm_now_ns(), REPAIR_RETRY_NS));
    free(q);
    uint32_t nxt = PLIM_SHM_NIL;
    for (uint32_t r = bump; r-- > 0;) {
        plim_shm_rec_t *R = rec_at(h, r);
        if (LD(R->state) == PLIM_SHM_R_FREE) {
            ST(R->next, nxt);
            nxt = r;
        }
    }
    ST(H->free_head, nxt);
    for (uint32_t p = 0; p < h->npools; p++)
        process_locked(h, p, 0);
    h->wk.all = 1;   /* everyone rechecks: decisions may have been lost */
}

/* fix: a walk found the derived fields inconsistent.  Repair, or give up
 * after MAX_REPAIRS in one operation (a writer keeps corrupting them). */
static int fix(plim_shm_t *h, int *repairs)
{
    if (*repairs >= MAX_REPAIRS)
        return PLIM_SHM_CORRUPT;
    (*repairs)++;
    repair_locked(h, -1);
    return PLIM_SHM_OK;
}

/* ======================================================================== */
/*  the lock                                                                */
/* ======================================================================== */

int plim_shm_trylock(plim_shm_t *h)
{
    return plim_shm_trylock_inline(h);
}

void plim_shm_wake_lock(plim_shm_t *h)
{
    futex_wake(&hdr(h)->mutex, 1);
}

int plim_shm_lock(plim_shm_t *h)
{
    _Atomic uint32_t *mu = &hdr(h)->mutex;
    uint32_t id = mu_id(h);
    for (int i = 0; i < 100; i++) {
        uint32_t z = 0;
        if (atomic_compare_exchange_weak_explicit(mu, &z, id, memory_order_acquire,
                                                  memory_order_relaxed))
            return PLIM_SHM_OK;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    }
    int64_t start = plim_shm_now_ns();
    int64_t check_at = start + SPIN_NS;
    for (unsigned spins = 0;; spins++) {
        /* Bounded whatever the word does (a writer flipping it so that no
         * CAS of ours ever lands counts as a holder that never releases). */
        if ((spins & 63u) == 63u && plim_shm_now_ns() - start > h->lock_timeout_ns)
            return PLIM_SHM_STUCK;
        uint32_t cur = atomic_load_explicit(mu, memory_order_relaxed);
        if (cur == 0) {
            /* Taken with WAITERS set: others may sleep, the unlock wakes one. */
            if (atomic_compare_exchange_strong_explicit(mu, &cur, id | MU_WAITERS,
                                                        memory_order_acquire,
                                                        memory_order_relaxed))
                return PLIM_SHM_OK;
            continue;
        }
        if (!(cur & MU_WAITERS)) {
            if (!atomic_compare_exchange_strong_explicit(mu, &cur, cur | MU_WAITERS,
                                                         memory_order_relaxed,
                                                         memory_order_relaxed))
                continue;
            cur |= MU_WAITERS;
        }
        /* Sleep at most SPIN_NS: a holder that died never wakes us. */
        futex_wait(mu, cur, SPIN_NS);
        int64_t now = plim_shm_now_ns();
        if (now < check_at)
            continue;
        check_at = now + SPIN_NS;
        cur = atomic_load_explicit(mu, memory_order_relaxed);
        if (cur == 0)
            continue;
        uint32_t field = cur & 0xFFFFu;
        /* Our own slot number with another generation: a previous holder
         * of our slot, which died holding the lock (we registered in its
         * place), not another thread of ours. */
        int stale = (int32_t)(field - 1) == h->slot && (cur & ~MU_WAITERS) != id;
        if (field == 0 || field - 1 >= h->maxp || stale || !slot_alive(h, field - 1)) {
            /* Dead holder (or garbage): take the word over from exactly the
             * value we judged, then repair what it may have left half done. */
            if (atomic_compare_exchange_strong_explicit(mu, &cur, id | MU_WAITERS,
                                                        memory_order_acquire,
                                                        memory_order_relaxed)) {
                repair_locked(h, -1);
                return PLIM_SHM_OK;
            }
            continue;
        }
        if (now - start > h->lock_timeout_ns)
            return PLIM_SHM_STUCK;
    }
}

void plim_shm_unlock(plim_shm_t *h)
{
    plim_shm_wake_t w;
    int any = h->wk.nrec | h->wk.nslot | h->wk.ndirect | h->wk.all || h->wk.own_loops;
    if (any) {
        w.nrec = h->wk.nrec;
        w.nslot = h->wk.nslot;
        w.ndirect = h->wk.ndirect;
        w.all = h->wk.all;
        w.own_loops = h->wk.own_loops;
        memcpy(w.rec, h->wk.rec, (size_t)w.nrec * sizeof(uint32_t));
        memcpy(w.slot, h->wk.slot, (size_t)w.nslot * sizeof(uint32_t));
        memcpy(w.direct, h->wk.direct, (size_t)w.ndirect * sizeof(plim_shm_direct_t));
        h->wk.nrec = h->wk.nslot = h->wk.ndirect = h->wk.all = 0;
        h->wk.own_loops = 0;
    }
    /* release: publishes this critical section to the next holder. */
    uint32_t old = atomic_exchange_explicit(&hdr(h)->mutex, 0u, memory_order_release);
    if (old & MU_WAITERS)
        futex_wake(&hdr(h)->mutex, 1);
    /* Wake after the unlock: a woken waiter's first step is to lock. */
    if (any)
        deliver(h, &w);
}

/* ======================================================================== */
/*  attach, register, sweep                                                 */
/* ======================================================================== */

int plim_shm_attach(plim_shm_t *h, int fd, int lockfd, size_t size, uint32_t npools,
                    uint32_t maxp, uint32_t nrec, int64_t max_queue)
{
    memset(h, 0, sizeof *h);
    h->fd = fd;
    h->lockfd = lockfd;
    h->slot = -1;
    h->npools = npools;
    h->maxp = maxp;
    h->nrec = nrec;
    h->max_queue = max_queue;
    h->lock_timeout_ns = 10LL * 1000000000LL;
    h->off_pools = sizeof(plim_shm_header_t);
    h->off_slots = h->off_pools + (size_t)npools * sizeof(plim_shm_pool_t);
    h->off_recs = h->off_slots + (size_t)maxp * sizeof(plim_shm_slot_t);
    for (int i = 0; i < PLIM_SHM_NLOOPS; i++)
        h->efd[i] = h->lsock[i] = -1;
    h->dsock = -1;
    pthread_mutex_init(&h->wmu, NULL);
    if (plim_fstat_ids(fd, &h->dev, &h->ino) != 0)
        h->dev = h->ino = 0;
    if (npools < 1 || npools > PLIM_SHM_MAX_POOLS || maxp < 1 || maxp > 4096 ||
        h->off_recs + (size_t)nrec * sizeof(plim_shm_rec_t) > size) {
        errno = EINVAL;
        return PLIM_SHM_ERRNO;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return PLIM_SHM_ERRNO;
    h->base = m;
    h->size = size;
    for (uint32_t p = 0; p < npools; p++)
        h->pool[p] = plim_shm_pool_at(h, p);
    return PLIM_SHM_OK;
}

void plim_shm_unmap(plim_shm_t *h)
{
    for (int i = 0; i < PLIM_SHM_NLOOPS; i++)
        plim_shm_loop_direct_close(h, i);
    if (h->dsock >= 0) {
        close(h->dsock);
        h->dsock = -1;
    }
    if (h->base != NULL) {
        munmap(h->base, h->size);
        h->base = NULL;
    }
}

/* repair_due: a repair that could not quiesce asked for another round
 * from now on (a time too far ahead is hostile: due). */
static int repair_due(plim_shm_t *h, int64_t now)
{
    int64_t at = LD(hdr(h)->repair_at);
    return at != 0 && (at <= now || at - now > REPAIR_RETRY_NS);
}

int plim_shm_sweep_due(plim_shm_t *h)
{
    int64_t now = plim_shm_now_ns();
    int64_t last = LD(hdr(h)->last_sweep);
    /* A time in the future (hostile, or another boot's) counts as due. */
    return !(last <= now && now - last < SWEEP_NS) || repair_due(h, now);
}

int plim_shm_any_dead(plim_shm_t *h)
{
    /* Without the lock: a slot is marked taken only after its process holds
     * its OFD lock, and marked free before it lets go of it, so "taken and
     * unlocked" is a death (or a hostile state word: the locked sweep that
     * follows sorts that out).  One fcntl per other taken slot. */
    for (uint32_t s = 0; s < h->maxp; s++) {
        if ((int32_t)s == h->slot || LD(slot_at(h, s)->state) == PLIM_SHM_SLOT_FREE)
            continue;
        if (!slot_alive(h, s))
            return 1;
    }
    return 0;
}

int plim_shm_sweep_locked(plim_shm_t *h, int force)
{
    if (!force && !plim_shm_sweep_due(h))
        return PLIM_SHM_OK;
    ST(hdr(h)->last_sweep, plim_shm_now_ns());
    if (repair_due(h, plim_shm_now_ns())) {
        repair_locked(h, -1);
        return PLIM_SHM_OK;
    }
    if (plim_shm_any_dead(h))
        repair_locked(h, -1);
    return PLIM_SHM_OK;
}

int plim_shm_register(plim_shm_t *h, int32_t pid)
{
    for (uint32_t s = 0; s < h->maxp; s++) {
        plim_shm_slot_t *S = slot_at(h, s);
        if (slot_alive(h, s))
            continue;   /* live, or registering: not ours */
        /* Its OFD lock first: nobody may see the slot LIVE without it. */
        if (ofd_cmd(h->lockfd, F_OFD_SETLK, F_WRLCK, PLIM_SHM_LOCK_BASE + (int64_t)s,
                    NULL) != 0)
            continue;
        h->slot = (int32_t)s;
        h->gen = LD(S->gen) + 1u;
        int st = plim_shm_lock(h);
        if (st != PLIM_SHM_OK) {
            ofd_cmd(h->lockfd, F_OFD_SETLK, F_UNLCK, PLIM_SHM_LOCK_BASE + (int64_t)s, NULL);
            h->slot = -1;
            return st;
        }
        if (LD(S->state) != PLIM_SHM_SLOT_FREE || LD(S->held[0]) || LD(S->held[1]) ||
            LD(S->fheld[0]) || LD(S->fheld[1]))
            repair_locked(h, (int32_t)s);   /* a dead process's slot: drop its leftovers */
        else
            plim_shm_sweep_locked(h, 1);
        uint32_t g = LD(S->gen) + 1u;
        ST(S->gen, g);
        h->gen = g;
        ST(S->pid, pid);
        ST(S->held[0], 0);
        ST(S->held[1], 0);
        ST(S->fheld[0], 0);
        ST(S->fheld[1], 0);
        ST(S->inflight, 0u);   /* fcount stays: the slot's grants ever */
        ST(S->loopmask, 0);
        ST(S->direct, 0);
        ST(S->state, PLIM_SHM_SLOT_LIVE);   /* the commit */
        h->me = S;
        plim_shm_unlock(h);
        return PLIM_SHM_OK;
    }
    return PLIM_SHM_NOSLOT;
}

void plim_shm_release_slot(plim_shm_t *h, int32_t slot)
{
    h->me = NULL;
    if (slot >= 0)
        ofd_cmd(h->lockfd, F_OFD_SETLK, F_UNLCK, PLIM_SHM_LOCK_BASE + (int64_t)slot, NULL);
}

void plim_shm_after_fork(plim_shm_t *h)
{
    /* The parent's slot lock lives in the description we share: drop our
     * reference, or the parent would look alive after its death. */
    if (h->lockfd >= 0) {
        close(h->lockfd);
        h->lockfd = -1;
    }
    h->slot = -1;
    h->me = NULL;
    h->crash = 0;
    memset(&h->wk, 0, sizeof h->wk);
    /* No thread survives fork; the waker's mutex may have been held. */
    pthread_mutex_init(&h->wmu, NULL);
    for (int i = 0; i < PLIM_SHM_NLOOPS; i++) {
        if (h->efd[i] >= 0)
            close(h->efd[i]);
        h->efd[i] = -1;
        /* The parent's names stay bound (its copies); ours go. */
        if (h->lsock[i] >= 0)
            close(h->lsock[i]);
        h->lsock[i] = -1;
    }
    if (h->dsock >= 0)
        close(h->dsock);
    h->dsock = -1;
    h->waker_running = 0;
    atomic_store(&h->waker_stop, 0);
}

/* ======================================================================== */
/*  snapshots                                                               */
/* ======================================================================== */

int64_t plim_shm_max(plim_shm_t *h, uint32_t p)
{
    return LD(pool_at(h, p)->max);
}

int64_t plim_shm_avail(plim_shm_t *h, uint32_t p)
{
    return plim_shm_word_avail(LD(pool_at(h, p)->word));
}

static int64_t acquired_of(int64_t m, int64_t avail)
{
    return m > 0 ? sat_sub(m, avail) : sat_sub(0, avail);
}

int64_t plim_shm_acquired(plim_shm_t *h, uint32_t p)
{
    plim_shm_pool_t *P = pool_at(h, p);
    return acquired_of(LD(P->max), plim_shm_word_avail(LD(P->word)));
}

int64_t plim_shm_qlen(plim_shm_t *h, uint32_t p)
{
    int64_t n = LD(pool_at(h, p)->qlen);
    return n < 0 ? 0 : n;
}

int64_t plim_shm_hwm(plim_shm_t *h, uint32_t p)
{
    return LD(pool_at(h, p)->hwm);
}

int plim_shm_peek(plim_shm_t *h, uint32_t r, uint32_t ticket)
{
    if (r >= h->nrec)
        return -1;
    plim_shm_rec_t *R = rec_at(h, r);
    if (LD(R->ticket) != ticket || (int32_t)LD(R->owner) != h->slot)
        return -1;
    return (int)LD(R->state);
}

/* ======================================================================== */
/*  the queue                                                               */
/* ======================================================================== */

static void record_grant(plim_shm_t *h, uint32_t p, int64_t wait_ns)
{
    plim_shm_pool_t *P = pool_at(h, p);
    if (wait_ns < 0)
        wait_ns = 0;
    int b = 0;
    while (b < PLIM_SHM_NBUCKETS - 1 && wait_ns > BOUNDS_NS[b])
        b++;
    ST(P->acquired_total, sat_add(LD(P->acquired_total), 1));
    ST(P->wait_ns, sat_add(LD(P->wait_ns), wait_ns));
    ST(P->buckets[b], sat_add(LD(P->buckets[b]), 1));
    plim_shm_hwm_raise(P, acquired_of(LD(P->max), avail_now(P)));
}

/* unlink: record r (its state already says it left: the state is the fact)
 * out of pool p's links.  PLIM_SHM_CORRUPT if the links disagree. */
static int unlink_rec(plim_shm_t *h, uint32_t p, uint32_t r)
{
    plim_shm_pool_t *P = pool_at(h, p);
    plim_shm_rec_t *R = rec_at(h, r);
    uint32_t prev = LD(R->prev), next = LD(R->next);
    if ((prev != PLIM_SHM_NIL && prev >= h->nrec) || (next != PLIM_SHM_NIL && next >= h->nrec))
        return PLIM_SHM_CORRUPT;
    if (prev == PLIM_SHM_NIL ? LD(P->head) != r : LD(rec_at(h, prev)->next) != r)
        return PLIM_SHM_CORRUPT;
    if (next == PLIM_SHM_NIL ? LD(P->tail) != r : LD(rec_at(h, next)->prev) != r)
        return PLIM_SHM_CORRUPT;
    if (prev == PLIM_SHM_NIL)
        ST(P->head, next);
    else
        ST(rec_at(h, prev)->next, next);
    if (next == PLIM_SHM_NIL)
        ST(P->tail, prev);
    else
        ST(rec_at(h, next)->prev, prev);
    ST(R->prev, PLIM_SHM_NIL);
    ST(R->next, PLIM_SHM_NIL);
    ST(P->qlen, sat_sub(LD(P->qlen), 1));
    if (next == PLIM_SHM_NIL && prev == PLIM_SHM_NIL)
        word_flag(P, W_QUEUED, 0);   /* S2: the last one left */
    return PLIM_SHM_OK;
}

static int link_tail(plim_shm_t *h, uint32_t p, uint32_t r)
{
    plim_shm_pool_t *P = pool_at(h, p);
    uint32_t tail = LD(P->tail);
    if (tail != PLIM_SHM_NIL && tail >= h->nrec)
        return PLIM_SHM_CORRUPT;
    plim_shm_rec_t *R = rec_at(h, r);
    ST(R->prev, tail);
    ST(R->next, PLIM_SHM_NIL);
    if (tail == PLIM_SHM_NIL)
        ST(P->head, r);
    else
        ST(rec_at(h, tail)->next, r);
    ST(P->tail, r);
    ST(P->qlen, sat_add(LD(P->qlen), 1));
    word_flag(P, W_QUEUED, 1);   /* S2 (enqueue set it already: idempotent) */
    return PLIM_SHM_OK;
}

static uint32_t alloc_locked(plim_shm_t *h)
{
    plim_shm_header_t *H = hdr(h);
    for (int i = 0; i < 2; i++) {
        uint32_t r = LD(H->free_head);
        if (r == PLIM_SHM_NIL)
            break;
        if (r < h->nrec && LD(rec_at(h, r)->state) == PLIM_SHM_R_FREE) {
            ST(H->free_head, LD(rec_at(h, r)->next));
            return r;
        }
        repair_locked(h, -1);   /* a corrupt free list: rebuilt from the states */
    }
    uint32_t b = LD(H->bump);
    if (b < h->nrec) {
        ST(H->bump, b + 1u);
        return b;
    }
    return PLIM_SHM_NIL;
}

static void free_locked(plim_shm_t *h, uint32_t r)
{
    plim_shm_header_t *H = hdr(h);
    plim_shm_rec_t *R = rec_at(h, r);
    ST(R->state, PLIM_SHM_R_FREE);   /* the fact; the list is derived */
    ST(R->next, LD(H->free_head));
    ST(H->free_head, r);
}

/* process_locked grants pool p's queue heads while they fit (S4) and fails
 * heads larger than a bounded limit. */
static int process_locked(plim_shm_t *h, uint32_t p, int may_repair)
{
    plim_shm_pool_t *P = pool_at(h, p);
    int64_t now = -1;
    uint32_t steps = 0;
    int repairs = may_repair ? 0 : MAX_REPAIRS;
    for (;;) {
        if (++steps > h->nrec + 2u) {   /* a cycle */
            if (fix(h, &repairs) != PLIM_SHM_OK)
                return PLIM_SHM_CORRUPT;
            steps = 0;
            continue;
        }
        uint32_t hd = LD(P->head);
        if (hd == PLIM_SHM_NIL)
            return PLIM_SHM_OK;
        plim_shm_rec_t *R = hd < h->nrec ? rec_at(h, hd) : NULL;
        if (R == NULL || LD(R->state) != PLIM_SHM_R_QUEUED || LD(R->pool) != p ||
            !in_permits(LD(R->need)) || !in_permits(LD(R->total))) {
            if (fix(h, &repairs) != PLIM_SHM_OK)
                return PLIM_SHM_CORRUPT;
            continue;
        }
        int64_t need = LD(R->need), m = LD(P->max);
        int granted = 0;
        if (m > 0 && LD(R->total) > m) {
            ST(R->limit, m);
            ST(R->state, PLIM_SHM_R_TOO_LARGE);   /* the commit */
        } else {
            /* The word first (S1'), then the facts that use the permits. */
            if (!word_take(P, need))
                return PLIM_SHM_OK;
            CRASH(h);
            ST(R->granted, need);                 /* before the commit */
            CRASH(h);
            ST(R->state, PLIM_SHM_R_GRANTED);     /* the commit */
            granted = 1;
        }
        CRASH(h);
        if (unlink_rec(h, p, hd) != PLIM_SHM_OK && fix(h, &repairs) != PLIM_SHM_OK)
            return PLIM_SHM_CORRUPT;
        if (granted) {
            if (now < 0)
                now = plim_shm_now_ns();
            record_grant(h, p, sat_sub(now, LD(R->enq_ns)));
        }
        note_decided(h, hd);
    }
}

/* ======================================================================== */
/*  critical sections                                                       */
/* ======================================================================== */

/* stray_recovering: RECOVERING under the lock is a leftover (hostile
 * bytes: a dead repairer's is taken over and repaired with the lock).  It
 * only diverts the lock-free paths to the lock; a repair clears it. */
static void stray_recovering(plim_shm_t *h, plim_shm_pool_t *P)
{
    if (LD(P->word) & W_RECOVERING)
        repair_locked(h, -1);
}

/* count_grant: an immediate grant under the lock, in the pool's counters
 * (0 s wait). */
static void count_grant(plim_shm_pool_t *P)
{
    ST(P->acquired_total, sat_add(LD(P->acquired_total), 1));
    ST(P->buckets[0], sat_add(LD(P->buckets[0]), 1));
    plim_shm_hwm_raise(P, acquired_of(LD(P->max), avail_now(P)));
}

/* take_now: n permits from the word (S3 checked by the caller), then into
 * this process's held (the word first: S1'). */
static int take_now(plim_shm_t *h, uint32_t p, int64_t n)
{
    plim_shm_pool_t *P = pool_at(h, p);
    if (n != 0 && !word_take(P, n))
        return LD(P->word) & W_UNBOUNDED ? PLIM_SHM_OVERFLOW : PLIM_SHM_EMPTY;
    CRASH(h);
    plim_shm_slot_t *S = slot_at(h, (uint32_t)h->slot);
    ST(S->held[p], sat_add(LD(S->held[p]), n));
    count_grant(P);
    return PLIM_SHM_OK;
}

int plim_shm_take_locked(plim_shm_t *h, uint32_t p, int64_t n)
{
    plim_shm_pool_t *P = pool_at(h, p);
    stray_recovering(h, P);
    uint64_t w = atomic_load_explicit(&P->word, memory_order_acquire);
    /* S3.  Unbounded, the queue holds only requests that would overflow. */
    if (n != 0 && (w & (W_QUEUED | W_UNBOUNDED)) == W_QUEUED)
        return PLIM_SHM_EMPTY;
    return take_now(h, p, n);
}

int plim_shm_enqueue_locked(plim_shm_t *h, uint32_t p, int64_t need, int64_t total,
                            uint32_t tag, uint32_t *rec, uint32_t *ticket, int64_t *limit)
{
    plim_shm_header_t *H = hdr(h);
    plim_shm_pool_t *P = pool_at(h, p);
    int64_t m = LD(P->max);
    if (m > 0 && total > m) {
        *limit = m;
        return PLIM_SHM_TOO_LARGE;
    }
    if (h->max_queue > 0 && LD(P->qlen) >= h->max_queue)
        return PLIM_SHM_FULL;
    uint32_t r = alloc_locked(h);
    if (r == PLIM_SHM_NIL)
        return PLIM_SHM_FULL;
    /* QUEUED by a CAS that re-checks the fit against the same word: a
     * lock-free release that came since the caller's take is seen here, or
     * sees QUEUED and comes to the lock (the notes: no lost wake-up). */
    uint64_t w = atomic_load_explicit(&P->word, memory_order_acquire);
    for (int i = 0;; i++) {
        if (!(w & W_QUEUED) && fits(w, need)) {
            free_locked(h, r);
            return take_now(h, p, need);
        }
        if (i >= CAS_TRIES) {
            word_flag(P, W_QUEUED, 1);   /* a writer that never lets a CAS land */
            break;
        }
        /* acq_rel: F1 (an RMW in the word's release sequences). */
        if (atomic_compare_exchange_weak_explicit(&P->word, &w, w | W_QUEUED,
                                                  memory_order_acq_rel, memory_order_acquire))
            break;
    }
    plim_shm_rec_t *R = rec_at(h, r);
    uint32_t t = LD(H->ticket) + 1u;
    ST(H->ticket, t);
    uint64_t seq = LD(H->seq) + 1u;
    ST(H->seq, seq);
    ST(R->owner, (uint32_t)h->slot);
    ST(R->owner_gen, h->gen);
    ST(R->ticket, t);
    ST(R->pool, p);
    ST(R->tag, tag);
    ST(R->need, need);
    ST(R->total, total);
    ST(R->granted, 0);
    ST(R->limit, 0);
    ST(R->seq, seq);
    ST(R->enq_ns, plim_shm_now_ns());
    CRASH(h);
    if (link_tail(h, p, r) != PLIM_SHM_OK) {
        ST(R->state, PLIM_SHM_R_QUEUED);
        repair_locked(h, -1);   /* the links, ours included, from the states */
    } else {
        ST(R->state, PLIM_SHM_R_QUEUED);   /* the commit */
    }
    *rec = r;
    *ticket = t;
    return PLIM_SHM_QUEUED;
}

int plim_shm_give_back_locked(plim_shm_t *h, uint32_t p, int64_t n, uint32_t rec,
                              uint32_t ticket)
{
    plim_shm_pool_t *P = pool_at(h, p);
    plim_shm_slot_t *S = slot_at(h, (uint32_t)h->slot);
    stray_recovering(h, P);
    /* Both ledgers count (permits taken lock-free may come back here, so
     * held[] alone may go below 0); fheld[] is not ours to write here. */
    int64_t held = LD(S->held[p]);
    int64_t mine = clamp_permits(sat_add(held, LD(S->fheld[p])));
    if (n > mine)
        n = mine;   /* never more than the segment says we hold */
    ST(S->held[p], sat_sub(held, n));
    CRASH(h);
    if (rec != PLIM_SHM_NIL && rec < h->nrec) {
        plim_shm_rec_t *R = rec_at(h, rec);
        if (LD(R->ticket) == ticket && (int32_t)LD(R->owner) == h->slot &&
            LD(R->state) == PLIM_SHM_R_QUEUED)
            ST(R->need, clamp_permits(sat_add(LD(R->need), n)));   /* the update takes all */
    }
    word_add(P, n);   /* after the facts (S1') */
    return process_locked(h, p, 1);
}

static plim_shm_rec_t *own_rec(plim_shm_t *h, uint32_t r, uint32_t ticket)
{
    if (r >= h->nrec)
        return NULL;
    plim_shm_rec_t *R = rec_at(h, r);
    if (LD(R->ticket) != ticket || (int32_t)LD(R->owner) != h->slot ||
        LD(R->owner_gen) != h->gen)
        return NULL;
    return R;
}

int plim_shm_collect_locked(plim_shm_t *h, uint32_t r, uint32_t ticket, int *state,
                            int64_t *granted, int64_t *limit)
{
    plim_shm_rec_t *R = own_rec(h, r, ticket);
    if (R == NULL)
        return PLIM_SHM_GONE;
    uint32_t st = LD(R->state), p = LD(R->pool);
    if (st == PLIM_SHM_R_QUEUED)
        return PLIM_SHM_QUEUED;
    if (st < PLIM_SHM_R_GRANTED || st > PLIM_SHM_R_REMOVED || p >= h->npools)
        return PLIM_SHM_GONE;
    *state = (int)st;
    *granted = 0;
    int64_t g = LD(R->granted);
    if (st == PLIM_SHM_R_TOO_LARGE)
        *limit = LD(R->limit);
    /* The record first, then held: between the two stores the grant is
     * counted by neither (a death there drops held anyway), never by both. */
    free_locked(h, r);
    if (st == PLIM_SHM_R_GRANTED) {
        if (!in_permits(g))
            return PLIM_SHM_GONE;
        CRASH(h);
        plim_shm_slot_t *S = slot_at(h, (uint32_t)h->slot);
        ST(S->held[p], sat_add(LD(S->held[p]), g));
        *granted = g;
    }
    return PLIM_SHM_OK;
}

int plim_shm_abandon_locked(plim_shm_t *h, uint32_t r, uint32_t ticket, int timed_out)
{
    plim_shm_rec_t *R = own_rec(h, r, ticket);
    if (R == NULL)
        return PLIM_SHM_GONE;
    uint32_t st = LD(R->state), p = LD(R->pool);
    if (p >= h->npools)
        return PLIM_SHM_GONE;
    plim_shm_pool_t *P = pool_at(h, p);
    if (st == PLIM_SHM_R_QUEUED) {
        int was_head = LD(P->head) == r;
        int repairs = 0;
        ST(R->state, PLIM_SHM_R_REMOVED);
        if (unlink_rec(h, p, r) != PLIM_SHM_OK)
            fix(h, &repairs);
        free_locked(h, r);
        plim_shm_count_locked(h, p, timed_out ? 1 : 3);
        if (was_head)
            process_locked(h, p, 1);
        return PLIM_SHM_REMOVED;
    }
    if (st == PLIM_SHM_R_GRANTED) {
        if (timed_out)
            return PLIM_SHM_KEPT;   /* a grant that raced with a timeout stands */
        int64_t g = LD(R->granted);
        free_locked(h, r);
        plim_shm_count_locked(h, p, 3);
        if (in_permits(g))
            word_add(P, g);   /* after the fact (S1') */
        process_locked(h, p, 1);
        return PLIM_SHM_GAVE_BACK;
    }
    return PLIM_SHM_DECIDED;
}

void plim_shm_count_locked(plim_shm_t *h, uint32_t p, int which)
{
    plim_shm_pool_t *P = pool_at(h, p);
    _Atomic int64_t *c = which == 1 ? &P->timeout_total
                         : which == 2 ? &P->queue_full_total
                                      : &P->cancelled_total;
    atomic_store_explicit(c, sat_add(atomic_load_explicit(c, memory_order_relaxed), 1),
                          memory_order_relaxed);
}

int plim_shm_set_max_locked(plim_shm_t *h, uint32_t p, int64_t max)
{
    plim_shm_pool_t *P = pool_at(h, p);
    int64_t old = LD(P->max);
    if (old > MAXP)
        old = MAXP;
    /* The word's avail and mode change with max, and the lock-free acquire
     * reads max (F3): no lock-free path may be in flight meanwhile. */
    if (!quiesce(h, h->lock_timeout_ns, 1u << p)) {
        word_flag(P, W_RECOVERING, 0);
        return PLIM_SHM_STUCK;
    }
    uint64_t w = LD(P->word);
    int64_t avail = plim_shm_word_avail(w);
    int64_t next = clamp_avail(sat_add(avail, sat_sub(max > 0 ? max : 0, old > 0 ? old : 0)));
    uint64_t nw = plim_shm_word_make(next, (w & (W_QUEUED | W_RECOVERING)) |
                                               (max > 0 ? 0u : W_UNBOUNDED));
    /* S1': lowering, the word before the fact; raising, after it. */
    if (next < avail)
        atomic_exchange_explicit(&P->word, nw, memory_order_relaxed);
    ST(P->max, max);   /* the fact */
    CRASH(h);
    if (next >= avail)
        atomic_exchange_explicit(&P->word, nw, memory_order_relaxed);
    /* release: F3, the lock-free paths that see the flag cleared see max. */
    word_flag(P, W_RECOVERING, 0);
    if (max > 0) {
        /* Queued requests that can never fit fail now (AsyncSemaphore's
         * rule), not only when they reach the head. */
        uint32_t r = LD(P->head), steps = 0;
        int repairs = 0;
        while (r != PLIM_SHM_NIL) {
            if (r >= h->nrec || ++steps > h->nrec) {
                if (fix(h, &repairs) != PLIM_SHM_OK)
                    return PLIM_SHM_CORRUPT;
                break;
            }
            plim_shm_rec_t *R = rec_at(h, r);
            uint32_t next = LD(R->next);
            if (LD(R->state) == PLIM_SHM_R_QUEUED && LD(R->total) > max) {
                ST(R->limit, max);
                ST(R->state, PLIM_SHM_R_TOO_LARGE);
                if (unlink_rec(h, p, r) != PLIM_SHM_OK) {
                    if (fix(h, &repairs) != PLIM_SHM_OK)
                        return PLIM_SHM_CORRUPT;
                    note_decided(h, r);
                    break;
                }
                note_decided(h, r);
            }
            r = next;
        }
    }
    return process_locked(h, p, 1);
}

int plim_shm_detach_locked(plim_shm_t *h)
{
    uint32_t bump = LD(hdr(h)->bump);
    if (bump > h->nrec)
        bump = h->nrec;
    int repairs = 0;
    for (uint32_t r = 0; r < bump; r++) {
        plim_shm_rec_t *R = rec_at(h, r);
        if ((int32_t)LD(R->owner) != h->slot || LD(R->owner_gen) != h->gen)
            continue;
        uint32_t st = LD(R->state), p = LD(R->pool);
        if (st == PLIM_SHM_R_FREE || p >= h->npools)
            continue;
        if (st == PLIM_SHM_R_QUEUED) {
            ST(R->state, PLIM_SHM_R_CLOSED);
            if (unlink_rec(h, p, r) != PLIM_SHM_OK)
                fix(h, &repairs);
            note_decided(h, r);   /* its thread, if any, wakes and reads "closed" */
            free_locked(h, r);
        } else if (st == PLIM_SHM_R_GRANTED) {
            int64_t g = LD(R->granted);
            free_locked(h, r);
            if (in_permits(g))
                word_add(pool_at(h, p), g);   /* after the fact (S1') */
        } else {
            free_locked(h, r);
        }
    }
    plim_shm_slot_t *S = slot_at(h, (uint32_t)h->slot);
    for (uint32_t p = 0; p < h->npools; p++) {
        /* Both ledgers: no lock-free path of ours runs now (plim_shm.h). */
        int64_t held = clamp_permits(sat_add(LD(S->held[p]), LD(S->fheld[p])));
        ST(S->held[p], 0);
        ST(S->fheld[p], 0);
        CRASH(h);
        word_add(pool_at(h, p), held);   /* after the facts (S1') */
    }
    ST(S->gen, LD(S->gen) + 1u);
    ST(S->state, PLIM_SHM_SLOT_FREE);
    for (uint32_t p = 0; p < h->npools; p++)
        process_locked(h, p, 1);
    return PLIM_SHM_OK;
}

int plim_shm_stats_locked(plim_shm_t *h, uint32_t p, plim_shm_stats_t *out)
{
    plim_shm_pool_t *P = pool_at(h, p);
    /* Lock-free grants count in their slots (0 s waits). */
    int64_t fast = 0;
    for (uint32_t s = 0; s < h->maxp; s++) {
        int64_t v = LD(slot_at(h, s)->fcount[p]);
        if (v > 0)
            fast = sat_add(fast, v);
    }
    out->max = LD(P->max);
    out->avail = plim_shm_word_avail(LD(P->word));
    out->qlen = LD(P->qlen) < 0 ? 0 : LD(P->qlen);
    out->acquired_total = sat_add(LD(P->acquired_total), fast);
    out->timeout_total = LD(P->timeout_total);
    out->queue_full_total = LD(P->queue_full_total);
    out->cancelled_total = LD(P->cancelled_total);
    out->wait_ns = LD(P->wait_ns);
    out->hwm = LD(P->hwm);
    for (int i = 0; i < PLIM_SHM_NBUCKETS; i++) {
        int64_t v = LD(P->buckets[i]);
        out->buckets[i] = v < 0 ? 0 : v;
    }
    out->buckets[0] = sat_add(out->buckets[0], fast);
    return PLIM_SHM_OK;
}

int plim_shm_holders_locked(plim_shm_t *h, int32_t *pids, int64_t *held)
{
    int n = 0;
    for (uint32_t s = 0; s < h->maxp; s++) {
        plim_shm_slot_t *S = slot_at(h, s);
        if (LD(S->state) != PLIM_SHM_SLOT_LIVE)
            continue;
        pids[n] = LD(S->pid);
        for (uint32_t p = 0; p < h->npools; p++)
            held[(size_t)n * h->npools + p] =
                clamp_permits(sat_add(LD(S->held[p]), LD(S->fheld[p])));
        n++;
    }
    return n;
}

int plim_shm_audit_locked(plim_shm_t *h, uint32_t p, int64_t out[6])
{
    plim_shm_pool_t *P = pool_at(h, p);
    int64_t held = 0, granted = 0, queued = 0, linked = 0;
    /* A snapshot: the lock-free paths of live processes move the word and
     * their fheld[] without the lock, so they are held off (RECOVERING, as
     * for a repair) while the facts are read, then let go again, unless a
     * repair had left the flag for a later round. */
    int was_recovering =
        (atomic_load_explicit(&P->word, memory_order_acquire) & W_RECOVERING) != 0;
    quiesce(h, QUIESCE_NS, 1u << p);
    for (uint32_t s = 0; s < h->maxp; s++)
        if (LD(slot_at(h, s)->state) == PLIM_SHM_SLOT_LIVE)
            held = sat_add(held, sat_add(LD(slot_at(h, s)->held[p]),
                                         LD(slot_at(h, s)->fheld[p])));
    uint32_t bump = LD(hdr(h)->bump);
    if (bump > h->nrec)
        bump = h->nrec;
    for (uint32_t r = 0; r < bump; r++) {
        plim_shm_rec_t *R = rec_at(h, r);
        if (LD(R->pool) != p)
            continue;
        uint32_t st = LD(R->state);
        if (st == PLIM_SHM_R_GRANTED)
            granted = sat_add(granted, LD(R->granted));
        else if (st == PLIM_SHM_R_QUEUED)
            queued++;
    }
    for (uint32_t r = LD(P->head); r != PLIM_SHM_NIL && r < h->nrec && linked <= h->nrec;
         r = LD(rec_at(h, r)->next))
        linked++;
    out[0] = acquired_of(LD(P->max), plim_shm_word_avail(LD(P->word)));
    out[1] = held;
    out[2] = granted;
    out[3] = LD(P->qlen);
    out[4] = queued;
    out[5] = linked;
    if (!was_recovering)
        word_flag(P, W_RECOVERING, 0);
    return PLIM_SHM_OK;
}

/* ======================================================================== */
/*  waiting                                                                 */
/* ======================================================================== */

static int sweep_now(plim_shm_t *h)
{
    int st = plim_shm_lock(h);
    if (st != PLIM_SHM_OK)
        return st;
    plim_shm_sweep_locked(h, 0);
    plim_shm_unlock(h);
    return PLIM_SHM_OK;
}

int plim_shm_wait_rec(plim_shm_t *h, uint32_t r, uint32_t ticket, int64_t deadline_ns)
{
    if (r >= h->nrec)
        return PLIM_SHM_DECIDED;
    plim_shm_rec_t *R = rec_at(h, r);
    for (;;) {
        /* acquire: pairs with nothing in particular (the collect that
         * follows takes the lock); it only keeps the check fresh. */
        uint32_t st = atomic_load_explicit(&R->state, memory_order_acquire);
        if (st != PLIM_SHM_R_QUEUED || LD(R->ticket) != ticket ||
            (int32_t)LD(R->owner) != h->slot)
            return PLIM_SHM_DECIDED;
        int64_t now = plim_shm_now_ns();
        int64_t slice = SWEEP_NS;
        if (deadline_ns >= 0) {
            if (now >= deadline_ns)
                return PLIM_SHM_TIMEDOUT;
            if (deadline_ns - now < slice)
                slice = deadline_ns - now;
        }
        long rc = futex_wait(&R->state, PLIM_SHM_R_QUEUED, slice);
        if (rc != 0 && errno == EINTR)
            return PLIM_SHM_INTR;
        /* Woken: read the record first (the hand-off's latency); sweep for
         * dead processes only when a slice ran out unwoken. */
        if (rc != 0 && errno == ETIMEDOUT && plim_shm_sweep_due(h)) {
            int s = sweep_now(h);
            if (s != PLIM_SHM_OK)
                return s;
        }
    }
}

int plim_shm_wait_collect(plim_shm_t *h, uint32_t r, uint32_t ticket, int64_t deadline_ns,
                          int *state, int64_t *granted, int64_t *limit)
{
    for (;;) {
        int st = plim_shm_wait_rec(h, r, ticket, deadline_ns);
        if (st != PLIM_SHM_DECIDED)
            return st;
        /* Collect before going back to the caller: one critical section
         * more without the GIL, none with it. */
        if (!plim_shm_trylock_inline(h)) {
            st = plim_shm_lock(h);
            if (st != PLIM_SHM_OK)
                return st;
        }
        st = plim_shm_collect_locked(h, r, ticket, state, granted, limit);
        plim_shm_unlock(h);
        if (st != PLIM_SHM_QUEUED)   /* QUEUED: hostile bytes put it back */
            return st == PLIM_SHM_OK ? PLIM_SHM_DECIDED : st;
    }
}

int plim_shm_loop_add(plim_shm_t *h, int bit)
{
    if (bit < 0 || bit >= PLIM_SHM_NLOOPS)
        return -1;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        return -1;
    pthread_mutex_lock(&h->wmu);
    if (h->efd[bit] >= 0)
        close(h->efd[bit]);
    h->efd[bit] = fd;
    pthread_mutex_unlock(&h->wmu);
    return fd;
}

void plim_shm_loop_remove(plim_shm_t *h, int bit)
{
    if (bit < 0 || bit >= PLIM_SHM_NLOOPS)
        return;
    pthread_mutex_lock(&h->wmu);
    if (h->efd[bit] >= 0)
        close(h->efd[bit]);
    h->efd[bit] = -1;
    pthread_mutex_unlock(&h->wmu);
}

int plim_shm_loop_direct(plim_shm_t *h, int bit)
{
    if (bit < 0 || bit >= 63 || h->me == NULL || h->slot < 0) {
        errno = EINVAL;
        return -1;
    }
    plim_shm_loop_direct_close(h, bit);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un a;
    socklen_t len = direct_name(h, (uint32_t)h->slot, h->gen, (uint32_t)bit, &a);
    if (bind(fd, (struct sockaddr *)(void *)&a, len) != 0) {
        int e = errno;   /* EADDRINUSE: squatted; the waker serves this loop */
        close(fd);
        errno = e;
        return -1;
    }
    h->lsock[bit] = fd;
    /* relaxed: deciders read it under the host's lock, which this process
     * takes (to queue the loop's first request) after this store. */
    atomic_fetch_or_explicit(&h->me->direct, (uint64_t)1 << bit, memory_order_relaxed);
    return fd;
}

void plim_shm_loop_direct_close(plim_shm_t *h, int bit)
{
    if (bit < 0 || bit >= 63)
        return;
    if (h->me != NULL)
        atomic_fetch_and_explicit(&h->me->direct, ~((uint64_t)1 << bit), memory_order_relaxed);
    if (h->lsock[bit] >= 0) {
        close(h->lsock[bit]);
        h->lsock[bit] = -1;
    }
}

int plim_shm_loop_drain(int fd, int is_socket)
{
    /* One system call on the hand-off's path: an eventfd's read takes its
     * whole count; a socket's recvmmsg up to 32 datagrams.  What is left
     * keeps the fd readable, and the loop calls again. */
    if (!is_socket) {
        uint64_t v;
        return read(fd, &v, sizeof v) == (ssize_t)sizeof v;
    }
    char buf[32][8];
    struct iovec iov[32];
    struct mmsghdr msgs[32];
    memset(msgs, 0, sizeof msgs);
    for (int i = 0; i < 32; i++) {
        iov[i].iov_base = buf[i];
        iov[i].iov_len = sizeof buf[i];
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(fd, msgs, 32, MSG_DONTWAIT, NULL);
    return n < 0 ? 0 : n;
}

/* The waker: sleeps on this process's slot futex; when another process
 * decided one of our asyncio requests, writes the eventfd of its loop.  It
 * also sweeps for dead processes every 250 ms while it runs. */
static void *waker_main(void *arg)
{
    plim_shm_t *h = arg;
    int32_t s = h->slot;
    if (s < 0 || (uint32_t)s >= h->maxp)
        return NULL;
    plim_shm_slot_t *S = slot_at(h, (uint32_t)s);
    while (!atomic_load(&h->waker_stop)) {
        uint32_t seen = atomic_load_explicit(&S->wake, memory_order_acquire);
        uint64_t mask = atomic_exchange_explicit(&S->loopmask, 0, memory_order_acquire);
        if (mask)
            deliver_loops(h, mask);
        if (atomic_load(&h->waker_stop))
            break;
        futex_wait(&S->wake, seen, SWEEP_NS);
        if (plim_shm_sweep_due(h))
            sweep_now(h);
    }
    return NULL;
}

int plim_shm_waker_start(plim_shm_t *h)
{
    if (h->waker_running)
        return PLIM_SHM_OK;
    atomic_store(&h->waker_stop, 0);
    sigset_t all, old;
    sigfillset(&all);
    /* Signals go to the interpreter's threads, never to the waker. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 128 * 1024);
    int rc = pthread_create(&h->waker, &attr, waker_main, h);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        return PLIM_SHM_ERRNO;
    }
    h->waker_running = 1;
    return PLIM_SHM_OK;
}

void plim_shm_waker_stop(plim_shm_t *h)
{
    if (!h->waker_running)
        return;
    atomic_store(&h->waker_stop, 1);
    if (h->slot >= 0 && (uint32_t)h->slot < h->maxp)
        wake_slot(h, (uint32_t)h->slot);
    pthread_join(h->waker, NULL);
    h->waker_running = 0;
}
