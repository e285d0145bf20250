// Command fakeenvoy is a stand-in for Envoy used only by the agent's tests;
// it is not a proxy. It takes Envoy's command line, reads the admin port
// from the bootstrap given with -c, and serves the few admin endpoints the
// agent uses: /ready ("LIVE"), /stats (control_plane.connected_state) and
// POST /drain_listeners. It records its arguments, every signal it gets,
// every drain request and its exit as JSON lines appended to the file
// $FAKEENVOY_RECORD, and exits 0 on SIGTERM or SIGINT.
//
// What it does not do: hot restart. Real Envoy hands its listeners and
// admin port from parent to child, and the parent exits by itself after
// --parent-shutdown-time-s; here parent and child share the admin port
// (SO_REUSEPORT) and a parent simply runs until it gets SIGTERM.
//
// Test controls (environment):
//
//	FAKEENVOY_RECORD          file the JSON lines are appended to
//	FAKEENVOY_CRASH_AFTER     a duration: exit 1 that long after starting
//	FAKEENVOY_CONNECTED_FILE  a file: control_plane.connected_state is 0
//	                          while it holds "0", else 1
//	FAKEENVOY_FAIL_EPOCH_ONCE an epoch: the first instance of it exits 1 at
//	                          once (a hot restart that does not take)
//	FAKEENVOY_NOT_LIVE_EPOCH  an epoch whose instances never turn LIVE
//	                          (/server_info says INITIALIZING)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Event is one line of the record.
type Event struct {
	Time   time.Time `json:"time"`
	PID    int       `json:"pid"`
	Epoch  int       `json:"epoch"`
	Event  string    `json:"event"` // start, signal, drain, crash, exit
	Args   []string  `json:"args,omitempty"`
	Signal string    `json:"signal,omitempty"`
	Query  string    `json:"query,omitempty"`
}

var epoch int

func record(e Event) {
	e.Time, e.PID, e.Epoch = time.Now(), os.Getpid(), epoch
	path := os.Getenv("FAKEENVOY_RECORD")
	if path == "" {
		return
	}
	b, _ := json.Marshal(e)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeenvoy:", err)
		return
	}
	defer f.Close()
	_, _ = f.Write(append(b, '\n')) // one write: lines of several processes do not interleave
}

func main() {
	fs := flag.NewFlagSet("fakeenvoy", flag.ContinueOnError)
	config := fs.String("c", "", "bootstrap")
	fs.IntVar(&epoch, "restart-epoch", 0, "")
	for _, name := range []string{"parent-shutdown-time-s", "drain-time-s", "base-id", "concurrency"} {
		fs.Int(name, 0, "")
	}
	for _, name := range []string{"drain-strategy", "log-level"} {
		fs.String(name, "", "")
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2) // an argument real Envoy would not take either, as far as the agent uses them
	}
	record(Event{Event: "start", Args: os.Args[1:]})
	if e := os.Getenv("FAKEENVOY_FAIL_EPOCH_ONCE"); e == fmt.Sprint(epoch) {
		marker := os.Getenv("FAKEENVOY_RECORD") + ".failed-" + e
		if _, err := os.Stat(marker); err != nil {
			_ = os.WriteFile(marker, nil, 0o600)
			record(Event{Event: "crash"})
			os.Exit(1)
		}
	}

	port, err := adminPort(*config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeenvoy:", err)
		os.Exit(1)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	lis, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeenvoy:", err)
		os.Exit(1)
	}
	go func() { _ = http.Serve(lis, admin()) }()

	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	var crash <-chan time.Time
	if d, err := time.ParseDuration(os.Getenv("FAKEENVOY_CRASH_AFTER")); err == nil {
		crash = time.After(d)
	}
	for {
		select {
		case s := <-signals:
			record(Event{Event: "signal", Signal: s.(syscall.Signal).String()})
			if s == syscall.SIGTERM || s == syscall.SIGINT {
				record(Event{Event: "exit"})
				os.Exit(0)
			}
		case <-crash:
			record(Event{Event: "crash"})
			os.Exit(1)
		}
	}
}

// adminPort reads admin.address.socket_address.port_value from the bootstrap.
func adminPort(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var bs struct {
		Admin struct {
			Address struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"portValue"`
				} `json:"socketAddress"`
			} `json:"address"`
		} `json:"admin"`
	}
	if err := json.Unmarshal(b, &bs); err != nil {
		return 0, fmt.Errorf("bootstrap %s: %w", path, err)
	}
	sa := bs.Admin.Address.SocketAddress
	if sa.Address != "127.0.0.1" || sa.PortValue == 0 {
		return 0, fmt.Errorf("bootstrap %s: admin on %q:%d, want 127.0.0.1 and a port", path, sa.Address, sa.PortValue)
	}
	return sa.PortValue, nil
}

func admin() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "LIVE")
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		const want = `^(control_plane\.connected_state|listener_manager\.lds\.update_success|cluster_manager\.cds\.update_success)$`
		if r.URL.Query().Get("filter") != want {
			http.Error(w, "fakeenvoy knows only "+want, http.StatusBadRequest)
			return
		}
		state := "1"
		if f := os.Getenv("FAKEENVOY_CONNECTED_FILE"); f != "" {
			if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == "0" {
				state = "0"
			}
		}
		fmt.Fprintf(w, "cluster_manager.cds.update_success: 1\ncontrol_plane.connected_state: %s\nlistener_manager.lds.update_success: 1\n", state)
	})
	mux.HandleFunc("GET /server_info", func(w http.ResponseWriter, _ *http.Request) {
		state := "LIVE"
		if os.Getenv("FAKEENVOY_NOT_LIVE_EPOCH") == fmt.Sprint(epoch) {
			state = "INITIALIZING"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"state": state, "command_line_options": map[string]any{"restart_epoch": epoch}})
	})
	mux.HandleFunc("POST /drain_listeners", func(w http.ResponseWriter, r *http.Request) {
		record(Event{Event: "drain", Query: r.URL.RawQuery})
		fmt.Fprintln(w, "OK")
	})
	return mux
}
