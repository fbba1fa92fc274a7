# PyInstaller hook for edgebroker._native (packaging/edgebroker.spec).
#
# The package picks its backend at import time (importlib-free, but inside a try), so
# PyInstaller's import scan does not follow it: name the compiled cffi module, and cffi's own
# C extension `_cffi_backend` that the compiled module imports from C (invisible to the scan).
# Without `_cffi_backend` the binary stops at start with "No module named '_cffi_backend'"
# (or, under EDGEBROKER_NATIVE=auto, silently runs the slow pure-Python twin).
hiddenimports = [
    "_cffi_backend",
    "edgebroker._native._edgebroker_c",
    "edgebroker._native._cbackend",
    "edgebroker._native._pure",
]
