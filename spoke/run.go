package spoke

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/importwriter"
	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/registry"
)

// Source is where a spoke learns its cluster's state. Run hands the complete
// state to out once it is known, then every change, until ctx ends.
type Source interface {
	Name() string
	Run(ctx context.Context, out Sink) error
}

// Sink takes what a source hands over: its whole state (Set, which keeps
// st), or only what changed (Apply: the new shard of each service in set,
// nil when withheld, and the services removed). federation.Changes is one.
type Sink interface {
	Set(st State)
	Apply(set State, removed []registry.ServiceKey)
}

// counted is the spoke's sink: the publisher's Changes, counted.
type counted struct {
	*federation.Changes
	mon *monitor
}

func (c counted) Set(st State) {
	c.mon.states.Inc()
	c.mon.sourceReady.Store(true)
	c.Changes.Set(st)
}

func (c counted) Apply(set State, removed []registry.ServiceKey) {
	c.mon.states.Inc()
	c.mon.sourceReady.Store(true)
	c.Changes.Apply(set, removed)
}

// Config configures a spoke.
type Config struct {
	Cluster registry.ClusterID
	Network registry.Network
	// NetworkGateways are east-west gateways of the network to announce
	// besides those the source's Services labelled NetworkGatewayLabel offer.
	NetworkGateways []registry.Gateway
	// HubAddr is the hub's federation address (host:port).
	HubAddr string
	// TokenFile holds the cluster's federation token; empty sends none.
	TokenFile string
	// HubCAFile, when set, makes the spoke connect over TLS and trust the hub
	// certificates it signed (PEM); HubServerName overrides the name checked.
	HubCAFile, HubServerName string
	// CertFile and KeyFile are the spoke's client certificate (naming its
	// cluster: spiffe://TRUST-DOMAIN/nave/cluster/ID) for a hub that asks
	// for one, over TLS (with HubCAFile). Every credential file is read
	// again when it changes.
	CertFile, KeyFile string
	// Source is "kube" (the Kubernetes API) or "dir:PATH" (a directory of manifests).
	Source string
	// Kubeconfig is the kubeconfig of a kube source; empty uses the pod's
	// service account (in a cluster). KubeQPS and KubeBurst bound its requests.
	Kubeconfig string
	KubeQPS    float32
	KubeBurst  int
	// Namespaces selects the namespaces whose services a kube source exports.
	Namespaces NamespaceFilter
	// LeaderElection makes one of several replicas of a kube source's spoke stream.
	LeaderElection LeaderElection
	// GiveUpAfter is how many hub sessions in a row the leader may fail to
	// establish (the hub unreachable, the stream broken before the hub
	// acknowledged the state) before it gives up the Lease, so a standby on
	// another node tries (see LeaderElection.StandBack); 0 never gives up.
	// Only with leader election.
	GiveUpAfter int
	// Region is the region of endpoints whose node carries none.
	Region string
	// ExportAll federates every service, not only those labelled nave.io/export=true.
	ExportAll bool
	// Imports makes the leader of a kube source write the MCS imports the hub
	// sends: ServiceImports, EndpointSlices and derived Services, with a
	// client of its own limited to ImportsQPS and ImportsBurst (a cluster that
	// imports a thousand services takes a few thousand writes).
	Imports      bool
	ImportsQPS   float32
	ImportsBurst int
	// PollInterval is how often a dir source rescans its directory (it
	// watches it for changes, and polls at this interval if it cannot).
	PollInterval time.Duration
	// AdminAddr serves /healthz, /readyz and /metrics; empty serves nothing.
	AdminAddr  string
	Federation federation.SpokeConfig
}

// DefaultConfig returns the configuration `nave spoke` starts with.
func DefaultConfig() Config {
	f := federation.DefaultSpokeConfig()
	f.SpokeID = DefaultSpokeID()
	return Config{
		PollInterval: 500 * time.Millisecond, Federation: f,
		KubeQPS: 20, KubeBurst: 40,
		Namespaces:     NamespaceFilter{Exclude: slices.Clone(DefaultExcludedNamespaces)},
		LeaderElection: DefaultLeaderElection(),
		GiveUpAfter:    5,
		Imports:        true, ImportsQPS: 50, ImportsBurst: 100,
	}
}

// DefaultSpokeID names this spoke process when --spoke-id is not given: the
// pod's name in a pod (POD_NAME, from the downward API), else the host name
// and the process ID. The ID is the hub's name for the session and the
// Lease holder's identity, so two spokes must not share it (the host name
// alone is shared by every spoke on one machine).
func DefaultSpokeID() string {
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return pod
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "spoke"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// Run runs a spoke until ctx ends: its source feeds the publisher, which keeps
// the hub's copy of the cluster's state current. With leader election (kube
// sources only), the source runs all the time but only the leader publishes
// and writes ServiceExport status.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := registry.ValidateClusterID(cfg.Cluster); err != nil {
		return err
	}
	log = log.With("cluster", cfg.Cluster)
	src, clients, err := newSource(cfg, log)
	if err != nil {
		return err
	}
	opts, err := hubDialOptions(ctx, cfg, log)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(cfg.HubAddr, opts...)
	if err != nil {
		return fmt.Errorf("hub address %q: %w", cfg.HubAddr, err)
	}
	defer conn.Close()

	mon := newMonitor()
	var adminLis net.Listener
	if cfg.AdminAddr != "" {
		if adminLis, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
			return fmt.Errorf("listen admin: %w", err)
		}
		defer adminLis.Close()
	}

	// The source hands its changes over; whichever publisher streams takes them.
	changes := federation.NewChanges()
	// The publisher speaks for the cluster, and probes the hub's port while it waits to reconnect.
	wiring := federation.SpokeWiring{Cluster: cfg.Cluster, Network: cfg.Network, HubAddr: cfg.HubAddr}
	// Where each change began, from the source to the update that carries it (the hub traces it).
	wiring.Origins = federation.NewOrigins()
	switch s := src.(type) {
	case *KubeSource:
		s.Origins = wiring.Origins
	case *DirSource:
		s.Origins = wiring.Origins
	}
	kube, _ := src.(*KubeSource)
	if kube != nil {
		wiring.OnReport = kube.SetReports
	}
	// A leader that cannot reach the hub gives up the Lease after GiveUpAfter sessions in a row failed.
	giveUpAfter := 0
	if kube != nil && cfg.LeaderElection.Enabled {
		giveUpAfter = cfg.GiveUpAfter
	}
	// A term is one stretch of publishing: the whole run, or one leadership.
	// It ends with ctx, or gives up (errHubUnreachable).
	term := func(ctx context.Context) error {
		ctx, giveUp := context.WithCancelCause(ctx)
		mon.setLeading(true)
		defer mon.setLeading(false)
		if kube != nil {
			kube.forgetReports() // an earlier term's hub session is not this one's
		}
		var wg sync.WaitGroup
		// The term's goroutines end with its context, also when it panics.
		defer func() { giveUp(nil); wg.Wait() }()
		var pub *federation.Publisher
		tw := wiring
		if kube != nil && cfg.Imports {
			// The hub's imports go to the writer, which says how far it has written them.
			writer := importwriter.New(clients.importer, importwriter.Config{
				Cluster: cfg.Cluster, Written: func(epoch, version uint64) { pub.ImportsWritten(epoch, version) },
				Problems: func(ps []federation.ImportProblem) { pub.ImportProblems(ps) },
			}, log)
			tw.OnImports = writer.Set
			wg.Go(func() {
				if err := writer.Run(ctx); err != nil && ctx.Err() == nil {
					log.Error("import writer failed; imports are not written this term", "err", err)
				}
			})
		}
		tw.Status = mon.observe
		if giveUpAfter > 0 {
			failures := &hubFailures{limit: giveUpAfter}
			tw.Status = func(s federation.SessionStatus) {
				mon.observe(s)
				if err := failures.observe(s); err != nil {
					giveUp(err)
				}
			}
		}
		pub = federation.NewPublisher(cfg.Federation, tw, conn, log)
		if kube != nil {
			wg.Go(func() { kube.WriteStatus(ctx) })
		}
		if tw.OnImports != nil {
			kube.OnNamespaces(pub.SetNamespaces)
			defer kube.OnNamespaces(nil)
		}
		defer announceGateways(cfg, src, pub, log)()
		_ = pub.Run(ctx, changes) // returns once ctx ends
		if err := context.Cause(ctx); errors.Is(err, errHubUnreachable) {
			return err
		}
		return nil
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srcErr := make(chan error, 1)
	go func() {
		defer cancel()
		srcErr <- src.Run(ctx, counted{changes, mon})
	}()
	adminDone := make(chan struct{})
	go func() {
		defer close(adminDone)
		if adminLis == nil {
			return
		}
		if err := mon.serve(ctx, adminLis, log); err != nil {
			log.Error("spoke admin server failed", "err", err)
		}
	}()
	defer func() { cancel(); <-adminDone }()
	log.Info("spoke running", "source", src.Name(), "hub", cfg.HubAddr, "spoke", cfg.Federation.SpokeID)
	var leadErr error
	if kube != nil && cfg.LeaderElection.Enabled {
		// Only a replica with synced caches competes: a cold one must not take
		// the Lease from a warm standby, nor hold it while it cannot publish.
		select {
		case <-kube.Synced():
			leadErr = leadOrGiveUp(ctx, clients.source, cfg.LeaderElection, cfg.Federation.SpokeID, log, term)
		case <-ctx.Done():
		}
		cancel()
	} else {
		_ = term(ctx) // gives up never: giveUpAfter is 0
	}
	// Publishing ends only once ctx ends: because the caller is done, or the source failed.
	if err := <-srcErr; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("source %s: %w", src.Name(), err)
	}
	return leadErr
}

// kubeClients are a kube source's client, and the import writer's (rate-limited on its own).
type kubeClients struct {
	source, importer *kubeclient.Client
}

// newSource returns the source cfg.Source names, and for a kube source its clients.
func newSource(cfg Config, log *slog.Logger) (Source, kubeClients, error) {
	opts := BuildOptions{Cluster: cfg.Cluster, DefaultRegion: cfg.Region, ExportAll: cfg.ExportAll, Limits: registry.DefaultLimits()}
	kind, arg, _ := strings.Cut(cfg.Source, ":")
	switch {
	case kind == "dir" && arg != "":
		return NewDirSource(arg, opts, cfg.PollInterval, log), kubeClients{}, nil
	case cfg.Source == "kube":
		klog.SetSlogLogger(log.With("component", "client-go"))
		rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		if err != nil {
			return nil, kubeClients{}, fmt.Errorf("kubeconfig: %w", err)
		}
		rc.QPS, rc.Burst = cfg.KubeQPS, cfg.KubeBurst
		rc.UserAgent = "nave-spoke/" + cfg.Federation.Build
		client, err := kubeclient.New(rc)
		if err != nil {
			return nil, kubeClients{}, fmt.Errorf("kubernetes client: %w", err)
		}
		wc := rest.CopyConfig(rc)
		wc.QPS, wc.Burst = cfg.ImportsQPS, cfg.ImportsBurst
		importer, err := kubeclient.New(wc)
		if err != nil {
			return nil, kubeClients{}, fmt.Errorf("kubernetes client: %w", err)
		}
		return NewKubeSource(client, opts, cfg.Namespaces, log), kubeClients{source: client, importer: importer}, nil
	default:
		return nil, kubeClients{}, fmt.Errorf("unknown source %q: want kube or dir:PATH", cfg.Source)
	}
}
