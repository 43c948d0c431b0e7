"""``python -m promptyoself`` runs the command line.

``serve --transport stdio`` first tries the stdio relay (promptyoself.faces.stdio_entry): with a
service running for the same database this process then imports no more than the standard library.
"""

import sys

from promptyoself.faces.stdio_entry import cli_main

sys.exit(cli_main())
