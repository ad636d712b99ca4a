"""``python -m blueque.cli``: the ``blueque`` command."""

import sys

from blueque.cli import main

if __name__ == "__main__":
    sys.exit(main())
