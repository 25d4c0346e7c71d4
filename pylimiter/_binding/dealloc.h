/* dealloc.h: the permit's and the request's deallocation hooks -- the
 * ResourceWarning of a leaked permit, the RuntimeWarning of a forgotten
 * `await`, and the request's cleanup (its lock back to the pool, its
 * result out of the StopIteration cache).
 *
 * Installed over Cython's tp_dealloc of the permit and the request, so that
 * the common case adds a test or two and no call: a Cython __dealloc__ would
 * save and restore the error indicator and call out on every deallocation.
 *
 * Rules
 * -----
 * - No Python code runs while the dying object is still known to the
 *   cyclic GC (issue 18).  A collection started by that code would find it
 *   tracked with refcount 0, deallocate it a second time and put it on a
 *   freelist twice (the next two allocations then share one object).  So
 *   each hook takes what its Python code needs out of the object first,
 *   lets the deallocator proper (plim_permit_release_memory, permit_alloc.h;
 *   Cython's for the request) untrack and free it, and only then runs that
 *   code, on references of its own.
 * - A warning runs with the error indicator saved and restored around it
 *   (plim_saved_error): a deallocation may happen while an exception is
 *   propagating, which the warning must neither see nor lose; an error the
 *   warning raises (-W error) is reported as unraisable.
 * - The GIL is held.  Installed at import, after plim_install_permit_alloc
 *   (the permit hook reads the layout it recorded); plim_leak_check swaps
 *   the permit hook for Cython's deallocator and back (benchmarks only).
 */
#ifndef PLIM_BINDING_DEALLOC_H
#define PLIM_BINDING_DEALLOC_H

#include <Python.h>
#include <stdint.h>

#include "permit_alloc.h"
#include "stop_cache.h"

/* The error indicator around a hook's warning: an error the warning
 * raises is reported by PyErr_WriteUnraisable, with it still set, as that
 * function requires. */
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

/* ---- the permit ---------------------------------------------------------- */

static destructor plim_permit_base_dealloc = NULL;
/* Cython: emits the ResourceWarning; gets the semaphore and the count, never
 * the permit itself (which no longer exists when it runs). */
static int (*plim_permit_leaked)(PyObject *sem, int64_t n) = NULL;  /* -1: raised */

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

/* ---- the request --------------------------------------------------------- */

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

/* ---- installation -------------------------------------------------------- */

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

static int plim_install_deallocs(PyObject *permit_type, int (*leaked)(PyObject *, int64_t),
                                 PyObject *request_type, Py_ssize_t result_offset,
                                 Py_ssize_t lock_offset, void (*give_lock)(void *))
{
    PyTypeObject *pt = (PyTypeObject *)permit_type, *rt = (PyTypeObject *)request_type;
    if (pt != plim_permit_type) {
        PyErr_SetString(PyExc_RuntimeError,
                        "pylimiter: plim_install_permit_alloc must run first");
        return -1;
    }
    plim_permit_base_dealloc = pt->tp_dealloc;
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

/* plim_leak_check switches the permit's hook on or off (the hook's cost is
 * measured against its absence in one process: benchmarks only). */
static void plim_leak_check(PyObject *permit_type, int on)
{
    PyTypeObject *pt = (PyTypeObject *)permit_type;
    pt->tp_dealloc = on ? plim_permit_dealloc : plim_permit_base_dealloc;
    PyType_Modified(pt);
}

#endif /* PLIM_BINDING_DEALLOC_H */
