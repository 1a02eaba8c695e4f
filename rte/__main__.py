"""``python -m rte`` is the ``rte`` command."""

import sys

from rte.cli import main

sys.exit(main())
