package main

import (
	"runtime"
	"runtime/debug"
)

// buildVersion names this build: the module version (or "devel") and the Go release.
func buildVersion() string {
	v := "devel"
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	return "nave/" + v + " " + runtime.Version()
}
