#!/usr/bin/env bash
# Makes sure a Go toolchain of at least the version go.mod names is
# available. When neither `go` on PATH nor <prefix>/bin/go (prefix:
# $GO_PREFIX, default /usr/local/go) is recent enough and <prefix> does not
# exist, it installs that exact version there from the Go module proxy's
# toolchain module (the same files as the go.dev/dl archive), checked
# against the SHA-256 pinned below. Needs root for /usr/local and Debian's
# apt for curl and unzip when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

want=$(awk '$1 == "go" { print $2; exit }' go.mod)
prefix=${GO_PREFIX:-/usr/local/go}

# Pinned checksums of proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go<version>.linux-<arch>.zip.
pinned() {
	case "$1" in
	1.26.8/amd64) echo 30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7 ;;
	1.26.8/arm64) echo 02b36b6787b3ac767668f630e2998df45a3b1f9ffee08d1bf3ef6487cd658d99 ;;
	*) return 1 ;;
	esac
}

recent_enough() {
	local v
	v=$("$1" env GOVERSION 2>/dev/null) || return 1
	v=${v#go}
	[ "$(printf '%s\n%s\n' "$want" "$v" | sort -V | head -n1)" = "$want" ]
}

for g in "$(command -v go || true)" "$prefix/bin/go"; do
	if [ -n "$g" ] && [ -x "$g" ] && recent_enough "$g"; then
		exit 0
	fi
done

if [ -e "$prefix" ]; then
	echo "Go $want or newer is needed; $prefix holds an older one: upgrade it (https://go.dev/dl/) or set GO_PREFIX" >&2
	exit 1
fi
arch=$(uname -m)
case "$arch" in
x86_64) arch=amd64 ;;
aarch64) arch=arm64 ;;
esac
if ! sum=$(pinned "$want/$arch"); then
	echo "no pinned checksum for Go $want on linux/$arch: install Go $want or newer from https://go.dev/dl/" >&2
	exit 1
fi

"$(dirname "$0")/apt-install.sh" curl=curl /etc/ssl/certs/ca-certificates.crt=ca-certificates unzip=unzip

mod="golang.org/toolchain@v0.0.1-go$want.linux-$arch"
url="https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$want.linux-$arch.zip"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo ">> installing Go $want into $prefix (from $url)"
curl -fsSL --retry 3 -o "$tmp/go.zip" "$url"
echo "$sum  $tmp/go.zip" | sha256sum -c --quiet -
unzip -q "$tmp/go.zip" -d "$tmp/x"
mkdir -p "$(dirname "$prefix")"
mv "$tmp/x/$mod" "$prefix"
"$prefix/bin/go" version
