"""``fastsearch.tvm``: the earlier name of :mod:`fastsearch.metaschedule` (the same module object)."""

import sys

from fastsearch import metaschedule

sys.modules[__name__] = metaschedule
