"""``python -m flows.cli``: the ``repeval`` command."""

import sys

from flows.cli.main import main

sys.exit(main())
