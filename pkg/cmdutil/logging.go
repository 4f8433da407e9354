package cmdutil

import (
	"fmt"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	// Registers --logging-format=json.
	_ "k8s.io/component-base/logs/json/register"
)

// Logging holds the logging flags of the long-running commands, those of
// Kubernetes' own components (k8s.io/component-base/logs): --logging-format
// (text or json), -v, --vmodule (text only), --log-flush-frequency and the
// output-stream options. Logs go to stderr.
type Logging struct {
	c *logsapi.LoggingConfiguration
}

// NewLogging returns the default configuration: text, verbosity 0.
func NewLogging() *Logging {
	// Tests run a command's entry point more than once in one process;
	// the same configuration may then be applied again.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
	return &Logging{c: logsapi.NewLoggingConfiguration()}
}

// AddFlags registers the logging flags on fs.
func (l *Logging) AddFlags(fs *pflag.FlagSet) {
	logsapi.AddFlags(l.c, fs)
}

// Apply validates the configuration and makes klog (and so every logger
// taken from it) use it. Call it right after parsing the flags, before any
// goroutine logs. The error names the setting.
func (l *Logging) Apply() error {
	if err := logsapi.ValidateAndApply(l.c, nil); err != nil {
		return fmt.Errorf("logging flags (--logging-format=%s): %w", l.c.Format, err)
	}
	return nil
}

// Flush writes buffered log entries; call it before the process exits.
func Flush() {
	klog.Flush()
}
