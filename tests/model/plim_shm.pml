/* plim_shm.pml: a Promela model of the host-wide limiter's cross-process
 * protocol (csrc/plim_shm.c, csrc/plim_shm_fast.h), for spin.  Every
 * process may die after any step, holding the lock or not, inside a
 * lock-free path or not; spin explores every interleaving.
 *
 * What is modelled, store by store as in the C code:
 *   - the counter word: avail with the QUEUED and RECOVERING flags (`wq`,
 *     `wr`); a CAS on it is one atomic step that checks the flags and the
 *     fit and changes avail;
 *   - the lock-free paths: the in-flight mark, the CAS, the store to the
 *     lock-free ledger (fheld), the mark cleared; a refusal (a flag, or no
 *     fit) clears the mark and takes the lock;
 *   - the host's lock (a word holding its owner), taken with a CAS, taken
 *     over with a CAS from a dead owner (its OFD lock gone: `alive`), after
 *     which the taker repairs;
 *   - take under the lock (the word first, then held), enqueue (QUEUED set
 *     by the CAS that re-checks the fit, or the permits taken after all;
 *     the record fields, the link, then the state: the commit), the grant
 *     by whoever releases (the word first, then granted, then the state:
 *     the commit, then the unlink, clearing QUEUED with the last one),
 *     collect by the owner (the record is freed, then held += granted),
 *     release under the lock (held, then the word, then the queue is
 *     served), abandon on timeout (a queued record leaves; a granted one
 *     is kept and collected);
 *   - the sweep: a waiter that sees a LIVE slot whose process is dead, or
 *     a repair still due, takes the lock and repairs;
 *   - the repair: RECOVERING set; the wait for the marks of live processes,
 *     which may give up (the bound) at any moment while one is set; the
 *     dead slots' facts dropped (one store at a time: the repairer may die
 *     too); the queue rebuilt; then, in one step, the word: rebuilt from
 *     the facts of the living if the wait succeeded, else kept (and the
 *     repair is due again), QUEUED from the queue, RECOVERING cleared; then
 *     the queue is served.
 * What is not: hostile bytes, several pools, is_cancelled, set_max, the
 * statistics, the wake-up mechanism (a waiter here re-reads its record;
 * the real waits time out every 250 ms and re-read it too), memory orders
 * (plim_shm.c's notes, F1-F4, say why the protocol sees sequential
 * consistency).
 *
 * Checked: (1) in every state, what live processes' callers hold (`inuse`,
 * a ghost moved at each path's linearization point: the lock-free CAS, the
 * word step of a take under the lock, the held store of a release under
 * it, the freeing of a collected record) plus the grants not yet collected
 * never exceed MAX (the monitor); (2) a grant collected is the grant asked
 * for; (3) no process that lives is blocked for ever (spin's invalid end
 * states: a lost permit or a dead lock holder never taken over leaves a
 * waiter stuck); (4) at the end, after one more repair (what the next open
 * does), every permit is back and nothing is queued.
 *
 * WEAKEN=n builds a deliberately broken protocol that must fail
 * (tests/shared/test_shm_model.py):
 *   1  no repair: a dead lock holder is taken over, and dead slots found,
 *      but nothing is rebuilt (its permits never come back)
 *   2  the grant's two stores in the wrong order: the state (the commit)
 *      before `granted`, so a granter dying between them hands out a grant
 *      of 0
 *   3  the repair forgets grants not yet collected (avail counts only the
 *      held permits): permits are handed out twice
 *   4  no takeover: a lock word whose owner died is waited on for ever
 *   5  no in-flight wait: the repair rebuilds the word while a live process
 *      is between its lock-free CAS and its ledger store, so that process's
 *      permits are counted free and handed out twice
 *   6  the grant commits before it lowers the word: a granter dying between
 *      leaves the word too high, and a repair that cannot wait out a
 *      lock-free path keeps that word (S1' broken): handed out twice
 */

#ifndef WEAKEN
#define WEAKEN 0
#endif
/* Rounds of process 0 (acquire, hold, release). */
#ifndef ROUNDS0
#define ROUNDS0 1
#endif

#define N 3          /* processes */
#define MAX 2        /* permits */
#define KILLS 1      /* deaths per run */
#define FREE 0
#define QUEUED 1
#define GRANTED 2

byte mutex = 0;          /* 0, or the owner + 1 */
bool alive[N];           /* the process's OFD lock: dropped at its death */
bool live[N];            /* its slot is LIVE (a fact; cleared by a repair) */
short held[N];           /* facts: only its process writes them, a repair */
short fheld[N];          /*   zeroes them; what it holds is their sum */
bool inflight[N];        /* its in-flight mark */
byte inuse[N];           /* ghost: what its callers hold */
byte rstate[N];          /* one record per process: the state is the commit */
byte rneed[N];
byte rgranted[N];
byte rseq[N];
byte seq = 0;
short avail = MAX;       /* the word (derived) */
bool wq = false;         /* the word's QUEUED */
bool wr = false;         /* the word's RECOVERING */
bool due = false;        /* a repair could not rebuild the word */
byte q[N + 1];           /* derived: the queue, oldest first */
byte qn = 0;
byte kills = 0;
byte done = 0;           /* processes that finished */
bool finished[N];

#define QUIET (!(alive[0] && inflight[0]) && !(alive[1] && inflight[1]) && \
               !(alive[2] && inflight[2]))

inline LOCK() {
    do
    :: atomic { mutex == 0 -> mutex = me + 1 }; break
#if WEAKEN != 4
    :: atomic { mutex != 0 && !alive[mutex - 1] -> mutex = me + 1 };
       REPAIR(); break
#endif
    od
}

inline UNLOCK() {
    mutex = 0
}

/* The queue from the records of the live processes (one step: the links
 * are rebuilt whole by plim_shm.c's repair, and a repairer that dies is
 * followed by another repair). */
inline REBUILD_QUEUE() {
    d_step {
        byte i, j, t;
        qn = 0;
        i = 0;
        do
        :: i < N ->
            if
            :: alive[i] && rstate[i] == QUEUED -> q[qn] = i; qn++
            :: else -> skip
            fi;
            i++
        :: else -> break
        od;
        /* oldest first */
        i = 0;
        do
        :: i < qn ->
            j = i + 1;
            do
            :: j < qn ->
                if
                :: rseq[q[j]] < rseq[q[i]] -> t = q[i]; q[i] = q[j]; q[j] = t
                :: else -> skip
                fi;
                j++
            :: else -> break
            od;
            i++
        :: else -> break
        od;
        i = 0; j = 0; t = 0
    }
}

/* The word from the facts of the live processes (S1), RECOVERING cleared
 * (one step: the exchange that publishes it). */
inline REBUILD_WORD() {
    d_step {
        byte i;
        short used = 0;
        i = 0;
        do
        :: i < N ->
            if
            :: alive[i] ->
                used = used + held[i] + fheld[i];
#if WEAKEN != 3
                if
                :: rstate[i] == GRANTED -> used = used + rgranted[i]
                :: else -> skip
                fi
#endif
            :: else -> skip
            fi;
            i++
        :: else -> break
        od;
        avail = MAX - used;
        wq = (qn > 0);
        wr = false;
        due = false;
        i = 0; used = 0
    }
}

/* Grant the heads that fit (S4).  A head whose record says it is not
 * queued means the derived queue is stale: rebuild it. */
inline PROCESS() {
    do
    :: qn > 0 && rstate[q[0]] != QUEUED -> REBUILD_QUEUE()
    :: qn > 0 && rstate[q[0]] == QUEUED && avail < rneed[q[0]] -> break
    :: qn > 0 && rstate[q[0]] == QUEUED && avail >= rneed[q[0]] ->
        h = q[0];
#if WEAKEN == 2
        avail = avail - rneed[h];
        rstate[h] = GRANTED;
        rgranted[h] = rneed[h];
#elif WEAKEN == 6
        rgranted[h] = rneed[h];
        rstate[h] = GRANTED;       /* the commit before the word */
        avail = avail - rneed[h];
#else
        avail = avail - rneed[h];  /* the word first (S1') */
        rgranted[h] = rneed[h];    /* before the commit */
        rstate[h] = GRANTED;       /* the commit */
#endif
        d_step {                   /* unlink the head */
            byte k = 0;
            do
            :: k + 1 < qn -> q[k] = q[k + 1]; k++
            :: else -> break
            od;
            qn--;
            k = 0
        };
        if
        :: qn == 0 -> wq = false   /* the last one left */
        :: else -> skip
        fi
    :: qn == 0 -> break
    od
}

inline REPAIR() {
#if WEAKEN != 1
    wr = true;                                   /* (a) */
    if                                           /* (b), bounded */
    :: atomic { QUIET -> quiet = true }
#if WEAKEN != 5
    :: atomic { !QUIET -> quiet = false }        /* gave up: a live mark stays */
#else
    :: atomic { !QUIET -> quiet = true }         /* weakened: no wait at all */
#endif
    fi;
    d = 0;
    do
    :: d < N ->
        if
        :: live[d] && !alive[d] ->               /* dead: what it held goes back */
            held[d] = 0;
            fheld[d] = 0;
            rstate[d] = FREE;
            live[d] = false
        :: else -> skip
        fi;
        d++
    :: else -> break
    od;
    REBUILD_QUEUE();
    if                                           /* (c) */
    :: quiet -> REBUILD_WORD()
    :: else -> d_step { wq = (qn > 0); wr = false; due = true }
    fi;
    PROCESS()
#else
    d = 0
#endif
}

#define SWEEP_NEEDED ((live[0] && !alive[0]) || (live[1] && !alive[1]) || \
                      (live[2] && !alive[2]) || due)

proctype P(byte me; byte need; byte rounds) {
    byte h, d, got, r = 0;
    bool may_time_out = true, ok, quiet;
    {
        do
        :: r < rounds ->
            /* acquire: lock-free first */
            inflight[me] = true;
            if
            :: atomic { !wq && !wr && avail >= need ->
                   avail = avail - need; inuse[me] = inuse[me] + need; ok = true }
            :: atomic { (wq || wr || avail < need) -> ok = false }
            fi;
            if
            :: ok ->
                fheld[me] = fheld[me] + need;
                inflight[me] = false
            :: else ->
                inflight[me] = false;
                LOCK();
                if
                :: atomic { !wq && avail >= need ->   /* take (or enqueue's re-check) */
                       avail = avail - need; inuse[me] = inuse[me] + need; ok = true }
                :: atomic { (wq || avail < need) -> wq = true; ok = false }
                fi;
                if
                :: ok ->
                    held[me] = held[me] + need;       /* the word first, then held */
                    UNLOCK()
                :: else ->                            /* queue */
                    seq++;
                    rseq[me] = seq;
                    rneed[me] = need;
                    rgranted[me] = 0;
                    q[qn] = me;
                    qn++;
                    rstate[me] = QUEUED;              /* the commit */
                    UNLOCK();
                    do                                /* wait: re-read, sweep */
                    :: rstate[me] != QUEUED -> break
                    :: SWEEP_NEEDED -> LOCK(); REPAIR(); UNLOCK()
                    :: may_time_out ->                /* a timeout */
                        may_time_out = false;
                        LOCK();
                        if
                        :: rstate[me] == QUEUED ->    /* leave the queue */
                            rstate[me] = FREE;
                            REBUILD_QUEUE();
                            if
                            :: qn == 0 -> wq = false
                            :: else -> skip
                            fi;
                            PROCESS();
                            UNLOCK();
                            goto next                 /* nothing held */
                        :: else -> UNLOCK()           /* granted: the grant stands */
                        fi
                    od;
                    LOCK();                           /* collect */
                    assert(rstate[me] == GRANTED);
                    got = rgranted[me];
                    assert(got == need);
                    atomic { rstate[me] = FREE;       /* the record first... */
                             inuse[me] = inuse[me] + got };
                    held[me] = held[me] + got;        /* ...then held: never counted twice */
                    UNLOCK()
                fi
            fi;
            /* release: lock-free first */
            inflight[me] = true;
            if
            :: atomic { !wq && !wr ->
                   avail = avail + need; inuse[me] = inuse[me] - need; ok = true }
            :: atomic { (wq || wr) -> ok = false }
            fi;
            if
            :: ok ->
                fheld[me] = fheld[me] - need;
                inflight[me] = false
            :: else ->
                inflight[me] = false;
                LOCK();
                atomic { held[me] = held[me] - need; inuse[me] = inuse[me] - need };
                avail = avail + need;                 /* after the fact (S1') */
                PROCESS();
                UNLOCK()
            fi;
next:       r++
        :: else -> break
        od;
        atomic { finished[me] = true; done++ }
    } unless { !alive[me] }
}

/* Death comes at any step of any process (its OFD lock drops with it). */
active proctype killer() {
    do
    :: atomic { kills < KILLS && alive[0] && !finished[0] -> alive[0] = false; kills++ }
    :: atomic { kills < KILLS && alive[1] && !finished[1] -> alive[1] = false; kills++ }
    :: atomic { kills < KILLS && alive[2] && !finished[2] -> alive[2] = false; kills++ }
    :: break
    od
}

/* (1) in every state: what live processes' callers hold, and the grants
 * they have not collected, never exceed the budget. */
active proctype monitor() {
    assert(
        (alive[0] -> inuse[0] + (rstate[0] == GRANTED -> rgranted[0] : 0) : 0) +
        (alive[1] -> inuse[1] + (rstate[1] == GRANTED -> rgranted[1] : 0) : 0) +
        (alive[2] -> inuse[2] + (rstate[2] == GRANTED -> rgranted[2] : 0) : 0) <= MAX)
}

init {
    byte me = N, h, d;
    bool quiet;
    atomic {
        alive[0] = true; alive[1] = true; alive[2] = true;
        live[0] = true; live[1] = true; live[2] = true;
        run P(0, 1, ROUNDS0);
        run P(1, 2, 1);
        run P(2, 1, 1)
    }
    /* Every process finished or died (none is stuck: spin reports a
     * stuck one as an invalid end state). */
    (done + kills == N);
    /* (4) what the next open does: take the lock (over from a dead holder),
     * repair; then every permit is back. */
    do
    :: atomic { mutex == 0 -> mutex = me + 1 }; break
    :: atomic { mutex != 0 && !alive[mutex - 1] -> mutex = me + 1 }; break
    od;
    REPAIR();
    assert(avail == MAX && qn == 0);
    mutex = 0
}
