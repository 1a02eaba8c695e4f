"""``python -m rte`` is the ``rte`` command."""

import sys

try:
    from rte.cli import main
except KeyboardInterrupt:  # a Ctrl-C this early: the command's one line, not a traceback
    print("rte: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
