from .cli import PROG, main, run

raise SystemExit(run(main, PROG))
