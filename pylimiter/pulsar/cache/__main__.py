from .pipeline import PROG, main, run

raise SystemExit(run(main, PROG))
