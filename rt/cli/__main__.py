"""``python -m pkrt.rt.cli``: the ``pkrt`` command."""

import sys

from pkrt.rt.cli import main

sys.exit(main())
