package manifests

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// walkthroughMarker precedes, on a line of its own, each ```sh block of the
// walkthrough page that belongs to the local walkthrough.
const walkthroughMarker = "<!-- local-walkthrough -->"

// walkthroughPage is the page that holds the local walkthrough.
const walkthroughPage = "docs/demo.md"

// The namespace and app of docs/examples/local-cluster.
const (
	exampleNamespace = "example"
	exampleApp       = "web"
)

// walkthroughBlocks returns the page's local-walkthrough blocks, in order.
func walkthroughBlocks(page []byte) ([]string, error) {
	return markedBlocks(page, walkthroughPage, walkthroughMarker)
}

// markedBlocks returns the ```sh blocks of a page (named file in errors)
// that follow marker on a line of their own, in order.
func markedBlocks(page []byte, file, marker string) ([]string, error) {
	var blocks []string
	sc := bufio.NewScanner(bytes.NewReader(page))
	line := 0
	next := func() (string, bool) {
		ok := sc.Scan()
		line++
		return sc.Text(), ok
	}
	for {
		l, ok := next()
		if !ok {
			break
		}
		if strings.TrimSpace(l) != marker {
			continue
		}
		at := line
		if l, ok = next(); !ok || strings.TrimSpace(l) != "```sh" {
			return nil, fmt.Errorf("%s:%d: %s is not followed by a ```sh block", file, at, marker)
		}
		var b strings.Builder
		for {
			if l, ok = next(); !ok {
				return nil, fmt.Errorf("%s:%d: the block after %s never ends", file, at, marker)
			}
			if strings.TrimSpace(l) == "```" {
				break
			}
			b.WriteString(l + "\n")
		}
		blocks = append(blocks, b.String())
	}
	return blocks, sc.Err()
}

func TestWalkthroughBlocksExtracted(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), walkthroughPage))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := walkthroughBlocks(b)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(blocks, "")
	for _, want := range []string{"manifests/overlays/audit", "docs/examples/local-cluster", "bypass.sh", repair.EventWouldRepair, "manifests/base", repair.EventBypassedCNI} {
		if !strings.Contains(all, want) {
			t.Errorf("the local walkthrough of %s (%d blocks) never mentions %q", walkthroughPage, len(blocks), want)
		}
	}
	if _, err := walkthroughBlocks([]byte(walkthroughMarker + "\n```\nls\n```\n")); err == nil {
		t.Error("a marker before a block that is not ```sh was accepted")
	}
}
