// Command mcscrds writes the Kubernetes MCS API's CRDs (ServiceExport and
// ServiceImport, as the sigs.k8s.io/mcs-api module embeds them) into
// deploy/crds, so that what Nave ships is exactly the upstream release its
// go.mod names. `make generate` runs it; `make generate-check` fails when
// the files differ.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	mcscrd "sigs.k8s.io/mcs-api/config/crd"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mcscrds DIR")
		os.Exit(2)
	}
	for name, body := range map[string][]byte{
		"serviceexports.yaml": mcscrd.ServiceExportCRD,
		"serviceimports.yaml": mcscrd.ServiceImportCRD,
	} {
		if err := os.WriteFile(filepath.Join(os.Args[1], name), body, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
