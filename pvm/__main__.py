"""``python -m pvm``: the ``pvm`` command (how the wrapper processes are started)."""

import sys

from pvm.cli import main

sys.exit(main())
