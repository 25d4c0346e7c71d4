"""python -m pylimiter.pulsar.balance simulate ..."""

import sys

from ..._cli import run
from .pipeline import PROG, main

sys.exit(run(main, PROG))
