package reproduce

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// WriteText writes what a report of a run opens with when its study reproduces a
// published one: the study, which mesh stands for which, its own tables, and its
// figures beside the run's. For the terminal.
func (r *Reproduction) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "reproduces %s\n", r.Citation)
	fmt.Fprintf(w, "meshes: %s\n", r.MeshLine())
	for _, m := range r.Meshes {
		if m.Unlike != "" && m.Mesh != "" {
			fmt.Fprintf(w, "  %s for %s is not comparable: %s\n", m.Mesh, m.Title, m.Unlike)
		}
	}
	for _, t := range r.Tables {
		fmt.Fprintf(w, "\n%s\n", t.Title)
		if t.Note != "" {
			fmt.Fprintf(w, "  (%s)\n", t.Note)
		}
		if len(t.Rows) == 0 {
			fmt.Fprintln(w, "  nothing measured")
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.ToUpper(strings.Join(t.Header, "\t")))
		for _, row := range t.Rows {
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if t.Bars != nil {
			WriteBars(w, t.Bars)
		}
	}
	fmt.Fprintf(w, "\n%s's published figures beside this run's: %s\n", r.Study, r.Tally())
	for _, e := range r.Claims {
		fmt.Fprintf(w, "  [%s] %s (%s)\n", e.Mark, e.Published, e.Where)
		if e.Point != "" {
			fmt.Fprintf(w, "      here at %s: %s\n", e.Point, dash(e.Ours))
		}
		fmt.Fprintf(w, "      agrees if %s", e.Expect)
		if e.Reason != "" {
			fmt.Fprintf(w, "; %s", e.Reason)
		}
		fmt.Fprintln(w)
	}
	_, err := fmt.Fprintf(w, "  %s\n", MarksLine)
	return err
}

// MarksLine says how the marks are computed, under every list of them.
const MarksLine = "marks are computed from this run's intervals (docs/reproductions.md): an ordering agrees only when the run resolves it the same way, " +
	"a ratio only when its whole interval lies in the band; not resolved is neither agreement nor disagreement"

// MeshLine says which of the run's meshes stands for each of the study's, and which
// meshes the study did not have.
func (r *Reproduction) MeshLine() string {
	var parts []string
	for _, m := range r.Meshes {
		mesh := m.Mesh
		if mesh == "" {
			mesh = "none here"
		}
		parts = append(parts, m.Title+" = "+mesh)
	}
	s := strings.Join(parts, "; ")
	if len(r.Extra) > 0 {
		s += "; not in " + r.Study + ": " + strings.Join(r.Extra, ", ")
	}
	return s
}

// barWidth is the longest bar, in characters.
const barWidth = 40

// WriteBars draws a figure's grouped bars in text, one line per bar.
func WriteBars(w io.Writer, b *Bars) {
	top := 0.0
	name := 0
	for _, s := range b.Series {
		name = max(name, len([]rune(s.Name)))
		for _, v := range s.Values {
			if v != nil && *v > top {
				top = *v
			}
		}
	}
	if top <= 0 {
		return
	}
	fmt.Fprintf(w, "%s (%s)\n", b.Title, b.Unit)
	cat := 0
	for _, c := range b.Categories {
		cat = max(cat, len([]rune(c)))
	}
	for i, c := range b.Categories {
		for j, s := range b.Series {
			label := ""
			if j == 0 {
				label = c
			}
			if i >= len(s.Values) || s.Values[i] == nil {
				fmt.Fprintf(w, "  %-*s  %-*s  -\n", cat, label, name, s.Name)
				continue
			}
			v := *s.Values[i]
			n := int(math.Round(barWidth * v / top))
			fmt.Fprintf(w, "  %-*s  %-*s  %s %.3g\n", cat, label, name, s.Name, strings.Repeat("█", n), v)
		}
	}
}
