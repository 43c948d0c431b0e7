"""``python -m promptyoself`` runs the command line.

``serve --transport stdio`` first tries the stdio relay (promptyoself.faces.relay): with a service
running for the same database this process then imports no more than the standard library.
"""

import sys

if sys.argv[1:2] == ["serve"]:
    from promptyoself.faces.relay import is_stdio_args, try_relay

    if is_stdio_args(sys.argv[2:], default_stdio=False):
        relayed = try_relay()
        if relayed is not None:
            sys.exit(relayed)

from promptyoself.faces.cli import main

sys.exit(main())
