// Package version holds the one version string of the project's binaries.
//
// It is stamped at link time from hack/version.sh:
//
//	-ldflags "-X github.com/consul-cni-repair/consul-cni-repair/pkg/version.Version=v0.1.0"
//
// Every command prints it for --version, the controller and the installer
// export it in their build_info metric, and the plugin logs it.
package version

import (
	"fmt"
	"runtime"
)

// Version is the build's version; "dev" when it was not stamped.
var Version = "dev"

// String is the line every command prints for --version.
func String(command string) string {
	return fmt.Sprintf("%s %s (%s, %s/%s)", command, Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
