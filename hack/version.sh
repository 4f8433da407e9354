#!/usr/bin/env bash
# Prints the project's one version string: the VERSION file when there is
# one (a source tarball), otherwise `git describe` of the checkout
# (v0.1.0, v0.1.0-3-gabcdef0, with -dirty for local changes), otherwise
# v0.0.0-dev when neither tells.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f VERSION ]; then
	tr -d ' \n' < VERSION
	echo
	exit 0
fi
if v=$(git describe --tags --dirty --match 'v[0-9]*' 2>/dev/null); then
	echo "$v"
	exit 0
fi
if c=$(git rev-parse --short=12 HEAD 2>/dev/null); then
	dirty=""
	git diff --quiet HEAD 2>/dev/null || dirty="-dirty"
	echo "v0.0.0-dev+g${c}${dirty}"
	exit 0
fi
echo "v0.0.0-dev"
