package workload

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// PosError is one problem in a graph file, with the position and the field path
// (e.g. services[2].script[0].call.service) it concerns.
type PosError struct {
	File   string
	Line   int
	Column int // 0 when only the line is known (YAML syntax errors)
	Field  string
	Msg    string
}

func (e *PosError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	b.WriteByte(':')
	b.WriteString(strconv.Itoa(e.Line))
	if e.Column > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Column))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is every problem found in a graph file, in file order of discovery.
type ErrorList []*PosError

func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Limits that keep a graph runnable on one machine and catch unit mistakes
// ("responseSize: 1GiB" is almost always meant to be 1KiB).
const (
	maxReplicas     = 1000
	maxWeight       = 1_000_000
	maxBodySize     = 64 << 20
	maxDelay        = time.Hour
	maxCPU          = 10 * time.Second
	maxNodesVisited = 200_000 // bounds alias expansion ("billion laughs")
	maxErrors       = 50
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ParseFile reads and parses a graph file.
func ParseFile(path string) (*Graph, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	g, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	if abs, aerr := filepath.Abs(path); aerr == nil {
		g.Origin = abs
	}
	return g, nil
}

// Parse parses and validates a graph; file names the source in error messages. A
// non-nil error is always an ErrorList whose entries carry a line.
func Parse(file string, data []byte) (*Graph, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, ErrorList{syntaxError(file, data, err)}
	}
	p := &parser{file: file, firstServiceAt: map[string]*yaml.Node{}, callAt: map[*Call]callNode{}}
	g := p.graph(&root)
	if len(p.errs) == 0 {
		p.validate(g)
	}
	if len(p.errs) > 0 {
		return nil, p.errs
	}
	g.Origin = file
	return g, nil
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxError turns a yaml.v3 error into a positioned one. yaml.v3 numbers lines from 1
// for scanner errors but from 0 for parser errors ("did not find expected …", which
// point at the start of the enclosing block), and names no line for encoding errors, so
// those are located here.
func syntaxError(file string, data []byte, err error) *PosError {
	problem := strings.TrimPrefix(err.Error(), "yaml: ")
	line, col := 0, 0
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		problem = strings.TrimPrefix(err.Error(), m[0])
	}
	parserError := strings.HasPrefix(problem, "did not find expected") || strings.HasPrefix(problem, "found duplicate %") ||
		strings.HasPrefix(problem, "found incompatible") || strings.HasPrefix(problem, "found undefined tag")
	switch {
	case parserError:
		line++
		if strings.HasPrefix(problem, "did not find expected") {
			problem += " (in the block that starts on this line)"
		}
	case line == 0:
		line, col = firstBadByte(data)
	}
	lines := bytes.Split(data, []byte("\n"))
	if strings.Contains(problem, "cannot start any token") && line <= len(lines) {
		if i := bytes.IndexByte(lines[line-1], '\t'); i >= 0 {
			col = 1 + utf8.RuneCount(lines[line-1][:i])
			problem += " (tabs cannot indent YAML)"
		}
	}
	return &PosError{File: file, Line: max(line, 1), Column: col, Msg: "YAML syntax: " + problem}
}

// firstBadByte finds the first byte YAML cannot read: invalid UTF-8 or a control
// character.
func firstBadByte(data []byte) (line, col int) {
	line, col = 1, 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		bad := r == utf8.RuneError && size <= 1
		ctrl := r < 0x20 && r != '\n' && r != '\t' && r != '\r' || r == 0x7f
		if bad || ctrl {
			return line, col
		}
		if r == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
		i += size
	}
	return 1, 0
}

type parser struct {
	file    string
	errs    ErrorList
	visited int
	tooBig  bool

	defaults serviceDefaults
	// where things were written, for errors found after parsing
	servicesKey    *yaml.Node
	firstServiceAt map[string]*yaml.Node
	serviceNodes   map[*Service]serviceNodes
	callAt         map[*Call]callNode
	callNodes      []callNode
}

type serviceNodes struct {
	field        string
	node         *yaml.Node
	isEntrypoint *yaml.Node
}

type callNode struct {
	caller string
	call   *Call
	field  string // path of the call's service field
	node   *yaml.Node
}

type serviceDefaults struct {
	port         int
	protocol     string
	replicas     int
	responseSize int64
	errorRate    float64
	requestSize  int64
}

func (p *parser) errorf(n *yaml.Node, field, format string, args ...any) {
	if len(p.errs) >= maxErrors {
		return
	}
	line, col := 1, 1
	if n != nil && n.Line > 0 {
		line, col = n.Line, n.Column
	}
	p.errs = append(p.errs, &PosError{File: p.file, Line: line, Column: col, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// deref follows aliases and counts visited nodes so that nested aliases cannot make
// parsing exponential.
func (p *parser) deref(n *yaml.Node, field string) *yaml.Node {
	for depth := 0; n != nil && n.Kind == yaml.AliasNode && depth < 100; depth++ {
		n = n.Alias
	}
	p.visited++
	if p.visited > maxNodesVisited && !p.tooBig {
		p.tooBig = true
		p.errorf(n, field, "graph too large (more than %d YAML nodes after expanding aliases)", maxNodesVisited)
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an alias"
}

// fields walks a mapping, rejecting duplicate and unknown keys. handle returns false
// for keys it does not know.
func (p *parser) fields(n *yaml.Node, field string, handle func(key string, keyNode, val *yaml.Node, field string) bool) bool {
	n = p.deref(n, field)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, field, "want a mapping, got %s", kindName(n))
		return false
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content) && !p.tooBig; i += 2 {
		k, v := p.deref(n.Content[i], field), p.deref(n.Content[i+1], field)
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, field, "keys must be plain names, got %s", kindName(k))
			continue
		}
		sub := k.Value
		if field != "" {
			sub = field + "." + k.Value
		}
		if seen[k.Value] {
			p.errorf(k, sub, "duplicate field")
			continue
		}
		seen[k.Value] = true
		if !handle(k.Value, k, v, sub) {
			p.errorf(k, sub, "unknown field")
		}
	}
	return true
}

func (p *parser) scalar(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.errorf(n, field, "want a value, got %s", kindName(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) name(n *yaml.Node, field, what string) string {
	s, ok := p.scalar(n, field)
	if !ok {
		return ""
	}
	if len(s) > 63 || !nameRE.MatchString(s) {
		p.errorf(n, field, "%s name %q must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit", what, s)
		return ""
	}
	return s
}

func (p *parser) integer(n *yaml.Node, field string, lo, hi int) (int, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return 0, false
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		p.errorf(n, field, "want a whole number, got %q", s)
		return 0, false
	}
	if v < lo || v > hi {
		p.errorf(n, field, "%d out of range [%d, %d]", v, lo, hi)
		return 0, false
	}
	return v, true
}

func (p *parser) boolean(n *yaml.Node, field string) bool {
	s, ok := p.scalar(n, field)
	if !ok {
		return false
	}
	switch s {
	case "true", "True", "TRUE":
		return true
	case "false", "False", "FALSE":
		return false
	}
	p.errorf(n, field, "want true or false, got %q", s)
	return false
}

var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1e3}, {"kB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
	{"B", 1},
}

// ParseSize reads a byte size such as "512", "512B", "1KiB", "1.5MiB" or "2KB".
func ParseSize(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range sizeUnits {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || strings.ContainsAny(num, "xXpP_") {
		return 0, fmt.Errorf("want a size like 1KiB, 512B or 2MiB, got %q", s)
	}
	v *= mult
	if v < 0 || v > maxBodySize {
		return 0, fmt.Errorf("size %q out of range [0, 64MiB]", s)
	}
	return int64(math.Round(v)), nil
}

func (p *parser) size(n *yaml.Node, field string) (int64, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return 0, false
	}
	v, err := ParseSize(s)
	if err != nil {
		p.errorf(n, field, "%v", err)
		return 0, false
	}
	return v, true
}

// percent reads "1%" or "0.5%" as a probability. The percent sign is required so that
// "errorRate: 1" cannot silently mean 100%.
func (p *parser) percent(n *yaml.Node, field string) (float64, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return 0, false
	}
	num, found := strings.CutSuffix(strings.TrimSpace(s), "%")
	v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !found || err != nil || strings.ContainsAny(num, "xXpP_") {
		p.errorf(n, field, "want a percentage like \"1%%\", got %q", s)
		return 0, false
	}
	if !(v >= 0 && v <= 100) {
		p.errorf(n, field, "%q out of range [0%%, 100%%]", s)
		return 0, false
	}
	return v / 100, true
}

func (p *parser) duration(n *yaml.Node, field string, hi time.Duration) (time.Duration, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		p.errorf(n, field, "want a duration like 10ms or 200us, got %q", s)
		return 0, false
	}
	if d < 0 || d > hi {
		p.errorf(n, field, "%s out of range [0s, %s]", s, hi)
		return 0, false
	}
	return d, true
}

func (p *parser) graph(root *yaml.Node) *Graph {
	g := &Graph{}
	if root.Kind == 0 || len(root.Content) == 0 {
		p.errorf(nil, "", "empty graph file: want a mapping with name and services")
		return g
	}
	top := p.deref(root.Content[0], "")
	var servicesNode, defaultsNode *yaml.Node
	var nameNode *yaml.Node
	p.fields(top, "", func(key string, k, v *yaml.Node, field string) bool {
		switch key {
		case "name":
			nameNode = v
			g.Name = p.name(v, field, "graph")
		case "defaults":
			defaultsNode = v
		case "services":
			p.servicesKey, servicesNode = k, v
		default:
			return false
		}
		return true
	})
	if top.Kind != yaml.MappingNode {
		return g
	}
	if nameNode == nil {
		p.errorf(top, "name", "missing field")
	}
	p.defaults = serviceDefaults{port: DefaultPort, protocol: "http", replicas: 1}
	if defaultsNode != nil {
		p.parseDefaults(defaultsNode)
	}
	if servicesNode == nil {
		p.errorf(top, "services", "missing field")
		return g
	}
	list := p.deref(servicesNode, "services")
	if list.Kind != yaml.SequenceNode || len(list.Content) == 0 {
		p.errorf(list, "services", "want a non-empty list of services, got %s", kindName(list))
		return g
	}
	p.serviceNodes = map[*Service]serviceNodes{}
	for i, sn := range list.Content {
		if p.tooBig {
			break
		}
		if s := p.service(sn, fmt.Sprintf("services[%d]", i)); s != nil {
			g.Services = append(g.Services, s)
		}
	}
	return g
}

func (p *parser) parseDefaults(n *yaml.Node) {
	d := &p.defaults
	p.fields(n, "defaults", func(key string, _, v *yaml.Node, field string) bool {
		switch key {
		case "port":
			d.port, _ = p.integer(v, field, 1, 65535)
		case "protocol":
			d.protocol = p.protocol(v, field)
		case "replicas":
			d.replicas, _ = p.integer(v, field, 1, maxReplicas)
		case "responseSize":
			d.responseSize, _ = p.size(v, field)
		case "errorRate":
			d.errorRate, _ = p.percent(v, field)
		case "requestSize":
			d.requestSize, _ = p.size(v, field)
		default:
			return false
		}
		return true
	})
}

func (p *parser) protocol(n *yaml.Node, field string) string {
	s, ok := p.scalar(n, field)
	if !ok {
		return ""
	}
	switch s {
	case "h2c":
		s = ProtocolHTTP2
	case "http1", "http/1.1":
		s = ProtocolHTTP
	}
	if !slices.Contains(Protocols, s) {
		p.errorf(n, field, "unsupported protocol %q (supported: %s; h2c means http2)", s, strings.Join(Protocols, ", "))
		return ""
	}
	return s
}

func (p *parser) service(n *yaml.Node, field string) *Service {
	s := &Service{
		Port:         p.defaults.port,
		Protocol:     p.defaults.protocol,
		Path:         "/",
		ResponseSize: p.defaults.responseSize,
		ErrorRate:    p.defaults.errorRate,
	}
	replicas := p.defaults.replicas
	var script Script
	var versionsNode, nameNode, entryNode *yaml.Node
	var versionsField string
	ok := p.fields(n, field, func(key string, _, v *yaml.Node, sub string) bool {
		switch key {
		case "name":
			nameNode = v
			s.Name = p.name(v, sub, "service")
		case "port":
			s.Port, _ = p.integer(v, sub, 1, 65535)
		case "protocol":
			s.Protocol = p.protocol(v, sub)
		case "path":
			if path, ok := p.scalar(v, sub); ok {
				if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t\r\n#") {
					p.errorf(v, sub, "path %q must start with / and contain no spaces or '#'", path)
				}
				s.Path = path
			}
		case "replicas":
			replicas, _ = p.integer(v, sub, 1, maxReplicas)
		case "versions":
			versionsNode, versionsField = v, sub
		case "script":
			script = p.script(v, sub)
		case "responseSize":
			s.ResponseSize, _ = p.size(v, sub)
		case "errorRate":
			s.ErrorRate, _ = p.percent(v, sub)
		case "isEntrypoint":
			entryNode = v
			s.IsEntrypoint = p.boolean(v, sub)
		default:
			return false
		}
		return true
	})
	if !ok {
		return nil
	}
	if nameNode == nil {
		p.errorf(n, field+".name", "missing field")
		return nil
	}
	p.serviceNodes[s] = serviceNodes{field: field, node: nameNode, isEntrypoint: entryNode}
	if s.Name != "" {
		if first, dup := p.firstServiceAt[s.Name]; dup {
			p.errorf(nameNode, field+".name", "duplicate service %q (first defined at line %d)", s.Name, first.Line)
		} else {
			p.firstServiceAt[s.Name] = nameNode
		}
	}
	p.recordCalls(s.Name, script, field+".script")
	if versionsNode == nil {
		s.Versions = []*Version{{Name: "v1", Weight: 1, Replicas: replicas, Script: script}}
		return s
	}
	list := p.deref(versionsNode, versionsField)
	if list.Kind != yaml.SequenceNode || len(list.Content) == 0 {
		p.errorf(list, versionsField, "want a non-empty list of versions, got %s", kindName(list))
		return s
	}
	seen := map[string]*yaml.Node{}
	totalWeight := 0
	for i, vn := range list.Content {
		if p.tooBig {
			break
		}
		vfield := fmt.Sprintf("%s[%d]", versionsField, i)
		v := &Version{Weight: 1, Replicas: replicas, Script: script}
		var vname *yaml.Node
		p.fields(vn, vfield, func(key string, _, val *yaml.Node, sub string) bool {
			switch key {
			case "name":
				vname = val
				v.Name = p.name(val, sub, "version")
			case "weight":
				v.Weight, _ = p.integer(val, sub, 0, maxWeight)
			case "replicas":
				v.Replicas, _ = p.integer(val, sub, 1, maxReplicas)
			case "script":
				v.Script = p.script(val, sub)
				p.recordCalls(s.Name, v.Script, sub)
			default:
				return false
			}
			return true
		})
		if vname == nil {
			p.errorf(p.deref(vn, vfield), vfield+".name", "missing field")
			continue
		}
		if first, dup := seen[v.Name]; dup && v.Name != "" {
			p.errorf(vname, vfield+".name", "duplicate version %q (first defined at line %d)", v.Name, first.Line)
		}
		seen[v.Name] = vname
		totalWeight += v.Weight
		s.Versions = append(s.Versions, v)
	}
	if totalWeight == 0 && len(s.Versions) > 0 {
		p.errorf(list, versionsField, "every version has weight 0: the service would get no traffic")
	}
	return s
}

func (p *parser) script(n *yaml.Node, field string) Script {
	list := p.deref(n, field)
	if list.Kind != yaml.SequenceNode {
		p.errorf(list, field, "want a list of steps, got %s", kindName(list))
		return nil
	}
	var out Script
	for i, sn := range list.Content {
		if p.tooBig {
			break
		}
		sfield := fmt.Sprintf("%s[%d]", field, i)
		sn = p.deref(sn, sfield)
		if sn.Kind == yaml.SequenceNode {
			if len(sn.Content) == 0 {
				p.errorf(sn, sfield, "empty concurrent group")
				continue
			}
			group := Step{}
			for j, member := range sn.Content {
				if p.tooBig {
					break
				}
				mfield := fmt.Sprintf("%s[%d]", sfield, j)
				member = p.deref(member, mfield)
				if member.Kind == yaml.SequenceNode {
					p.errorf(member, mfield, "concurrent groups cannot be nested")
					continue
				}
				if st, ok := p.step(member, mfield); ok {
					group.Concurrent = append(group.Concurrent, st)
				}
			}
			out = append(out, group)
			continue
		}
		if st, ok := p.step(sn, sfield); ok {
			out = append(out, st)
		}
	}
	return out
}

func (p *parser) step(n *yaml.Node, field string) (Step, bool) {
	var st Step
	var kinds []string
	var probNode *yaml.Node
	var probField string
	p.fields(n, field, func(key string, _, v *yaml.Node, sub string) bool {
		switch key {
		case "call":
			kinds = append(kinds, key)
			st.Call = p.call(v, sub)
		case "probability":
			probNode, probField = v, sub
		case "sleep":
			kinds = append(kinds, key)
			st.Sleep = p.delay(v, sub)
		case "cpu":
			kinds = append(kinds, key)
			st.CPU, _ = p.duration(v, sub, maxCPU)
		default:
			return false
		}
		return true
	})
	if n.Kind != yaml.MappingNode {
		return st, false
	}
	switch {
	case len(kinds) == 0:
		p.errorf(n, field, "a step needs one of call, sleep or cpu")
		return st, false
	case len(kinds) > 1:
		p.errorf(n, field, "a step has exactly one of call, sleep or cpu, got %s", strings.Join(kinds, " and "))
		return st, false
	}
	if probNode != nil {
		if st.Call == nil {
			p.errorf(probNode, probField, "probability applies to calls only")
		} else if prob, ok := p.percent(probNode, probField); ok {
			st.Call.Probability = prob
		}
	}
	return st, st.Call != nil || st.Sleep != nil || kinds[0] == "cpu"
}

func (p *parser) call(n *yaml.Node, field string) *Call {
	c := &Call{Size: p.defaults.requestSize, Probability: 1}
	if n.Kind == yaml.ScalarNode {
		c.Service = p.name(n, field, "service")
		p.callAt[c] = callNode{call: c, field: field, node: n}
		return c
	}
	var svcNode *yaml.Node
	p.fields(n, field, func(key string, _, v *yaml.Node, sub string) bool {
		switch key {
		case "service":
			svcNode = v
			c.Service = p.name(v, sub, "service")
			p.callAt[c] = callNode{call: c, field: sub, node: v}
		case "path":
			if path, ok := p.scalar(v, sub); ok {
				if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t\r\n#") {
					p.errorf(v, sub, "path %q must start with / and contain no spaces or '#'", path)
				}
				c.Path = path
			}
		case "size":
			c.Size, _ = p.size(v, sub)
		case "probability":
			c.Probability, _ = p.percent(v, sub)
		default:
			return false
		}
		return true
	})
	if svcNode == nil && n.Kind == yaml.MappingNode {
		p.errorf(n, field+".service", "missing field")
	}
	return c
}

func (p *parser) delay(n *yaml.Node, field string) *Delay {
	if n.Kind == yaml.ScalarNode {
		d, _ := p.duration(n, field, maxDelay)
		return &Delay{Distribution: Constant, Mean: d}
	}
	d := &Delay{}
	var distNode, meanNode, stddevNode, minNode, maxNode *yaml.Node
	p.fields(n, field, func(key string, _, v *yaml.Node, sub string) bool {
		switch key {
		case "distribution":
			distNode = v
			if s, ok := p.scalar(v, sub); ok {
				switch Distribution(s) {
				case Constant, Normal, Exponential, Uniform:
					d.Distribution = Distribution(s)
				default:
					p.errorf(v, sub, "unknown distribution %q (want constant, normal, exponential or uniform)", s)
				}
			}
		case "mean":
			meanNode = v
			d.Mean, _ = p.duration(v, sub, maxDelay)
		case "stddev":
			stddevNode = v
			d.Stddev, _ = p.duration(v, sub, maxDelay)
		case "min":
			minNode = v
			d.Min, _ = p.duration(v, sub, maxDelay)
		case "max":
			maxNode = v
			d.Max, _ = p.duration(v, sub, maxDelay)
		default:
			return false
		}
		return true
	})
	if n.Kind != yaml.MappingNode {
		return d
	}
	if distNode == nil {
		d.Distribution = Constant
	}
	need := func(node *yaml.Node, name string) {
		if node == nil {
			p.errorf(n, field+"."+name, "missing field (needed by distribution %s)", d.Distribution)
		}
	}
	switch d.Distribution {
	case Constant, Exponential:
		need(meanNode, "mean")
	case Normal:
		need(meanNode, "mean")
		need(stddevNode, "stddev")
	case Uniform:
		need(minNode, "min")
		need(maxNode, "max")
	}
	if maxNode != nil && d.Max < d.Min {
		p.errorf(maxNode, field+".max", "max %s is below min %s", d.Max, d.Min)
	}
	return d
}
