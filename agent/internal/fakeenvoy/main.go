// Command fakeenvoy is a stand-in for Envoy used only by the agent's tests;
// it is not a proxy. It takes Envoy's command line, reads the admin port
// from the bootstrap given with -c, and serves the few admin endpoints the
// agent uses: /ready, /server_info, /stats (control_plane.connected_state)
// and POST /drain_listeners. It records its arguments, every signal it gets,
// every drain request, its admin's binding and shutdown, and its exit as
// JSON lines appended to the file $FAKEENVOY_RECORD, and exits 0 on SIGTERM
// or SIGINT.
//
// Hot restart, as far as the admin API goes: like Envoy (server.cc,
// sendParentAdminShutdownRequest), an instance of epoch N > 0 asks its
// parent (epoch N-1, same --base-id) to shut its admin down as it starts,
// before it binds its own admin address: the parent's admin then stops
// answering for good, whatever addresses the two bootstraps name, and the
// child takes the admin address over when it is the same. The request goes
// over a unix socket named by the bootstrap's directory, base ID and epoch
// (Envoy's are abstract sockets named by base ID and epoch). An admin
// address that is still taken makes the instance exit 1, as Envoy does.
// A child then stays INITIALIZING (/ready answers 503) until it may turn
// LIVE (see FAKEENVOY_LIVE_GATE). What it does not do: hand listeners over,
// drain, or exit by itself after --parent-shutdown-time-s; a parent simply
// runs until it gets SIGTERM.
//
// Test controls (environment):
//
//	FAKEENVOY_RECORD          file the JSON lines are appended to
//	FAKEENVOY_CRASH_AFTER     a duration: exit 1 that long after starting
//	FAKEENVOY_CONNECTED_FILE  a file: control_plane.connected_state is 0
//	                          while it holds "0", else 1
//	FAKEENVOY_FAIL_EPOCH_ONCE an epoch: the first instance of it exits 1 at
//	                          once (a hot restart that does not take)
//	FAKEENVOY_NOT_LIVE_EPOCH  an epoch whose instances never turn LIVE (the
//	                          hub unreachable, say)
//	FAKEENVOY_LIVE_GATE       a file: an instance turns LIVE only once the
//	                          file holds a number at least its epoch (unset:
//	                          at once); a test holds a new epoch initialising
//	                          with it, then lets it go
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Event is one line of the record.
type Event struct {
	Time   time.Time `json:"time"`
	PID    int       `json:"pid"`
	Epoch  int       `json:"epoch"`
	Event  string    `json:"event"` // start, admin, admin-shutdown, live, signal, drain, crash, exit
	Args   []string  `json:"args,omitempty"`
	Signal string    `json:"signal,omitempty"`
	Query  string    `json:"query,omitempty"`
}

var (
	epoch int
	// live latches once the instance turned LIVE (Envoy never goes back).
	live atomic.Bool
)

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

// hotRestartSocket is where the instance of epoch listens for its child:
// named by the bootstrap's directory (tests running at once do not meet)
// hashed short (a socket path has at most 107 bytes), base ID and epoch.
func hotRestartSocket(bootstrap string, baseID, epoch int) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(filepath.Dir(bootstrap)))
	return filepath.Join(os.TempDir(), fmt.Sprintf("fakeenvoy-%x-%d-%d.sock", h.Sum64(), baseID, epoch))
}

// exit removes the instance's hot restart socket and exits.
var hotRestartPath string

func exit(code int) {
	if hotRestartPath != "" {
		_ = os.Remove(hotRestartPath)
	}
	os.Exit(code)
}

func main() {
	fs := flag.NewFlagSet("fakeenvoy", flag.ContinueOnError)
	config := fs.String("c", "", "bootstrap")
	baseID := fs.Int("base-id", 0, "")
	fs.IntVar(&epoch, "restart-epoch", 0, "")
	for _, name := range []string{"parent-shutdown-time-s", "drain-time-s", "concurrency"} {
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
	// As Envoy: the parent's admin goes first, then this one's is bound.
	if epoch > 0 {
		if err := shutdownParentAdmin(hotRestartSocket(*config, *baseID, epoch-1)); err != nil {
			fmt.Fprintln(os.Stderr, "fakeenvoy: no parent to shut the admin of (it is gone):", err)
		}
	}
	lis, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeenvoy: cannot bind the admin address:", err)
		record(Event{Event: "crash"})
		os.Exit(1)
	}
	srv := &http.Server{Handler: admin()}
	go func() { _ = srv.Serve(lis) }()
	record(Event{Event: "admin"})
	if err := serveChild(hotRestartSocket(*config, *baseID, epoch), srv); err != nil {
		fmt.Fprintln(os.Stderr, "fakeenvoy: hot restart socket:", err)
		exit(1)
	}

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
				exit(0)
			}
		case <-crash:
			record(Event{Event: "crash"})
			exit(1)
		}
	}
}

// shutdownParentAdmin asks the parent listening on path to shut its admin
// down, and waits until it has.
func shutdownParentAdmin(path string) error {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(c, "shutdown-admin"); err != nil {
		return err
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(reply) != "ok" {
		return fmt.Errorf("the parent answered %q", reply)
	}
	return nil
}

// serveChild listens on path for a child's requests: "shutdown-admin" closes
// the admin server (listener and connections), for good.
func serveChild(path string, adminSrv *http.Server) error {
	_ = os.Remove(path) // left by an instance that was killed
	lis, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	hotRestartPath = path
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			if err == nil && strings.TrimSpace(line) == "shutdown-admin" {
				err = adminSrv.Close()
				if err == nil || errors.Is(err, http.ErrServerClosed) {
					record(Event{Event: "admin-shutdown"})
					_, _ = fmt.Fprintln(c, "ok")
				}
			}
			c.Close()
		}
	}()
	return nil
}

// state is the server state /ready and /server_info report.
func state() string {
	if live.Load() {
		return "LIVE"
	}
	if os.Getenv("FAKEENVOY_NOT_LIVE_EPOCH") == fmt.Sprint(epoch) {
		return "INITIALIZING"
	}
	if gate := os.Getenv("FAKEENVOY_LIVE_GATE"); gate != "" {
		b, err := os.ReadFile(gate)
		n, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || perr != nil || n < epoch {
			return "INITIALIZING"
		}
	}
	if !live.Swap(true) {
		record(Event{Event: "live"})
	}
	return "LIVE"
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
		st := state()
		if st != "LIVE" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, st)
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
		_ = json.NewEncoder(w).Encode(map[string]any{"state": state(), "command_line_options": map[string]any{"restart_epoch": epoch}})
	})
	mux.HandleFunc("POST /drain_listeners", func(w http.ResponseWriter, r *http.Request) {
		record(Event{Event: "drain", Query: r.URL.RawQuery})
		fmt.Fprintln(w, "OK")
	})
	return mux
}
