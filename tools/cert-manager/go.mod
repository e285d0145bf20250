// The cert-manager release whose CRDs the manifest test applies before it
// dry-runs deploy/security (the Certificates and Issuers Nave's
// identities come from). `make cert-manager-crds` copies them from the
// module into the cache.
module github.com/navemesh/nave/tools/cert-manager

go 1.26.0

require github.com/cert-manager/cert-manager v1.21.2
