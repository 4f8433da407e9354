package cmdutil

import (
	"errors"
	"strings"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/configkey"
)

// FlagError names the flags of a library's *configkey.Error: flags maps
// configuration keys to flag names (without "--"). Other errors, and keys
// without a flag, are returned as they are.
func FlagError(err error, flags map[string]string) error {
	var ke *configkey.Error
	if !errors.As(err, &ke) {
		return err
	}
	named := ke.WithKeys(func(key string) (string, bool) {
		f, ok := flags[key]
		return "--" + f, ok
	})
	if err == error(ke) {
		return named
	}
	// Wrapped: keep the surrounding text.
	return errors.New(strings.Replace(err.Error(), ke.Error(), named.Error(), 1))
}
