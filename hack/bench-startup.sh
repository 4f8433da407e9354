#!/usr/bin/env bash
# Start-up cost of the consul-cni binary against an empty Go program built
# the same way, with hyperfine (Debian package; make deps): `consul-cni
# --version` is process start, runtime and package initialisation and
# nothing else. Prints hyperfine's summary and each median with its user
# and system time.
#
#   hack/bench-startup.sh BIN_DIR     (BIN_DIR holds consul-cni; make bench-startup)
set -euo pipefail
bin=$(cd "$1" && pwd)/consul-cni
"$(dirname "$0")/apt-install.sh" hyperfine=hyperfine python3=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'package main\n\nfunc main() {}\n' >"$tmp/main.go"
printf 'module empty\n\ngo 1.21\n' >"$tmp/go.mod"
(cd "$tmp" && CGO_ENABLED=0 "${GO:-go}" build -trimpath -o linked .)
# Both run from copies written with write(2), as the installer puts the
# plugin on a node: a file the linker just wrote (through a shared mapping)
# starts measurably slower here for a minute or more.
cp "$tmp/linked" "$tmp/empty-go-program"
cp "$bin" "$tmp/consul-cni"
hyperfine -N --warmup 20 --runs "${RUNS:-300}" --export-json "$tmp/out.json" \
	"$tmp/empty-go-program" "$tmp/consul-cni --version"
python3 - "$tmp/out.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    name = r["command"].rsplit("/", 1)[-1]
    print(f"{name:24s} median {r['median']*1000:6.2f} ms  user {r['user']*1000:5.2f} ms  system {r['system']*1000:5.2f} ms")
PY
