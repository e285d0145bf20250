package hub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// startEmbeddedEtcd runs a single-node etcd whose data lives in dir, listening
// on loopback ports of its own, and returns its client endpoint.
func startEmbeddedEtcd(ctx context.Context, dir string, log *slog.Logger) (*embed.Etcd, string, error) {
	// A port found free may be taken before etcd binds it (by any process's
	// outgoing connection: they come from the same range): try new ones.
	for attempt := 1; ; attempt++ {
		e, endpoint, err := startEmbeddedEtcdOnce(ctx, dir, log)
		if err == nil || attempt == portAttempts || !addrInUse(err) {
			return e, endpoint, err
		}
		log.Warn("embedded etcd's port was taken before it bound it; trying others", "err", err, "attempt", attempt)
	}
}

// portAttempts bounds the tries at free ports for the embedded etcd.
const portAttempts = 5

// addrInUse says whether err is a listener's "address already in use".
func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func startEmbeddedEtcdOnce(ctx context.Context, dir string, log *slog.Logger) (*embed.Etcd, string, error) {
	clientURL, err := freeLoopbackURL()
	if err != nil {
		return nil, "", err
	}
	peerURL, err := freeLoopbackURL()
	if err != nil {
		return nil, "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "nave-hub"
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*clientURL}, []url.URL{*clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peerURL}, []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	// etcd logs through zap; keep its log in the data dir, out of the hub's.
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cfg.AutoCompactionMode = "revision"
	cfg.AutoCompactionRetention = "1000"
	// etcd keeps the raft log in memory between its own snapshots (10,000
	// entries by default, plus 5,000 for slow followers), and each registry
	// snapshot the hub saves is a megabyte-sized entry or more. One member has
	// no follower to catch up, so a short log keeps that memory small.
	cfg.SnapshotCount = 100
	cfg.SnapshotCatchUpEntries = 10
	// A restarted member waits an election timeout before it leads again, and
	// the hub cannot restore its snapshot until then. With no peer to hear
	// from, a short timeout (100 ms instead of 1 s) costs nothing.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start embedded etcd in %s: %w", cfg.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd in %s not ready after 60s", cfg.Dir)
	case <-ctx.Done():
		e.Close()
		return nil, "", ctx.Err()
	}
	log.Info("embedded etcd ready", "dir", cfg.Dir, "endpoint", clientURL.String())
	return e, clientURL.String(), nil
}

// freeLoopbackURL finds a free loopback port. Another process could take it
// before etcd binds it (startEmbeddedEtcd then tries again).
func freeLoopbackURL() (*url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("find a free port for etcd: %w", err)
	}
	defer l.Close()
	return &url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

// EtcdTLS is how the hub authenticates an external etcd and itself to it:
// the CA that signed etcd's certificate, and the hub's client certificate
// and key (for etcd's --client-cert-auth). Empty: plaintext.
type EtcdTLS struct {
	CAFile, CertFile, KeyFile string
}

func (e EtcdTLS) enabled() bool { return e != EtcdTLS{} }

// clientConfig is the TLS configuration of the etcd client (Config.Validate
// has checked which files go together). etcd's
// transport reads the certificate files at every handshake, so a renewed
// client certificate is used without a restart.
func (e EtcdTLS) clientConfig() (*tls.Config, error) {
	cfg, err := transport.TLSInfo{CertFile: e.CertFile, KeyFile: e.KeyFile, TrustedCAFile: e.CAFile}.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS: %w", err)
	}
	return cfg, nil
}

// etcdRedialMax bounds the wait between attempts to reach an etcd that went away.
const etcdRedialMax = 2 * time.Second

func newEtcdClient(endpoints []string, tlsCfg *tls.Config) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      nil,
		TLS:         tlsCfg,
		// grpc's own backoff grows to 2 minutes while etcd is away: a hub
		// that withholds xDS until etcd answers (see xdsgate.go) would wait
		// that long after etcd returned. Within 2 s instead.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: etcdRedialMax},
			MinConnectTimeout: 5 * time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	return cli, nil
}
