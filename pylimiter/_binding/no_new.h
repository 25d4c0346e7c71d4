/* no_new.h: types Python may not instantiate.
 *
 * The permit, the request and the loop state are made by the binding only,
 * which calls Cython's tp_new functions directly.  Their type's tp_new slot
 * (what Cls(), Cls.__new__(Cls), copy and pickle reach) refuses with a
 * TypeError, so no half-made object with None where a C struct is expected
 * can ever exist.
 *
 * Rules: plim_forbid_new runs at import, last, once every object the
 * module needs to make there is made (after it, only the binding's direct
 * calls of Cython's tp_new make instances); at most PLIM_NO_NEW_MAX types;
 * the messages are held for the life of the process.  The GIL is held.
 */
#ifndef PLIM_BINDING_NO_NEW_H
#define PLIM_BINDING_NO_NEW_H

#include <Python.h>

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

#endif /* PLIM_BINDING_NO_NEW_H */
