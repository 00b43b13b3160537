// A test oracle for ci-sizer (tests/runner_pods.py), not agent-stack-k8s itself: the loop of
// buildkite/agent-stack-k8s internal/controller/scheduler/scheduler.go (*worker).ParseJob over the
// job's BUILDKITE_PLUGINS, run with Go's own encoding/json. Every kubernetes plugin entry is
// decoded with json.Unmarshal into the same KubernetesPlugin value, as ParseJob does
// (json.Unmarshal(val, &parsed.k8sPlugin) in the loop), so a later entry's fields land on the
// earlier entry's: a slice is filled index by index into the elements already there.
//
// The structs have the shape of KubernetesPlugin in scheduler.go and of the k8s.io/api/core/v1
// fields the tests use (same JSON names and omitempty), nothing more.
//
// stdin: the BUILDKITE_PLUGINS JSON. Flag -prohibit: the controller's prohibit-kubernetes-plugin.
// stdout: {"k8sPlugin": <the decoded plugin, or null>}; exit 3 with the error on stderr when
// ParseJob returns one.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value,omitempty"`
}

type ResourceRequirements struct {
	Limits   map[string]string `json:"limits,omitempty"`
	Requests map[string]string `json:"requests,omitempty"`
}

type VolumeMount struct {
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
}

type Container struct {
	Name         string               `json:"name"`
	Image        string               `json:"image,omitempty"`
	Command      []string             `json:"command,omitempty"`
	Args         []string             `json:"args,omitempty"`
	Env          []EnvVar             `json:"env,omitempty"`
	Resources    ResourceRequirements `json:"resources,omitempty"`
	VolumeMounts []VolumeMount        `json:"volumeMounts,omitempty"`
}

type PodSpec struct {
	InitContainers     []Container       `json:"initContainers,omitempty"`
	Containers         []Container       `json:"containers"`
	NodeSelector       map[string]string `json:"nodeSelector,omitempty"`
	ServiceAccountName string            `json:"serviceAccountName,omitempty"`
}

type KubernetesPlugin struct {
	PodSpec      *PodSpec    `json:"podSpec,omitempty"`
	PodSpecPatch *PodSpec    `json:"podSpecPatch,omitempty"`
	PodTemplate  string      `json:"podTemplate,omitempty"`
	Sidecars     []Container `json:"sidecars,omitempty"`
}

const k8sPluginName = "github.com/buildkite-plugins/kubernetes-buildkite-plugin"

var errK8sPluginProhibited = errors.New("the kubernetes plugin is prohibited by this controller, but was configured on this job")

func parseJob(pluginsJSON string, prohibit bool) (*KubernetesPlugin, error) {
	var k8sPlugin *KubernetesPlugin
	if pluginsJSON == "" {
		return nil, nil
	}
	var plugins []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(pluginsJSON), &plugins); err != nil {
		return nil, fmt.Errorf("failed parsing plugins: %w", err)
	}
	for _, plugin := range plugins {
		if len(plugin) != 1 {
			return nil, fmt.Errorf("found invalid plugin: %v", plugin)
		}
		val, isK8sPlugin := plugin[k8sPluginName]
		if !isK8sPlugin {
			continue
		}
		if prohibit {
			return nil, errK8sPluginProhibited
		}
		if err := json.Unmarshal(val, &k8sPlugin); err != nil {
			return nil, fmt.Errorf("failed parsing Kubernetes plugin: %w", err)
		}
	}
	return k8sPlugin, nil
}

func main() {
	prohibit := flag.Bool("prohibit", false, "prohibit-kubernetes-plugin")
	flag.Parse()
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	plugin, err := parseJob(string(in), *prohibit)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	out, err := json.Marshal(map[string]*KubernetesPlugin{"k8sPlugin": plugin})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Stdout.Write(out)
}
