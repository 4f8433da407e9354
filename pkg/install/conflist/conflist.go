// Package conflist reads and edits CNI network configuration files the way
// the runtime loads them, for the installer (which chains consul-cni into
// the node's network and takes it out again) and the node verifier.
//
// Which network a runtime uses is decided as containerd, CRI-O and kubelet
// decide it: the .conf, .conflist and .json files of the net directory
// sorted by name, each loaded with libcni (a .conflist with the plugins of
// its plugin directory, <net dir>/<network>/, appended), and the first
// valid one wins (ScanConfDir, Primary); FindEntry says where consul-cni
// sits in its chain. A file that another writer is rewriting in place is
// read again for a moment before it is judged invalid.
//
// Edits touch nothing but consul-cni entries: a list is decoded only as far
// as its top-level keys and plugins (List), every other byte of another
// writer's plugins is kept, values are compared as JSON, not text
// (SameJSON), and the output is indented without HTML escaping, as
// consul-k8s and most installers write. ChainInline makes the entry the
// last inline plugin exactly once; where the network takes plugins from
// its plugin directory, libcni appends those after the inline ones, so the
// entry goes there instead, under a name that sorts last
// (UsesPluginDir, PluginDirEntryName). ConvertSingle turns a single-network
// file into a list the way libcni up-converts it, and ConvertedFrom tells
// such a conversion apart from a list someone else wrote, so that only the
// installer's own conversions are undone.
package conflist

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
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// PluginDirFile is the name of the entry written into a network's plugin
// directory (<net dir>/<network name>/) when the network loads its plugins
// from there (CNI spec 1.1).
const PluginDirFile = "zzz-consul-cni.conf"

// Extensions are the files containerd, CRI-O and kubelet consider, in
// the order libcni's ConfFiles is asked for them; the files are then sorted
// by name.
var Extensions = []string{".conf", ".conflist", ".json"}

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

// JSON is the entry as it is written into a list.
func (p PluginConfig) JSON() json.RawMessage {
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
	files, err := libcni.ConfFiles(dir, Extensions)
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
// every SettleStep, before it is judged invalid.
const inPlaceWindow = 100 * time.Millisecond

// SettleStep is how often a file written in place is read again.
const SettleStep = 5 * time.Millisecond

// loadSettled loads path, reading it again while it is invalid and was
// modified within inPlaceWindow: a pass that follows a write in place by
// SettleStep never takes a list being written for a broken one (and chains
// another network instead).
func loadSettled(path string) Candidate {
	c := loadCandidate(path)
	for i := 0; !c.Valid() && i < int(inPlaceWindow/SettleStep) && nodefile.ModifiedWithin(path, inPlaceWindow); i++ {
		time.Sleep(SettleStep)
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

// List is a .conflist decoded only as far as the installer needs: every
// top-level key and every plugin stays as it was written.
type List struct {
	top     map[string]json.RawMessage
	plugins []json.RawMessage
	// hasPlugins is false when the file has no "plugins" key (its plugins
	// come from the plugin directory).
	hasPlugins bool
}

// DecodeList decodes a configuration list as far as List needs.
func DecodeList(data []byte) (*List, error) {
	l := &List{}
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

// Encode renders the list with its plugins as they are now.
func (l *List) Encode() ([]byte, error) {
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
	return Marshal(l.top)
}

// Marshal renders a configuration the way consul-k8s and most CNI
// installers do: indented, with a final newline.
func Marshal(v any) ([]byte, error) {
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
func (l *List) loadOnlyInlined() bool {
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

// Name is the network's name.
func (l *List) Name() string {
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

// SameJSON reports whether two JSON documents are equal as values.
func SameJSON(a, b []byte) bool {
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

// WithoutPlugin drops every consul-cni entry; changed reports whether any
// was there.
func (l *List) WithoutPlugin() (changed bool) {
	return l.WithoutEntries(func(p []byte) bool { return pluginType(p) == cniconf.PluginType })
}

// WithoutEntries drops the inline plugins match selects; changed reports
// whether any was there.
// Plugins are the list's inline plugins as written.
func (l *List) Plugins() []json.RawMessage { return l.plugins }

func (l *List) WithoutEntries(match func([]byte) bool) (changed bool) {
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

// HasPlugin reports whether a configuration list has an inline
// consul-cni entry.
func HasPlugin(data []byte) bool {
	l, err := DecodeList(data)
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
	l, err := DecodeList(data)
	if err != nil {
		return nil, false, err
	}
	n := len(l.plugins)
	if n > 0 && pluginType(l.plugins[n-1]) == cniconf.PluginType && SameJSON(l.plugins[n-1], entry) {
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
	l.WithoutPlugin()
	l.hasPlugins = true
	l.plugins = append(l.plugins, json.RawMessage(entry))
	out, err = l.Encode()
	return out, true, err
}

// UnchainInline returns the configuration list data without any consul-cni
// entry; changed is false when there was none.
func UnchainInline(data []byte) (out []byte, changed bool, err error) {
	l, err := DecodeList(data)
	if err != nil {
		return nil, false, err
	}
	if !l.WithoutPlugin() {
		return data, false, nil
	}
	out, err = l.Encode()
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
	return Marshal(top)
}

// UsesPluginDir reports whether the network at path takes plugins from its
// plugin directory, where libcni appends them after the inline ones: then
// the entry must go there to be last.
func UsesPluginDir(path string, l *List) (bool, error) {
	if l.loadOnlyInlined() {
		return false, nil
	}
	if !l.hasPlugins {
		return true, nil
	}
	foreign, err := PluginDirFiles(path, l.Name(), false)
	if err != nil {
		return false, err
	}
	return len(foreign) > 0, nil
}

// PluginDirFiles lists the .conf files of the network's plugin directory in
// libcni's order: the consul-cni entries when ours is true, every other file otherwise.
func PluginDirFiles(listPath, network string, ours bool) ([]string, error) {
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

// PluginDirEntryName picks a file name for the entry that sorts after every
// other plugin file of the directory.
func PluginDirEntryName(foreign []string) string {
	name := PluginDirFile
	if n := len(foreign); n > 0 {
		last := filepath.Base(foreign[n-1])
		if last >= name {
			name = last + "-" + PluginDirFile
		}
	}
	return name
}

// ConvertedFrom reports whether list is what converting single made of it
// (ConvertSingle), consul-cni entries aside.
func ConvertedFrom(list, single []byte) bool {
	want, err := ConvertSingle(single, []byte(`{"type":"`+cniconf.PluginType+`"}`))
	if err != nil {
		return false
	}
	norm := func(b []byte) ([]byte, bool) {
		l, err := DecodeList(b)
		if err != nil {
			return nil, false
		}
		l.WithoutPlugin()
		out, err := l.Encode()
		return out, err == nil
	}
	a, okA := norm(list)
	b, okB := norm(want)
	return okA && okB && SameJSON(a, b)
}
