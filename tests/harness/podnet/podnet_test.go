package podnet

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

func TestAllocSubnetHandsOutEachIndexOnceUntilReleased(t *testing.T) {
	seen := map[int]bool{}
	var releases []func()
	for range maxSubnets {
		i, release, err := AllocSubnet()
		if err != nil {
			t.Fatal(err)
		}
		if seen[i] {
			t.Fatalf("index %d handed out twice", i)
		}
		seen[i] = true
		releases = append(releases, release)
	}
	if _, _, err := AllocSubnet(); err == nil {
		t.Fatal("a full table handed out another subnet")
	}
	releases[3]()
	i, release, err := AllocSubnet()
	if err != nil || !seen[i] {
		t.Fatalf("after a release got %d, %v; want a released index", i, err)
	}
	release()
	for j, r := range releases {
		if j != 3 {
			r()
		}
	}
}

func TestConflistGivesAddressesOfTheSubnetFromDataDir(t *testing.T) {
	var conf struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type   string `json:"type"`
			IPMasq bool   `json:"ipMasq"`
			IPAM   struct {
				Type    string                `json:"type"`
				Ranges  [][]map[string]string `json:"ranges"`
				DataDir string                `json:"dataDir"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	b := Conflist("/n/cni/networks", netip.MustParsePrefix("198.18.3.7/24"))
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	if conf.Name != NetworkName || len(conf.Plugins) != 1 {
		t.Fatalf("conflist %s", b)
	}
	p := conf.Plugins[0]
	if p.Type != "ptp" || p.IPMasq || p.IPAM.Type != "host-local" || p.IPAM.DataDir != "/n/cni/networks" ||
		len(p.IPAM.Ranges) != 1 || p.IPAM.Ranges[0][0]["subnet"] != "198.18.3.0/24" {
		t.Fatalf("conflist %s", b)
	}
}

func TestCopyExecutableLeavesAnExecutableCopyAndNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CopyExecutable(src, dst); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil || fi.Mode().Perm()&0o111 == 0 || fi.Size() != 10 {
		t.Fatalf("copy: %v, %v", fi, err)
	}
	if _, err := os.Stat(dst + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left: %v", err)
	}
	if err := CopyExecutable(filepath.Join(dir, "missing"), dst); err == nil {
		t.Fatal("copying a missing file succeeded")
	}
}
