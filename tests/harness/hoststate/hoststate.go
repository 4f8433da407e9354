// Package hoststate records the parts of the host's state a test run could
// change, and compares two records. `make test` and `make demo` record the
// host before they start anything and compare after everything stopped
// (tests/cmd/hoststate): the harness works in namespaces it owns, and a run
// that leaves the host different from how it found it fails and lists the
// difference.
//
// What is recorded, each as a sorted list of lines:
//   - sysctl: the forwarding and proxy-ARP switches (a fresh machine has
//     forwarding off; a run that depends on it proves nothing there), and the
//     kernel tunables kubelet sets;
//   - route4, route6, rule4, rule6: the main routing tables and the policy
//     rules;
//   - link, netns: the host's network interfaces and named network namespaces;
//   - iptables, ip6tables, iptables-legacy, ip6tables-legacy, nft: the init
//     namespace's rulesets, without counters;
//   - mount: every mount point;
//   - cgroup: kubelet's kubepods and the test nodes' cgroups in every hierarchy;
//   - hostfile: entries in the host paths containerd, libcni and kubelet write
//     whatever their configuration says;
//   - process: processes of the programs a run starts (only new ones count:
//     a process that ended is no difference).
package hoststate

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// State is a record: section name to sorted lines.
type State map[string][]string

// Sysctls are the switches recorded (below /proc/sys).
var Sysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/forwarding",
	"net/ipv4/conf/default/forwarding",
	"net/ipv4/conf/all/proxy_arp",
	"net/ipv4/conf/default/proxy_arp",
	"net/ipv6/conf/all/forwarding",
	"net/ipv6/conf/default/forwarding",
	"net/ipv6/conf/all/proxy_ndp",
	// kubelet's kernel tunables (protectKernelDefaults: false sets them)
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
	"fs/inotify/max_user_instances",
	"fs/inotify/max_user_watches",
}

// Programs are the executables (base names) of processes a run starts.
var Programs = []string{
	"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "helm",
	"containerd", "containerd-shim-runc-v2", "runc", "ctr", "pause",
	"consul-cni", "consul-cni-installer", "consul-cni-check", "consul-cni-verifier", "repair", "install-cni",
	"podprog", "netprobe", "registry", "docker-registry", "podman", "conmon",
}

// HostPaths are the directories whose entries are recorded.
var HostPaths = []string{"/run/containerd/s", "/var/lib/cni/results", "/var/lib/kubelet/device-plugins", "/var/log/containers"}

// Snapshot records the host's state now.
func Snapshot() State {
	s := State{}
	s["sysctl"] = sysctls()
	s["route4"] = cmdLines(normRoute, "ip", "-4", "route", "show", "table", "main")
	s["route6"] = cmdLines(normRoute, "ip", "-6", "route", "show", "table", "main")
	s["rule4"] = cmdLines(nil, "ip", "-4", "rule", "show")
	s["rule6"] = cmdLines(nil, "ip", "-6", "rule", "show")
	s["link"] = cmdLines(linkName, "ip", "-o", "link", "show")
	s["netns"] = cmdLines(firstField, "ip", "netns", "list")
	for _, t := range [][]string{{"iptables", "iptables-save"}, {"ip6tables", "ip6tables-save"},
		{"iptables-legacy", "iptables-legacy-save"}, {"ip6tables-legacy", "ip6tables-legacy-save"}, {"nft", "nft", "list", "ruleset"}} {
		if _, err := exec.LookPath(t[1]); err == nil {
			s[t[0]] = cmdLines(normRules, t[1], t[2:]...)
		}
	}
	s["mount"] = mounts()
	s["cgroup"] = cgroups()
	s["hostfile"] = hostFiles()
	s["process"] = processes()
	return s
}

// Diff lists what differs from before to after, a line each ("+" added,
// "-" gone); processes count only when added.
func Diff(before, after State) []string {
	var names []string
	for k := range before {
		names = append(names, k)
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var d []string
	for _, k := range names {
		b, a := set(before[k]), set(after[k])
		for _, l := range after[k] {
			if !b[l] {
				d = append(d, fmt.Sprintf("%s: + %s", k, l))
			}
		}
		if k == "process" {
			continue
		}
		for _, l := range before[k] {
			if !a[l] {
				d = append(d, fmt.Sprintf("%s: - %s", k, l))
			}
		}
	}
	return d
}

// Save writes the record as JSON; Load reads it.
func (s State) Save(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func Load(path string) (State, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s State
	return s, json.Unmarshal(b, &s)
}

func set(l []string) map[string]bool {
	m := make(map[string]bool, len(l))
	for _, x := range l {
		m[x] = true
	}
	return m
}

func sysctls() []string {
	var l []string
	for _, k := range Sysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			continue
		}
		l = append(l, strings.ReplaceAll(k, "/", ".")+" = "+strings.Join(strings.Fields(string(b)), " "))
	}
	return l
}

// cmdLines runs a command and returns its output's lines, each passed
// through norm (nil: kept; "" from norm: dropped), sorted and unique; a
// command that fails gives one line saying so.
func cmdLines(norm func(string) string, name string, args ...string) []string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return []string{fmt.Sprintf("(%s %s failed: %v)", name, strings.Join(args, " "), err)}
	}
	var l []string
	for _, line := range strings.Split(string(out), "\n") {
		if norm != nil {
			line = norm(line)
		}
		if line = strings.TrimSpace(line); line != "" {
			l = append(l, line)
		}
	}
	sort.Strings(l)
	return slices.Compact(l)
}

var expires = regexp.MustCompile(`\s+expires \S+`)

// normRoute drops what changes by itself (router advertisements' lifetimes).
func normRoute(l string) string { return expires.ReplaceAllString(l, "") }

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// normRules drops comments and packet counters.
func normRules(l string) string {
	if strings.HasPrefix(l, "#") {
		return ""
	}
	return counters.ReplaceAllString(l, "")
}

func linkName(l string) string {
	f := strings.Fields(l)
	if len(f) < 2 {
		return ""
	}
	name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
	return name
}

func firstField(l string) string {
	if f := strings.Fields(l); len(f) > 0 {
		return f[0]
	}
	return ""
}

func mounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"(mountinfo: " + err.Error() + ")"}
	}
	defer f.Close()
	var l []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 {
			l = append(l, fs[4])
		}
	}
	sort.Strings(l)
	return slices.Compact(l)
}

func cgroups() []string {
	var l []string
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	hier = append(hier, "/sys/fs/cgroup")
	for _, h := range hier {
		for _, pat := range []string{"kubepods*", "ccr-*", "*/kubepods*"} {
			m, _ := filepath.Glob(filepath.Join(h, pat))
			l = append(l, m...)
		}
	}
	sort.Strings(l)
	return slices.Compact(l)
}

func hostFiles() []string {
	var l []string
	for _, d := range HostPaths {
		es, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range es {
			l = append(l, filepath.Join(d, e.Name()))
		}
	}
	sort.Strings(l)
	return l
}

func processes() []string {
	es, _ := os.ReadDir("/proc")
	var l []string
	for _, e := range es {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			continue
		}
		base := filepath.Base(strings.TrimSuffix(exe, " (deleted)"))
		if slices.Contains(Programs, base) {
			l = append(l, fmt.Sprintf("%s[%d]", base, pid))
		}
	}
	sort.Strings(l)
	return l
}
