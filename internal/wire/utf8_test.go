package wire

import (
	"bytes"
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

const placeholder = "PLACEHOLDER"

// badBytes has placeholder's length and is not UTF-8: swapped in on the
// wire, every length stays right.
var badBytes = bytes.Repeat([]byte{0xff}, len(placeholder))

// stringCase is a message with one string field set to placeholder, and
// the path a refusal must name.
type stringCase struct {
	msg  proto.Message
	path string
}

// stringCases returns one case per string field reachable from a message
// of md (depth bounds the nesting), each built by set on a fresh message.
func stringCases(newMsg func() protoreflect.Message, at func(protoreflect.Message) protoreflect.Message, md protoreflect.MessageDescriptor, prefix string, depth int) []stringCase {
	var out []stringCase
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		m := newMsg()
		target := at(m)
		path := prefix + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapKey().Kind() == protoreflect.StringKind {
				target.Mutable(fd).Map().Set(protoreflect.ValueOfString(placeholder).MapKey(), fd.MapValue().Default())
				out = append(out, stringCase{m.Interface(), path})
			}
			if fd.MapValue().Kind() == protoreflect.StringKind {
				m := newMsg()
				at(m).Mutable(fd).Map().Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString(placeholder))
				out = append(out, stringCase{m.Interface(), path})
			}
		case fd.IsList() && fd.Kind() == protoreflect.StringKind:
			l := target.Mutable(fd).List()
			l.Append(protoreflect.ValueOfString("ok"))
			l.Append(protoreflect.ValueOfString(placeholder))
			out = append(out, stringCase{m.Interface(), path + "[1]"})
		case fd.Kind() == protoreflect.StringKind:
			target.Set(fd, protoreflect.ValueOfString(placeholder))
			out = append(out, stringCase{m.Interface(), path})
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList() && depth > 0:
			fd := fd
			out = append(out, stringCases(newMsg, func(m protoreflect.Message) protoreflect.Message { return at(m).Mutable(fd).Message() },
				fd.Message(), path+".", depth-1)...)
		}
	}
	return out
}

// TestServerCodecInvalidUTF8: every string field of the create, run and
// exec requests, when it is not UTF-8 on the wire, is refused as
// INVALID_ARGUMENT naming the field (issue 21: grpc-go answered INTERNAL).
func TestServerCodecInvalidUTF8(t *testing.T) {
	for _, proto0 := range []proto.Message{&berthv1.CreateSandboxRequest{}, &berthv1.RunRequest{}, &berthv1.ExecRequest{}} {
		md := proto0.ProtoReflect().Descriptor()
		newMsg := func() protoreflect.Message { return proto0.ProtoReflect().New() }
		cases := stringCases(newMsg, func(m protoreflect.Message) protoreflect.Message { return m }, md, "", 3)
		if len(cases) < 3 {
			t.Fatalf("%s: only %d string fields found", md.FullName(), len(cases))
		}
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", md.Name(), tc.path), func(t *testing.T) {
				b, err := proto.Marshal(tc.msg)
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Count(b, []byte(placeholder)) != 1 {
					t.Fatalf("placeholder appears %d times on the wire", bytes.Count(b, []byte(placeholder)))
				}
				b = bytes.Replace(b, []byte(placeholder), badBytes, 1)
				got := newMsg().Interface()
				if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got); err == nil {
					t.Fatalf("Codec decoded invalid UTF-8 without an error")
				}
				got = newMsg().Interface()
				if err := (serverCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got); err != nil {
					t.Fatalf("serverCodec.Unmarshal = %v, want a marked message", err)
				}
				err = invalidUTF8Error(got)
				if rpcstatus.Reason(err) != rpcstatus.ReasonInvalidArgument || !bytes.HasPrefix([]byte(err.Error()), []byte("rpc error: code = InvalidArgument desc = "+tc.path+": ")) {
					t.Errorf("refusal = %v, want INVALID_ARGUMENT naming %s", err, tc.path)
				}
			})
		}
	}
	// A valid message is not marked; a malformed one still fails.
	ok := &berthv1.RunRequest{SandboxId: "sb", Process: &berthv1.ProcessSpec{Argv: []string{"ls"}}}
	b, _ := proto.Marshal(ok)
	got := &berthv1.RunRequest{}
	if err := (serverCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got); err != nil || invalidUTF8Error(got) != nil || !proto.Equal(got, ok) {
		t.Errorf("valid request = %v, %v, %v", got, err, invalidUTF8Error(got))
	}
	if err := (serverCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x05, 'a'})}, &berthv1.RunRequest{}); err == nil {
		t.Errorf("truncated request decoded without an error")
	}
}
