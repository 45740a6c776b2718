package report

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"io"
	"strings"
)

// echartsJS is Apache ECharts, vendored (see assets/ECHARTS_VERSION) and inlined into
// every page so that a report opens offline and never fetches anything.
//
//go:embed assets/echarts.min.js
var echartsJS string

//go:embed assets/report.html.tmpl
var pageTemplate string

//go:embed assets/report.js
var pageJS string

// reproductionJS draws the published study a run reproduces; it runs before pageJS,
// which marks the page rendered.
//
//go:embed assets/reproduction.js
var reproductionJS string

var page = template.Must(template.New("report").Funcs(template.FuncMap{"mul100": func(f float64) float64 { return 100 * f }}).Parse(pageTemplate))

type pageData struct {
	S            *Summary
	Data         template.JS
	Library      template.JS
	Script       template.JS
	Reproduce    template.JS
	Titles       map[string]string
	Provenance   [][]string
	StudyFile    string
	HasStudyFile bool
}

func renderHTML(w io.Writer, s *Summary) error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	// The JSON sits inside a <script>; "</" must not end it early.
	safe := strings.ReplaceAll(string(data), "</", `<\/`)
	return page.Execute(w, pageData{
		S:         s,
		Data:      template.JS(safe),
		Library:   template.JS(echartsJS),
		Script:    template.JS(pageJS),
		Reproduce: template.JS(reproductionJS),
		Titles: map[string]string{"answer": titleAnswer, "verdicts": titleVerdicts, "comparisons": titleComparisons, "results": titleResults,
			"capacity": titleCapacity, "resources": titleResources, "cost": titleCost, "checks": titleChecks, "reproduction": titleReproduction, "security": titleSecurity, "effort": titleEffort, "provenance": titleProvenance},
		Provenance: provenanceRows(s),
		StudyFile:  s.Provenance.StudyFile, HasStudyFile: s.Provenance.StudyFile != "",
	})
}
