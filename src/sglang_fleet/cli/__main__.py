"""``python -m sglang_fleet.cli``: the ``sglang-fleet`` command."""

import sys

from sglang_fleet.cli import main

sys.exit(main())
