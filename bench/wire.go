package main

import (
	"errors"
	"fmt"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// scanAssignment reads a marshalled ClusterLoadAssignment straight from the
// wire, calling fn for every endpoint with its socket address, port and
// health. A thousand clients decoding every assignment into messages kept a
// core of this machine busy, competing with the hub being measured; the
// clients only need these few fields.
func scanAssignment(b []byte, fn func(addr string, port uint32, health core.HealthStatus)) (clusterName string, err error) {
	err = scanFields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch num {
		case claClusterName:
			clusterName = string(v)
		case claEndpoints:
			return scanFields(v, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) error {
				if num != lleLbEndpoints {
					return nil
				}
				return scanLbEndpoint(v, fn)
			})
		}
		return nil
	})
	return clusterName, err
}

func scanLbEndpoint(b []byte, fn func(addr string, port uint32, health core.HealthStatus)) error {
	var addr string
	var port uint32
	health := core.HealthStatus_UNKNOWN
	err := scanFields(b, func(num protowire.Number, _ protowire.Type, v []byte, n uint64) error {
		switch num {
		case lbHealthStatus:
			health = core.HealthStatus(n)
		case lbEndpoint:
			return scanFields(v, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) error {
				if num != epAddress {
					return nil
				}
				return scanFields(v, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) error {
					if num != addrSocketAddress {
						return nil
					}
					return scanFields(v, func(num protowire.Number, _ protowire.Type, v []byte, n uint64) error {
						switch num {
						case saAddress:
							addr = string(v)
						case saPortValue:
							port = uint32(n)
						}
						return nil
					})
				})
			})
		}
		return nil
	})
	if err != nil {
		return err
	}
	fn(addr, port, health)
	return nil
}

var errBadWire = errors.New("malformed protobuf")

// scanFields calls fn for every field of the message in b: v holds the bytes
// of a length-delimited field, n the value of a varint or fixed one.
func scanFields(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return fmt.Errorf("%w: %v", errBadWire, protowire.ParseError(l))
		}
		b = b[l:]
		var v []byte
		var n uint64
		switch typ {
		case protowire.BytesType:
			v, l = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			n, l = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x uint32
			x, l = protowire.ConsumeFixed32(b)
			n = uint64(x)
		case protowire.Fixed64Type:
			n, l = protowire.ConsumeFixed64(b)
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return fmt.Errorf("%w: %v", errBadWire, protowire.ParseError(l))
		}
		b = b[l:]
		if err := fn(num, typ, v, n); err != nil {
			return err
		}
	}
	return nil
}

// Field numbers, from the generated descriptors.
var (
	claClusterName    = fieldNumber(&endpoint.ClusterLoadAssignment{}, "cluster_name")
	claEndpoints      = fieldNumber(&endpoint.ClusterLoadAssignment{}, "endpoints")
	lleLbEndpoints    = fieldNumber(&endpoint.LocalityLbEndpoints{}, "lb_endpoints")
	lbEndpoint        = fieldNumber(&endpoint.LbEndpoint{}, "endpoint")
	lbHealthStatus    = fieldNumber(&endpoint.LbEndpoint{}, "health_status")
	epAddress         = fieldNumber(&endpoint.Endpoint{}, "address")
	addrSocketAddress = fieldNumber(&core.Address{}, "socket_address")
	saAddress         = fieldNumber(&core.SocketAddress{}, "address")
	saPortValue       = fieldNumber(&core.SocketAddress{}, "port_value")
)

func fieldNumber(m interface {
	ProtoReflect() protoreflect.Message
}, name protoreflect.Name) protowire.Number {
	f := m.ProtoReflect().Descriptor().Fields().ByName(name)
	if f == nil {
		panic(fmt.Sprintf("%T has no field %s", m, name))
	}
	return f.Number()
}
