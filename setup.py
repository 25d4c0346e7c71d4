"""Build configuration: the two C extensions (the limiter, pylimiter._limiter_c;
the broker entry cache, pylimiter.pulsar.cache._cache_c) and their switches.

PYLIMITER_NO_EXTENSIONS=1     build and install the pure-Python package only
PYLIMITER_DEBUG_BUILD=1       -O0 -g3, assertions and PLIM_DEBUG on
PYLIMITER_SANITIZE=thread|address   build the extensions with a sanitizer
"""

import os

from setuptools import Extension, setup


def _compat():
    """pylimiter/_compat.py, loaded by path (the package is not importable
    before it is built): the install reads PYLIMITER_NO_EXTENSIONS as the
    import does (1/true/yes/on: pure; unset/0/false/no/off: C)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pylimiter", "_compat.py")
    spec = importlib.util.spec_from_file_location("_pylimiter_compat", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NO_EXTENSIONS = not _compat().USE_EXTENSIONS

if NO_EXTENSIONS:
    print("*********************\n* Pure Python build *\n*********************")
    setup(ext_modules=[])
else:
    from Cython.Build import cythonize

    print("**********************\n* Accelerated build *\n**********************")
    if os.name == "nt":
        cflags = ["/std:c11", "/experimental:c11atomics", "/W3"]
    else:
        cflags = ["-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]
    macros = []
    ldflags = []
    directives = {}
    if os.environ.get("PYLIMITER_DEBUG_BUILD"):
        if os.name != "nt":
            cflags += ["-O0", "-g3", "-UNDEBUG"]
        macros.append(("PLIM_DEBUG", "1"))
        directives.update(boundscheck=True, wraparound=True)
    sanitize = os.environ.get("PYLIMITER_SANITIZE")
    if sanitize:
        if sanitize not in ("thread", "address"):
            raise SystemExit(f"PYLIMITER_SANITIZE must be thread or address, not {sanitize!r}")
        cflags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
        ldflags += [f"-fsanitize={sanitize}"]
    ext = Extension(
        "pylimiter._limiter_c",
        sources=[
            "pylimiter/_limiter_c.pyx",
            "csrc/plim_sem.c",
            "csrc/plim_waitq.c",
        ],
        include_dirs=["csrc", "pylimiter"],
        depends=["pylimiter/_plim_main_only.h"],
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        define_macros=macros,
    )
    # The broker entry cache (pylimiter.pulsar.cache): its own core file and
    # Cython module, independent of the limiter's.
    cache_ext = Extension(
        "pylimiter.pulsar.cache._cache_c",
        sources=["pylimiter/pulsar/cache/_cache_c.pyx", "csrc/plim_cacheq.c"],
        # pylimiter/: _plim_main_only.h (main interpreter only, issue 32 G11)
        include_dirs=["csrc", "pylimiter"],
        depends=["pylimiter/_plim_main_only.h"],
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        define_macros=macros,
    )
    setup(
        ext_modules=cythonize(
            [ext, cache_ext],
            compiler_directives={"language_level": "3", **directives},
        )
    )
