/* _shared_init.c: the entry point of pylimiter._shared_c.
 *
 * Cython's multi-phase init records the first interpreter that creates the
 * module and refuses every other one afterwards, so a first import from a
 * (legacy) subinterpreter would make the main interpreter's later import
 * fail.  The generated PyInit__shared_c is renamed (a #define at the top
 * of _shared_c.pyx) and this one refuses a subinterpreter first, with a
 * clear ImportError, before Cython's check has seen it.  (3.12+ isolated
 * subinterpreters are refused by Cython's Py_mod_multiple_interpreters
 * slot as well.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyMODINIT_FUNC plim_cython_PyInit__shared_c(void);

PyMODINIT_FUNC PyInit__shared_c(void)
{
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_SetString(PyExc_ImportError,
                        "pylimiter._shared_c cannot be imported in a subinterpreter: the "
                        "host-wide limiter keeps per-process state (its segment "
                        "attachments, waker thread and fork handlers); import it in the "
                        "main interpreter");
        return NULL;
    }
    return plim_cython_PyInit__shared_c();
}
