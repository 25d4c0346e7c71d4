import sys

from .simulate import cli

sys.exit(cli())
