"""``python -m fastsearch.cli``."""

import sys

from fastsearch.cli.main import main

sys.exit(main())
