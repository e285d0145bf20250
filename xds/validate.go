package xds

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// ValidateDeep is Validate for resources that embed configuration in
// google.protobuf.Any fields (a listener's filters, a bootstrap's
// extensions): go-control-plane's generated ValidateAll does not look inside
// them, so an empty HttpConnectionManager in a listener would pass. Every
// Any, at any depth, is unpacked (its type must be linked into the binary)
// and validated the same way.
func ValidateDeep(m proto.Message) error {
	if err := Validate(m); err != nil {
		return err
	}
	return validateAnys(m.ProtoReflect(), typeName(m)+" "+fmt.Sprintf("%q", resourceName(m)))
}

var anyName = (&anypb.Any{}).ProtoReflect().Descriptor().FullName()

// validateAnys validates every Any reachable from m; where says where m is.
func validateAnys(m protoreflect.Message, where string) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					err = validateValue(mv.Message(), where+"."+string(fd.Name()))
					return err == nil
				})
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				l := v.List()
				for i := 0; i < l.Len() && err == nil; i++ {
					err = validateValue(l.Get(i).Message(), fmt.Sprintf("%s.%s[%d]", where, fd.Name(), i))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			err = validateValue(v.Message(), where+"."+string(fd.Name()))
		}
		return err == nil
	})
	return err
}

// validateValue validates a message field: an Any is unpacked and validated
// whole (ValidateAll, then its own Anys); any other message is searched for Anys.
func validateValue(m protoreflect.Message, where string) error {
	if m.Descriptor().FullName() != anyName {
		return validateAnys(m, where)
	}
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		return fmt.Errorf("%w: %s: an Any of unexpected Go type %T", ErrInvalidResource, where, m.Interface())
	}
	inner, err := a.UnmarshalNew()
	if err != nil {
		return fmt.Errorf("%w: %s: cannot unpack %s: %v", ErrInvalidResource, where, a.GetTypeUrl(), err)
	}
	if v, ok := inner.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%w: %s (%s): %v", ErrInvalidResource, where, inner.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	return validateAnys(inner.ProtoReflect(), where+"("+string(inner.ProtoReflect().Descriptor().Name())+")")
}
