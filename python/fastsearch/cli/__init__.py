"""The ``fastsearch`` command (``main``)."""

from fastsearch.cli.main import main

__all__ = ["main"]
