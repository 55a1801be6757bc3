"""``python -m bench.faults``: see :mod:`bench.faults`."""

import sys

from bench.faults.run import main

sys.exit(main())
