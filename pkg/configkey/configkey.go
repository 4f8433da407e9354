// Package configkey is the error a library returns for a bad setting. It
// names the setting by its configuration key (the Go field name of the
// library's Config), not by a command-line flag: each command maps the keys
// to its own flags (see cmdutil.FlagError).
package configkey

import (
	"fmt"
	"strings"
)

// Sep separates keys judged together (for example "BackoffBase/BackoffMax").
const Sep = "/"

// Error is a bad value of one or more configuration keys.
type Error struct {
	// Key is the configuration key, or several joined by Sep.
	Key string
	// Value is the offending value; nil when Reason already shows it.
	Value any
	// Reason says what is wrong.
	Reason string
	// Err is the underlying error, if any.
	Err error
}

// New returns an Error for key and value.
func New(key string, value any, reason string) *Error {
	return &Error{Key: key, Value: value, Reason: reason}
}

// Errorf returns an Error for key whose reason is formatted (the reason
// shows the value itself).
func Errorf(key, format string, args ...any) *Error {
	return &Error{Key: key, Reason: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Key)
	b.WriteString(": ")
	switch v := e.Value.(type) {
	case nil:
	case string:
		fmt.Fprintf(&b, "%q ", v)
	default:
		fmt.Fprintf(&b, "%v ", v)
	}
	b.WriteString(e.Reason)
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Keys returns the keys the error is about.
func (e *Error) Keys() []string { return strings.Split(e.Key, Sep) }

// WithKeys returns a copy of e whose keys are renamed by rename (a command
// uses it to name its flags); keys rename does not know are kept.
func (e *Error) WithKeys(rename func(key string) (string, bool)) *Error {
	keys := e.Keys()
	for i, k := range keys {
		if n, ok := rename(k); ok {
			keys[i] = n
		}
	}
	c := *e
	c.Key = strings.Join(keys, Sep)
	return &c
}
