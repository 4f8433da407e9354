package iptables_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
)

// goldenCase is a redirect configuration with a golden file
// testdata/<name>.golden. sdk says whether Consul's SDK can apply it (the
// privileged tests then compare our table with the SDK's).
type goldenCase struct {
	name string
	json string
	dual bool
	sdk  bool
}

// upstreamDefault is what the consul-k8s webhook writes for a default pod.
const upstreamDefault = `{"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,` +
	`"ProxyOutboundPort":15001,"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":null,` +
	`"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

// tenOfEach is a config with 10 exclusions of each kind.
func tenOfEach(dns string) string {
	var in, out, cidrs, uids []string
	for i := 0; i < 10; i++ {
		in = append(in, fmt.Sprintf("%q", fmt.Sprint(8000+i)))
		out = append(out, fmt.Sprintf("%q", fmt.Sprint(9000+i)))
		cidrs = append(cidrs, fmt.Sprintf("%q", fmt.Sprintf("10.%d.0.0/16", 100+i)))
		uids = append(uids, fmt.Sprintf("%q", fmt.Sprint(6000+i)))
	}
	return `{` + dns + `"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,` +
		`"ExcludeInboundPorts":[` + strings.Join(in, ",") + `],"ExcludeOutboundPorts":[` + strings.Join(out, ",") + `],` +
		`"ExcludeOutboundCIDRs":[` + strings.Join(cidrs, ",") + `],"ExcludeUIDs":[` + strings.Join(uids, ",") + `]}`
}

var goldenCases = []goldenCase{
	{name: "default", json: upstreamDefault, sdk: true},
	{name: "minimal", json: `{"ProxyUserID":"5995","ProxyInboundPort":20000}`, sdk: true},
	{name: "dns-ip-only", json: `{"ConsulDNSIP":"198.18.200.53","ProxyUserID":"5995","ProxyInboundPort":20000}`, sdk: true},
	{name: "dns-port-only", json: `{"ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15002}`, sdk: true},
	{name: "many-exclusions", json: tenOfEach(`"ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600,`), sdk: true},
	{name: "dual-stack", json: `{"ConsulDNSIP":"::1","ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000,` +
		`"ExcludeInboundPorts":["20200","21000"],"ExcludeOutboundPorts":["5432"],"ExcludeUIDs":["5996"]}`, dual: true, sdk: true},
	{name: "dual-stack-dns-ip-only", json: `{"ConsulDNSIP":"fd63:6372:ffff::53","ProxyUserID":"5995","ProxyInboundPort":20000}`, dual: true, sdk: true},
	{name: "dual-stack-dns-port-only", json: `{"ConsulDNSPort":8600,"ProxyUserID":"5995","ProxyInboundPort":20000}`, dual: true, sdk: true},
	// Port ranges in both exclude lists, as consul-k8s's plugin applies
	// them: the SDK hands "a:b" to --dport.
	{name: "port-ranges", json: `{"ProxyUserID":"5995","ProxyInboundPort":20000,` +
		`"ExcludeInboundPorts":["20200:20300","21000"],"ExcludeOutboundPorts":["8000:8100","9090","1:65535"]}`, sdk: true},
	{name: "dual-stack-port-ranges", json: `{"ConsulDNSIP":"::1","ProxyUserID":"5995","ProxyInboundPort":20000,` +
		`"ExcludeInboundPorts":["20200:20300"],"ExcludeOutboundPorts":["8000:8100"]}`, dual: true, sdk: true},
	// The SDK cannot apply this one (it passes every CIDR to both iptables
	// and ip6tables); each family gets its own CIDRs here.
	{name: "dual-stack-mixed-cidrs", json: `{"ProxyUserID":"5995","ProxyInboundPort":20000,` +
		`"ExcludeOutboundCIDRs":["10.0.0.0/8","fd00::/8","192.168.1.7","2001:db8::1"]}`, dual: true},
}

func (c goldenCase) config(t testing.TB) annotations.TrafficConfig {
	t.Helper()
	cfg, err := annotations.ParseRedirectTrafficConfig([]byte(c.json), c.dual)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	return cfg
}

// Golden file layout: "## <family> <section>" headers, each followed by
// its text.
const (
	secRestore = "iptables-restore --noflush input"
	secTable   = "nat table after ADD (iptables-save -t nat)"
)

func renderGolden(c goldenCase, sets []iptables.RuleSet, tables map[redirect.Family]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s (dual stack: %v)\n# %s\n", c.name, c.dual, c.json)
	for _, rs := range sets {
		fmt.Fprintf(&b, "## %s %s\n%s", rs.Family, secRestore, rs.RestoreNew())
		fmt.Fprintf(&b, "## %s %s\n%s", rs.Family, secTable, tables[rs.Family])
	}
	return b.String()
}

// goldenSection returns one section of a golden file.
func goldenSection(golden string, fam redirect.Family, section string) (string, bool) {
	head := "## " + fam.String() + " " + section + "\n"
	i := strings.Index(golden, head)
	if i < 0 {
		return "", false
	}
	rest := golden[i+len(head):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j+1]
	}
	return rest, true
}
