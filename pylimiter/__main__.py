"""``python -m pylimiter`` and the ``pylimiter`` command: pylimiter's commands
in one place, each the ``python -m pylimiter.<...>`` entry point it names
(same flags, same output, same exit statuses).

    pylimiter                       the commands, one line each
    pylimiter COMMAND [ARGS...]     run COMMAND (``pylimiter COMMAND --help``)
    pylimiter --version

An unknown command prints the usage and exits with status 2.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Optional, Sequence

PROG = "pylimiter"

#: command -> (the package whose __main__ runs it, one line on what it does).
#: The lines are written here, not read from the packages: listing the
#: commands must not import PySpark or protobuf.
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("pylimiter.bench",
              "the benchmark grid on Spark: pylimiter against its stdlib anchors, "
              "an HTML report (extra: spark)"),
    "topiclist": ("pylimiter.pulsar.topiclist",
                  "PIP-442's topic-list broker, proxy and load generator "
                  "(extra: topiclist)"),
    "balance": ("pylimiter.pulsar.balance",
                "Pulsar bundle load balancing: replay a cluster's load, compare "
                "strategies (extra: spark)"),
    "cache": ("pylimiter.pulsar.cache",
              "the broker entry cache (PIP-430) and its policy simulator "
              "(extra: spark)"),
    "cursor": ("pylimiter.pulsar.cursor",
               "message lifecycle: acknowledgment holes, TTL, backlog quotas "
               "(extra: spark)"),
}


def usage() -> str:
    """The usage line and the commands, one line each."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [ARGS...]   ({PROG} COMMAND --help for its options)",
             "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", f"Each is also `python -m <package>`: "
                  f"{PROG} bench == python -m {COMMANDS['bench'][0]}."]
    return "\n".join(lines)


def version() -> str:
    from pylimiter import IMPLEMENTATION, __version__
    from pylimiter.spark.cli import DISTRIBUTION

    return f"{PROG} ({DISTRIBUTION} {__version__}, {IMPLEMENTATION} implementation)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``pylimiter ARGS``: list the commands, or hand ARGS over to the
    command's own entry point (its ``__main__``, with ``sys.argv`` set as
    ``python -m`` would set it).  Returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help", "--version"):
        text = version() if args[:1] == ["--version"] else usage()
        try:
            print(text, flush=True)
        except BrokenPipeError:   # `pylimiter | head -1`: the reader left
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(usage(), file=sys.stderr)
        print(f"{PROG}: error: unknown command {name!r} "
              f"(choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    package = COMMANDS[name][0]
    saved = sys.argv
    sys.argv = [f"{PROG} {name}", *rest]
    try:
        runpy.run_module(package, run_name="__main__", alter_sys=False)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
