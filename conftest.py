"""Root conftest: thin. The kvgate plugin comes from the package's pytest11 entry point; the
fixtures the suites use come from the ``fixtures`` package."""

pytest_plugins = ["fixtures.endpoint", "fixtures.soak", "fixtures.pools", "fixtures.health", "fixtures.baseline", "fixtures.answers", "fixtures.scale"]
