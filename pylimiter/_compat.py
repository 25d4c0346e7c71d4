"""Which implementation to use: PYLIMITER_NO_EXTENSIONS=1 selects pure Python."""

import os
import sys

NO_EXTENSIONS = bool(os.environ.get("PYLIMITER_NO_EXTENSIONS"))
IS_CPYTHON = sys.implementation.name == "cpython"
USE_EXTENSIONS = not NO_EXTENSIONS and IS_CPYTHON
