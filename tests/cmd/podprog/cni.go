package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// recorderConf is the configuration of podprog run as a chained CNI plugin
// (when CNI_COMMAND is set): it appends one JSON line per call to
// record_file and passes prevResult through, or fails ADD when fail_add is
// set (to exercise the runtime's retry).
type recorderConf struct {
	CNIVersion string          `json:"cniVersion"`
	Name       string          `json:"name"`
	RecordFile string          `json:"record_file"`
	FailAdd    string          `json:"fail_add"`
	PrevResult json.RawMessage `json:"prevResult"`
}

// Record is one line of the record file.
type Record struct {
	Command     string `json:"command"`
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	IfName      string `json:"ifName"`
	Args        string `json:"args"`
	Path        string `json:"path"`
}

func cniPlugin() {
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		cniError(err.Error())
	}
	cmd := os.Getenv("CNI_COMMAND")
	if cmd == "VERSION" {
		fmt.Print(`{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}`)
		return
	}
	var conf recorderConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		cniError("bad configuration: " + err.Error())
	}
	if conf.RecordFile != "" {
		rec := Record{Command: cmd, ContainerID: os.Getenv("CNI_CONTAINERID"), Netns: os.Getenv("CNI_NETNS"),
			IfName: os.Getenv("CNI_IFNAME"), Args: os.Getenv("CNI_ARGS"), Path: os.Getenv("CNI_PATH")}
		b, _ := json.Marshal(rec)
		f, err := os.OpenFile(conf.RecordFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			cniError(err.Error())
		}
		fmt.Fprintf(f, "%s\n", b)
		f.Close()
	}
	switch cmd {
	case "ADD":
		if conf.FailAdd != "" {
			cniError(conf.FailAdd)
		}
		if len(conf.PrevResult) == 0 {
			cniError("no prevResult: this plugin must be chained")
		}
		var prev map[string]any
		if err := json.Unmarshal(conf.PrevResult, &prev); err != nil {
			cniError(err.Error())
		}
		prev["cniVersion"] = conf.CNIVersion
		b, _ := json.Marshal(prev)
		fmt.Print(string(b))
	case "CHECK", "DEL", "GC", "STATUS":
	default:
		cniError("unknown CNI_COMMAND " + cmd)
	}
}

func cniError(msg string) {
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "code": 999, "msg": strings.TrimSpace(msg)})
	fmt.Print(string(b))
	os.Exit(1)
}
