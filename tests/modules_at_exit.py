"""The edgebroker command line that writes to OUT, when it exits, the names of the modules it
imported over its whole life (for tests/server/test_lazy_imports.py), and to OUT.imported those
it imported at any time, unloaded since or not (its child processes' imports left out):

    EDGEBROKER_TEST_SITE=DIR[:DIR...] python -S tests/modules_at_exit.py OUT serve ...

With -S no .pth file of site-packages imports anything first (an editable install's finder
imports pathlib, ipaddress, ...): the package and the site-packages directories given in
EDGEBROKER_TEST_SITE are put on the path here, and what the interpreter had imported before
the broker starts is left out."""

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
sys.path += os.environ["EDGEBROKER_TEST_SITE"].split(os.pathsep)
before = set(sys.modules)
out = sys.argv.pop(1)


imported = set()
pid = os.getpid()


def _imported(event: str, args) -> None:
    if event == "import" and os.getpid() == pid:
        imported.add(args[0])


def _write() -> None:
    with open(out, "w") as fh:
        fh.write("\n".join(sorted(set(sys.modules) - before)))
    with open(out + ".imported", "w") as fh:
        fh.write("\n".join(sorted(imported - before)))


import atexit  # noqa: E402  (a built-in module: imports nothing)

atexit.register(_write)
sys.addaudithook(_imported)

from edgebroker.cli.main import main  # noqa: E402

sys.exit(main())
