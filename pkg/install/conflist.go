package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
)

// Names of what the installer writes into the host's CNI directories
// besides cniconf's plugin, kubeconfig and token names.
const (
	// BackupSuffix is appended to a single-network file (.conf/.json) once
	// it has been converted into a .conflist, so that the runtime no longer
	// reads it, and to a .conflist the conversion had to replace.
	BackupSuffix = ".consul-cni-orig"
	// pluginDirFile is the name of the entry written into a network's
	// plugin directory (<net dir>/<network name>/) when the primary network
	// loads its plugins from there (CNI spec 1.1).
	pluginDirFile = "zzz-consul-cni.conf"
)

// configExtensions are the files containerd, CRI-O and kubelet consider, in
// the order libcni's ConfFiles is asked for them; the files are then sorted
// by name.
var configExtensions = []string{".conf", ".conflist", ".json"}

// PluginConfig is the chain entry, with the keys consul-k8s writes.
type PluginConfig struct {
	Name string `json:"name"`
	Type string `json:"type"`
	cniconf.Settings
	// ExcludeNamespaces is written only when set (the plugin's default is
	// kube-system).
	ExcludeNamespaces []string `json:"exclude_namespaces,omitempty"`
	// Backend is written only when set (the plugin's default is
	// cniconf.BackendIptables).
	Backend string `json:"backend,omitempty"`
}

func (p PluginConfig) json() json.RawMessage {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // a struct of strings and a bool always marshals
	}
	return b
}

// Candidate is one network configuration file in the runtime's order.
type Candidate struct {
	Path string
	// Raw is the file content as read.
	Raw []byte
	// List is true for a .conflist; .conf and .json hold a single network.
	List bool
	// Network is the chain as libcni loads it (for a .conflist including
	// plugins from its plugin directory); nil when Err is set.
	Network *libcni.NetworkConfigList
	// Err says why the runtime would not use the file.
	Err error
}

// Valid reports whether a runtime would accept the file as a network.
func (c Candidate) Valid() bool { return c.Err == nil }

// ScanConfDir returns the network configuration files of dir sorted by
// name, the order containerd, CRI-O and kubelet use, each loaded and judged
// the way they do. A missing dir is not an error: it has no candidates.
func ScanConfDir(dir string) ([]Candidate, error) {
	files, err := libcni.ConfFiles(dir, configExtensions)
	if err != nil {
		return nil, fmt.Errorf("listing CNI configurations in %s: %w", dir, err)
	}
	sort.Strings(files)
	out := make([]Candidate, 0, len(files))
	for _, f := range files {
		out = append(out, loadSettled(f))
	}
	return out, nil
}

// A file written in place (truncated, then written: consul-k8s's installer
// writes the list so) is empty or partial for a moment. inPlaceWindow is
// how recently an invalid file must have been modified to be read again,
// every restoreDebounce, before it is judged invalid.
const inPlaceWindow = 100 * time.Millisecond

// loadSettled loads path, reading it again while it is invalid and was
// modified within inPlaceWindow: a pass that follows a write in place by
// restoreDebounce never takes a list being written for a broken one (and
// chains another network instead).
func loadSettled(path string) Candidate {
	c := loadCandidate(path)
	for i := 0; !c.Valid() && i < int(inPlaceWindow/restoreDebounce) && modifiedWithin(path, inPlaceWindow); i++ {
		time.Sleep(restoreDebounce)
		c = loadCandidate(path)
	}
	return c
}

func loadCandidate(path string) Candidate {
	c := Candidate{Path: path, List: strings.HasSuffix(path, ".conflist")}
	raw, err := os.ReadFile(path)
	if err != nil {
		c.Err = err
		return c
	}
	c.Raw = raw
	if c.List {
		// Load from the file, not the bytes: plugins may also come from the
		// network's plugin directory.
		n, err := libcni.NetworkConfFromFile(path)
		if err != nil {
			c.Err = err
			return c
		}
		if len(n.Plugins) == 0 {
			c.Err = errors.New("no plugins")
			return c
		}
		c.Network = n
		return c
	}
	conf, err := libcni.ConfFromBytes(raw)
	if err != nil {
		c.Err = err
		return c
	}
	if conf.Network.Type == "" {
		c.Err = errors.New("no plugin type (a list in a single-network file?)")
		return c
	}
	n, err := libcni.ConfListFromConf(conf)
	if err != nil {
		c.Err = err
		return c
	}
	c.Network = n
	return c
}

// Primary returns the network the runtime uses: the lexically first valid
// configuration file, and the invalid files sorted before it (a strict
// runtime such as containerd refuses to load any network while those are
// broken; CRI-O and kubelet skip them). ok is false when there is none.
func Primary(cands []Candidate) (primary Candidate, invalidBefore []Candidate, ok bool) {
	for _, c := range cands {
		if c.Valid() {
			return c, invalidBefore, true
		}
		invalidBefore = append(invalidBefore, c)
	}
	return Candidate{}, invalidBefore, false
}

// EntryPlacement describes where the plugin sits in a network's effective chain.
type EntryPlacement struct {
	// Count is the number of consul-cni entries in the chain.
	Count int
	// Last is true when the only consul-cni entry is the last plugin.
	Last bool
	// Entry is that entry's raw configuration (the last one seen).
	Entry []byte
	// Plugins is the number of plugins in the chain.
	Plugins int
}

// FindEntry reports where the plugin sits in the network as loaded by libcni.
func FindEntry(n *libcni.NetworkConfigList) EntryPlacement {
	var s EntryPlacement
	if n == nil {
		return s
	}
	s.Plugins = len(n.Plugins)
	for i, p := range n.Plugins {
		if p.Network.Type == cniconf.PluginType {
			s.Count++
			s.Entry = p.Bytes
			s.Last = i == len(n.Plugins)-1
		}
	}
	s.Last = s.Last && s.Count == 1
	return s
}

// list is a .conflist decoded only as far as the installer needs: every
// top-level key and every plugin stays as it was written.
type list struct {
	top     map[string]json.RawMessage
	plugins []json.RawMessage
	// hasPlugins is false when the file has no "plugins" key (its plugins
	// come from the plugin directory).
	hasPlugins bool
}

func decodeList(data []byte) (*list, error) {
	l := &list{}
	if err := json.Unmarshal(data, &l.top); err != nil {
		return nil, fmt.Errorf("configuration list is not a JSON object: %w", err)
	}
	if l.top == nil {
		return nil, errors.New("configuration list is null")
	}
	raw, ok := l.top["plugins"]
	if !ok {
		return l, nil
	}
	l.hasPlugins = true
	if err := json.Unmarshal(raw, &l.plugins); err != nil {
		return nil, fmt.Errorf("configuration list: \"plugins\" is not a list: %w", err)
	}
	return l, nil
}

func (l *list) encode() ([]byte, error) {
	if l.hasPlugins {
		if l.plugins == nil {
			l.plugins = []json.RawMessage{}
		}
		b, err := encodeJSON(l.plugins, "")
		if err != nil {
			return nil, err
		}
		l.top["plugins"] = b
	}
	return marshalConfig(l.top)
}

// marshalConfig renders a configuration the way consul-k8s and most CNI
// installers do: indented, with a final newline.
func marshalConfig(v any) ([]byte, error) {
	return encodeJSON(v, "  ")
}

// encodeJSON encodes without HTML escaping, so that values written by
// others ("<", "&") stay as they were; the result ends with a newline.
func encodeJSON(v any, indent string) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if indent != "" {
		enc.SetIndent("", indent)
	}
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// loadOnlyInlined reads the list's loadOnlyInlinedPlugins the way libcni
// does (a bool or the strings "true"/"false").
func (l *list) loadOnlyInlined() bool {
	raw, ok := l.top["loadOnlyInlinedPlugins"]
	if !ok {
		return false
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch t := v.(type) {
	case bool:
		return t
	case string:
		return strings.EqualFold(t, "true")
	}
	return false
}

func (l *list) name() string {
	var n string
	_ = json.Unmarshal(l.top["name"], &n)
	return n
}

func pluginType(raw json.RawMessage) string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &p)
	return p.Type
}

// sameJSON reports whether two JSON documents are equal as values.
func sameJSON(a, b []byte) bool {
	var va, vb any
	da := json.NewDecoder(bytes.NewReader(a))
	da.UseNumber()
	db := json.NewDecoder(bytes.NewReader(b))
	db.UseNumber()
	if da.Decode(&va) != nil || db.Decode(&vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// withoutPlugin drops every consul-cni entry; changed reports whether any
// was there.
func (l *list) withoutPlugin() (changed bool) {
	return l.withoutEntries(func(p []byte) bool { return pluginType(p) == cniconf.PluginType })
}

// withoutEntries drops the inline plugins match selects; changed reports
// whether any was there.
func (l *list) withoutEntries(match func([]byte) bool) (changed bool) {
	kept := l.plugins[:0:0]
	for _, p := range l.plugins {
		if match(p) {
			changed = true
			continue
		}
		kept = append(kept, p)
	}
	l.plugins = kept
	return changed
}

// listHasPlugin reports whether a configuration list has an inline
// consul-cni entry.
func listHasPlugin(data []byte) bool {
	l, err := decodeList(data)
	if err != nil {
		return false
	}
	for _, p := range l.plugins {
		if pluginType(p) == cniconf.PluginType {
			return true
		}
	}
	return false
}

// ChainInline returns the configuration list data with exactly one
// consul-cni entry, entry, as its last inline plugin. changed is false when
// data already had exactly that. Every other key and plugin is kept as it
// was.
func ChainInline(data []byte, entry []byte) (out []byte, changed bool, err error) {
	l, err := decodeList(data)
	if err != nil {
		return nil, false, err
	}
	n := len(l.plugins)
	if n > 0 && pluginType(l.plugins[n-1]) == cniconf.PluginType && sameJSON(l.plugins[n-1], entry) {
		others := 0
		for _, p := range l.plugins[:n-1] {
			if pluginType(p) == cniconf.PluginType {
				others++
			}
		}
		if others == 0 {
			return data, false, nil
		}
	}
	l.withoutPlugin()
	l.hasPlugins = true
	l.plugins = append(l.plugins, json.RawMessage(entry))
	out, err = l.encode()
	return out, true, err
}

// UnchainInline returns the configuration list data without any consul-cni
// entry; changed is false when there was none.
func UnchainInline(data []byte) (out []byte, changed bool, err error) {
	l, err := decodeList(data)
	if err != nil {
		return nil, false, err
	}
	if !l.withoutPlugin() {
		return data, false, nil
	}
	out, err = l.encode()
	return out, true, err
}

// ConvertSingle turns a single-network configuration (.conf/.json) into a
// configuration list holding that network's plugin followed by entry, the
// way libcni up-converts such a file (name and cniVersion move to the list).
func ConvertSingle(data []byte, entry []byte) ([]byte, error) {
	conf, err := libcni.ConfFromBytes(data)
	if err != nil {
		return nil, err
	}
	if conf.Network.Type == "" {
		return nil, errors.New("no plugin type")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		return nil, err
	}
	top := map[string]any{
		"name":    conf.Network.Name,
		"plugins": []json.RawMessage{compact.Bytes(), entry},
	}
	if conf.Network.CNIVersion != "" {
		top["cniVersion"] = conf.Network.CNIVersion
	}
	return marshalConfig(top)
}

// usesPluginDir reports whether the network at path takes plugins from its
// plugin directory, where libcni appends them after the inline ones: then
// the entry must go there to be last.
func usesPluginDir(path string, l *list) (bool, error) {
	if l.loadOnlyInlined() {
		return false, nil
	}
	if !l.hasPlugins {
		return true, nil
	}
	foreign, err := pluginDirFiles(path, l.name(), false)
	if err != nil {
		return false, err
	}
	return len(foreign) > 0, nil
}

// pluginDirFiles lists the .conf files of the network's plugin directory in
// libcni's order: the installer's own entries (consul-cni type) when ours is
// true, every other file otherwise.
func pluginDirFiles(listPath, network string, ours bool) ([]string, error) {
	if network == "" || strings.ContainsAny(network, `/\`) || network == "." || network == ".." {
		return nil, nil
	}
	dir := filepath.Join(filepath.Dir(listPath), network)
	files, err := libcni.ConfFiles(dir, []string{".conf"})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		if (pluginType(b) == cniconf.PluginType) == ours {
			out = append(out, f)
		}
	}
	return out, nil
}

// pluginDirEntryName picks a file name for the entry that sorts after every
// other plugin file of the directory.
func pluginDirEntryName(foreign []string) string {
	name := pluginDirFile
	if n := len(foreign); n > 0 {
		last := filepath.Base(foreign[n-1])
		if last >= name {
			name = last + "-" + pluginDirFile
		}
	}
	return name
}
