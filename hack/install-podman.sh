#!/usr/bin/env bash
# Installs what `make test-images` runs the built images with, when missing:
# podman, conmon and runc (Debian's crun 1.8 refuses hybrid cgroup
# hierarchies, so the tests run runc).
exec "$(dirname "$0")/apt-install.sh" podman=podman runc=runc conmon=conmon
