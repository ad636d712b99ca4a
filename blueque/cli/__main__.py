"""``python -m blueque.cli``: the ``blueque`` command."""

import sys

from blueque.cli import main

sys.exit(main())
