"""``python -m kvgate ...``: the same as the ``kvgate`` console script (see :mod:`kvgate.cli`)."""

import sys

from .cli import main

sys.exit(main())
