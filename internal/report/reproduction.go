package report

import (
	"strings"

	"github.com/meshmark/meshmark/internal/reproduce"
)

// titleReproduction heads the published study's own tables, before the answer.
const titleReproduction = "The published study, reproduced"

// reproduction writes the section a report opens with when the run reproduces a
// published study: which mesh stands for which, the study's own tables, and its
// figures beside the run's, each marked.
func (m *mdWriter) reproduction(s *Summary) {
	r := s.Reproduction
	if r == nil {
		return
	}
	m.section(titleReproduction+": "+r.Study, false, "")
	m.printf("This run reproduces **%s**. Meshes: %s.\n\n", mdCell(r.Citation), mdCell(r.MeshLine()))
	unlike := false
	for _, rm := range r.Meshes {
		if rm.Unlike != "" && rm.Mesh != "" {
			m.printf("- %s for %s is not comparable: %s.\n", mdCell(rm.Mesh), mdCell(rm.Title), mdCell(rm.Unlike))
			unlike = true
		}
	}
	if unlike {
		m.printf("\n")
	}
	for _, t := range r.Tables {
		m.printf("### %s\n\n", mdCell(t.Title))
		if t.Note != "" {
			m.printf("_%s._\n\n", mdCell(t.Note))
		}
		if len(t.Rows) == 0 {
			m.printf("_Nothing measured._\n\n")
			continue
		}
		m.table(t.Header, t.Rows)
		if t.Bars != nil {
			var b strings.Builder
			reproduce.WriteBars(&b, t.Bars)
			if b.Len() > 0 {
				m.printf("```\n%s```\n\n", b.String())
			}
		}
	}
	m.printf("### %s's published figures beside this run's: %s\n\n", r.Study, r.Tally())
	var rows [][]string
	for _, e := range r.Claims {
		rows = append(rows, []string{"**" + string(e.Mark) + "**", e.Published + " (" + e.Where + ")", orDash(e.Point), orDash(e.Ours), e.Expect, orDash(e.Reason)})
	}
	m.table([]string{"Mark", "Published", "Here at", "This run", "Agrees if", "Why"}, rows)
	m.printf("_%s._\n\n", mdCell(reproduce.MarksLine))
}
