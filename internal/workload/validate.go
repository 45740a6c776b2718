package workload

import "strings"

// recordCalls remembers the calls of a script written under field so that validation
// can point at them.
func (p *parser) recordCalls(caller string, sc Script, field string) {
	for _, c := range sc.Calls() {
		cn, ok := p.callAt[c]
		if !ok {
			continue
		}
		cn.caller = caller
		p.callNodes = append(p.callNodes, cn)
	}
}

// validate checks what only the whole graph can tell: calls name existing services,
// calls form no cycle, and exactly one service is the entrypoint.
func (p *parser) validate(g *Graph) {
	callees := map[string][]callNode{}
	called := map[string]bool{}
	for _, cn := range p.callNodes {
		if cn.call.Service == "" {
			continue
		}
		if g.Service(cn.call.Service) == nil {
			p.errorf(cn.node, cn.field, "unknown service %q", cn.call.Service)
			continue
		}
		callees[cn.caller] = append(callees[cn.caller], cn)
		called[cn.call.Service] = true
	}
	if len(p.errs) > 0 {
		return
	}
	p.findCycles(g, callees)
	if len(p.errs) > 0 {
		return
	}

	var marked []*Service
	for _, s := range g.Services {
		if s.IsEntrypoint {
			marked = append(marked, s)
		}
	}
	switch {
	case len(marked) > 1:
		sn := p.serviceNodes[marked[1]]
		p.errorf(sn.isEntrypoint, sn.field+".isEntrypoint", "more than one entrypoint (%s and %s)", marked[0].Name, marked[1].Name)
	case len(marked) == 0:
		var roots []string
		for _, s := range g.Services {
			if !called[s.Name] {
				roots = append(roots, s.Name)
			}
		}
		if len(roots) == 1 {
			g.Service(roots[0]).IsEntrypoint = true
			return
		}
		p.errorf(p.servicesKey, "services", "no service is marked isEntrypoint and %d services are called by no other (%s): mark one with isEntrypoint: true", len(roots), strings.Join(roots, ", "))
	}
}

// findCycles reports each call that closes a cycle, at that call.
func (p *parser) findCycles(g *Graph, callees map[string][]callNode) {
	const (
		unvisited = iota
		onStack
		done
	)
	state := map[string]int{}
	var stack []string
	var visit func(name string)
	visit = func(name string) {
		state[name] = onStack
		stack = append(stack, name)
		for _, cn := range callees[name] {
			next := cn.call.Service
			switch state[next] {
			case onStack:
				i := len(stack) - 1
				for i > 0 && stack[i] != next {
					i--
				}
				cycle := append(append([]string{}, stack[i:]...), next)
				p.errorf(cn.node, cn.field, "call cycle %s", strings.Join(cycle, " → "))
			case unvisited:
				visit(next)
			}
		}
		stack = stack[:len(stack)-1]
		state[name] = done
	}
	for _, s := range g.Services {
		if state[s.Name] == unvisited {
			visit(s.Name)
		}
	}
}
