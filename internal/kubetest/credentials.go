package kubetest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// AdminUser is who Cluster.Kubeconfig and Cluster.Config authenticate as; it is in system:masters.
	AdminUser = "admin"
	// SpokeUser is who Cluster.SpokeKubeconfig authenticates as: the user name of
	// ServiceAccount nave-system/nave-spoke, so RBAC bindings to that ServiceAccount apply.
	SpokeUser = "system:serviceaccount:nave-system:nave-spoke"
)

// spokeGroups are the groups a real token of SpokeUser's ServiceAccount carries.
const spokeGroups = "system:serviceaccounts,system:serviceaccounts:nave-system,system:authenticated"

// tokens are the bearer tokens an API server accepts (--token-auth-file).
type tokens struct{ admin, spoke string }

func newTokens() tokens {
	return tokens{admin: rand.Text(), spoke: rand.Text()}
}

// writeFile writes the static token file: token,user,uid,"groups".
func (k tokens) writeFile(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "tokens.csv")
	content := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n%s,%s,%s,%q\n",
		k.admin, AdminUser, "admin-uid", k.spoke, SpokeUser, "nave-spoke-uid", spokeGroups)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeServiceAccountKey writes an ECDSA private key in PEM, which serves as
// both --service-account-signing-key-file and --service-account-key-file.
func writeServiceAccountKey(t testing.TB, dir string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "service-account.key")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// caData returns the certificates the server generated in its cert dir at
// startup (its serving certificate and the CA that signed it), once they are there.
func (s *apiServer) caData() ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(s.certDir, "apiserver.crt"))
	if err != nil {
		return nil, err
	}
	// The server may be writing the file right now: accept it only when it is whole.
	rest, n := b, 0
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, fmt.Errorf("apiserver.crt: %w", err)
		}
		n++
	}
	if n == 0 || len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("apiserver.crt is not complete yet")
	}
	return b, nil
}

// restConfig is a client configuration for a bearer token.
func restConfig(url string, ca []byte, token string) *rest.Config {
	return &rest.Config{Host: url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
}

// writeKubeconfig writes a kubeconfig with one context, named after the cluster.
func writeKubeconfig(t testing.TB, path, cluster, url string, ca []byte, user, token string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{Server: url, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
	cfg.CurrentContext = cluster
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
}
