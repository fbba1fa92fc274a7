# PyInstaller hook for edgebroker._native (packaging/edgebroker.spec).
#
# The package chooses its backend at run time (edgebroker/_native/__init__.py imports the
# compiled module inside a try, falling back to the pure-Python twin), and the compiled cffi
# module imports cffi's C extension `_cffi_backend` from C, where PyInstaller's scan of Python
# imports cannot see it. Both are named here: without `_cffi_backend` the compiled module does
# not load, and the binary would run the slow twin (`make dist` checks that `--version` says C).
hiddenimports = [
    "_cffi_backend",
    "edgebroker._native._edgebroker_c",
    "edgebroker._native._cbackend",
    "edgebroker._native._pure",
]
