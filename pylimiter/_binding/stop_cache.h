/* stop_cache.h: how an `await` of a request returns its result through
 * next() -- one StopIteration, reused while nobody else holds it.
 *
 * 3.10 and 3.11 drive awaitables through am_send, which returns the result
 * directly (await.h).  3.12-3.14's SEND calls tp_iternext for
 * non-generators, and a result must travel in a StopIteration: making one
 * per await was a measurable part of an uncontended `await acquire()`.  So
 * one is kept here (PLIM_STOP_CACHE) and refilled.  3.15's SEND calls
 * am_send again: no exception per await, so no cache there (a hand-driven
 * next() gets a fresh StopIteration), nor on a free-threaded build, where
 * it would need one per thread.
 *
 * Rules
 * -----
 * - The GIL is held throughout, and makes the check-then-reuse atomic: the
 *   module is not declared free-threading compatible (a free-threaded
 *   interpreter enables the GIL when it imports it), and the cache is
 *   compiled out where Py_GIL_DISABLED is defined.
 * - Reused only when ours is the only reference and it carries no
 *   traceback, context, cause, notes or dict: whoever else saw it (a
 *   sys.monitoring RAISE callback, a debugger, an `except StopIteration`
 *   around a hand-driven next()) keeps an untouched object, and we start a
 *   fresh one.  SEND fetches the raised exception, reads its value and
 *   drops it at once, so in the common case the refcount is back to 1
 *   (ours) before the next await finishes.
 * - `value` is an owned reference, never a borrowed one, so no holder can
 *   meet a dangling pointer.
 * - It does not keep the last permit alive past its request: a request's
 *   deallocator (dealloc.h) calls plim_stop_take, which detaches the value
 *   if it is still its result.  (The request itself holds the same permit
 *   until then, for `async with`.)
 */
#ifndef PLIM_BINDING_STOP_CACHE_H
#define PLIM_BINDING_STOP_CACHE_H

#include <Python.h>

#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030F0000 && !defined(Py_GIL_DISABLED)
#  define PLIM_STOP_CACHE 1

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

#endif /* PLIM_BINDING_STOP_CACHE_H */
