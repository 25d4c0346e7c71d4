/* _plim_binding.h: the few things the Cython binding needs below Cython's reach.
 * Binding code (it includes Python.h); the core in csrc/ never does. */
#ifndef PLIM_BINDING_H
#define PLIM_BINDING_H

#include <Python.h>
#include <stdint.h>
#ifdef _WIN32
#  include <windows.h>
#else
#  include <time.h>
#endif

/* plim_monotonic_ns: a monotonic clock for wait-time statistics.  Called on
 * slow paths only (enqueue, grant of a queued waiter). */
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

/* The request object's step function, defined in Cython: returns a new
 * reference (the result when *done is set, else a future to yield), or NULL
 * with an exception set. */
typedef PyObject *(*plim_advance_fn)(PyObject *self, int *done);
static plim_advance_fn plim_advance_impl = NULL;

#if PY_VERSION_HEX >= 0x030A0000
/* am_send lets `await request` finish without raising StopIteration: the
 * interpreter's SEND (3.10, 3.11) calls it through PyIter_Send and gets the
 * result directly.  From 3.12 on SEND calls tp_iternext for non-generators,
 * so this slot is unused there and __next__ does the work. */
static PySendResult plim_am_send(PyObject *self, PyObject *arg, PyObject **presult)
{
    int done = 0;
    (void)arg; /* asyncio only ever sends None into an awaitable it waits on */
    PyObject *v = plim_advance_impl(self, &done);
    if (v == NULL) {
        *presult = NULL;
        return PYGEN_ERROR;
    }
    *presult = v;
    return done ? PYGEN_RETURN : PYGEN_NEXT;
}
#endif

/* tp_iternext, used by SEND from 3.12 on (and by next()).  A raise of
 * StopIteration from Cython code would also record a traceback entry on every
 * finished await; setting it here costs only the exception object. */
static PyObject *plim_iternext(PyObject *self)
{
    int done = 0;
    PyObject *v = plim_advance_impl(self, &done);
    if (v == NULL || !done)
        return v;
    PyObject *exc = PyObject_CallOneArg(PyExc_StopIteration, v);
    Py_DECREF(v);
    if (exc == NULL)
        return NULL;
    PyErr_SetObject(PyExc_StopIteration, exc);
    Py_DECREF(exc);
    return NULL;
}

static int plim_install_am_send(PyObject *type, plim_advance_fn fn)
{
    PyTypeObject *tp = (PyTypeObject *)type;
    plim_advance_impl = fn;
    tp->tp_iternext = plim_iternext;
#if PY_VERSION_HEX >= 0x030A0000
    if (tp->tp_as_async == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pylimiter: awaitable type has no tp_as_async");
        return -1;
    }
    tp->tp_as_async->am_send = plim_am_send;
#  ifdef Py_TPFLAGS_HAVE_AM_SEND
    tp->tp_flags |= Py_TPFLAGS_HAVE_AM_SEND;
#  endif
    PyType_Modified(tp);
#else
    PyType_Modified(tp);
#endif
    return 0;
}

#endif /* PLIM_BINDING_H */
