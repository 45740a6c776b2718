package workload

import (
	"os"
	"strings"
	"testing"
)

// TestDocsExamplesParse keeps the examples in docs/graph.md valid.
func TestDocsExamplesParse(t *testing.T) {
	doc, err := os.ReadFile("../../docs/graph.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, part := range strings.Split(string(doc), "```yaml\n")[1:] {
		blocks = append(blocks, part[:strings.Index(part, "```")])
	}
	if len(blocks) != 2 {
		t.Fatalf("want 2 yaml examples in docs/graph.md, found %d", len(blocks))
	}
	g, err := Parse("graph.md#example", []byte(blocks[0]))
	if err != nil {
		t.Fatal(err)
	}
	if g.Entrypoint().Path != "/productpage" || len(g.Deployments()) != 5 {
		t.Errorf("example graph: %+v %+v", g.Entrypoint(), g.Deployments())
	}
	script := "name: steps\nservices:\n  - name: front\n    isEntrypoint: true\n" + indent(blocks[1], "    ")
	for _, callee := range []string{"details", "reviews", "ratings", "emoji", "voting"} {
		script += "  - name: " + callee + "\n"
	}
	if _, err := Parse("graph.md#steps", []byte(script)); err != nil {
		t.Fatal(err)
	}
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}
