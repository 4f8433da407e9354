package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
)

// consulK8sKubeconfig is the kubeconfig file consul-k8s's installer writes.
const consulK8sKubeconfig = cniconf.ConsulK8sKubeconfigFileName

// installCNI stands in for consul-k8s's install-cni: it copies the plugin,
// writes a kubeconfig with the service-account token embedded, appends the
// consul-cni entry (consul-k8s's keys) to the first .conflist, and on
// SIGTERM removes the entry, the binary and the kubeconfig again.
func installCNI(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("install-cni", flag.ContinueOnError)
	binDir := fs.String("bin-dir", "", "CNI bin directory")
	netDir := fs.String("net-dir", "", "CNI configuration directory")
	plugin := fs.String("plugin", "", "the consul-cni binary to install")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *binDir == "" || *netDir == "" || *plugin == "" {
		return errors.New("install-cni: --bin-dir, --net-dir and --plugin are required")
	}
	b, err := os.ReadFile(*plugin)
	if err != nil {
		return err
	}
	bin := filepath.Join(*binDir, "consul-cni")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		return err
	}
	kc := filepath.Join(*netDir, consulK8sKubeconfig)
	if err := writeEmbeddedKubeconfig(kc); err != nil {
		return err
	}
	list, err := editFirstList(*netDir, func(plugins []map[string]any) []map[string]any {
		return append(plugins, map[string]any{"name": cniconf.PluginName, "type": cniconf.PluginType,
			cniconf.KeyCNIBinDir: *binDir, cniconf.KeyCNINetDir: *netDir, cniconf.KeyKubeconfig: consulK8sKubeconfig,
			cniconf.KeyLogLevel: "info", cniconf.KeyMultus: false})
	})
	if err != nil {
		return err
	}
	fmt.Println("install-cni: chained consul-cni into", list)
	<-ctx.Done()
	if _, err := editFirstList(*netDir, func(plugins []map[string]any) []map[string]any {
		kept := plugins[:0]
		for _, p := range plugins {
			if p["type"] != "consul-cni" {
				kept = append(kept, p)
			}
		}
		return kept
	}); err != nil {
		return err
	}
	fmt.Println("install-cni: removed consul-cni from", list)
	return errors.Join(os.Remove(bin), os.Remove(kc))
}

// writeEmbeddedKubeconfig writes the container's client configuration with
// its token embedded, as consul-k8s does.
func writeEmbeddedKubeconfig(path string) error {
	cfg, err := clientcmd.LoadFromFile(os.Getenv("KUBECONFIG"))
	if err != nil {
		return err
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil {
		return fmt.Errorf("KUBECONFIG: no current context")
	}
	cl, user := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	if cl == nil || user == nil {
		return fmt.Errorf("KUBECONFIG: context %q incomplete", cfg.CurrentContext)
	}
	ca := cl.CertificateAuthorityData
	if len(ca) == 0 && cl.CertificateAuthority != "" {
		if ca, err = os.ReadFile(cl.CertificateAuthority); err != nil {
			return err
		}
	}
	tok := user.Token
	if user.TokenFile != "" {
		b, err := os.ReadFile(user.TokenFile)
		if err != nil {
			return err
		}
		tok = strings.TrimSpace(string(b))
	}
	out := clientcmdapi.NewConfig()
	out.Clusters["local"] = &clientcmdapi.Cluster{Server: cl.Server, CertificateAuthorityData: ca, TLSServerName: cl.TLSServerName}
	out.AuthInfos["consul-cni"] = &clientcmdapi.AuthInfo{Token: tok}
	out.Contexts["consul-cni"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "consul-cni"}
	out.CurrentContext = "consul-cni"
	return clientcmd.WriteToFile(*out, path)
}

// editFirstList rewrites the plugins of the lexically first .conflist.
func editFirstList(dir string, edit func([]map[string]any) []map[string]any) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.conflist"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no .conflist in %s (%v)", dir, err)
	}
	sort.Strings(files)
	b, err := os.ReadFile(files[0])
	if err != nil {
		return "", err
	}
	var top map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		return "", err
	}
	var plugins []map[string]any
	raw, _ := json.Marshal(top["plugins"])
	if err := json.Unmarshal(raw, &plugins); err != nil {
		return "", err
	}
	top["plugins"] = edit(plugins)
	out, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return "", err
	}
	tmp := files[0] + ".install-cni.tmp"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return "", err
	}
	return files[0], os.Rename(tmp, files[0])
}
