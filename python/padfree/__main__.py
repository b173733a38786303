"""`python -m padfree`: the `padfree` command."""
import sys

from padfree.cli import main

sys.exit(main())
