/* await.h: the request's await path -- the type slots through which an
 * `await`, an asyncio.Task or a hand-driven next() advances a request, and
 * the completed awaitable that `__aexit__` returns.
 *
 * The request's step function, written in Cython (plim_advance_fn), does
 * the work and says how the await goes on:
 *   PLIM_STEP_YIELD   the value is what the awaiting task parks on;
 *   PLIM_STEP_RETURN  the value is the result of the await;
 *   PLIM_STEP_RAISE   the value is an exception instance: it is raised here,
 *                     once, with no traceback entry of ours on top (the
 *                     binding never raises it through its own frames).
 * am_send serves SEND on 3.10, 3.11 and 3.15+ and PyIter_Send (an
 * asyncio.Task driving the request as a coroutine) everywhere, returning
 * the result directly; tp_iternext serves SEND on 3.12-3.14 and next(), and
 * returns the result in a StopIteration (stop_cache.h).
 *
 * Rules: the GIL is held; the slots are written once, at import
 * (plim_install_request, plim_install_done), before any instance of the
 * type is awaited; the step function returns a new reference and sets its
 * status, or NULL with an exception set (an unexpected error, such as
 * MemoryError).  Past the step function, the only error these slots can
 * add is a MemoryError making the StopIteration (tp_iternext).
 */
#ifndef PLIM_BINDING_AWAIT_H
#define PLIM_BINDING_AWAIT_H

#include <Python.h>

#include "stop_cache.h"

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

#endif /* PLIM_BINDING_AWAIT_H */
