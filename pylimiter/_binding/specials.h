/* specials.h: `async with` / `with` without a bound method object per call
 * (3.10-3.13).
 *
 * Before 3.14, BEFORE_ASYNC_WITH and BEFORE_WITH look __aenter__/__aexit__
 * (__enter__/__exit__) up with _PyObject_LookupSpecial, which binds a
 * method descriptor: two builtin-method objects malloc'ed and freed per
 * `async with sem.acquire(n)`, a fifth of its time on 3.12.  The binding
 * replaces those methods in the type's dict by a plim_special_t wrapping
 * Cython's own descriptor, whose binding is a plim_bound_t from a freelist
 * and whose call goes straight to the C function.  3.14's LOAD_SPECIAL
 * binds nothing (it pushes the descriptor and self), so there the types
 * keep Cython's descriptors and none of this is compiled
 * (plim_speed_special is a no-op).
 *
 * Rules
 * -----
 * - Both objects are ordinary to Python: the descriptor is callable unbound
 *   (through the wrapped descriptor, with its self check), __get__ checks
 *   the instance's type as method descriptors do, both answer __name__,
 *   __qualname__, __doc__, __text_signature__ and __objclass__ from the
 *   wrapped one, and bound ones compare and hash as builtin methods do.
 * - The bound object is GC-tracked (its self may be on a cycle) and
 *   untracked by its deallocator before anything is dropped: dropping self
 *   may run Python code (a request's permit warning), and a collection then
 *   must not meet it (the rule of dealloc.h).
 * - The GIL is held (the freelist is a plain array).  plim_speed_special
 *   runs at import, on the binding's own types, before any instance is
 *   used in a `with`.
 */
#ifndef PLIM_BINDING_SPECIALS_H
#define PLIM_BINDING_SPECIALS_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

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

#endif /* PLIM_BINDING_SPECIALS_H */
