"""`python -m servelab ...`: the same as the `servelab` command."""
import sys

from servelab.cli import main

sys.exit(main())
