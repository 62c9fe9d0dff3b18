"""``python -m pkrt.rt.cli``: the ``pkrt`` command."""

import sys

from pkrt.rt.cli import main

if __name__ == "__main__":  # a spawned worker process (planning) re-imports this module
    sys.exit(main())
