package wire

import (
	"bytes"
	"crypto/rand"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// split cuts b into pieces of at most n bytes, as gRPC's receive buffers
// (one per HTTP/2 data frame) hold a message.
func split(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		s = append(s, mem.SliceBuffer(b[:k]))
		b = b[k:]
	}
	return s
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// TestFrameChunk receives encoded messages into a Frame, cut into buffers
// of several sizes, and checks which are plain chunks, the bytes Data
// returns for those, and that Decode gives the message back for the rest.
func TestFrameChunk(t *testing.T) {
	field := ChunkField(&berthv1.ReadFileResponse{})
	chunk := func(b []byte) []byte {
		out, err := proto.Marshal(&berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Chunk{Chunk: b}})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	big := random(1<<20 - 16)
	header, _ := proto.Marshal(&berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Header{Header: &berthv1.ReadFileHeader{LengthBytes: 7}}})
	for _, tc := range []struct {
		name    string
		wire    []byte
		isChunk bool
		data    []byte
	}{
		{"small chunk", chunk([]byte("hello")), true, []byte("hello")},
		{"1 MiB chunk", chunk(big), true, big},
		{"chunk of 200 bytes (2-byte length)", chunk(big[:200]), true, big[:200]},
		{"empty chunk", chunk([]byte{}), true, []byte{}},
		{"header", header, false, nil},
		{"empty message", nil, false, nil},
		{"chunk then an unknown field", protowire.AppendVarint(protowire.AppendTag(chunk([]byte("x")), 99, protowire.VarintType), 1), false, nil},
		{"chunk twice", append(chunk([]byte("a")), chunk([]byte("b"))...), false, nil},
		{"chunk field as a varint", protowire.AppendVarint(protowire.AppendTag(nil, field, protowire.VarintType), 5), false, nil},
		{"length past the end", chunk([]byte("abc"))[:4], false, nil},
	} {
		for _, piece := range []int{1, 3, 16 << 10, 4 << 20} {
			var fr Frame
			if err := (Codec{}).Unmarshal(split(tc.wire, piece), &fr); err != nil {
				t.Fatalf("%s: Unmarshal: %v", tc.name, err)
			}
			n, ok := fr.Chunk(field)
			if ok != tc.isChunk {
				t.Errorf("%s in pieces of %d: Chunk = %d, %v; want %v", tc.name, piece, n, ok, tc.isChunk)
				continue
			}
			if ok {
				var buf []byte
				if got := fr.Data(&buf); n != len(tc.data) || !bytes.Equal(got, tc.data) {
					t.Errorf("%s in pieces of %d: Data = %d bytes (Chunk said %d), want %d", tc.name, piece, len(got), n, len(tc.data))
				}
				views := fr.Buffers(nil)
				if got := bytes.Join(views, nil); !bytes.Equal(got, tc.data) {
					t.Errorf("%s in pieces of %d: Buffers = %d views of %d bytes, want the %d bytes of Data", tc.name, piece, len(views), len(got), len(tc.data))
				}
				if want := (len(tc.wire) + piece - 1) / piece; len(views) > want {
					t.Errorf("%s in pieces of %d: Buffers = %d views, more than the %d buffers", tc.name, piece, len(views), want)
				}
			} else if len(tc.wire) > 0 && tc.name != "length past the end" {
				var got, want berthv1.ReadFileResponse
				if err := fr.Decode(&got); err != nil {
					t.Errorf("%s: Decode: %v", tc.name, err)
				}
				proto.Unmarshal(tc.wire, &want)
				if d := cmp.Diff(&want, &got, protocmp.Transform()); d != "" {
					t.Errorf("%s: Decode (-want +got):\n%s", tc.name, d)
				}
			}
			fr.Free()
		}
	}
}

// TestFrameFill builds chunks with Fill and checks that what Codec sends
// decodes, with protobuf itself, to the chunk message of those bytes.
func TestFrameFill(t *testing.T) {
	field := ChunkField(&berthv1.WriteFileRequest{})
	for _, n := range []int{1, 127, 128, 16383, 16384, 1<<20 - 16, 2 << 20} {
		data := random(n)
		var fr Frame
		got, err := fr.Fill(field, n, func(p []byte) (int, error) { return copy(p, data), nil })
		if err != nil || got != n {
			t.Fatalf("Fill(%d) = %d, %v", n, got, err)
		}
		out, err := (Codec{}).Marshal(&fr)
		if err != nil {
			t.Fatal(err)
		}
		var msg berthv1.WriteFileRequest
		if err := proto.Unmarshal(out.Materialize(), &msg); err != nil {
			t.Fatalf("Fill(%d): the frame does not decode: %v", n, err)
		}
		out.Free()
		if !bytes.Equal(msg.GetChunk(), data) || msg.GetHeader() != nil {
			t.Errorf("Fill(%d) decodes to a chunk of %d bytes (header %v), want the %d bytes filled", n, len(msg.GetChunk()), msg.GetHeader(), n)
		}
		if fr.data != nil {
			t.Errorf("Fill(%d): the frame still holds its buffers after Marshal handed them to gRPC", n)
		}
	}
	var fr Frame
	if n, err := fr.Fill(field, 10, func([]byte) (int, error) { return 0, nil }); n != 0 || err != nil || fr.data != nil {
		t.Errorf("Fill of nothing = %d, %v, frame %v; want an empty frame", n, err, fr.data)
	}
}

// TestCodecOtherMessages: what is not a Frame goes through gRPC's proto
// codec both ways.
func TestCodecOtherMessages(t *testing.T) {
	in := &berthv1.WriteFileRequest{Part: &berthv1.WriteFileRequest_Header{Header: &berthv1.WriteFileHeader{SandboxId: "sb", WantSha256: true}}}
	out, err := (Codec{}).Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var got berthv1.WriteFileRequest
	if err := (Codec{}).Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, &got, protocmp.Transform()); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
	if _, err := (Codec{}).Marshal("not a message"); err == nil {
		t.Error("Marshal(string) = nil error, want one")
	}
}

// TestCodecRunResponse: a RunResponse's large output goes to the wire
// from the response's own buffers, not a copy of them (issue 21: the copy
// doubled what a Run's output holds while it is sent), and decodes to the
// same response, small or large, whoever decodes it.
func TestCodecRunResponse(t *testing.T) {
	res := &berthv1.ExecResult{ExitCode: proto.Int32(3), StdoutBytes: 99 << 20, StdoutTruncated: true}
	for _, tt := range []struct {
		name           string
		stdout, stderr int
	}{
		{"large stdout", 63 << 20, 1 << 20},
		{"large stderr", 10, 2 << 20},
		{"small", 100, 5},
		{"empty", 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := &berthv1.RunResponse{ExecId: "ex", Result: res, Stdout: random(tt.stdout), Stderr: random(tt.stderr)}
			// Two collections empty gRPC's buffer pools (sync.Pool), which
			// would otherwise lend an earlier subtest's buffer unseen.
			runtime.GC()
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			out, err := (Codec{}).Marshal(in)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
				t.Errorf("Marshal of %d + %d bytes of output allocated %d bytes, want at most 64 KiB", tt.stdout, tt.stderr, got)
			}
			for _, decode := range []struct {
				name string
				fn   func(m proto.Message) error
			}{
				{"Codec", func(m proto.Message) error { return (Codec{}).Unmarshal(split(out.Materialize(), 16<<10), m) }},
				{"proto", func(m proto.Message) error { return proto.Unmarshal(out.Materialize(), m) }},
			} {
				var got berthv1.RunResponse
				if err := decode.fn(&got); err != nil {
					t.Fatalf("%s: %v", decode.name, err)
				}
				if !proto.Equal(&got, in) {
					t.Errorf("%s: decoded %d + %d bytes of output, exec %q, result %v; want the response sent", decode.name,
						len(got.GetStdout()), len(got.GetStderr()), got.GetExecId(), got.GetResult())
				}
			}
			if want := proto.Size(in); out.Len() != want {
				t.Errorf("encoded %d bytes, want %d (proto.Size)", out.Len(), want)
			}
		})
	}
}

// TestUnzeroedPool: a buffer comes back at the size asked, from the
// smallest class that holds it, and is reused as it was left; sizes past
// the largest class are not pooled. Fill's frame holds only what fill
// wrote, whatever the buffer held before.
func TestUnzeroedPool(t *testing.T) {
	for size, class := range map[int]int{1: 0, 4096: 0, 4097: 1, 256 << 10: 6, 1 << 20: 8, 4 << 20: 10, 4<<20 + 1: -1} {
		if got := unzeroedClass(size); got != class {
			t.Errorf("class of %d bytes: %d, want %d", size, got, class)
		}
	}
	var p unzeroedPool
	b := p.Get(5000)
	if len(*b) != 5000 || cap(*b) != 8192 {
		t.Fatalf("Get(5000): len %d cap %d; want 5000, 8192", len(*b), cap(*b))
	}
	big := p.Get(5 << 20)
	if len(*big) != 5<<20 {
		t.Errorf("Get(5 MiB): len %d", len(*big))
	}
	p.Put(big) // dropped, not pooled

	var f Frame
	defer f.Free()
	for _, s := range []string{strings.Repeat("x", 1000), "ab"} {
		n, err := f.Fill(1, 4096, func(p []byte) (int, error) { return copy(p, s), nil })
		var buf []byte
		if got, ok := f.Chunk(1); err != nil || n != len(s) || !ok || got != len(s) || string(f.Data(&buf)) != s {
			t.Errorf("Fill of %d bytes into a used buffer: n %d, chunk %d %v, %q", len(s), n, got, ok, f.Data(&buf))
		}
	}
}
