"""sdrt's benchmark harness: ``python -m bench`` (or ``nox -s bench``). See bench/README.md."""
