"""python -m pylimiter.pulsar.cursor simulate ..."""

import sys

from .simulate import cli

sys.exit(cli())
