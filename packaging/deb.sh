#!/usr/bin/env bash
# make deb / make deb-arm64: the Debian package dist/edgebroker_<version>_<arch>.deb, built
# with dpkg-deb alone (no debhelper) from a one-file binary (docs/deploy.md, "The Debian
# package").
#
#   packaging/deb.sh BINARY ARCH OUTDIR [LIBC_ROOT]
#   packaging/deb.sh --version     the version the package gets
#
# BINARY   the one-file binary for ARCH (dist/edgebroker, dist-arm64/edgebroker)
# ARCH     the Debian architecture: amd64, arm64
# OUTDIR   where the .deb goes
# LIBC_ROOT the root file system the binary was built in (default /): its libc6 version is
#          the package's lower bound, as the binary needs that C library or a newer one
# DEB_VERSION (environment) overrides the version, else edgebroker/__init__.py's __version__
#          in Debian's spelling (0.2.0rc1 -> 0.2.0~rc1, 0.2.0.dev3 -> 0.2.0~dev3,
#          0.2.0.post1 -> 0.2.0+post1).
#
# What goes in:
#   /usr/bin/edgebroker                      the binary
#   /lib/systemd/system/edgebroker.service   systemd/edgebroker.service with ExecStart at
#                                            /usr/bin/edgebroker (the repo's unit says
#                                            /usr/local/bin, for a manual install)
#   /lib/systemd/system/edgebroker.socket    systemd/edgebroker.socket, when it exists
#   /etc/edgebroker/edgebroker.toml          systemd/edgebroker.toml, a conffile
#   /usr/share/doc/edgebroker/               copyright, changelog.gz
#   /usr/share/man/man1/edgebroker.1.gz      packaging/debian/edgebroker.1
#   /usr/share/lintian/overrides/edgebroker  packaging/debian/lintian-overrides: the warnings
#                                            that stay, with the reasons
# and the maintainer scripts of packaging/debian/ with the list of units filled in.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)

deb_version() {
    if [ -n "${DEB_VERSION:-}" ]; then
        echo "$DEB_VERSION"
    else
        sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$HERE/edgebroker/__init__.py" |
            sed -e 's/\.\?\(a\|b\|rc\|dev\)\([0-9]\)/~\1\2/' -e 's/\.post\([0-9]\)/+post\1/'
    fi
}
if [ "${1:-}" = --version ]; then deb_version; exit 0; fi

[ $# -ge 3 ] || { echo "usage: $0 BINARY ARCH OUTDIR [LIBC_ROOT] | $0 --version" >&2; exit 2; }
BINARY=$1
ARCH=$2
OUTDIR=$3
LIBC_ROOT=${4:-/}
SRC=$HERE/packaging/debian
UNITS_DIR=$HERE/systemd

[ -f "$BINARY" ] && [ -x "$BINARY" ] || { echo "$0: $BINARY: no executable file" >&2; exit 1; }
# A binary of the wrong architecture in the package would install and never start: the ELF
# header's e_machine (bytes 18-19, little-endian) must be the architecture's.
case "$ARCH" in
    amd64) machine=62 ;;       # EM_X86_64
    arm64) machine=183 ;;      # EM_AARCH64
    *) echo "$0: architecture $ARCH: only amd64 and arm64 are built" >&2; exit 1 ;;
esac
found=$(od -An -tu2 -j18 -N2 "$BINARY" | tr -d ' ')
[ "$(head -c4 "$BINARY" | od -An -c | tr -d ' ')" = '177ELF' ] && [ "$found" = "$machine" ] || \
    { echo "$0: $BINARY: no ELF executable for $ARCH (e_machine $found, not $machine)" >&2
      exit 1; }

VERSION=$(deb_version)
[ -n "$VERSION" ] || { echo "$0: no __version__ in edgebroker/__init__.py" >&2; exit 1; }
LIBC=$(dpkg-query --admindir="$LIBC_ROOT/var/lib/dpkg" -W -f '${Version}' libc6 | sed 's/-[^-]*$//')
[ -n "$LIBC" ] || { echo "$0: no libc6 installed in $LIBC_ROOT" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/root
mkdir -p "$ROOT/DEBIAN" "$ROOT/usr/bin" "$ROOT/lib/systemd/system" "$ROOT/etc/edgebroker" \
    "$ROOT/usr/share/doc/edgebroker" "$ROOT/usr/share/man/man1"

install -m 0755 "$BINARY" "$ROOT/usr/bin/edgebroker"

# The unit: the binary's path of the package, and a header saying where it comes from in
# place of the manual install's instructions (the first comment lines).
packaged_unit() {
    awk -v name="$(basename "$1")" '
        !body && /^#/ { next }
        !body { print "# " name " of the Debian package edgebroker (docs/deploy.md)."
                print "# Changes: a drop-in (systemctl edit " name "); this file is replaced"
                print "# on upgrade."
                body = 1 }
        { gsub("/usr/local/bin/edgebroker", "/usr/bin/edgebroker"); print }' "$1"
}
packaged_unit "$UNITS_DIR/edgebroker.service" > "$ROOT/lib/systemd/system/edgebroker.service"
grep -q '^ExecStart=/usr/bin/edgebroker serve -c /etc/edgebroker/edgebroker.toml' \
    "$ROOT/lib/systemd/system/edgebroker.service" || \
    { echo "$0: the packaged unit does not run /usr/bin/edgebroker serve -c" \
           "/etc/edgebroker/edgebroker.toml" >&2; exit 1; }
UNITS=edgebroker.service
if [ -f "$UNITS_DIR/edgebroker.socket" ]; then
    packaged_unit "$UNITS_DIR/edgebroker.socket" > "$ROOT/lib/systemd/system/edgebroker.socket"
    UNITS="edgebroker.socket edgebroker.service"
fi
chmod 0644 "$ROOT"/lib/systemd/system/*

install -m 0644 "$UNITS_DIR/edgebroker.toml" "$ROOT/etc/edgebroker/edgebroker.toml"
echo /etc/edgebroker/edgebroker.toml > "$ROOT/DEBIAN/conffiles"

install -m 0644 "$SRC/copyright" "$ROOT/usr/share/doc/edgebroker/copyright"
install -D -m 0644 "$SRC/lintian-overrides" "$ROOT/usr/share/lintian/overrides/edgebroker"
gzip -9n < "$SRC/edgebroker.1" > "$ROOT/usr/share/man/man1/edgebroker.1.gz"
# A native package's changelog: one entry for this build, dated by the last commit when
# there is one (reproducible), else now.
date=$(git -C "$HERE" log -1 --format=%cD 2>/dev/null || date -R)
{
    echo "edgebroker ($VERSION) unstable; urgency=medium"
    echo
    echo "  * edgebroker $VERSION, built from its repository (see its git log)."
    echo
    echo " -- edgebroker maintainers <maintainers@edgebroker.invalid>  $date"
} | gzip -9n > "$ROOT/usr/share/doc/edgebroker/changelog.gz"
chmod 0644 "$ROOT/usr/share/doc/edgebroker/changelog.gz" "$ROOT/usr/share/man/man1/edgebroker.1.gz"

for script in postinst prerm postrm; do
    sed "s/@UNITS@/$UNITS/" "$SRC/$script" > "$ROOT/DEBIAN/$script"
    chmod 0755 "$ROOT/DEBIAN/$script"
done

size=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
cat > "$ROOT/DEBIAN/control" <<EOF
Package: edgebroker
Version: $VERSION
Architecture: $ARCH
Maintainer: edgebroker maintainers <maintainers@edgebroker.invalid>
Installed-Size: $size
Depends: libc6 (>= $LIBC)
Section: net
Priority: optional
Homepage: https://github.com/edgebroker/edgebroker
Description: MQTT broker for edge gateways with a durable commit log
 edgebroker is an MQTT broker (3.1.1 and 5.0) for edge gateways: every
 message is written to a commit log on disk, and batches of it can be
 uploaded to a central store.
 .
 This package holds the one-file binary (no Python needed) and runs it
 under systemd as the hardened service edgebroker, with its state in
 /var/lib/edgebroker and its configuration in
 /etc/edgebroker/edgebroker.toml.
EOF
# Checksums of the files dpkg does not track as conffiles (dpkg --verify, debsums).
(cd "$ROOT" && find . -path ./DEBIAN -prune -o -type f ! -path ./etc/edgebroker/edgebroker.toml \
    -printf '%P\0' | sort -z | xargs -0 md5sum) > "$ROOT/DEBIAN/md5sums"
chmod 0644 "$ROOT/DEBIAN/md5sums" "$ROOT/DEBIAN/control" "$ROOT/DEBIAN/conffiles"

mkdir -p "$OUTDIR"
out=$OUTDIR/edgebroker_${VERSION}_$ARCH.deb
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$out" >/dev/null
echo "$out"
