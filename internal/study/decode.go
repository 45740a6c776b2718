package study

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// FieldError is one problem in a study file, located by line, column and the path
// of the field, e.g. spec.experiments[1].rate.
type FieldError struct {
	File   string
	Line   int
	Column int
	Field  string
	Msg    string
	// Err is the underlying error when the problem came from another package.
	Err error
}

func (e *FieldError) Unwrap() error { return e.Err }

func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in a study file, in file order.
type Errors []*FieldError

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// maxNodes bounds the work on one document: YAML aliases can make a small file
// expand into an enormous tree.
const maxNodes = 200000

// decoder turns a yaml.Node tree into Go values, remembering where every field was
// written so later validation can point at it.
type decoder struct {
	file    string
	errs    Errors
	values  map[string]*yaml.Node // field path -> its value node
	failed  map[string]bool       // fields whose value could not be decoded
	visited int
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	e := &FieldError{File: d.file, Field: path, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, e)
}

// decodeErr reports a value that could not be decoded, and remembers the field so
// that checks on it later stay quiet.
func (d *decoder) decodeErr(n *yaml.Node, path, format string, args ...any) {
	d.failed[path] = true
	d.errorf(n, path, format, args...)
}

// errAt reports a problem at the field, or at its closest written ancestor when the
// field itself is absent (a missing required field is reported where its parent is).
func (d *decoder) errAt(path, format string, args ...any) {
	if d.failed[path] {
		return // already reported as undecodable; a second complaint would only confuse
	}
	d.errorf(d.nearest(path), path, format, args...)
}

func (d *decoder) nearest(path string) *yaml.Node {
	for p := path; ; {
		if n, ok := d.values[p]; ok {
			return n
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			return d.values[""]
		}
		p = p[:i]
	}
}

// has reports whether the field was written in the file (with a non-null value).
func (d *decoder) has(path string) bool {
	_, ok := d.values[path]
	return ok
}

var nodeDecoderType = reflect.TypeFor[nodeDecoder]()

func (d *decoder) decode(path string, n *yaml.Node, v reflect.Value) {
	for n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return
		}
		n = n.Alias
	}
	if d.visited++; d.visited > maxNodes {
		if d.visited == maxNodes+1 {
			d.decodeErr(n, path, "document too large (more than %d values after expanding aliases)", maxNodes)
		}
		return
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // an empty value is the same as leaving the field out
	}
	d.values[path] = n
	if v.CanAddr() && v.Addr().Type().Implements(nodeDecoderType) {
		if err := v.Addr().Interface().(nodeDecoder).decodeNode(n); err != nil {
			d.decodeErr(n, path, "%v", err)
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		elem := reflect.New(v.Type().Elem())
		d.decode(path, n, elem.Elem())
		v.Set(elem)
	case reflect.Struct:
		d.decodeStruct(path, n, v)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.decodeErr(n, path, "expected a list, got %s", quote(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(fmt.Sprintf("%s[%d]", path, i), item, s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		d.decodeMap(path, n, v)
	case reflect.Interface:
		var x any
		if err := n.Decode(&x); err != nil {
			d.decodeErr(n, path, "%v", err)
			return
		}
		if x != nil {
			v.Set(reflect.ValueOf(x))
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.decodeErr(n, path, "expected a string, got %s", quote(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
			d.decodeErr(n, path, "expected true or false, got %s", quote(n))
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64:
		var i int64
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&i) != nil {
			d.decodeErr(n, path, "expected a whole number, got %s", quote(n))
			return
		}
		v.SetInt(i)
	case reflect.Uint64:
		var u uint64
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&u) != nil {
			d.decodeErr(n, path, "expected a whole number from 0 to %d, got %s", uint64(math.MaxUint64), quote(n))
			return
		}
		v.SetUint(u)
	case reflect.Float64:
		var f float64
		if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") ||
			n.Decode(&f) != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			d.decodeErr(n, path, "expected a number, got %s", quote(n))
			return
		}
		v.SetFloat(f)
	default:
		panic("study: no YAML decoding for " + v.Type().String())
	}
}

func (d *decoder) decodeStruct(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.decodeErr(n, path, "expected a mapping of fields, got %s", quote(n))
		return
	}
	fields := yamlFields(v.Type())
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		name := key.Value
		fieldPath := join(path, name)
		if key.Kind != yaml.ScalarNode {
			d.decodeErr(key, path, "field names must be plain strings")
			continue
		}
		idx, ok := fields[name]
		if !ok {
			d.decodeErr(key, fieldPath, "unknown field%s", suggest(name, sortedKeys(fields)))
			continue
		}
		if seen[name] {
			d.decodeErr(key, fieldPath, "given twice")
			continue
		}
		seen[name] = true
		d.decode(fieldPath, val, v.Field(idx))
	}
}

func (d *decoder) decodeMap(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.decodeErr(n, path, "expected a mapping, got %s", quote(n))
		return
	}
	m := reflect.MakeMap(v.Type())
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if key.Kind != yaml.ScalarNode || key.Value == "" {
			d.decodeErr(key, path, "keys must be non-empty plain strings")
			continue
		}
		keyPath := path + "." + key.Value
		if m.MapIndex(reflect.ValueOf(key.Value)).IsValid() {
			d.decodeErr(key, keyPath, "given twice")
			continue
		}
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(keyPath, val, elem)
		m.SetMapIndex(reflect.ValueOf(key.Value), elem)
	}
	v.Set(m)
}

// yamlFields maps the YAML names of a struct's fields to their indexes.
func yamlFields(t reflect.Type) map[string]int {
	out := map[string]int{}
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			out[name] = i
		}
	}
	return out
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	return name
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// suggest returns ` (did you mean "x"?)` naming the closest candidate, or "" when
// none is close enough to be a likely typo.
func suggest(got string, candidates []string) string {
	best, bestDist := "", math.MaxInt
	for _, c := range candidates {
		d := editDistance(strings.ToLower(got), strings.ToLower(c))
		if d < bestDist {
			best, bestDist = c, d
		}
	}
	if best == "" || bestDist > max(1, min(3, len(best)/3)) {
		return ""
	}
	return " (did you mean " + strconv.Quote(best) + "?)"
}

// editDistance is the optimal-string-alignment distance between a and b: edits
// and swaps of neighbouring letters, the commonest typos, each count one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 200 || len(rb) > 200 {
		return math.MaxInt // nothing that long is a typo of a field name
	}
	before := make([]int, len(rb)+1) // row i-2
	prev := make([]int, len(rb)+1)   // row i-1
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], before[j-2]+1)
			}
		}
		before, prev, cur = prev, cur, before
	}
	return prev[len(rb)]
}
