package main

import (
	"context"
	"encoding/json"
	"flag"
	"net"
	"os"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Report is what "podprog report" writes.
type Report struct {
	UID        int               `json:"uid"`
	GID        int               `json:"gid"`
	Kubeconfig string            `json:"kubeconfig"`
	User       string            `json:"user"`
	UserError  string            `json:"userError,omitempty"`
	Files      map[string]string `json:"files"`
	Addrs      []string          `json:"addrs"`
	Args       []string          `json:"args"`
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func report(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	out := fs.String("out", "", "report file")
	var files multiFlag
	fs.Var(&files, "file", "file to include (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r := Report{UID: os.Getuid(), GID: os.Getgid(), Kubeconfig: os.Getenv("KUBECONFIG"), Files: map[string]string{}, Args: os.Args}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			r.Files[f] = "ERROR: " + err.Error()
			continue
		}
		r.Files[f] = string(b)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			r.Addrs = append(r.Addrs, a.String())
		}
	}
	if cfg, err := clientcmd.BuildConfigFromFlags("", r.Kubeconfig); err != nil {
		r.UserError = err.Error()
	} else if cs, err := kubernetes.NewForConfig(cfg); err != nil {
		r.UserError = err.Error()
	} else if ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{}); err != nil {
		r.UserError = err.Error()
	} else {
		r.User = ssr.Status.UserInfo.Username
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}
