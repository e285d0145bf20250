package e2e

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildNave builds the nave binary, as `make build` does.
func buildNave(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nave")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/nave")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build nave: %v\n%s", err, out)
	}
	return bin
}

// `make demo` end to end: separate hub and spoke processes, an xDS client
// process, and the scripted failover, with every RPC answered.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the whole demo")
	}
	bin := buildNave(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	work := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, "demo", "--once", "--step", "3s", "--manifests", "../deploy/demo", "--work-dir", work)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		for _, name := range []string{"hub", "spoke-east", "client"} {
			b, _ := os.ReadFile(filepath.Join(work, name+".log"))
			t.Logf("%s.log:\n%s", name, b)
		}
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	output := out.String()
	t.Logf("demo output:\n%s", output)

	// Which backends answered in each step, from the client's lines.
	step := -1
	answered := map[int]string{}
	sc := bufio.NewScanner(strings.NewReader(output))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "==> Client's own zone"):
			step = 0
		case strings.Contains(line, "==> Marking east's us-east-1a"):
			step = 1
		case strings.Contains(line, "==> Marking every us-east"):
			step = 2
		case strings.Contains(line, "==> Marking us-east ready again"):
			step = 3
		case strings.Contains(line, "==> Script done"):
			step = 4
		case strings.Contains(line, "client us-east-1a: answered by"):
			if !strings.HasSuffix(line, "; 0 failed") {
				t.Errorf("the demo client saw failures: %s", line)
			}
			if step >= 0 {
				answered[step] = line // the last line of each step: after failover settled
			}
		}
	}
	want := map[int]string{
		0: "answered by east/us-east-1a x",
		1: "north/us-east-1c",
		2: "answered by west/us-west-1a x",
		3: "answered by east/us-east-1a x",
	}
	for s, w := range want {
		if !strings.Contains(answered[s], w) {
			t.Errorf("step %d ended with %q, want it to contain %q", s, answered[s], w)
		}
	}
	if !strings.Contains(output, "Stopped everything.") {
		t.Error("the demo did not stop cleanly")
	}
}
