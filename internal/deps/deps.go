package deps

import (
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	_ "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	_ "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	_ "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	_ "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	_ "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "google.golang.org/grpc"
	_ "google.golang.org/grpc/xds"
	_ "google.golang.org/protobuf/proto"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/runtime/serializer"
	_ "sigs.k8s.io/yaml"
)
