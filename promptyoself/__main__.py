"""``python -m promptyoself`` runs the command line."""

import sys

from promptyoself.faces.cli import main

sys.exit(main())
