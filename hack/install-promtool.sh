#!/usr/bin/env bash
# Installs promtool (Debian's prometheus package) when it is missing: the
# alert rules' unit tests run `promtool test rules`. The prometheus service
# the package may start is stopped; the tests only use promtool.
exec "$(dirname "$0")/apt-install.sh" --stop prometheus promtool=prometheus
