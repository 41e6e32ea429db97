package wire

import (
	"context"
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
)

// A request whose string field holds invalid UTF-8 fails protobuf's decode,
// and grpc-go turns every codec error into INTERNAL ("grpc: failed to
// unmarshal the received message", rpc_util.go recv) before any handler or
// interceptor sees it. A server's Codec therefore answers such a request
// with an empty message marked with the field's path (an unknown field of
// number invalidUTF8Field), and the interceptors of ServerOptions refuse a
// marked message with INVALID_ARGUMENT naming the field. Only servers mark:
// a client's decode of a bad response still fails.

// invalidUTF8Field is the field number of the mark: the largest valid one,
// which no berth message uses.
const invalidUTF8Field = protowire.MaxValidNumber

// invalidUTF8 returns the path of the first string field in b, a message
// of md on the wire, that is not valid UTF-8 ("process.argv[1]",
// "labels"), or false when there is none or b is malformed. prefix is
// the path of the message itself, with a trailing dot.
func invalidUTF8(b []byte, md protoreflect.MessageDescriptor, prefix string) (string, bool) {
	seen := make(map[protowire.Number]int)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "", false
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil {
			continue
		}
		i := seen[num]
		seen[num]++
		path := prefix + string(fd.Name())
		if fd.IsList() {
			path = fmt.Sprintf("%s[%d]", path, i)
		}
		switch {
		case fd.IsMap():
			// A map's entry is a message of key and value; the field
			// is the map's, as for other refusals of its entries.
			if _, bad := invalidUTF8(v, fd.Message(), ""); bad {
				return prefix + string(fd.Name()), true
			}
		case fd.Kind() == protoreflect.StringKind:
			if !utf8.Valid(v) {
				return path, true
			}
		case fd.Kind() == protoreflect.MessageKind:
			if p, bad := invalidUTF8(v, fd.Message(), path+"."); bad {
				return p, true
			}
		}
	}
	return "", false
}

// markInvalidUTF8 makes m empty but for the mark naming field.
func markInvalidUTF8(m proto.Message, field string) {
	proto.Reset(m)
	var mark []byte
	mark = protowire.AppendTag(mark, invalidUTF8Field, protowire.BytesType)
	mark = protowire.AppendString(mark, field)
	m.ProtoReflect().SetUnknown(mark)
}

// invalidUTF8Error returns INVALID_ARGUMENT naming the field when v is a
// message the server's Codec marked, or nil.
func invalidUTF8Error(v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return nil
	}
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if num == invalidUTF8Field && typ == protowire.BytesType {
			field, _ := protowire.ConsumeString(b)
			return rpcstatus.InvalidArgument(field, "is not valid UTF-8 (protobuf string fields must be)")
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return nil
		}
		b = b[n:]
	}
	return nil
}

// checkUnary refuses a unary request the Codec marked.
func checkUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := invalidUTF8Error(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// checkStream refuses each stream message the Codec marked: RecvMsg
// fails with the refusal.
func checkStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, checkedStream{ss})
}

type checkedStream struct{ grpc.ServerStream }

func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return invalidUTF8Error(m)
}
