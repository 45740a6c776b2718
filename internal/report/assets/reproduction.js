// meshmark report page: the published study the run reproduces (REPORT.reproduction),
// drawn before the answer: which mesh stands for which, the study's own tables
// (heatmaps shaded by share), its figures as grouped bars, and its published figures
// beside this run's, each marked. Everything needed is in this file; nothing is fetched.
(function () {
  "use strict";
  const P = REPORT.reproduction;
  const section = document.querySelector('section[data-section="reproduction"] .body');
  if (!P || !section) return;
  const charts = [];
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [a, v] of Object.entries(attrs || {})) e.setAttribute(a, v);
    for (const c of kids) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }
  function table(header, rows, heat, attrs) {
    const t = el("table", attrs || {});
    t.append(el("thead", {}, el("tr", {}, ...header.map(h => el("th", {}, h)))));
    const tb = el("tbody", {});
    rows.forEach((r, i) => {
      tb.append(el("tr", {}, ...r.map((c, j) => {
        const td = el("td", {});
        if (c instanceof Node) td.append(c); else td.textContent = c;
        const share = heat && heat[i] ? heat[i][j] : 0;
        if (share > 0) { // viridis-like teal, darker with the share
          td.style.background = "rgba(33, 145, 140, " + (0.08 + 0.92 * share / 100).toFixed(3) + ")";
          if (share > 50) td.style.color = "#fff";
        }
        return td;
      })));
    });
    t.append(tb);
    section.append(t);
    return t;
  }
  function bars(b) {
    const d = el("div", { class: "chart" });
    section.append(d);
    const c = echarts.init(d, null, { renderer: "canvas" });
    charts.push(c);
    const okabe = ["#000000", "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"];
    c.setOption({
      textStyle: { fontFamily: "system-ui, sans-serif" }, animation: false,
      title: { text: b.title + " (" + b.unit + ")", left: "center", textStyle: { fontSize: 14 } },
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: v => v === null || v === undefined ? "—" : Number(v.toPrecision(4)) + " " + b.unit },
      legend: { top: 28 },
      grid: { left: 70, right: 30, top: 66, bottom: 40 },
      xAxis: { type: "category", data: b.categories },
      yAxis: { type: "value", name: b.unit },
      series: b.series.map((s, i) => ({ name: s.name, type: "bar", color: okabe[i % okabe.length], data: s.values })),
    });
  }
  section.append(el("p", {}, "This run reproduces ", el("b", {}, P.citation), ". Meshes: " +
    P.meshes.map(m => m.title + " = " + (m.mesh || "none here")).join("; ") +
    ((P.extra || []).length ? "; not in " + P.study + ": " + P.extra.join(", ") : "") + "."));
  const unlike = P.meshes.filter(m => m.unlike && m.mesh);
  if (unlike.length) {
    const ul = el("ul", { class: "notes" });
    unlike.forEach(m => ul.append(el("li", {}, m.mesh + " for " + m.title + " is not comparable: " + m.unlike + ".")));
    section.append(ul);
  }
  for (const t of P.tables || []) {
    section.append(el("h3", {}, t.title));
    if (t.note) section.append(el("p", { class: "meta" }, t.note + "."));
    if (!t.rows || !t.rows.length) { section.append(el("p", { class: "empty" }, "Nothing measured.")); continue; }
    table(t.header, t.rows, t.heat, { "data-table": "study" });
    if (t.bars) bars(t.bars);
  }
  const marks = {}, order = ["agrees", "disagrees", "not resolved", "not comparable", "not measured"];
  (P.claims || []).forEach(c => { marks[c.mark] = (marks[c.mark] || 0) + 1; });
  section.append(el("h3", {}, P.study + "'s published figures beside this run's: " +
    (order.filter(m => marks[m]).map(m => marks[m] + " " + (marks[m] > 1 ? m.replace(/^(dis)?agrees$/, s => s.slice(0, -1)) : m)).join(", ") ||
      "no published figure to compare")));
  const cls = { "agrees": "pass", "disagrees": "fail", "not resolved": "inconclusive", "not comparable": "na", "not measured": "na" };
  table(["Mark", "Published", "Here at", "This run", "Agrees if", "Why"], (P.claims || []).map(c => [
    el("span", { class: cls[c.mark] || "", "data-mark": c.mark, "data-claim": c.claim }, c.mark), c.published + " (" + c.where + ")",
    c.point || "—", c.ours || "—", c.expect, c.reason || "—"]), null, { "data-table": "claims" });
  section.append(el("p", { class: "meta" }, "Marks are computed from this run's intervals: an ordering agrees only when the run resolves it the same way, " +
    "a ratio only when its whole interval lies in the band; not resolved is neither agreement nor disagreement (docs/reproductions.md)."));
  window.addEventListener("resize", () => charts.forEach(c => c.resize()));
})();
