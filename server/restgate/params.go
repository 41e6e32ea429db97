package restgate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// fromQuery fills msg from r's path variables (vars: wildcard name ->
// field name) and query parameters, each a top-level field of msg by its
// JSON or proto name (sinceSeq or since_seq), with protobuf's JSON mapping
// of the text: a bool field takes true or false, a repeated field one
// parameter per element, an integer decimal digits (a leading zero is
// refused: mode=0644 would be read as 644, not octal). An unknown or
// malformed parameter is INVALID_ARGUMENT naming it. skip names
// parameters the route reads itself.
func fromQuery(r *http.Request, msg proto.Message, vars map[string]string, skip ...string) error {
	fields := msg.ProtoReflect().Descriptor().Fields()
	obj := map[string]any{}
	for wildcard, field := range vars {
		obj[field] = r.PathValue(wildcard)
	}
	for key, values := range r.URL.Query() {
		if slices.Contains(skip, key) {
			continue
		}
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByName(protoreflect.Name(key))
		}
		if fd == nil || fd.Message() != nil || fd.IsMap() {
			return invalid(key, fmt.Sprintf("not a parameter of %s %s", r.Method, r.URL.Path))
		}
		var out []any
		for _, v := range values {
			x, err := queryValue(fd, v)
			if err != nil {
				return invalid(key, err.Error())
			}
			out = append(out, x)
		}
		switch {
		case fd.IsList():
			obj[string(fd.Name())] = out
		case len(out) != 1:
			return invalid(key, "given more than once")
		default:
			obj[string(fd.Name())] = out[0]
		}
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if err := protojson.Unmarshal(b, msg); err != nil {
		return invalid("query", err.Error())
	}
	return nil
}

// queryValue is the JSON value of parameter text v for field fd.
func queryValue(fd protoreflect.FieldDescriptor, v string) (any, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%q is not true or false", v)
		}
		return b, nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind, protoreflect.Uint32Kind, protoreflect.Fixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if len(v) > 1 && v[0] == '0' {
			return nil, fmt.Errorf("%q has a leading zero: give the number in decimal (420 for 0644)", v)
		}
		if _, err := strconv.ParseInt(strings.TrimPrefix(v, "-"), 10, 64); err != nil {
			if _, uerr := strconv.ParseUint(v, 10, 64); uerr != nil {
				return nil, fmt.Errorf("%q is not a decimal integer", v)
			}
		}
		return v, nil // protobuf's JSON mapping takes integers as strings too
	}
	return v, nil
}
