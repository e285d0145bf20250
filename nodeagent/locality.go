package nodeagent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/navemesh/nave/registry"
)

// The well-known topology labels of a Node (k8s.io/api/core/v1's
// LabelTopologyRegion and LabelTopologyZone, written out: the agent does
// not link the Kubernetes API types for two strings).
const (
	labelRegion = "topology.kubernetes.io/region"
	labelZone   = "topology.kubernetes.io/zone"
)

// KubeAPI is how the agent reads its Node: one GET with a bearer token,
// no client library and no watch.
type KubeAPI struct {
	// Server is the API server's base URL (https://HOST:PORT).
	Server string
	// TokenFile holds the bearer token; it is read at each request (bound
	// service-account tokens are rotated).
	TokenFile string
	// CAFile is the PEM CA the API server's certificate chains to.
	CAFile string
}

// The files a pod's service account mounts.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// InCluster is the API server as a pod sees it: KUBERNETES_SERVICE_HOST
// and _PORT, and the service account's token and CA.
func InCluster() KubeAPI {
	k := KubeAPI{TokenFile: serviceAccountDir + "/token", CAFile: serviceAccountDir + "/ca.crt"}
	if host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"); host != "" && port != "" {
		k.Server = "https://" + net.JoinHostPort(host, port)
	}
	return k
}

// Locality reads the region and zone labels of node, retrying with backoff
// (1 s doubling to 30 s) until it succeeds or ctx ends: without its
// locality the agent cannot ask the hub for the node's endpoints.
func (k KubeAPI) Locality(ctx context.Context, node string, log *slog.Logger) (registry.Locality, error) {
	if k.Server == "" {
		return registry.Locality{}, errors.New("node agent: no Kubernetes API server to read the Node from (not in a pod): give --zone and --region")
	}
	if u, err := url.Parse(k.Server); err != nil || u.Scheme != "https" {
		return registry.Locality{}, fmt.Errorf("node agent: the Kubernetes API server %q: want an https:// URL (the token must not travel in clear)", k.Server)
	}
	client, err := k.client()
	if err != nil {
		return registry.Locality{}, err
	}
	defer client.CloseIdleConnections() // read once: no connection kept
	delay := time.Second
	for attempt := 1; ; attempt++ {
		loc, err := k.get(ctx, client, node)
		if err == nil {
			if loc.Zone == "" {
				log.Warn("the node has no zone label: its clients are served without zone preference", "node", node, "label", labelZone)
			}
			return loc, nil
		}
		if ctx.Err() != nil {
			return registry.Locality{}, ctx.Err()
		}
		wait := delay/2 + rand.N(delay/2+1)
		log.Warn("cannot read the node's locality; retrying", "node", node, "err", err, "attempt", attempt, "retry in", wait)
		select {
		case <-ctx.Done():
			return registry.Locality{}, ctx.Err()
		case <-time.After(wait):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

func (k KubeAPI) client() (*http.Client, error) {
	pem, err := os.ReadFile(k.CAFile)
	if err != nil {
		return nil, fmt.Errorf("node agent: Kubernetes CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("node agent: Kubernetes CA %s: no PEM certificate", k.CAFile)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots},
	}}, nil
}

// get reads the Node once.
func (k KubeAPI) get(ctx context.Context, client *http.Client, node string) (registry.Locality, error) {
	token, err := os.ReadFile(k.TokenFile)
	if err != nil {
		return registry.Locality{}, fmt.Errorf("token: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(k.Server, "/")+"/api/v1/nodes/"+url.PathEscape(node), nil)
	if err != nil {
		return registry.Locality{}, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return registry.Locality{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return registry.Locality{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return registry.Locality{}, fmt.Errorf("GET node %s: %s: %s", node, resp.Status, strings.TrimSpace(string(body[:min(len(body), 300)])))
	}
	var n struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &n); err != nil {
		return registry.Locality{}, fmt.Errorf("GET node %s: %w", node, err)
	}
	return registry.Locality{Region: n.Metadata.Labels[labelRegion], Zone: n.Metadata.Labels[labelZone]}, nil
}
