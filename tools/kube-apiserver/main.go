// Command kube-apiserver is the real Kubernetes API server, built from the
// k8s.io/kubernetes module for Nave's end-to-end tests. It lives in its own
// module so that Nave's go.mod never depends on k8s.io/kubernetes.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
