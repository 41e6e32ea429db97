package wire

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Codec is the gRPC codec of berth's hops: a *Frame goes to the wire and
// comes from it as it is, a RunResponse goes with its output taken from
// its own buffers, every other message through gRPC's own proto codec.
// Its name is "proto", so nothing changes on the wire: a peer that uses
// the plain proto codec reads and writes the same bytes. Servers take
// it through ServerOptions, calls through CallOption.
type Codec struct{}

var protoCodec = encoding.GetCodecV2(protocodec.Name)

// Name returns "proto".
func (Codec) Name() string { return protocodec.Name }

// Marshal returns a *Frame's buffers, handing them to gRPC (the frame is
// empty afterwards), encodes a RunResponse with its output by reference
// (marshalByReference), and any other message with protobuf.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *Frame:
		data := m.data
		*m = Frame{}
		return data, nil
	case *berthv1.RunResponse:
		// A unary response: built once, never changed after the
		// handler returns it.
		return marshalByReference(m)
	}
	return protoCodec.Marshal(v)
}

// referenceBytes is the size from which marshalByReference sends a bytes
// field from the message's own buffer.
const referenceBytes = 64 << 10

// marshalByReference encodes m with its bytes fields of referenceBytes or
// more as references to m's own buffers: gRPC's proto codec would copy
// them into a buffer of its own, so that a Run's output (up to 64 MiB)
// took twice its size while it was sent (issue 21). The large fields
// follow the others on the wire, which protobuf allows (fields may come
// in any order). m must not change until gRPC has written it, so this is
// only for messages built once and sent once.
func marshalByReference(m proto.Message) (mem.BufferSlice, error) {
	r := m.ProtoReflect()
	var large []protoreflect.FieldDescriptor
	r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() == protoreflect.BytesKind && !fd.IsList() && len(v.Bytes()) >= referenceBytes {
			large = append(large, fd)
		}
		return true
	})
	if len(large) == 0 {
		return protoCodec.Marshal(m)
	}
	rest := r.New()
	r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if !slices.Contains(large, fd) {
			rest.Set(fd, v)
		}
		return true
	})
	rest.SetUnknown(r.GetUnknown())
	head, err := proto.Marshal(rest.Interface())
	if err != nil {
		return nil, err
	}
	data := mem.BufferSlice{mem.SliceBuffer(head)}
	for _, fd := range large {
		b := r.Get(fd).Bytes()
		tag := protowire.AppendVarint(protowire.AppendTag(nil, fd.Number(), protowire.BytesType), uint64(len(b)))
		data = append(data, mem.SliceBuffer(tag), mem.SliceBuffer(b))
	}
	return data, nil
}

// Unmarshal makes a *Frame hold the message's buffers (a reference to
// them, until Frame.Free), or decodes into any other message with
// protobuf.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*Frame); ok {
		f.Free()
		data.Ref()
		f.data = data
		return nil
	}
	return protoCodec.Unmarshal(data, v)
}

// serverCodec is Codec for servers: a request with a string field that is
// not valid UTF-8 decodes as an empty message marked with the field's
// path, which the interceptors of ServerOptions refuse (see utf8.go).
type serverCodec struct{ Codec }

func (c serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.Codec.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	if field, bad := invalidUTF8(data.Materialize(), m.ProtoReflect().Descriptor(), ""); bad {
		markInvalidUTF8(m, field)
		return nil
	}
	return err
}

// CallOption makes a call use Codec, for calls that send or receive a
// *Frame.
func CallOption() grpc.CallOption { return grpc.ForceCodecV2(Codec{}) }

// Frame is one message as it is on the wire, in gRPC's buffers. A file
// stream's data message holds a single bytes field, the chunk, whose
// number is the same in berth.v1 and berth.agent.v1 (TestChunkFields):
// berthd relays such a frame from one stream to the other without
// decoding it, and the client and the agent take its bytes straight from
// gRPC's buffers or read them straight into one. Receiving into a Frame
// holds the buffers until Free or the next receive into it; sending it
// hands them to gRPC. The zero Frame is empty; a Frame is not safe for
// concurrent use.
type Frame struct {
	data mem.BufferSlice
	// off and n locate the chunk's bytes in data once Chunk found them.
	off, n int
}

// Free releases the frame's buffers.
func (f *Frame) Free() {
	if f.data != nil {
		f.data.Free()
	}
	*f = Frame{}
}

// Chunk reports whether the frame is a message of exactly one field, the
// bytes field numbered field, and returns the length of its bytes. Any
// other message (a header, a summary, an empty message, unknown or
// repeated fields) is not a chunk: Decode it.
func (f *Frame) Chunk(field protoreflect.FieldNumber) (int, bool) {
	var head [16]byte // a tag (at most 5 bytes) and a length (at most 10)
	got := 0
	for _, b := range f.data {
		got += copy(head[got:], b.ReadOnlyData())
		if got == len(head) {
			break
		}
	}
	num, typ, tagLen := protowire.ConsumeTag(head[:got])
	if tagLen < 0 || num != field || typ != protowire.BytesType {
		return 0, false
	}
	n, lenLen := protowire.ConsumeVarint(head[tagLen:got])
	if lenLen < 0 || n != uint64(f.data.Len()-tagLen-lenLen) {
		return 0, false
	}
	f.off, f.n = tagLen+lenLen, int(n)
	return f.n, true
}

// Data returns the chunk's bytes after Chunk or Embedded reported one: a view of
// gRPC's buffer when they lie in one, or else a copy in *buf (grown when
// too small). The bytes are valid until the frame is freed, received into
// or sent.
func (f *Frame) Data(buf *[]byte) []byte {
	skip := f.off
	for i, b := range f.data {
		d := b.ReadOnlyData()
		if skip >= len(d) {
			skip -= len(d)
			continue
		}
		if len(d)-skip >= f.n {
			return d[skip : skip+f.n]
		}
		if cap(*buf) < f.n {
			*buf = make([]byte, f.n)
		}
		out := (*buf)[:f.n]
		k := copy(out, d[skip:])
		for _, b := range f.data[i+1:] {
			k += copy(out[k:], b.ReadOnlyData())
		}
		return out
	}
	return nil
}

// Buffers appends the chunk's bytes after Chunk or Embedded reported one
// to views, as views of gRPC's buffers in order, and returns views: a
// message of 1 MiB arrives in 64 buffers of 16 KiB (one per HTTP/2 data
// frame), which Data would copy into one. The views are valid until the
// frame is freed, received into or sent.
func (f *Frame) Buffers(views [][]byte) [][]byte {
	skip, left := f.off, f.n
	for _, b := range f.data {
		if left == 0 {
			break
		}
		d := b.ReadOnlyData()
		if skip >= len(d) {
			skip -= len(d)
			continue
		}
		d = d[skip:]
		skip = 0
		d = d[:min(len(d), left)]
		left -= len(d)
		views = append(views, d)
	}
	return views
}

// DataLen returns the length in bytes of the chunk's data after Chunk or
// Embedded reported one, without copying it (for accounting).
func (f *Frame) DataLen() int { return f.n }

// Decode decodes the frame into m, for a message that is not a chunk.
func (f *Frame) Decode(m proto.Message) error {
	if err := proto.Unmarshal(f.data.Materialize(), m); err != nil {
		return fmt.Errorf("decode %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

// Fill makes the frame a chunk message of the bytes field numbered field,
// its bytes read by fill straight into a pooled buffer of size bytes,
// which gRPC returns to the pool once it has written it. It returns what
// fill returned; with n == 0 the frame is empty. The buffer is not zeroed:
// fill must have written the n bytes it reports (as io.Reader does), and
// only those are sent.
func (f *Frame) Fill(field protoreflect.FieldNumber, size int, fill func([]byte) (int, error)) (int, error) {
	f.Free()
	pool := fillPool
	buf := pool.Get(size)
	n, err := fill(*buf)
	if n <= 0 {
		pool.Put(buf)
		return 0, err
	}
	*buf = (*buf)[:n]
	head := protowire.AppendVarint(protowire.AppendTag(nil, field, protowire.BytesType), uint64(n))
	f.data = mem.BufferSlice{mem.SliceBuffer(head), mem.NewBuffer(buf, pool)}
	f.off, f.n = len(head), n
	return n, err
}

// ChunkField returns the number of m's bytes field named "chunk", the
// data of berth's file streams. It panics when m has none.
func ChunkField(m proto.Message) protoreflect.FieldNumber { return BytesField(m, "chunk") }

// BytesField returns the number of m's bytes field named name (the data
// field of a port-forward message, say). It panics when m has none.
func BytesField(m proto.Message, name protoreflect.Name) protoreflect.FieldNumber {
	fd := m.ProtoReflect().Descriptor().Fields().ByName(name)
	if fd == nil || fd.Kind() != protoreflect.BytesKind {
		panic(fmt.Sprintf("wire: %s has no bytes field %s", m.ProtoReflect().Descriptor().FullName(), name))
	}
	return fd.Number()
}

// Receiver receives the messages of a stream whose data messages carry
// chunks in the bytes field Field: a plain chunk as it is on the wire, its
// bytes taken from gRPC's buffers; anything else decoded.
type Receiver struct {
	Field protoreflect.FieldNumber
	fr    Frame
	buf   []byte
}

// Recv receives the next message with recvMsg (a stream's RecvMsg). For a
// plain chunk it returns the chunk's bytes, valid until the next Recv or
// Free, and chunk true, leaving m alone; any other message it decodes into
// m and returns chunk false. Errors are recvMsg's (io.EOF at the end) or a
// message that does not decode.
func (r *Receiver) Recv(recvMsg func(any) error, m proto.Message) (data []byte, chunk bool, err error) {
	if chunk, err = r.recv(recvMsg, m); !chunk || err != nil {
		return nil, false, err
	}
	return r.fr.Data(&r.buf), true, nil
}

// RecvBuffers is Recv for a caller that takes a chunk's bytes as views of
// gRPC's buffers (Frame.Buffers), appended to views[:0], rather than
// copied into one slice.
func (r *Receiver) RecvBuffers(recvMsg func(any) error, m proto.Message, views [][]byte) (data [][]byte, chunk bool, err error) {
	if chunk, err = r.recv(recvMsg, m); !chunk || err != nil {
		return nil, false, err
	}
	return r.fr.Buffers(views[:0]), true, nil
}

// recv receives the next message into r.fr: chunk true for a plain chunk,
// any other message decoded into m.
func (r *Receiver) recv(recvMsg func(any) error, m proto.Message) (chunk bool, err error) {
	if err := recvMsg(&r.fr); err != nil {
		return false, err
	}
	if _, ok := r.fr.Chunk(r.Field); ok {
		return true, nil
	}
	return false, r.fr.Decode(m)
}

// Free releases the last chunk's buffers.
func (r *Receiver) Free() { r.fr.Free() }

// Embedded reports whether the frame is a message of exactly one field,
// the message field numbered field (an oneof case, say), whose own fields
// are exactly, in this order, the varints numbered varints (each once)
// and then the bytes field numbered data running to the frame's end: the
// shape proto.Marshal gives an exec's output event {seq, stream, data}.
// It stores the varints' values in vals (len(varints) of them) and makes
// the data field's bytes the frame's chunk (see Data). A frame that
// passes decodes to those fields and nothing else, whoever sent it, so it
// may be relayed as it is; any other message (a field missing, repeated,
// reordered or unknown, bytes that do not parse) is not: Decode it.
func (f *Frame) Embedded(field protoreflect.FieldNumber, varints []protoreflect.FieldNumber, data protoreflect.FieldNumber, vals []uint64) bool {
	// The headers: two tags with lengths and a tag with a value per
	// varint, at most 11 bytes each for field numbers below 16. Longer
	// headers do not pass.
	var head [64]byte
	got := 0
	for _, b := range f.data {
		got += copy(head[got:], b.ReadOnlyData())
		if got == len(head) {
			break
		}
	}
	p := head[:got]
	total := f.data.Len()
	// consume reads a tag numbered num of type typ and its varint (a
	// value or a length), advancing p.
	consume := func(num protoreflect.FieldNumber, typ protowire.Type) (uint64, bool) {
		n, t, tagLen := protowire.ConsumeTag(p)
		if tagLen < 0 || n != num || t != typ {
			return 0, false
		}
		v, vLen := protowire.ConsumeVarint(p[tagLen:])
		if vLen < 0 {
			return 0, false
		}
		p = p[tagLen+vLen:]
		return v, true
	}
	n, ok := consume(field, protowire.BytesType)
	if !ok || n != uint64(total-(got-len(p))) {
		return false
	}
	for i, num := range varints {
		if vals[i], ok = consume(num, protowire.VarintType); !ok {
			return false
		}
	}
	n, ok = consume(data, protowire.BytesType)
	if !ok || n != uint64(total-(got-len(p))) {
		return false
	}
	f.off, f.n = got-len(p), int(n)
	return true
}

// FrameOf returns a frame holding b, an encoded message, to be sent as it
// is. b must not change while gRPC may hold it; it is never pooled.
func FrameOf(b []byte) *Frame {
	return &Frame{data: mem.BufferSlice{mem.SliceBuffer(b)}}
}

// fillPool holds Fill's buffers, and gRPC's receive buffers on every hop
// (ServerOptions, DialOptions). grpc-go's pools zero each buffer they
// hand out: for PortForward's reads that was a tenth of berthd's CPU
// (docs/performance.md). Fill's buffer is written by fill before anything
// is sent, and only the bytes it wrote are, so nothing of an earlier use
// leaves through it; gRPC reads each HTTP/2 data frame into the whole of
// its buffer (io.ReadFull) before anything looks at it, and gives one
// that failed back.
var fillPool mem.BufferPool = &unzeroedPool{}

// Size classes of unzeroedPool: powers of two from 4 KiB to 4 MiB.
const (
	unzeroedMinShift = 12
	unzeroedClasses  = 11
)

// unzeroedPool is a mem.BufferPool whose Get returns a buffer as its last
// user left it; larger buffers than its largest class are not pooled.
type unzeroedPool struct {
	classes [unzeroedClasses]sync.Pool
}

// unzeroedClass returns the smallest class holding size bytes, or -1.
func unzeroedClass(size int) int {
	if size <= 1<<unzeroedMinShift {
		return 0
	}
	c := bits.Len(uint(size-1)) - unzeroedMinShift
	if c >= unzeroedClasses {
		return -1
	}
	return c
}

func (p *unzeroedPool) Get(size int) *[]byte {
	c := unzeroedClass(size)
	if c < 0 {
		b := make([]byte, size)
		return &b
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, 1<<(c+unzeroedMinShift))
	return &b
}

func (p *unzeroedPool) Put(b *[]byte) {
	if c := unzeroedClass(cap(*b)); c >= 0 && cap(*b) == 1<<(c+unzeroedMinShift) {
		p.classes[c].Put(b)
	}
}
