package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// outputFormat is the value of -o/--output: "table" (the default of list
// commands) or "json".
type outputFormat string

func (o *outputFormat) String() string { return string(*o) }
func (o *outputFormat) Type() string   { return "FORMAT" }
func (o *outputFormat) Set(v string) error {
	switch v {
	case "table", "json":
		*o = outputFormat(v)
		return nil
	}
	return fmt.Errorf("%q: want table or json", v)
}

// addOutputFlag adds -o/--output with the default def to cmd.
func addOutputFlag(cmd *cobra.Command, o *outputFormat, def outputFormat) {
	*o = def
	cmd.Flags().VarP(o, "output", "o", `output format: table or json (json: the API's messages as protojson, one array for a list)`)
}

// writeJSON writes msg as indented protojson (field names as in the .proto
// files' JSON mapping, e.g. "createdAt"), and a newline.
func writeJSON(w io.Writer, msg proto.Message) error {
	b, err := protojson.Marshal(msg)
	if err != nil {
		return err
	}
	return writeIndented(w, b)
}

// writeJSONList writes msgs as one indented JSON array of protojson objects.
func writeJSONList[M proto.Message](w io.Writer, msgs []M) error {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		j, err := protojson.Marshal(m)
		if err != nil {
			return err
		}
		b.Write(j)
	}
	b.WriteByte(']')
	return writeIndented(w, b.Bytes())
}

// writeIndented re-indents JSON for a stable look: protojson varies its
// spacing on purpose.
func writeIndented(w io.Writer, b []byte) error {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err := out.WriteTo(w)
	return err
}
