"""``python -m pkrt.rt.cli``: the ``pkrt`` command."""

import sys

from . import main

sys.exit(main())
