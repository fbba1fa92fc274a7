"""The frozen binary's entry point: the same `edgebroker` command as the installed one."""

import sys

from edgebroker.cli.main import main

sys.exit(main())
