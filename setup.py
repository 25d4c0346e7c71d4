"""Build configuration: the C extensions (the limiter, pylimiter._limiter_c;
the broker entry cache, pylimiter.pulsar.cache._cache_c; on Linux the
host-wide limiter, pylimiter._shared_c) and their switches.

PYLIMITER_NO_EXTENSIONS=1     build and install the pure-Python package only
PYLIMITER_DEBUG_BUILD=1       -O0 -g3, assertions and PLIM_DEBUG on
PYLIMITER_SANITIZE=thread|address   build the extensions with a sanitizer
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext
from setuptools.command.build_py import build_py as _build_py

HERE = os.path.dirname(os.path.abspath(__file__))


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


class build_py(_build_py):
    """Also writes pylimiter/_build_config.py into the build (never into the
    source tree), saying whether the build is pure: a package installed by
    `PYLIMITER_NO_EXTENSIONS=1 pip install .` then imports as pure without
    the variable at run time (pylimiter/_compat.py reads it)."""

    CONFIG = os.path.join("pylimiter", "_build_config.py")

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return   # an editable install imports the tree itself, as a checkout
        path = os.path.join(self.build_lib, self.CONFIG)
        self.mkpath(os.path.dirname(path))
        with open(path, "w", encoding="utf-8") as f:
            f.write('"""Written by setup.py at build time: how this pylimiter was built."""\n\n'
                    "#: Built with PYLIMITER_NO_EXTENSIONS=1: no C extension, the pure twins.\n"
                    f"PURE = {NO_EXTENSIONS!r}\n")

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return [*outputs, os.path.join(self.build_lib, self.CONFIG)]


class build_ext(_build_ext):
    """In a git checkout, also places the built extensions in the source
    tree, as `--inplace` does.  pip builds `pip install .` in the checkout
    itself, and Python puts the current directory first on sys.path: without
    this, `python -c "import pylimiter"` run in the checkout right after
    `pip install .` imports the unbuilt tree, not the install, and fails."""

    def run(self):
        super().run()
        if self.inplace or getattr(self, "editable_mode", False):
            return   # already in place
        if os.path.exists(os.path.join(HERE, ".git")):
            self.copy_extensions_to_source()


CMDCLASS = {"build_py": build_py, "build_ext": build_ext}

if NO_EXTENSIONS:
    print("*********************\n* Pure Python build *\n*********************")
    setup(ext_modules=[], cmdclass=CMDCLASS)
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
    # The bindings' own C headers, one per concern, in pylimiter/_binding/
    # (reached as "_binding/<name>.h" through pylimiter/ on the include
    # path); in the sdist (MANIFEST.in), never in a wheel.
    import glob

    binding_headers = sorted(glob.glob("pylimiter/_binding/*.h"))
    ext = Extension(
        "pylimiter._limiter_c",
        sources=[
            "pylimiter/_limiter_c.pyx",
            "csrc/plim_sem.c",
            "csrc/plim_waitq.c",
        ],
        include_dirs=["csrc", "pylimiter"],
        depends=binding_headers,
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        define_macros=macros,
    )
    # The broker entry cache (pylimiter.pulsar.cache): its own core file and
    # Cython module, independent of the limiter's.
    cache_ext = Extension(
        "pylimiter.pulsar.cache._cache_c",
        sources=["pylimiter/pulsar/cache/_cache_c.pyx", "csrc/plim_cacheq.c"],
        # pylimiter/: _binding/main_only.h (main interpreter only, issue 32 G11)
        include_dirs=["csrc", "pylimiter"],
        depends=["pylimiter/_binding/main_only.h"],
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        define_macros=macros,
    )
    exts = [ext, cache_ext]
    # The host-wide limiter (issue 33): Linux only (futexes, OFD locks);
    # elsewhere pylimiter uses the pure twin, whose constructors refuse the
    # platform.
    import sys

    if sys.platform.startswith("linux"):
        exts.append(Extension(
            "pylimiter._shared_c",
            sources=["pylimiter/_shared_c.pyx", "csrc/plim_shm.c"],
            # pylimiter/: _binding/main_only.h (main interpreter only)
            include_dirs=["csrc", "pylimiter"],
            depends=["pylimiter/_binding/main_only.h", "csrc/plim_shm.h",
                     "csrc/plim_shm_fast.h", "csrc/plim_glibc_pin.h"],
            extra_compile_args=cflags,
            extra_link_args=ldflags,
            # Its pthread calls bound to glibc's oldest versions, so the
            # wheel stays manylinux_2_17 (csrc/plim_glibc_pin.h); not under
            # a sanitizer, whose runtime intercepts them unversioned.
            define_macros=macros + ([] if sanitize else [("PLIM_PIN_GLIBC", "1")]),
        ))
    setup(
        cmdclass=CMDCLASS,
        ext_modules=cythonize(
            exts,
            compiler_directives={"language_level": "3", **directives},
        )
    )
