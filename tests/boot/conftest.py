"""The boot test (make test-boot, as root): a Debian bookworm root file system booted with
``systemd-nspawn --boot``, the package installed in it. Left out of a plain ``pytest`` run of
tests/ (make test): make test-boot sets EDGEBROKER_BOOT_TEST=1 and names the package in
EDGEBROKER_DEB."""

import os

collect_ignore_glob = [] if os.environ.get("EDGEBROKER_BOOT_TEST") else ["test_*.py"]
