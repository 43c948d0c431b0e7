"""``python -m promptyoself`` runs the command line."""

import sys

from promptyoself.cli import main

sys.exit(main())
