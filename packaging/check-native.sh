#!/bin/sh
# packaging/check-native.sh BINARY: the one-file binary must run the C helper ("native backend: c"
# in its --version; without it the broker runs the slow pure-Python paths). A binary that does
# not is removed and the exit status is 1, so that no later step (make deb, the arm64 copy) takes
# it. Used by make dist and packaging/arm64.sh (inside the arm64 root file system).
set -u
binary=$1
version=$("$binary" --version 2>&1) || true
case "$version" in
    *"(native backend: c,"*) exit 0 ;;
esac
echo "$binary --version: $version" >&2
echo "$binary does not run the C helper (native backend: c): removed" >&2
rm -f "$binary"
exit 1
