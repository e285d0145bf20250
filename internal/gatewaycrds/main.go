// Command gatewaycrds writes the Gateway API CRDs Nave reads into a
// directory, byte for byte as the sigs.k8s.io/gateway-api module that go.mod
// names carries them under config/crd: the standard channel's GRPCRoute,
// HTTPRoute and ReferenceGrant, and the experimental channel's HTTPRoute
// (which adds retry and sessionPersistence) for users who apply it instead.
// The module embeds no CRDs in Go, so they are read from its directory in the
// module cache (`go list -m`). `make generate` runs it; `make generate-check`
// fails when the files differ.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"sigs.k8s.io/gateway-api/pkg/consts"
	"sigs.k8s.io/yaml"
)

// modulePath is the Go module the CRDs come from.
const modulePath = "sigs.k8s.io/gateway-api"

// crd is one file to copy: from the module's config/crd/<channel>/<source>
// to <dir>/<channel>/<target>.
type crd struct {
	channel, source, target, kind string
}

// crds are the CRDs Nave needs. The channel is also the file's
// gateway.networking.k8s.io/channel annotation, checked before writing.
var crds = []crd{
	{"standard", "gateway.networking.k8s.io_grpcroutes.yaml", "grpcroutes.yaml", "GRPCRoute"},
	{"standard", "gateway.networking.k8s.io_httproutes.yaml", "httproutes.yaml", "HTTPRoute"},
	{"standard", "gateway.networking.k8s.io_referencegrants.yaml", "referencegrants.yaml", "ReferenceGrant"},
	{"experimental", "gateway.networking.k8s.io_httproutes.yaml", "httproutes.yaml", "HTTPRoute"},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gatewaycrds DIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "gatewaycrds:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	moduleDir, err := moduleDir()
	if err != nil {
		return err
	}
	for _, c := range crds {
		src := filepath.Join(moduleDir, "config", "crd", c.channel, c.source)
		body, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := c.check(body); err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		dst := filepath.Join(dir, c.channel, c.target)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, body, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// moduleDir returns the directory of the module as go.mod resolves it (the
// module cache, or a replacement's directory).
func moduleDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-json", modulePath).Output()
	if err != nil {
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("go list -m %s: %w", modulePath, err)
	}
	var m struct {
		Dir     string
		Replace *struct{ Dir string }
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("go list -m %s: %w", modulePath, err)
	}
	if m.Replace != nil && m.Replace.Dir != "" {
		return m.Replace.Dir, nil
	}
	if m.Dir == "" {
		return "", fmt.Errorf("%s is not in the module cache: run `go mod download %s`", modulePath, modulePath)
	}
	return m.Dir, nil
}

// check makes sure a file is the CRD it should be, of the channel it should
// be, from the same release as the Go package this command was built with
// (so the files and the Go types Nave compiles agree).
func (c crd) check(body []byte) error {
	var obj struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Names struct {
				Kind string `json:"kind"`
			} `json:"names"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(body, &obj); err != nil {
		return err
	}
	switch a := obj.Metadata.Annotations; {
	case obj.Kind != "CustomResourceDefinition" || obj.Spec.Names.Kind != c.kind:
		return fmt.Errorf("is a %s of %q, want the CustomResourceDefinition of %s", obj.Kind, obj.Spec.Names.Kind, c.kind)
	case a[consts.ChannelAnnotation] != c.channel:
		return fmt.Errorf("%s is %q, want %q", consts.ChannelAnnotation, a[consts.ChannelAnnotation], c.channel)
	case a[consts.BundleVersionAnnotation] != consts.BundleVersion:
		return fmt.Errorf("%s is %q, but the module's Go code says %s", consts.BundleVersionAnnotation, a[consts.BundleVersionAnnotation], consts.BundleVersion)
	}
	return nil
}
