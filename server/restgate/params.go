package restgate

import (
	"encoding/json"
	"errors"
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
// parameters the route reads itself. A parameter naming a field the path
// fills (sandboxId) is refused: the path's sandbox is the call's.
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
		if isVarField(vars, string(fd.Name())) {
			return invalid(key, fmt.Sprintf("given by the path of %s %s, not a query parameter", r.Method, r.URL.Path))
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
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return integer(v, func() error { _, err := strconv.ParseInt(v, 10, bits(fd)); return err })
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if strings.HasPrefix(v, "-") {
			return nil, fmt.Errorf("%q is negative: this field takes 0 or more", v)
		}
		return integer(v, func() error { _, err := strconv.ParseUint(v, 10, bits(fd)); return err })
	}
	return v, nil
}

// integer checks parameter text v of an integer field with parse (strconv
// for the field's sign and size), so that a value out of the field's
// range (-5 for a uint64, 2^32 for a uint32) is an error naming the
// parameter, not protojson's naming none.
func integer(v string, parse func() error) (any, error) {
	if digits := strings.TrimPrefix(v, "-"); len(digits) > 1 && digits[0] == '0' {
		return nil, fmt.Errorf("%q has a leading zero: give the number in decimal (420 for 0644)", v)
	}
	if err := parse(); err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return nil, fmt.Errorf("%q is out of range for this field", v)
		}
		return nil, fmt.Errorf("%q is not a decimal integer", v)
	}
	return v, nil // protobuf's JSON mapping takes integers as strings too
}

// bits is the size in bits of integer field fd.
func bits(fd protoreflect.FieldDescriptor) int {
	switch fd.Kind() {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind, protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return 32
	}
	return 64
}

// isVarField reports whether field is filled from a path variable.
func isVarField(vars map[string]string, field string) bool {
	for _, f := range vars {
		if f == field {
			return true
		}
	}
	return false
}
