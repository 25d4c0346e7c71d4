/* plim_shm.pml: a Promela model of the host-wide limiter's cross-process
 * protocol (csrc/plim_shm.c), for spin.  Every process may die after any
 * step, holding the lock or not; spin explores every interleaving.
 *
 * What is modelled, store by store as in plim_shm.c:
 *   - the host's lock (a word holding its owner), taken with a CAS, taken
 *     over with a CAS from a dead owner (its OFD lock gone: `alive`), after
 *     which the taker repairs;
 *   - take (fits now, nobody queued), enqueue (record fields, link, then the
 *     state: the commit), the grant by whoever releases (granted, then the
 *     state: the commit, then avail, then the unlink), collect by the owner
 *     (the record is freed, then held += granted), release (held, then
 *     avail, then the queue is processed), abandon on timeout (a queued
 *     record leaves; a granted one is kept and collected);
 *   - the sweep: a waiter that sees a LIVE slot whose process is dead takes
 *     the lock and repairs;
 *   - the repair: the dead slots' facts are dropped (one store at a time:
 *     the repairer may die too), then every derived field (avail, the queue)
 *     is rebuilt from the facts of the live processes, then the queue is
 *     processed.
 * What is not: hostile bytes, several pools, is_cancelled, set_max, the
 * wake-up mechanism (a waiter here re-reads its record; the real waits
 * time out every 250 ms and re-read it too), memory orders (every access is
 * under the lock; plim_shm.c's notes say why that suffices).
 *
 * Checked: (1) never more permits held by live processes (held + granted
 * and not yet collected) than MAX, in every state (the monitor); (2) a
 * grant collected is the grant asked for; (3) no process that lives is
 * blocked for ever (spin's invalid end states: a lost permit or a dead
 * lock holder never taken over leaves a waiter stuck); (4) at the end,
 * after one more repair (what the next open does), every permit is back
 * and nothing is queued.
 *
 * WEAKEN=n builds a deliberately broken protocol that must fail
 * (tests/test_shm_model.py):
 *   1  no repair: a dead lock holder is taken over, and dead slots found,
 *      but nothing is rebuilt (its permits never come back)
 *   2  the grant's two stores in the wrong order: the state (the commit)
 *      before `granted`, so a granter dying between them hands out a grant
 *      of 0
 *   3  the repair forgets grants not yet collected (avail counts only the
 *      held permits): permits are handed out twice
 *   4  no takeover: a lock word whose owner died is waited on for ever
 */

#ifndef WEAKEN
#define WEAKEN 0
#endif
/* Rounds of process 0 (acquire, hold, release): 1 keeps the exhaustive
 * search at about 6 million states; 2 makes it 24 million. */
#ifndef ROUNDS0
#define ROUNDS0 1
#endif

#define N 3          /* processes */
#define MAX 2        /* permits */
#define KILLS 1      /* deaths per run */
#define FREE 0
#define QUEUED 1
#define GRANTED 2
#define NIL 255

byte mutex = 0;          /* 0, or the owner + 1 */
bool alive[N];           /* the process's OFD lock: dropped at its death */
bool live[N];            /* its slot is LIVE (a fact; cleared by a repair) */
byte held[N];            /* a fact: only its process writes it, a repair zeroes it */
byte rstate[N];          /* one record per process: the state is the commit */
byte rneed[N];
byte rgranted[N];
byte rseq[N];
byte seq = 0;
short avail = MAX;       /* derived */
byte q[N + 1];           /* derived: the queue, oldest first */
byte qn = 0;
byte kills = 0;
byte done = 0;           /* processes that finished */
bool finished[N];

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

/* The derived fields from the facts of the live processes (one step:
 * derived fields are rebuilt whole by plim_shm.c's repair, and a repairer
 * that dies is followed by another repair). */
inline REBUILD() {
    d_step {
        byte i, j, t;
        short used = 0;
        qn = 0;
        i = 0;
        do
        :: i < N ->
            if
            :: alive[i] ->
                used = used + held[i];
                if
#if WEAKEN != 3
                :: rstate[i] == GRANTED -> used = used + rgranted[i]
#endif
                :: rstate[i] == QUEUED -> q[qn] = i; qn++
                :: else -> skip
                fi
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
        avail = MAX - used;
        i = 0; j = 0; t = 0; used = 0
    }
}

/* Grant the heads that fit (S4).  A head whose record says it is not
 * queued means the derived queue is stale: rebuild it. */
inline PROCESS() {
    do
    :: qn > 0 && rstate[q[0]] != QUEUED -> REBUILD()
    :: qn > 0 && rstate[q[0]] == QUEUED && avail >= rneed[q[0]] ->
        h = q[0];
#if WEAKEN == 2
        rstate[h] = GRANTED;
        rgranted[h] = rneed[h];
#else
        rgranted[h] = rneed[h];    /* before the commit */
        rstate[h] = GRANTED;       /* the commit */
#endif
        avail = avail - rneed[h];
        d_step {                   /* unlink the head */
            byte k = 0;
            do
            :: k + 1 < qn -> q[k] = q[k + 1]; k++
            :: else -> break
            od;
            qn--;
            k = 0
        }
    :: else -> break
    od
}

inline REPAIR() {
#if WEAKEN != 1
    d = 0;
    do
    :: d < N ->
        if
        :: live[d] && !alive[d] ->   /* dead: what it held goes back */
            held[d] = 0;
            rstate[d] = FREE;
            live[d] = false
        :: else -> skip
        fi;
        d++
    :: else -> break
    od;
    REBUILD();
    PROCESS()
#else
    d = 0
#endif
}

#define SWEEP_NEEDED ((live[0] && !alive[0]) || (live[1] && !alive[1]) || \
                      (live[2] && !alive[2]))

proctype P(byte me; byte need; byte rounds) {
    byte h, d, got, r = 0;
    bool may_time_out = true;
    {
        do
        :: r < rounds ->
            LOCK();
            if
            :: qn == 0 && avail >= need ->       /* take */
                avail = avail - need;
                held[me] = held[me] + need;
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
                        REBUILD();
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
                rstate[me] = FREE;                /* the record first... */
                held[me] = held[me] + got;        /* ...then held: never counted twice */
                UNLOCK()
            fi;
            LOCK();                               /* release */
            held[me] = held[me] - need;
            avail = avail + need;
            PROCESS();
            UNLOCK();
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

/* (1) in every state: what live processes hold never exceeds the budget. */
active proctype monitor() {
    assert(
        (alive[0] -> held[0] + (rstate[0] == GRANTED -> rgranted[0] : 0) : 0) +
        (alive[1] -> held[1] + (rstate[1] == GRANTED -> rgranted[1] : 0) : 0) +
        (alive[2] -> held[2] + (rstate[2] == GRANTED -> rgranted[2] : 0) : 0) <= MAX)
}

init {
    byte me = N, h, d;
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
