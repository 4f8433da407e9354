package simnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
)

// container is one container of a pod across its restarts.
type container struct {
	spec    corev1.Container
	init    bool
	sidecar bool // an init container with restartPolicy Always

	// The current instance, while running.
	id        string
	p         *proc.Process
	startedAt time.Time
	logFile   string
	termFile  string
	probes    context.CancelFunc
	ps        *probeState // results of the instance's probes

	runs      int                              // instances started
	last      *corev1.ContainerStateTerminated // the latest termination
	prev      *corev1.ContainerStateTerminated // the one before it
	nextStart time.Time                        // earliest restart (crash-loop back-off)
	waiting   string                           // reason shown while not running
	waitMsg   string
}

// imageBase returns the basename of an image's repository:
// "registry:5000/org/podprog:1.0@sha256:..." -> "podprog".
func imageBase(image string) string {
	if i := strings.IndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndexByte(image, '/'); i >= 0 {
		image = image[i+1:]
	}
	if i := strings.IndexByte(image, ':'); i >= 0 {
		image = image[:i]
	}
	return image
}

// imageTag returns the tag of an image reference ("" when it has none):
// "registry:5000/org/podprog:1.0@sha256:..." -> "1.0".
func imageTag(image string) string {
	if i := strings.IndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndexByte(image, '/'); i >= 0 {
		image = image[i+1:]
	}
	if i := strings.IndexByte(image, ':'); i >= 0 {
		return image[i+1:]
	}
	return ""
}

// program returns the executable the node runs for an image: the
// Programs entry "<basename>:<tag>" when there is one (two versions of a
// command side by side, as in a rolling update), else "<basename>".
func (n *Node) program(image string) (string, bool) {
	base := imageBase(image)
	if tag := imageTag(image); tag != "" {
		if exe, ok := n.cfg.Programs[base+":"+tag]; ok {
			return exe, true
		}
	}
	exe, ok := n.cfg.Programs[base]
	return exe, ok
}

// argv returns the process to run for a container: the program the node
// knows for its image (command[0] replaced by it; when command[0] names
// another program the node knows, as an image that holds several commands
// runs one of them, that one), or the idle command.
func (n *Node) argv(c *corev1.Container, init bool, expand func(string) string) []string {
	exe, ok := n.program(c.Image)
	if len(c.Command) > 0 && baseName(c.Command[0]) != imageBase(c.Image) {
		if other, known := n.cfg.Programs[baseName(c.Command[0])]; known {
			exe, ok = other, true
		}
	}
	if !ok {
		if init {
			return append([]string(nil), n.cfg.InitIdleCommand...)
		}
		return append([]string(nil), n.cfg.IdleCommand...)
	}
	argv := []string{exe}
	if len(c.Command) > 0 {
		for _, a := range c.Command[1:] {
			argv = append(argv, expand(a))
		}
	}
	for _, a := range c.Args {
		argv = append(argv, expand(a))
	}
	return argv
}

// expandVars replaces $(NAME) with the variable's value when it is defined,
// and $$ with $, as kubelet does for env values, command and args.
func expandVars(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '$' && i+1 < len(s) {
			if s[i+1] == '$' {
				b.WriteByte('$')
				i++
				continue
			}
			if s[i+1] == '(' {
				if j := strings.IndexByte(s[i+2:], ')'); j >= 0 {
					name := s[i+2 : i+2+j]
					if v, ok := lookup(name); ok {
						b.WriteString(v)
					} else {
						b.WriteString(s[i : i+3+j])
					}
					i += 2 + j
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// envVars is an environment being built: values by name, names in the
// order they were first set.
type envVars struct {
	vars  map[string]string
	order []string
}

func (e *envVars) set(k, val string) {
	if _, ok := e.vars[k]; !ok {
		e.order = append(e.order, k)
	}
	e.vars[k] = val
}

// env builds the container's environment: PATH and HOSTNAME, envFrom,
// env (with $(VAR) expansion and valueFrom), KUBECONFIG for the pod's
// service account; values that are paths are rebased.
func (w *podWorker) env(ctx context.Context, pod *corev1.Pod, c *corev1.Container, v *volumes, rb *rebaser) ([]string, map[string]string, error) {
	ev := &envVars{vars: map[string]string{}}
	vars := ev.vars
	ev.set("PATH", os.Getenv("PATH"))
	ev.set("HOSTNAME", pod.Name)
	for _, ef := range c.EnvFrom {
		data, err := w.envFrom(ctx, pod.Namespace, ef)
		if err != nil {
			return nil, nil, err
		}
		for k, val := range data {
			ev.set(ef.Prefix+k, val)
		}
	}
	lookup := func(k string) (string, bool) { s, ok := vars[k]; return s, ok }
	for _, e := range c.Env {
		val := expandVars(e.Value, lookup)
		if vf := e.ValueFrom; vf != nil {
			var err error
			if val, err = w.envValueFrom(ctx, pod, vf, val); err != nil {
				return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
		}
		ev.set(e.Name, val)
	}
	// Values from the pod spec are container paths and get rebased; the
	// ones the node provides (host PATH, KUBECONFIG) are host paths already.
	fromSpec := map[string]bool{}
	for _, k := range ev.order {
		fromSpec[k] = true
	}
	delete(fromSpec, "PATH")
	delete(fromSpec, "HOSTNAME")
	for _, e := range c.Env {
		fromSpec[e.Name] = true
	}
	if _, ok := vars["KUBECONFIG"]; !ok {
		ev.set("KUBECONFIG", v.kubeconfig)
	}
	env := make([]string, 0, len(ev.order))
	for _, k := range ev.order {
		if fromSpec[k] {
			vars[k] = rb.value(vars[k])
		}
		env = append(env, k+"="+vars[k])
	}
	return env, vars, nil
}

// envFrom returns the data of an envFrom source; nil when it is an
// optional one that does not exist.
func (w *podWorker) envFrom(ctx context.Context, ns string, ef corev1.EnvFromSource) (map[string]string, error) {
	switch {
	case ef.ConfigMapRef != nil:
		cm, err := w.n.client.CoreV1().ConfigMaps(ns).Get(ctx, ef.ConfigMapRef.Name, metav1.GetOptions{})
		if err != nil {
			if ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional {
				return nil, nil
			}
			return nil, fmt.Errorf("envFrom configmap %q: %w", ef.ConfigMapRef.Name, err)
		}
		return cm.Data, nil
	case ef.SecretRef != nil:
		s, err := w.n.client.CoreV1().Secrets(ns).Get(ctx, ef.SecretRef.Name, metav1.GetOptions{})
		if err != nil {
			if ef.SecretRef.Optional != nil && *ef.SecretRef.Optional {
				return nil, nil
			}
			return nil, fmt.Errorf("envFrom secret %q: %w", ef.SecretRef.Name, err)
		}
		data := map[string]string{}
		for k, b := range s.Data {
			data[k] = string(b)
		}
		return data, nil
	}
	return nil, nil
}

// envValueFrom resolves an env entry's valueFrom; val is the entry's value,
// kept when valueFrom names no source.
func (w *podWorker) envValueFrom(ctx context.Context, pod *corev1.Pod, vf *corev1.EnvVarSource, val string) (string, error) {
	switch {
	case vf.FieldRef != nil:
		return fieldValue(pod, vf.FieldRef.FieldPath)
	case vf.ConfigMapKeyRef != nil:
		cm, err := w.n.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, vf.ConfigMapKeyRef.Name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		return cm.Data[vf.ConfigMapKeyRef.Key], nil
	case vf.SecretKeyRef != nil:
		s, err := w.n.client.CoreV1().Secrets(pod.Namespace).Get(ctx, vf.SecretKeyRef.Name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		return string(s.Data[vf.SecretKeyRef.Key]), nil
	case vf.ResourceFieldRef != nil:
		return "0", nil // resources are not simulated
	}
	return val, nil
}

// credential returns the runAsUser/runAsGroup of the container (falling
// back to the pod's security context), or nil to run as root.
func credential(pod *corev1.Pod, c *corev1.Container) *syscall.Credential {
	var uid, gid *int64
	if psc := pod.Spec.SecurityContext; psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
	}
	if uid == nil && gid == nil {
		return nil
	}
	cred := &syscall.Credential{}
	if uid != nil {
		cred.Uid = uint32(*uid)
	}
	if gid != nil {
		cred.Gid = uint32(*gid)
	}
	if psc := pod.Spec.SecurityContext; psc != nil {
		for _, g := range psc.SupplementalGroups {
			cred.Groups = append(cred.Groups, uint32(g))
		}
		if psc.FSGroup != nil {
			cred.Groups = append(cred.Groups, uint32(*psc.FSGroup))
		}
	}
	return cred
}

func (w *podWorker) containerLogDir(pod *corev1.Pod, name string) string {
	return filepath.Join(logsDir(w.n.cfg.Root), fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), name)
}

// startContainer starts a new instance of c.
func (w *podWorker) startContainer(ctx context.Context, pod *corev1.Pod, c *container) error {
	inst := c.runs
	c.runs++
	c.id = randomID()
	c.ps = &probeState{}
	c.termFile = filepath.Join(w.podDir(), "containers", c.spec.Name, fmt.Sprint(inst), "termination-log")
	if err := os.MkdirAll(filepath.Dir(c.termFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(c.termFile, nil, 0o666); err != nil {
		return err
	}
	_ = os.Chmod(c.termFile, 0o666)
	logDir := w.containerLogDir(pod, c.spec.Name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	c.logFile = filepath.Join(logDir, fmt.Sprintf("%d.log", inst))
	rb := newRebaser(&c.spec, w.vols, c.termFile)
	env, vars, err := w.env(ctx, pod, &c.spec, w.vols, rb)
	if err != nil {
		return err
	}
	lookup := func(k string) (string, bool) { s, ok := vars[k]; return s, ok }
	argv := w.n.argv(&c.spec, c.init && !c.sidecar, func(s string) string { return rb.value(expandVars(s, lookup)) })
	dir := w.podDir()
	if c.spec.WorkingDir != "" {
		if d := rb.path(c.spec.WorkingDir); d != c.spec.WorkingDir {
			dir = d
		}
	}
	f, err := os.OpenFile(c.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	exe := argv[0]
	if !strings.Contains(exe, "/") {
		if p, err := exec.LookPath(exe); err == nil {
			exe = p
		}
	}
	cmd := exec.Command(exe, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, dir, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: credential(pod, &c.spec)}
	ns := w.n.net.path // hostNetwork: the node's namespace
	if w.sb != nil {
		ns = w.sb.netnsPath
	}
	p, err := proc.Start(cmd, ns)
	if err != nil {
		return err
	}
	c.p, c.startedAt = p, time.Now()
	c.ps.ready.Store(c.spec.ReadinessProbe == nil)
	go func() {
		<-p.Done()
		w.poke()
	}()
	pctx, cancel := context.WithCancel(w.n.ctx)
	c.probes = cancel
	w.startProbes(pctx, pod, c, env, rb)
	w.n.cfg.Logf("node %s: pod %s/%s: started container %s: %s", w.n.cfg.Name, pod.Namespace, pod.Name, c.spec.Name, strings.Join(argv, " "))
	return nil
}

// reap records the exit of c's current instance.
func (w *podWorker) reap(pod *corev1.Pod, c *container) {
	code, sig := c.p.ExitCode()
	t := &corev1.ContainerStateTerminated{
		ExitCode:    int32(code),
		StartedAt:   metav1.NewTime(c.startedAt),
		FinishedAt:  metav1.Now(),
		ContainerID: "simnode://" + c.id,
	}
	if sig != 0 {
		t.Signal = int32(sig)
		t.ExitCode = 128 + int32(sig)
	}
	if t.ExitCode == 0 {
		t.Reason = "Completed"
	} else {
		t.Reason = "Error"
	}
	msg, _ := os.ReadFile(c.termFile)
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	t.Message = string(msg)
	if t.Message == "" && t.ExitCode != 0 && c.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
		t.Message = tailLog(c.logFile, 80, 2048)
	}
	if c.probes != nil {
		c.probes()
	}
	c.p = nil
	c.prev, c.last = c.last, t
	w.n.cfg.Logf("node %s: pod %s/%s: container %s exited %d", w.n.cfg.Name, pod.Namespace, pod.Name, c.spec.Name, t.ExitCode)
}

func tailLog(file string, lines, maxBytes int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	s := strings.Join(ls, "\n")
	if len(s) > maxBytes {
		s = s[len(s)-maxBytes:]
	}
	return s
}

// stop stops c's running instance within grace and records its exit.
func (w *podWorker) stop(pod *corev1.Pod, c *container, grace time.Duration) {
	if c.p == nil {
		return
	}
	c.p.Stop(grace)
	w.reap(pod, c)
}

// status renders c for the pod status.
func (c *container) status(restarting bool) corev1.ContainerStatus {
	s := corev1.ContainerStatus{
		Name:    c.spec.Name,
		Image:   c.spec.Image,
		ImageID: "simnode://" + c.spec.Image,
		Ready:   c.p != nil && c.ps.ready.Load(),
	}
	if c.runs > 0 {
		s.RestartCount = int32(c.runs - 1)
	}
	started := c.p != nil
	s.Started = &started
	switch {
	case c.p != nil:
		s.ContainerID = "simnode://" + c.id
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.startedAt)}
		if c.last != nil {
			s.LastTerminationState.Terminated = c.last
		}
	case c.last != nil && restarting:
		s.ContainerID = c.last.ContainerID
		reason := c.waiting
		if reason == "" {
			reason = "CrashLoopBackOff"
		}
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: c.waitMsg}
		s.LastTerminationState.Terminated = c.last
	case c.last != nil:
		s.ContainerID = c.last.ContainerID
		s.State.Terminated = c.last
		if c.prev != nil {
			s.LastTerminationState.Terminated = c.prev
		}
	default:
		reason := c.waiting
		if reason == "" {
			reason = "ContainerCreating"
		}
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: c.waitMsg}
	}
	return s
}
