/* permit_alloc.h: where permits come from and go back to -- a freelist of
 * the binding's own, and GC tracking only for permits that may close a
 * cycle.
 *
 * A permit refers to its semaphore and, during a queued update, to that
 * request; nothing else.  A semaphore of the exact AsyncSemaphore type has
 * no __dict__: what it refers to is numbers and its per-loop states, which
 * exist only while the loop has queued waiters (held by the queue's own
 * references, so never collectable anyway) or a wake batch pending.  So a
 * permit of such a semaphore closes no cycle the collector could free, and
 * is left untracked: a GC track and untrack less per permit (5-9% of an
 * uncontended await on 3.14).  A subclass's semaphore may keep its permits
 * in its __dict__: those permits are tracked.
 *
 * Rules
 * -----
 * - The GIL is held (the freelist is a plain array).
 * - This header owns the permit's layout: plim_install_permit_alloc is
 *   given the offset of each field, checks that there are no others, and
 *   plim_permit_new sets every one, so a permit from the freelist carries
 *   nothing of its previous life.  It is called at import, before any
 *   permit is made through plim_permit_new and before the deallocation
 *   hooks (dealloc.h), which read the same offsets, are installed.
 * - The freelist is ours, so that the allocation (plim_permit_new) and the
 *   deallocation (plim_permit_release_memory, from the hook) agree on it;
 *   Cython's tp_new and tp_dealloc are used only for the import-time probe
 *   and by plim_leak_check(off).
 * - Tracked exactly when the semaphore is not a plain AsyncSemaphore (or
 *   was replaced by None by the collector's tp_clear): the release
 *   untracks by the same test, before anything it drops may run Python
 *   code.
 */
#ifndef PLIM_BINDING_PERMIT_ALLOC_H
#define PLIM_BINDING_PERMIT_ALLOC_H

#include <Python.h>
#include <stdint.h>

/* The permit's fields, as offsets into the object. */
static Py_ssize_t plim_permit_count_offset = 0;    /* int64_t permits held */
static Py_ssize_t plim_permit_sem_offset = 0;      /* PyObject *semaphore */
static Py_ssize_t plim_permit_pending_offset = 0;  /* PyObject *_pending */
static Py_ssize_t plim_permit_weak_offset = 0;     /* __weakref__ */

#define PLIM_PERMIT_FREELIST 256
static PyObject *plim_permit_free[PLIM_PERMIT_FREELIST];
static int plim_permit_nfree = 0;
static PyTypeObject *plim_permit_type = NULL;
static PyTypeObject *plim_plain_sem_type = NULL;   /* AsyncSemaphore, exactly */

/* plim_permit_release_memory: the permit `o` (refcount 0, its count
 * already handled) leaves the GC, drops its references and goes back to
 * the freelist or to tp_free. */
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

static int plim_install_permit_alloc(PyObject *permit_type, PyObject *plain_sem_type,
                                     Py_ssize_t count_offset, Py_ssize_t sem_offset,
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
    plim_permit_count_offset = count_offset;
    plim_permit_sem_offset = sem_offset;
    plim_permit_pending_offset = pending_offset;
    plim_permit_weak_offset = tp->tp_weaklistoffset;
    return 0;
}

#endif /* PLIM_BINDING_PERMIT_ALLOC_H */
