/* compact_int.h: reading the permits argument of every acquire, an exact
 * int, without a call in the common case.
 *
 * 3.12+ can read a compact (one-digit) int inline; the permits argument is
 * nearly always 1, and PyLong_AsLongLongAndOverflow was a few percent of an
 * uncontended acquire.  Anything else goes through that call, with its
 * overflow flag.
 *
 * Rules: the caller has checked that `o` is an exact int (the unstable
 * compact-int API reads PyLongObject's layout); the GIL is held.  Compiled
 * to the plain call under the limited API, which has no compact-int read.
 */
#ifndef PLIM_BINDING_COMPACT_INT_H
#define PLIM_BINDING_COMPACT_INT_H

#include <Python.h>

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

#endif /* PLIM_BINDING_COMPACT_INT_H */
