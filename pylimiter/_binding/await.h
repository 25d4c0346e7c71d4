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
 * Rules: the GIL is held; the slots and methods are written once, at
 * import (plim_install_request, plim_install_done, plim_install_outcomes),
 * before any instance of the type is awaited; the step function returns a
 * new reference and sets its status, or NULL with an exception set (an
 * unexpected error, such as MemoryError).  Past the step function, the
 * only error these slots can add is a MemoryError making the
 * StopIteration (tp_iternext).
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

/* The request's result() and throw(), in C for the same reason as the
 * slots above: a cancelled task calls the one and throws into the other,
 * and a Cython `raise` would add a frame object and a traceback object
 * (both tracked by the collector) to each CancelledError on the way.  The
 * Cython function decides and returns what to raise (PLIM_STEP_RAISE) or
 * the result (PLIM_STEP_RETURN); these raise it with no entry of ours.
 * throw's arguments are positional, as a coroutine's are. */
typedef PyObject *(*plim_outcome_fn)(PyObject *self, PyObject **args, Py_ssize_t nargs,
                                     int *status);
static plim_outcome_fn plim_result_impl = NULL;
static plim_outcome_fn plim_throw_impl = NULL;

static PyObject *plim_outcome(PyObject *v, int status)
{
    if (v == NULL || status != PLIM_STEP_RAISE)
        return v;
    plim_raise(v);
    Py_DECREF(v);
    return NULL;
}

static PyObject *plim_request_result(PyObject *self, PyObject *unused)
{
    int status = PLIM_STEP_RETURN;
    (void)unused;
    PyObject *v = plim_result_impl(self, NULL, 0, &status);   /* sets status */
    return plim_outcome(v, status);
}

static PyObject *plim_request_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int status = PLIM_STEP_RETURN;
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "throw expected %s, got %zd",
                     nargs < 1 ? "at least 1 argument" : "at most 3 arguments", nargs);
        return NULL;
    }
    PyObject *v = plim_throw_impl(self, (PyObject **)args, nargs, &status);   /* sets status */
    return plim_outcome(v, status);
}

static PyMethodDef plim_request_result_def = {
    "result", plim_request_result, METH_NOARGS,
    "result($self, /)\n--\n\n"
    "None once done (the request itself reads the outcome); raises\n"
    "CancelledError if the task cancelled it."};
static PyMethodDef plim_request_throw_def = {
    "throw", (PyCFunction)(void (*)(void))plim_request_throw, METH_FASTCALL,
    "throw($self, typ, val=None, tb=None, /)\n--\n\n"
    "Coroutine protocol: the awaiting task is cancelled or interrupted.\n"
    "A queued request leaves the queue; a grant that raced with it goes\n"
    "back; the exception propagates."};

static int plim_put_method(PyTypeObject *tp, PyMethodDef *def)
{
    PyObject *d = PyDescr_NewMethod(tp, def);
    if (d == NULL)
        return -1;
    int rc = PyDict_SetItemString(tp->tp_dict, def->ml_name, d);
    Py_DECREF(d);
    return rc;
}

/* plim_install_outcomes puts the two methods in the request type's dict,
 * in place of Cython's. */
static int plim_install_outcomes(PyObject *type, plim_outcome_fn result, plim_outcome_fn thrw)
{
    PyTypeObject *tp = (PyTypeObject *)type;
    plim_result_impl = result;
    plim_throw_impl = thrw;
    if (plim_put_method(tp, &plim_request_result_def) < 0 ||
        plim_put_method(tp, &plim_request_throw_def) < 0)
        return -1;
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
