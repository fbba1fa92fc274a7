"""``python -m edgebroker.spark``: the same as ``edgebroker-spark``."""

import sys

from edgebroker.spark.cli import main

sys.exit(main())
