"""Documentation generators, one per generated section (`make docs` runs each).

Each writes its section of a file between the markers it owns and can `--check` that the file
is up to date (a unit test runs the check, so a stale section fails the tests)."""
