//go:build !unix

package agent

import "syscall"

// envoyProcAttr: Envoy runs on unix systems only; elsewhere the agent builds but has nothing to add.
func envoyProcAttr() *syscall.SysProcAttr { return nil }
