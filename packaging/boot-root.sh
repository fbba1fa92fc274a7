#!/usr/bin/env bash
# The root file system of the boot test (make test-boot, tests/boot/, docs/deploy.md): Debian
# bookworm for this machine's architecture, or for $EDGEBROKER_BOOT_ARCH (make test-arm64:
# arm64, run by qemu-user through binfmt_misc, which packaging/arm64.sh sets up), minbase plus
# what booting it with systemd-nspawn needs (systemd, systemd-sysv, dbus), and procps (kill,
# pgrep: the tests' and an administrator's tools; the package itself needs nothing but libc6),
# so the test installs the package without the network. Made once with debootstrap, cached as $CACHE/bookworm-<arch>-boot (default
# ~/.cache/edgebroker); each test run boots a copy of it. Needs root and the network the first
# time (about 2 minutes here, either architecture).
#
#   packaging/boot-root.sh     makes it when missing, prints its path
set -euo pipefail

CACHE=${EDGEBROKER_CACHE:-$HOME/.cache/edgebroker}
ARCH=${EDGEBROKER_BOOT_ARCH:-$(dpkg --print-architecture)}
ROOT=$CACHE/bookworm-$ARCH-boot
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [ ! -f "$ROOT/.ready" ]; then
    command -v debootstrap >/dev/null || {
        echo "installing Debian packages: debootstrap" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2
    }
    mkdir -p "$CACHE"
    rm -rf "$ROOT"
    debootstrap --arch="$ARCH" --variant=minbase --include=systemd,systemd-sysv,dbus,procps \
        bookworm "$ROOT" "$MIRROR" >&2
    echo edgebroker-boot > "$ROOT/etc/hostname"     # debootstrap copies the host's
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb
    touch "$ROOT/.ready"
fi
echo "$ROOT"
