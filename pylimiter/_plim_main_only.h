/* _plim_main_only.h: pylimiter's C extensions load in the main interpreter
 * only (issue 32, G11).  Binding code (it includes Python.h); csrc/ never
 * includes it.
 *
 * What the extensions support
 * ---------------------------
 * They keep process-wide state in C statics (freelists, a lock pool, the
 * StopIteration cache, type slots patched at import, Cython's module
 * singleton), so they cannot be loaded once per interpreter.  Cython's
 * multi-phase init records the first interpreter that imports the module
 * and refuses every other one with "Interpreter change detected": when a
 * subinterpreter came first, that was the main interpreter, for the rest of
 * the process.  So each extension's PyInit_<name> and the create slot of
 * its module definition are wrapped: in any interpreter but the main one
 * (legacy subinterpreters made by Py_NewInterpreter /
 * _testcapi.run_in_subinterp, isolated ones made by _interpreters /
 * concurrent.interpreters) they raise a clear ImportError before Cython's
 * code runs, so nothing is recorded and nothing is created there; the main
 * interpreter imports it before or after, as if the subinterpreter had
 * never tried.  (Where CPython refuses first -- 3.12+'s isolated
 * interpreters, through the Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED
 * slot Cython sets -- its own ImportError, "module ... does not support
 * loading in subinterpreters", says the same.)  The pure-Python
 * implementation (PYLIMITER_NO_EXTENSIONS=1) works in any interpreter.
 *
 * How an extension follows the rule (pylimiter/_<name>.pyx, module
 * pylimiter.<pkg>.<name>): a verbatim block near the top of the .pyx, with
 * this directory on the extension's include path (setup.py include_dirs):
 *
 *     cdef extern from *:
 *         """
 *         #include "_plim_main_only.h"
 *         PLIM_MAIN_ONLY(<name>, "pylimiter.<pkg>.<name>")
 *         #define PyInit_<name> plim_cython_init_<name>
 *         """
 *
 * PLIM_MAIN_ONLY defines the real PyInit_<name> (the symbol the import
 * system looks up); the #define after it renames the PyInit_<name> that
 * Cython generates further down the same file to plim_cython_init_<name>,
 * which the wrapper calls once the interpreter is known to be the main one.
 * The wrapper also wraps the module definition's create slot, which checks
 * again in the importing interpreter (3.13+ runs PyInit in the main one).
 * tests/test_subinterpreters.py checks both import orders for every
 * extension listed there.
 */
#ifndef PLIM_MAIN_ONLY_H
#define PLIM_MAIN_ONLY_H

#include <Python.h>

/* plim_main_only_check returns 0 in the main interpreter; elsewhere it
 * sets ImportError naming `module` and returns -1. */
static int plim_main_only_check(const char *module)
{
    if (PyInterpreterState_Get() == PyInterpreterState_Main())
        return 0;
    PyErr_Format(PyExc_ImportError,
                 "pylimiter: the C extension %s can only be imported in the main "
                 "interpreter, not in a subinterpreter (it keeps process-wide state); "
                 "use the pure-Python implementation there (PYLIMITER_NO_EXTENSIONS=1)",
                 module);
    return -1;
}

typedef PyObject *(*plim_create_fn)(PyObject *spec, PyModuleDef *def);

/* plim_wrap_create puts `ours` in the Py_mod_create slot of the module
 * definition `def_obj` (what a multi-phase PyInit returns), keeping the
 * one it replaces in *saved.  Idempotent (PyInit runs at every import).
 * From 3.13 on CPython runs PyInit in the main interpreter even for an
 * import made in a subinterpreter (in case the module is single-phase),
 * so the check in PyInit alone would pass there: the create slot runs in
 * the importing interpreter, and checks again. */
static int plim_wrap_create(PyObject *def_obj, plim_create_fn *saved, plim_create_fn ours)
{
    if (!PyObject_TypeCheck(def_obj, &PyModuleDef_Type))
        return 0;   /* a single-phase module object: nothing to wrap */
    PyModuleDef *def = (PyModuleDef *)def_obj;
    for (PyModuleDef_Slot *slot = def->m_slots; slot != NULL && slot->slot != 0; slot++) {
        if (slot->slot != Py_mod_create || slot->value == (void *)ours)
            continue;
        *saved = (plim_create_fn)slot->value;
        slot->value = (void *)ours;
    }
    if (*saved == NULL) {
        PyErr_SetString(PyExc_ImportError,
                        "pylimiter: the extension's module definition has no create slot");
        return -1;
    }
    return 0;
}

/* Invoked before the rename (#define PyInit_<name> ...), so that the
 * wrapper's own name is not renamed; Cython's definition comes later in the
 * file and is. */
#define PLIM_MAIN_ONLY(name, module)                                         \
    PyMODINIT_FUNC plim_cython_init_##name(void);                            \
    static plim_create_fn plim_cython_create_##name = NULL;                  \
    static PyObject *plim_create_##name(PyObject *spec, PyModuleDef *def)    \
    {                                                                        \
        if (plim_main_only_check(module) < 0)                                \
            return NULL;                                                     \
        return plim_cython_create_##name(spec, def);                         \
    }                                                                        \
    PyMODINIT_FUNC PyInit_##name(void);                                      \
    PyMODINIT_FUNC PyInit_##name(void)                                       \
    {                                                                        \
        if (plim_main_only_check(module) < 0)                                \
            return NULL;                                                     \
        PyObject *def = plim_cython_init_##name();                           \
        if (def != NULL && plim_wrap_create(def, &plim_cython_create_##name, \
                                            plim_create_##name) < 0)         \
            return NULL;                                                     \
        return def;                                                          \
    }

#endif /* PLIM_MAIN_ONLY_H */
