"""``python -m kvgate ...``: the same as the ``kvgate`` console script (see :mod:`kvgate.cli.main`)."""

import sys

from kvgate.cli.main import main

sys.exit(main())
