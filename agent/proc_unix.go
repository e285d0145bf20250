//go:build unix

package agent

import "syscall"

// envoyProcAttr puts Envoy in a process group of its own, so that a
// Ctrl-C in a terminal (SIGINT to the foreground group) reaches only the
// agent, which then drains Envoy instead of Envoy dying at once.
func envoyProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
