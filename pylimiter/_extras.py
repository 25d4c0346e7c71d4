"""The optional extras and the hint a missing one gives.

``EXTRAS`` is a copy of pyproject.toml's ``[project.optional-dependencies]``
(tests/test_extras.py fails when the two differ): the package cannot read
pyproject.toml once installed, and its installed metadata is not there when
it runs from a checkout.  The distribution is not on PyPI, so a hint never
says ``pip install 'pylimiter-pulsar[...]'``: it names the install that works
today, ``pip install '.[extra]'`` from a checkout, or the extra's own
packages.
"""

from __future__ import annotations

import re
import sys

#: extra -> its requirements, exactly as pyproject.toml lists them.
EXTRAS: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark>=3.5", "pandas>=1.5,<3; python_version < '3.15'",
              "pandas>=3.1; python_version >= '3.15'", "pyarrow>=12", "matplotlib>=3.7",
              "rich>=13"),
    "topiclist": ("protobuf>=7.35.1,<8", "prometheus_client>=0.21", "aiohttp>=3.9",
                  "google-re2>=1.1", "google-crc32c>=1.5"),
    "prometheus": ("prometheus_client>=0.21",),
    "aiohttp": ("aiohttp>=3.9", "prometheus_client>=0.21"),
    "asgi": (),
    "grpc": ("grpcio>=1.59", "protobuf>=4.21"),
    "httpx": ("httpx>=0.25",),
    "otel": ("opentelemetry-api>=1.20",),
}

#: import name -> the distribution that provides it, where the two differ
#: (``google`` is a namespace several distributions share: the module asked
#: for, ``google.protobuf``, names the one that is missing).
PROVIDERS: dict[str, str] = {
    "google.protobuf": "protobuf",
    "re2": "google-re2",
    "google_crc32c": "google-crc32c",
    "py4j": "py4j",   # comes with pyspark
    "grpc": "grpcio",
    "opentelemetry": "opentelemetry-api",
}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PYVER = re.compile(r"""^python_version\s*(<=|>=|==|!=|<|>)\s*['"](\d+(?:\.\d+)*)['"]$""")


def requirement_name(requirement: str) -> str:
    """'google-re2>=1.1' -> 'google-re2'."""
    match = _NAME.match(requirement.strip())
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return match.group(0)


def _applies(requirement: str) -> bool:
    """Whether the requirement's marker holds on this Python (a marker other
    than a python_version comparison is kept: pip decides)."""
    _, _, marker = requirement.partition(";")
    match = _PYVER.match(marker.strip())
    if not marker.strip() or not match:
        return True
    op, version = match.groups()
    want = tuple(int(x) for x in version.split("."))
    have = sys.version_info[:len(want)]
    return {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want,
            "==": have == want, "!=": have != want}[op]


def requirements(extra: str) -> list[str]:
    """The extra's requirements for this Python, markers dropped."""
    return [r.partition(";")[0].strip() for r in EXTRAS[extra] if _applies(r)]


def provider(module: str) -> str:
    """The distribution that provides the import ``module``."""
    name = module
    while name:
        if name in PROVIDERS:
            return PROVIDERS[name]
        for reqs in EXTRAS.values():
            for req in reqs:
                dist = requirement_name(req)
                if dist.lower().replace("-", "_") == name.lower():
                    return dist
        name = name.rpartition(".")[0]
    return module.partition(".")[0]


def install_hint(extra: str) -> str:
    """The commands that install ``extra`` today."""
    packages = " ".join(f"'{r}'" for r in requirements(extra))
    return (f"pip install '.[{extra}]' in a pylimiter checkout, "
            f"or pip install {packages}")


def missing(module: str, extra: str, *, cause: str | None = None,
            error: str | None = None) -> str:
    """The one-line message for an import of ``module`` (needed by
    ``extra``) that failed.  ``cause`` is the module the ImportError named
    (another one when a dependency of ``module`` is missing, a parent
    namespace such as ``google`` when ``module`` itself is); ``error`` its
    text, shown when it named no module (a module there but broken)."""
    if cause is None and error:
        what = f"{module} cannot be imported ({error})"
    elif cause and cause != module and not module.startswith(cause + "."):
        what = (f"{cause} is missing (it comes from the {provider(cause)} package, "
                f"which {module} needs)")
    else:
        what = f"{module} is missing (it comes from the {provider(module)} package)"
    return f"{what}; the {extra} extra brings it: {install_hint(extra)}"
