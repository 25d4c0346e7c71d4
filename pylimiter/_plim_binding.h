/* _plim_binding.h: the few things the Cython binding needs below Cython's reach.
 * Binding code (it includes Python.h); the core in csrc/ never does.
 *
 * Invariants and locking rules
 * ----------------------------
 * Everything here runs with the GIL held and relies on it: the module is not
 * declared free-threading compatible, so a free-threaded interpreter enables
 * the GIL when it imports it, and the StopIteration cache below is compiled
 * out where Py_GIL_DISABLED is defined (it would need one per thread).
 *
 * The awaitable request finishes an `await` in one of three ways, chosen by
 * its step function (plim_advance_fn):
 *   PLIM_STEP_YIELD   the value is what the awaiting task parks on;
 *   PLIM_STEP_RETURN  the value is the result of the await;
 *   PLIM_STEP_RAISE   the value is an exception instance: it is raised here,
 *                     once, with no traceback entry of ours on top (the
 *                     binding never raises it through its own frames).
 * 3.10 and 3.11 drive awaitables through am_send, which returns the result
 * directly.  3.12-3.14's SEND calls tp_iternext for non-generators, and a
 * result must travel in a StopIteration; that exception is reused from a
 * one-slot cache while nothing else holds it (see plim_raise_stop).  3.15's
 * SEND calls am_send again: no exception per await, so no cache there (a
 * hand-driven next() gets a fresh StopIteration).
 */
#ifndef PLIM_BINDING_H
#define PLIM_BINDING_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef _WIN32
#  include <windows.h>
#else
#  include <time.h>
#endif

/* plim_monotonic_ns: the monotonic clock of wait-time statistics and of
 * request deadlines.  Called on slow paths only (enqueue, grants of queued
 * waiters, timer arming). */
static int64_t plim_monotonic_ns(void)
{
#ifdef _WIN32
    static LARGE_INTEGER freq;
    LARGE_INTEGER now;
    if (freq.QuadPart == 0)
        QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&now);
    return (int64_t)((double)now.QuadPart * 1e9 / (double)freq.QuadPart);
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

/* plim_as_longlong: PyLong_AsLongLongAndOverflow for an exact int, with
 * 3.12+'s inline read of a compact (one-digit) int first: the permits
 * argument of every acquire is one, and the call was a few percent of an
 * uncontended acquire. */
Py_LOCAL_INLINE(long long) plim_as_longlong(PyObject *o, int *overflow)
{
#if PY_VERSION_HEX >= 0x030C0000 && !defined(Py_LIMITED_API)
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        *overflow = 0;
        return (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
    }
#endif
    return PyLong_AsLongLongAndOverflow(o, overflow);
}

enum { PLIM_STEP_YIELD = 0, PLIM_STEP_RETURN = 1, PLIM_STEP_RAISE = 2 };

/* The request object's step function, defined in Cython: returns a new
 * reference and sets *status (PLIM_STEP_*), or NULL with an exception set
 * (an unexpected error, such as MemoryError). */
typedef PyObject *(*plim_advance_fn)(PyObject *self, int *status);
static plim_advance_fn plim_advance_impl = NULL;

/* plim_raise sets exc, an exception instance (borrowed), as the exception
 * being raised: implicit chaining as for a `raise`, no traceback entry. */
static void plim_raise(PyObject *exc)
{
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
}

#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030F0000 && !defined(Py_GIL_DISABLED)
#  define PLIM_STOP_CACHE 1
/* One StopIteration, reused for every finished await while nobody else
 * holds it.  SEND fetches the raised exception, reads its value and drops it
 * at once, so in the common case the refcount is back to 1 (ours) before the
 * next await finishes.
 *
 * Why this is safe:
 *   - Reused only when ours is the only reference and it carries no
 *     traceback, context, cause, notes or dict: whoever else saw it (a
 *     sys.monitoring RAISE callback, a debugger, an `except StopIteration`
 *     around a hand-driven next()) keeps an untouched object, and we start
 *     a fresh one.
 *   - `value` is an owned reference, never a borrowed one, so no holder can
 *     meet a dangling pointer.
 *   - It does not keep the last permit alive past its request: a request's
 *     deallocator calls plim_stop_take, which detaches the value if it is
 *     still its result.  (The request itself holds the same permit until
 *     then, for `async with`.)
 *   - The GIL makes the check-then-reuse atomic; see the file comment. */
static PyObject *plim_stop_cache = NULL;

static int plim_stop_reusable(PyObject *exc)
{
    PyBaseExceptionObject *e = (PyBaseExceptionObject *)exc;
    return Py_REFCNT(exc) == 1 && e->traceback == NULL && e->context == NULL &&
           e->cause == NULL && e->notes == NULL && e->dict == NULL;
}

static void plim_raise_stop(PyObject *value)
{
    PyObject *exc = plim_stop_cache;
    if (exc == NULL || !plim_stop_reusable(exc)) {
        /* No args: a value in args would be kept for ever. */
        exc = PyObject_CallNoArgs(PyExc_StopIteration);
        if (exc == NULL)
            return;
        Py_XSETREF(plim_stop_cache, exc);
    }
    PyObject *old = ((PyStopIterationObject *)exc)->value;
    ((PyStopIterationObject *)exc)->value = Py_NewRef(value);
    PyErr_SetRaisedException(Py_NewRef(exc));
    /* Dropped last: if that runs code (a leaked permit's warning), the
     * cached exception is already raised, so held twice, and is not reused
     * underneath us. */
    Py_XDECREF(old);
}
#endif

/* plim_stop_take: `value` (a permit) is no longer any request's result;
 * if the idle cached StopIteration still carries it, detach it and return
 * that reference for the caller to drop (when dropping it is safe); else
 * NULL.  Runs no Python code. */
static PyObject *plim_stop_take(PyObject *value)
{
#ifdef PLIM_STOP_CACHE
    PyObject *exc = plim_stop_cache;
    if (exc != NULL && Py_REFCNT(exc) == 1 &&
        ((PyStopIterationObject *)exc)->value == value) {
        ((PyStopIterationObject *)exc)->value = Py_NewRef(Py_None);
        return value;
    }
#else
    (void)value;
#endif
    return NULL;
}

/* plim_return_stop finishes a next() of the request with `value`. */
static void plim_return_stop(PyObject *value)
{
#ifdef PLIM_STOP_CACHE
    plim_raise_stop(value);
#else
    /* An argument that is a tuple or an exception would be taken apart by
     * PyErr_SetObject; a permit or None never is. */
    PyErr_SetObject(PyExc_StopIteration, value);
#endif
}

/* tp_iternext: SEND's way in from 3.12 on, and next() everywhere. */
static PyObject *plim_iternext(PyObject *self)
{
    int status = PLIM_STEP_YIELD;
    PyObject *v = plim_advance_impl(self, &status);
    if (v == NULL || status == PLIM_STEP_YIELD)
        return v;
    if (status == PLIM_STEP_RAISE)
        plim_raise(v);
    else
        plim_return_stop(v);
    Py_DECREF(v);
    return NULL;
}

/* am_send: SEND (3.10, 3.11) and PyIter_Send (asyncio.Task driving the
 * request as a coroutine, every version) get the result without any
 * exception. */
static PySendResult plim_am_send(PyObject *self, PyObject *arg, PyObject **presult)
{
    int status = PLIM_STEP_YIELD;
    (void)arg; /* asyncio only ever sends None into an awaitable it waits on */
    PyObject *v = plim_advance_impl(self, &status);
    if (v == NULL) {
        *presult = NULL;
        return PYGEN_ERROR;
    }
    if (status == PLIM_STEP_RAISE) {
        plim_raise(v);
        Py_DECREF(v);
        *presult = NULL;
        return PYGEN_ERROR;
    }
    *presult = v;
    return status == PLIM_STEP_RETURN ? PYGEN_RETURN : PYGEN_NEXT;
}

/* The completed awaitable: exhausted at once, result None, no exception. */
static PyObject *plim_done_iternext(PyObject *self)
{
    (void)self;
    return NULL;
}

static PySendResult plim_done_am_send(PyObject *self, PyObject *arg, PyObject **presult)
{
    (void)self;
    (void)arg;
    *presult = Py_NewRef(Py_None);
    return PYGEN_RETURN;
}

/* ---- deallocation hooks ----------------------------------------------------
 * Installed over Cython's tp_dealloc of the permit and the request, so that
 * the common case adds a test or two and no call: a Cython __dealloc__ would
 * save and restore the error indicator and call out on every deallocation.
 *
 * The rule for both (issue 18): no Python code runs while the dying object
 * is still known to the cyclic GC.  A collection started by that code would
 * find it tracked with refcount 0, deallocate it a second time and put it on
 * Cython's freelist twice (the next two allocations then share one object).
 * So each hook takes what its Python code needs out of the object first,
 * lets Cython's deallocator untrack and free it, and only then runs that
 * code, on references of its own. */

static destructor plim_permit_base_dealloc = NULL;
static Py_ssize_t plim_permit_count_offset = 0;  /* int64_t permits held */
static Py_ssize_t plim_permit_sem_offset = 0;    /* PyObject *semaphore */
/* Cython: emits the ResourceWarning; gets the semaphore and the count, never
 * the permit itself (which no longer exists when it runs). */
static int (*plim_permit_leaked)(PyObject *sem, int64_t n) = NULL;  /* -1: raised */

/* ---- permits: allocated here, GC-tracked only when they may close a cycle
 * A permit refers to its semaphore and, during a queued update, to that
 * request; nothing else.  A semaphore of the exact AsyncSemaphore type has
 * no __dict__: what it refers to is numbers and its per-loop states, which
 * exist only while the loop has queued waiters (held by the queue's own
 * references, so never collectable anyway) or a wake batch pending.  So a
 * permit of such a semaphore closes no cycle the collector could free, and
 * is left untracked: a GC track and untrack less per permit (5-9% of an
 * uncontended await on 3.14).  A subclass's semaphore may keep its permits
 * in its __dict__: those permits are tracked.  The freelist is ours, so
 * that the allocation (plim_permit_new) and the deallocation
 * (plim_permit_dealloc) agree on it; Cython's tp_new and tp_dealloc are used
 * only for the import-time probe and by plim_leak_check(off). */
#define PLIM_PERMIT_FREELIST 256
static PyObject *plim_permit_free[PLIM_PERMIT_FREELIST];
static int plim_permit_nfree = 0;
static PyTypeObject *plim_permit_type = NULL;
static PyTypeObject *plim_plain_sem_type = NULL;   /* AsyncSemaphore, exactly */
static Py_ssize_t plim_permit_pending_offset = 0;  /* PyObject *_pending */
static Py_ssize_t plim_permit_weak_offset = 0;     /* __weakref__ */

static void plim_permit_release_memory(PyObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject **sem = (PyObject **)((char *)o + plim_permit_sem_offset);
    PyObject **pending = (PyObject **)((char *)o + plim_permit_pending_offset);
    /* Out of the GC first: what follows may run Python code.  Tracked
     * exactly when its semaphore is not a plain AsyncSemaphore (and when
     * the collector's tp_clear replaced the semaphore by None). */
    if (*sem == NULL || Py_TYPE(*sem) != plim_plain_sem_type)
        PyObject_GC_UnTrack(o);
    if (*(PyObject **)((char *)o + plim_permit_weak_offset) != NULL)
        PyObject_ClearWeakRefs(o);
    Py_CLEAR(*sem);
    Py_CLEAR(*pending);
    if (tp == plim_permit_type && plim_permit_nfree < PLIM_PERMIT_FREELIST) {
        plim_permit_free[plim_permit_nfree++] = o;
        if (tp->tp_flags & Py_TPFLAGS_HEAPTYPE)
            Py_DECREF(tp);
        return;
    }
    tp->tp_free(o);
    if (tp->tp_flags & Py_TPFLAGS_HEAPTYPE)
        Py_DECREF(tp);
}

/* plim_permit_new: a new permit of `sem` holding n (a new reference). */
Py_LOCAL_INLINE(PyObject *) plim_permit_new(PyObject *sem, int64_t n)
{
    PyTypeObject *tp = plim_permit_type;
    PyObject *o;
    if (plim_permit_nfree > 0) {
        o = plim_permit_free[--plim_permit_nfree];
        /* Every field is set below (plim_install_permit_alloc checked
         * that there are no others). */
        *(PyObject **)((char *)o + plim_permit_weak_offset) = NULL;
        PyObject_Init(o, tp);
    } else {
        o = tp->tp_alloc(tp, 0);   /* zeroed and tracked */
        if (o == NULL)
            return NULL;
        PyObject_GC_UnTrack(o);
    }
    *(PyObject **)((char *)o + plim_permit_sem_offset) = Py_NewRef(sem);
    *(PyObject **)((char *)o + plim_permit_pending_offset) = Py_NewRef(Py_None);
    *(int64_t *)((char *)o + plim_permit_count_offset) = n;
    if (Py_TYPE(sem) != plim_plain_sem_type)
        PyObject_GC_Track(o);
    return o;
}

/* The error indicator around a hook's warning: a deallocation may run while
 * an exception is propagating, which the warning must neither see nor lose;
 * an error the warning raises (-W error) is reported as unraisable, with it
 * still set, as PyErr_WriteUnraisable requires. */
typedef struct {
    PyObject *type, *value, *tb;   /* 3.12+: the exception in `type` alone */
} plim_saved_error;

static inline void plim_save_error(plim_saved_error *s)
{
#if PY_VERSION_HEX >= 0x030C0000
    s->type = PyErr_GetRaisedException();
    s->value = s->tb = NULL;
#else
    PyErr_Fetch(&s->type, &s->value, &s->tb);
#endif
}

static inline void plim_restore_error(plim_saved_error *s)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(s->type);
#else
    PyErr_Restore(s->type, s->value, s->tb);
#endif
}

static void plim_permit_dealloc(PyObject *o)
{
    int64_t *count = (int64_t *)((char *)o + plim_permit_count_offset);
    int64_t n = *count;
    if (n == 0) {
        plim_permit_release_memory(o);
        return;
    }
    /* A leaked permit: warn once, after it is gone.  The count is cleared
     * so that nothing can see (or warn for) these permits again. */
    PyObject *sem = *(PyObject **)((char *)o + plim_permit_sem_offset);
    Py_XINCREF(sem);
    *count = 0;
    plim_permit_release_memory(o);
    if (sem == NULL)
        return;
    plim_saved_error saved;
    plim_save_error(&saved);
    if (plim_permit_leaked(sem, n) < 0)
        PyErr_WriteUnraisable(sem);
    plim_restore_error(&saved);
    Py_DECREF(sem);
}

static destructor plim_request_base_dealloc = NULL;
static Py_ssize_t plim_request_result_offset = 0; /* its permit: the result, once granted */
static Py_ssize_t plim_request_lock_offset = 0;   /* a blocking wait's lock */
static void (*plim_give_lock)(void *lock) = NULL; /* back to the binding's pool */

/* A request collected before anyone awaited, started or closed it (a
 * forgotten `await`): the RuntimeWarning a never-awaited coroutine gets.
 * What the warning needs is read out of the request before it is freed and
 * the warning raised after, as for a leaked permit.  Blocking waits make
 * requests that are never awaited by design: they are marked `blocking`. */
static Py_ssize_t plim_request_stage_offset = 0;    /* int; 0 is STAGE_CREATED */
static Py_ssize_t plim_request_blocking_offset = 0; /* int (bint) */
static Py_ssize_t plim_request_update_offset = 0;   /* int (bint) */
static Py_ssize_t plim_request_n_offset = 0;        /* int64_t */
static Py_ssize_t plim_request_sem_offset = 0;      /* PyObject *semaphore */
/* Cython: emits the warning (-1: raised, e.g. under -W error). */
static int (*plim_request_forgotten)(PyObject *sem, int64_t n, int is_update) = NULL;

static void plim_request_dealloc(PyObject *o)
{
    PyObject *result = *(PyObject **)((char *)o + plim_request_result_offset);
    void **lock = (void **)((char *)o + plim_request_lock_offset);
    PyObject *forgotten = NULL;   /* the semaphore of a never-awaited request */
    int64_t n = 0;
    int is_update = 0;
    if (plim_request_forgotten != NULL
        && *(int *)((char *)o + plim_request_stage_offset) == 0
        && !*(int *)((char *)o + plim_request_blocking_offset)) {
        forgotten = *(PyObject **)((char *)o + plim_request_sem_offset);
        Py_XINCREF(forgotten);
        n = *(int64_t *)((char *)o + plim_request_n_offset);
        is_update = *(int *)((char *)o + plim_request_update_offset);
    }
    /* The cached StopIteration's reference to our permit, if it still has
     * one: taken now, dropped once the request is gone (dropping it may
     * free the permit, and a leaked permit's warning runs Python code). */
    PyObject *drop = NULL;
    if (result != NULL && result != Py_None)
        drop = plim_stop_take(result);  /* runs no Python code */
    if (*lock != NULL) {
        plim_give_lock(*lock);      /* neither */
        *lock = NULL;
    }
    plim_request_base_dealloc(o);
    Py_XDECREF(drop);
    if (forgotten == NULL)
        return;
    plim_saved_error saved;
    plim_save_error(&saved);
    if (plim_request_forgotten(forgotten, n, is_update) < 0)
        PyErr_WriteUnraisable(forgotten);
    plim_restore_error(&saved);
    Py_DECREF(forgotten);
}

static void plim_install_forgotten(Py_ssize_t stage_offset, Py_ssize_t blocking_offset,
                                   Py_ssize_t update_offset, Py_ssize_t n_offset,
                                   Py_ssize_t sem_offset,
                                   int (*forgotten)(PyObject *, int64_t, int))
{
    plim_request_stage_offset = stage_offset;
    plim_request_blocking_offset = blocking_offset;
    plim_request_update_offset = update_offset;
    plim_request_n_offset = n_offset;
    plim_request_sem_offset = sem_offset;
    plim_request_forgotten = forgotten;
}

static int plim_install_deallocs(PyObject *permit_type, Py_ssize_t count_offset,
                                 Py_ssize_t sem_offset,
                                 int (*leaked)(PyObject *, int64_t),
                                 PyObject *request_type, Py_ssize_t result_offset,
                                 Py_ssize_t lock_offset, void (*give_lock)(void *))
{
    PyTypeObject *pt = (PyTypeObject *)permit_type, *rt = (PyTypeObject *)request_type;
    plim_permit_base_dealloc = pt->tp_dealloc;
    plim_permit_count_offset = count_offset;
    plim_permit_sem_offset = sem_offset;
    plim_permit_leaked = leaked;
    pt->tp_dealloc = plim_permit_dealloc;
    PyType_Modified(pt);
    plim_request_base_dealloc = rt->tp_dealloc;
    plim_request_result_offset = result_offset;
    plim_request_lock_offset = lock_offset;
    plim_give_lock = give_lock;
    rt->tp_dealloc = plim_request_dealloc;
    PyType_Modified(rt);
    return 0;
}

static int plim_install_permit_alloc(PyObject *permit_type, PyObject *plain_sem_type,
                                     Py_ssize_t pending_offset)
{
    PyTypeObject *tp = (PyTypeObject *)permit_type;
    /* plim_permit_new sets each field: the header, _sem, _permits,
     * _pending and __weakref__, and nothing else may exist. */
    if (tp->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) + 4 * sizeof(void *)) ||
        tp->tp_weaklistoffset <= 0 || tp->tp_itemsize != 0) {
        PyErr_SetString(PyExc_RuntimeError, "pylimiter: unexpected SemaphorePermit layout");
        return -1;
    }
    plim_permit_type = tp;
    plim_plain_sem_type = (PyTypeObject *)plain_sem_type;
    plim_permit_pending_offset = pending_offset;
    plim_permit_weak_offset = tp->tp_weaklistoffset;
    return 0;
}

/* plim_leak_check switches the permit's hook on or off (the hook's cost is
 * measured against its absence in one process: benchmarks only). */
static void plim_leak_check(PyObject *permit_type, int on)
{
    PyTypeObject *pt = (PyTypeObject *)permit_type;
    pt->tp_dealloc = on ? plim_permit_dealloc : plim_permit_base_dealloc;
    PyType_Modified(pt);
}

/* ---- types Python may not instantiate --------------------------------------
 * The permit, the request and the loop state are made by the binding only,
 * which calls Cython's tp_new functions directly.  Their type's tp_new slot
 * (what Cls(), Cls.__new__(Cls), copy and pickle reach) refuses with a
 * TypeError, so no half-made object with None where a C struct is expected
 * can ever exist. */
#define PLIM_NO_NEW_MAX 4
static PyTypeObject *plim_no_new_type[PLIM_NO_NEW_MAX];
static PyObject *plim_no_new_msg[PLIM_NO_NEW_MAX];
static int plim_no_new_count = 0;

static PyObject *plim_refuse_new(PyTypeObject *t, PyObject *args, PyObject *kwds)
{
    (void)args;
    (void)kwds;
    for (int i = 0; i < plim_no_new_count; i++) {
        if (t == plim_no_new_type[i]) {
            PyErr_SetObject(PyExc_TypeError, plim_no_new_msg[i]);
            return NULL;
        }
    }
    PyErr_Format(PyExc_TypeError, "cannot create '%s' instances", t->tp_name);
    return NULL;
}

static int plim_forbid_new(PyObject *type, PyObject *msg)
{
    if (plim_no_new_count == PLIM_NO_NEW_MAX) {
        PyErr_SetString(PyExc_RuntimeError, "pylimiter: too many types for plim_forbid_new");
        return -1;
    }
    plim_no_new_type[plim_no_new_count] = (PyTypeObject *)type;
    Py_INCREF(msg);
    plim_no_new_msg[plim_no_new_count++] = msg;
    ((PyTypeObject *)type)->tp_new = plim_refuse_new;
    /* Cython also gives the type a vectorcall that makes an instance
     * without looking at tp_new: calls must go through type_call. */
    ((PyTypeObject *)type)->tp_vectorcall = NULL;
    PyType_Modified((PyTypeObject *)type);
    return 0;
}

static int plim_set_slots(PyObject *type, iternextfunc next, sendfunc send)
{
    PyTypeObject *tp = (PyTypeObject *)type;
    if (tp->tp_as_async == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pylimiter: awaitable type has no tp_as_async");
        return -1;
    }
    tp->tp_iternext = next;
    tp->tp_as_async->am_send = send;
#ifdef Py_TPFLAGS_HAVE_AM_SEND
    tp->tp_flags |= Py_TPFLAGS_HAVE_AM_SEND;
#endif
    PyType_Modified(tp);
    return 0;
}

/* plim_install_request gives the request type its step function. */
static int plim_install_request(PyObject *type, plim_advance_fn fn)
{
    plim_advance_impl = fn;
    return plim_set_slots(type, plim_iternext, plim_am_send);
}

/* plim_install_done makes a type the completed awaitable. */
static int plim_install_done(PyObject *type)
{
    return plim_set_slots(type, plim_done_iternext, plim_done_am_send);
}

/* ---- `async with` / `with` without a bound method per call (3.10-3.13) -----
 * Before 3.14, BEFORE_ASYNC_WITH and BEFORE_WITH look __aenter__/__aexit__
 * (__enter__/__exit__) up with _PyObject_LookupSpecial, which binds a
 * method descriptor: two builtin-method objects malloc'ed and freed per
 * `async with sem.acquire(n)`, a fifth of its time on 3.12.  The binding
 * replaces those four methods in the type's dict by a plim_special_t
 * wrapping Cython's own descriptor, whose binding is a plim_bound_t from a
 * freelist and whose call goes straight to the C function.  3.14's
 * LOAD_SPECIAL binds nothing (it pushes the descriptor and self), so there
 * the types keep Cython's descriptors and none of this is compiled.
 *
 * Both objects are ordinary to Python: the descriptor is callable unbound
 * (through the wrapped descriptor, with its self check), __get__ checks the
 * instance's type as method descriptors do, both answer __name__,
 * __qualname__, __doc__, __text_signature__ and __objclass__ from the
 * wrapped one, and the bound object is GC-tracked (its self may be on a
 * cycle) and untracked by its deallocator before anything is dropped. */
#if PY_VERSION_HEX < 0x030E0000
#  define PLIM_SPECIALS 1

typedef struct {
    PyObject_HEAD
    PyMethodDescrObject *method;   /* the type's own (Cython's) descriptor */
    vectorcallfunc vectorcall;     /* unbound calls: forwarded to `method` */
} plim_special_t;

typedef struct {
    PyObject_HEAD
    plim_special_t *descr;
    PyObject *self;
    vectorcallfunc vectorcall;
} plim_bound_t;

static PyTypeObject plim_special_type;
static PyTypeObject plim_bound_type;
static PyObject *plim_bound_vectorcall(PyObject *o, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames);
/* METH_FASTCALL | METH_KEYWORDS (public as PyCFunctionFastWithKeywords
 * from 3.13 only). */
typedef PyObject *(*plim_fastkw_fn)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);

#define PLIM_BOUND_FREELIST 64
static plim_bound_t *plim_bound_free[PLIM_BOUND_FREELIST];
static int plim_bound_nfree = 0;

/* Forwards to the wrapped descriptor whatever the wrapper does not have. */
static PyObject *plim_special_getattro(PyObject *o, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr(o, name);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        r = PyObject_GetAttr((PyObject *)((plim_special_t *)o)->method, name);
    }
    return r;
}

static PyObject *plim_special_vectorcall(PyObject *o, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames)
{
    return PyObject_Vectorcall((PyObject *)((plim_special_t *)o)->method, args, nargsf, kwnames);
}

static PyObject *plim_special_get(PyObject *o, PyObject *obj, PyObject *type)
{
    plim_special_t *d = (plim_special_t *)o;
    (void)type;
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(o);
    if (!PyObject_TypeCheck(obj, PyDescr_TYPE(d->method))) {
        PyErr_Format(PyExc_TypeError,
                     "descriptor '%U' for '%.100s' objects doesn't apply to a '%.100s' object",
                     PyDescr_NAME(d->method), PyDescr_TYPE(d->method)->tp_name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    plim_bound_t *b;
    if (plim_bound_nfree > 0) {
        b = plim_bound_free[--plim_bound_nfree];
        PyObject_Init((PyObject *)b, &plim_bound_type);
    } else {
        b = PyObject_GC_New(plim_bound_t, &plim_bound_type);
        if (b == NULL)
            return NULL;
    }
    b->descr = (plim_special_t *)Py_NewRef(o);
    b->self = Py_NewRef(obj);
    b->vectorcall = plim_bound_vectorcall;
    PyObject_GC_Track(b);
    return (PyObject *)b;
}

static PyObject *plim_special_repr(PyObject *o)
{
    PyMethodDescrObject *m = ((plim_special_t *)o)->method;
    return PyUnicode_FromFormat("<method '%U' of '%s' objects>", PyDescr_NAME(m),
                                PyDescr_TYPE(m)->tp_name);
}

static int plim_special_traverse(PyObject *o, visitproc visit, void *arg)
{
    Py_VISIT(((plim_special_t *)o)->method);
    return 0;
}

static void plim_special_dealloc(PyObject *o)
{
    PyObject_GC_UnTrack(o);
    Py_CLEAR(((plim_special_t *)o)->method);
    PyObject_GC_Del(o);
}

/* The bound call: the C function itself, self first, as the wrapped
 * descriptor would call it (its self check is done: __get__ did it). */
static PyObject *plim_bound_vectorcall(PyObject *o, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    plim_bound_t *b = (plim_bound_t *)o;
    PyMethodDef *ml = b->descr->method->d_method;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int flags = ml->ml_flags & ~(METH_CLASS | METH_STATIC | METH_COEXIST);
    if (flags == METH_NOARGS && nargs == 0 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0))
        return ml->ml_meth(b->self, NULL);
    if (flags == (METH_FASTCALL | METH_KEYWORDS))
        return ((plim_fastkw_fn)(void (*)(void))ml->ml_meth)(b->self, args, nargs,
                                                                          kwnames);
    /* Anything else (and argument errors): the wrapped descriptor, self
     * prepended, which raises what a method would. */
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *small[8];
    PyObject **all = small;
    if (nargs + nkw + 1 > 8) {
        all = PyMem_Malloc((size_t)(nargs + nkw + 1) * sizeof(PyObject *));
        if (all == NULL)
            return PyErr_NoMemory();
    }
    all[0] = b->self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        all[i + 1] = args[i];
    PyObject *r = PyObject_Vectorcall((PyObject *)b->descr->method, all, (size_t)(nargs + 1),
                                      kwnames);
    if (all != small)
        PyMem_Free(all);
    return r;
}

static PyObject *plim_bound_getattro(PyObject *o, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr(o, name);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        r = PyObject_GetAttr((PyObject *)((plim_bound_t *)o)->descr->method, name);
    }
    return r;
}

static PyObject *plim_bound_repr(PyObject *o)
{
    plim_bound_t *b = (plim_bound_t *)o;
    PyMethodDescrObject *m = b->descr->method;
    return PyUnicode_FromFormat("<built-in method %U of %s object at %p>", PyDescr_NAME(m),
                                Py_TYPE(b->self)->tp_name, (void *)b->self);
}

static int plim_bound_traverse(PyObject *o, visitproc visit, void *arg)
{
    plim_bound_t *b = (plim_bound_t *)o;
    Py_VISIT(b->descr);
    Py_VISIT(b->self);
    return 0;
}

static void plim_bound_dealloc(PyObject *o)
{
    plim_bound_t *b = (plim_bound_t *)o;
    /* Out of the GC first: dropping self may run Python code (a request's
     * permit warning), and a collection then must not meet this object. */
    PyObject_GC_UnTrack(o);
    PyObject *self = b->self, *descr = (PyObject *)b->descr;
    b->self = NULL;
    b->descr = NULL;
    if (plim_bound_nfree < PLIM_BOUND_FREELIST)
        plim_bound_free[plim_bound_nfree++] = b;
    else
        PyObject_GC_Del(o);
    Py_XDECREF(self);
    Py_XDECREF(descr);
}

/* Equal when bound to the same object by the same descriptor, as builtin
 * methods are (remove_done_callback(req.__aexit__) finds it again). */
static PyObject *plim_bound_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || !Py_IS_TYPE(b, &plim_bound_type))
        Py_RETURN_NOTIMPLEMENTED;
    plim_bound_t *x = (plim_bound_t *)a, *y = (plim_bound_t *)b;
    int eq = x->descr == y->descr && x->self == y->self;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static Py_hash_t plim_bound_hash(PyObject *o)
{
    plim_bound_t *b = (plim_bound_t *)o;
    Py_hash_t h = (Py_hash_t)(((uintptr_t)b->self >> 4) ^ (((uintptr_t)b->descr >> 4) * 1000003u));
    return h == -1 ? -2 : h;
}

static PyObject *plim_bound_get_self(PyObject *o, void *c)
{
    (void)c;
    PyObject *self = ((plim_bound_t *)o)->self;
    return Py_NewRef(self != NULL ? self : Py_None);
}

static PyObject *plim_special_get_doc(PyObject *o, void *c)
{
    (void)c;
    return PyObject_GetAttrString((PyObject *)((plim_special_t *)o)->method, "__doc__");
}

static PyObject *plim_bound_get_doc(PyObject *o, void *c)
{
    (void)c;
    return PyObject_GetAttrString((PyObject *)((plim_bound_t *)o)->descr->method, "__doc__");
}

static PyGetSetDef plim_special_getset[] = {
    {"__doc__", plim_special_get_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PyGetSetDef plim_bound_getset[] = {
    {"__self__", plim_bound_get_self, NULL, NULL, NULL},
    {"__doc__", plim_bound_get_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PyTypeObject plim_special_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pylimiter._limiter_c.special_method",
    .tp_basicsize = sizeof(plim_special_t),
    .tp_dealloc = plim_special_dealloc,
    .tp_vectorcall_offset = offsetof(plim_special_t, vectorcall),
    .tp_repr = plim_special_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = plim_special_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = plim_special_traverse,
    .tp_descr_get = plim_special_get,
    .tp_getset = plim_special_getset,
};

static PyTypeObject plim_bound_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pylimiter._limiter_c.bound_special_method",
    .tp_basicsize = sizeof(plim_bound_t),
    .tp_dealloc = plim_bound_dealloc,
    .tp_vectorcall_offset = offsetof(plim_bound_t, vectorcall),
    .tp_repr = plim_bound_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = plim_bound_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = plim_bound_traverse,
    .tp_getset = plim_bound_getset,
    .tp_richcompare = plim_bound_richcompare,
    .tp_hash = plim_bound_hash,
};
#endif

/* plim_speed_special replaces the method `name` of `type` by its
 * plim_special_t (a no-op from 3.14 on). */
static int plim_speed_special(PyObject *type, const char *name)
{
#ifdef PLIM_SPECIALS
    PyTypeObject *tp = (PyTypeObject *)type;
    if (!(plim_special_type.tp_flags & Py_TPFLAGS_READY)) {
        if (PyType_Ready(&plim_special_type) < 0 || PyType_Ready(&plim_bound_type) < 0)
            return -1;
    }
    PyObject *m = PyDict_GetItemString(tp->tp_dict, name);   /* borrowed */
    if (m == NULL || !Py_IS_TYPE(m, &PyMethodDescr_Type)) {
        PyErr_Format(PyExc_RuntimeError, "pylimiter: %s.%s is not a method descriptor",
                     tp->tp_name, name);
        return -1;
    }
    plim_special_t *d = PyObject_GC_New(plim_special_t, &plim_special_type);
    if (d == NULL)
        return -1;
    d->method = (PyMethodDescrObject *)Py_NewRef(m);
    d->vectorcall = plim_special_vectorcall;
    PyObject_GC_Track(d);
    int rc = PyDict_SetItemString(tp->tp_dict, name, (PyObject *)d);
    Py_DECREF(d);
    if (rc < 0)
        return -1;
    PyType_Modified(tp);
#else
    (void)type;
    (void)name;
#endif
    return 0;
}

#endif /* PLIM_BINDING_H */
