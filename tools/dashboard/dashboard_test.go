package dashboard_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	sdkdashboard "github.com/grafana/grafana-foundation-sdk/go/dashboard"

	dashgen "github.com/consul-cni-repair/consul-cni-repair/tools/dashboard"
)

// TestDashboardIsGenerated: the shipped dashboard JSON is exactly what
// package dashboard builds (run `make dashboard` after changing it), and it
// decodes strictly into the Grafana Foundation SDK's dashboard model and
// validates there.
func TestDashboardIsGenerated(t *testing.T) {
	want, err := dashgen.JSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", dashgen.Path) // the repository root, from this package's directory
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the dashboard built by tools/dashboard: run `make dashboard`", dashgen.Path)
	}

	plugins.RegisterDefaultPlugins()
	var d sdkdashboard.Dashboard
	if err := sdkError(d.UnmarshalJSONStrict(got)); err != nil {
		t.Fatalf("%s: not a Grafana dashboard model: %v", dashgen.Path, err)
	}
	if err := sdkError(d.Validate()); err != nil {
		t.Fatalf("%s: %v", dashgen.Path, err)
	}
	if d.Uid == nil || *d.Uid != dashgen.UID {
		t.Errorf("dashboard uid %v, want %s", d.Uid, dashgen.UID)
	}
}

// sdkError turns the SDK's empty error list (a nil cog.BuildErrors in a
// non-nil error) into nil.
func sdkError(err error) error {
	if be, ok := err.(cog.BuildErrors); ok && len(be) == 0 {
		return nil
	}
	return err
}
