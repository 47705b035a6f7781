"""The ``driftstream`` console command (:mod:`.main`). It may import the API and the
connectors (the local broker); commands that come with the examples (``bench``,
``demo``) are found through entry points, not imported."""

from driftstream.engine.cli.main import main

__all__ = ["main"]
