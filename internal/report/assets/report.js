// meshmark report page: builds tables and ECharts charts from the inline REPORT data.
// Everything needed is in this file; nothing is fetched.
(function () {
  "use strict";
  const R = REPORT;
  // Okabe–Ito palette (distinct for colour-blind readers); the baseline is black.
  const OKABE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442"];
  const meshColour = {};
  let k = 0;
  (R.meshes || []).forEach(m => { meshColour[m.label] = m.baseline ? "#000000" : OKABE[k++ % OKABE.length]; });
  const colourOf = m => meshColour[m] || "#777777";
  const charts = [];

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [a, v] of Object.entries(attrs || {})) e.setAttribute(a, v);
    for (const c of kids) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }
  function body(id) { return document.querySelector('section[data-section="' + id + '"] .body'); }
  function empty(id, why) { body(id).append(el("p", { class: "empty" }, why)); }
  function fmt(x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return "—";
    if (Math.abs(x) >= 1e4) return Math.round(x).toString();
    return Number(x.toPrecision(digits || 4)).toString();
  }
  function pct(x) { return (x === null || x === undefined) ? "—" : (x >= 0 ? "+" : "") + x.toFixed(1) + "%"; }
  function iv(lo, hi, p) {
    if (lo === null || hi === null || lo === undefined) return "—";
    return p ? "[" + pct(lo) + ", " + pct(hi) + "]" : "[" + fmt(lo) + ", " + fmt(hi) + "]";
  }
  function val(v, unit) {
    if (v === null || v === undefined) return "—";
    if (unit === "ms") return fmt(v) + " ms";
    if (unit === "fraction") return fmt(100 * v) + "%";
    if (unit === "req/s") return fmt(v) + " req/s";
    return fmt(v);
  }
  function table(id, header, rows, numeric) {
    const t = el("table", {});
    t.append(el("thead", {}, el("tr", {}, ...header.map(h => el("th", {}, h)))));
    const tb = el("tbody", {});
    for (const r of rows) {
      tb.append(el("tr", {}, ...r.map((c, i) => {
        const td = el("td", numeric && numeric[i] ? { class: "num" } : {});
        if (c instanceof Node) td.append(c); else td.textContent = c;
        return td;
      })));
    }
    t.append(tb);
    body(id).append(t);
    return t;
  }
  // "inconclusive: too few repeats for an interval" is styled as inconclusive.
  function verdictCell(v) { return el("span", { class: String(v).split(":")[0] }, v); }
  function chart(id, height) {
    const d = el("div", { class: "chart" });
    if (height) d.style.height = height + "px";
    body(id).append(d);
    const c = echarts.init(d, null, { renderer: "canvas" });
    charts.push(c);
    return c;
  }
  function selector(id, label, options, onChange) {
    const s = el("select", { "aria-label": label });
    options.forEach((o, i) => s.append(el("option", { value: String(i) }, o)));
    s.addEventListener("change", () => onChange(Number(s.value)));
    body(id).append(el("label", {}, label + ": ", s));
    return s;
  }
  const baseAxis = { nameLocation: "middle", nameGap: 30 };
  const textStyle = { fontFamily: "system-ui, sans-serif" };

  // The answer: per load point, what each mesh adds to the baseline's latency, what it
  // costs and what its checks proved, flags beside the numbers they qualify, the
  // meshes ranked, and a chart of the added latency with its interval.
  function signed3(x) {
    const a = Math.abs(x), s = x < 0 ? "-" : "+";
    return s + (a >= 100 ? a.toFixed(0) : a >= 10 ? a.toFixed(1) : a >= 1 ? a.toFixed(2) : a.toFixed(3));
  }
  function addedText(ad) { // ms, with the interval in the value's unit
    if (!ad || ad.ms === null) return "—";
    const a = Math.abs(ad.ms);
    const [k, u] = a >= 1000 ? [1 / 1000, "s"] : a >= 1 ? [1, "ms"] : [1000, "µs"];
    let s = signed3(ad.ms * k) + u;
    if (ad.lo_ms !== null && ad.hi_ms !== null) s += " [" + signed3(ad.lo_ms * k) + ", " + signed3(ad.hi_ms * k) + "]";
    return s;
  }
  function beside(r, field) {
    return (r.flags || []).filter(f => f.field === field || (f.field === "latency" && (field === "p50" || field === "p99"))).map(f => f.label);
  }
  function flagged(text, labels) {
    if (!labels.length) return text;
    const s = el("span", {}, text + " ");
    s.append(el("span", { class: "flag" }, "(" + labels.join("; ") + ")"));
    return s;
  }
  const answers = R.answers || [];
  if (answers.length || (R.capacity_lines || []).length) {
    body("answer").append(el("p", {}, R.slo_line + "." + (R.interval_line ? " " + R.interval_line + "." : "")));
    const charted = answers.filter(p => p.rows.some(r => r.added_p50 || r.added_p99));
    if (charted.length) {
      let c;
      const draw = i => {
        const p = charted[i];
        const rows = p.rows.filter(r => r.added_p50 || r.added_p99);
        const meshes = rows.map(r => r.mesh);
        const grids = [{ left: 140, right: "54%", top: 60, bottom: 40 }, { left: "54%", right: 30, top: 60, bottom: 40 }];
        const series = [];
        ["p50", "p99"].forEach((q, k) => {
          const key = "added_" + q;
          series.push({ name: "added " + q, type: "bar", xAxisIndex: k, yAxisIndex: k, barWidth: "40%",
            data: rows.map(r => ({ value: r[key] ? r[key].ms : null, itemStyle: { color: colourOf(r.mesh) },
              // Above the bar, clear of the bar's colour and the whiskers.
              label: { show: beside(r, q).length > 0, position: [0, -15], formatter: beside(r, q).join("; "), color: "#b34700", fontWeight: 600 } })) });
          series.push({ name: q + " interval", type: "custom", xAxisIndex: k, yAxisIndex: k, z: 10,
            data: rows.map((r, j) => [j, r[key] ? r[key].lo_ms : null, r[key] ? r[key].hi_ms : null]).filter(d => d[1] !== null && d[2] !== null),
            encode: { y: 0, x: [1, 2] },
            renderItem: (params, api) => {
              const a = api.coord([api.value(1), api.value(0)]), b = api.coord([api.value(2), api.value(0)]);
              const h = api.size([0, 1])[1] * 0.22, st = { stroke: "#000", lineWidth: 1.5 };
              return { type: "group", children: [
                { type: "line", shape: { x1: a[0], y1: a[1], x2: b[0], y2: b[1] }, style: st },
                { type: "line", shape: { x1: a[0], y1: a[1] - h, x2: a[0], y2: a[1] + h }, style: st },
                { type: "line", shape: { x1: b[0], y1: b[1] - h, x2: b[0], y2: b[1] + h }, style: st }] };
            } });
        });
        c.setOption({
          textStyle, animation: false,
          title: { text: "Latency added to " + (p.baseline || "the baseline") + ", " + p.label + " (bars: pooled; whiskers: " + Math.round(100 * R.confidence) + "% interval)",
            left: "center", textStyle: { fontSize: 14 } },
          tooltip: { trigger: "item", formatter: prm => {
            const r = rows[prm.seriesType === "custom" ? prm.value[0] : prm.dataIndex], q = prm.seriesName.indexOf("p50") >= 0 ? "p50" : "p99";
            return r.mesh + ", added " + q + ": " + addedText(r["added_" + q]) + (beside(r, q).length ? "<br>" + beside(r, q).join("; ") : "");
          } },
          grid: grids,
          xAxis: [0, 1].map(k => Object.assign({ type: "value", gridIndex: k, name: "added " + ["p50", "p99"][k] + " (ms)" }, baseAxis)),
          yAxis: [0, 1].map(k => ({ type: "category", gridIndex: k, data: meshes, inverse: true, axisLabel: { show: k === 0 } })),
          series,
        }, true);
      };
      if (charted.length > 1) selector("answer", "Load point", charted.map(p => p.label), draw);
      c = chart("answer", Math.max(240, 46 * Math.max(...charted.map(p => p.rows.length)) + 110));
      draw(0);
    }
    const conf = Math.round(100 * R.confidence) + "%";
    const said = {};
    for (const p of answers) {
      body("answer").append(el("h3", {}, p.label));
      let lo = Infinity, hi = 0;
      p.rows.forEach(r => { lo = Math.min(lo, r.repeats); hi = Math.max(hi, r.repeats); });
      const base = p.rows.find(r => r.baseline);
      body("answer").append(el("p", {}, (lo === hi ? lo : lo + "–" + hi) + " repeats; " +
        (base ? "latency added to " + base.mesh + "'s p50 " + fmt(base.p50_ms) + " ms and p99 " + fmt(base.p99_ms) + " ms." : "no baseline was measured at this point.")));
      table("answer", ["Mesh", "Added p50 [" + conf + "]", "Added p99 [" + conf + "]", "CPU / 1000 req/s: proxies (system under test)", "Proxy memory", "Errors", "Security", "Verdict"],
        p.rows.map(r => {
          const own = q => r.baseline ? "base " + fmt(r[q + "_ms"]) + " ms" : "—";
          let cpu = r.proxies > 0 && r.proxy_cores_per_1000_rps !== null ? fmt(r.proxy_cores_per_1000_rps, 3) : "—";
          if (r.sut_cores_per_1000_rps !== null) cpu += " (" + fmt(r.sut_cores_per_1000_rps, 3) + ")";
          return [flagged(r.mesh, beside(r, "mesh")), flagged(r.added_p50 ? addedText(r.added_p50) : own("p50"), beside(r, "p50")),
            flagged(r.added_p99 ? addedText(r.added_p99) : own("p99"), beside(r, "p99")), flagged(cpu, beside(r, "cpu")),
            flagged(r.proxies > 0 ? fmt(r.proxy_mem_mib, 3) + " MiB" : "—", beside(r, "memory")),
            flagged(r.errors ? r.errors + " (" + fmt(100 * r.error_rate, 3) + "%)" : "0", beside(r, "errors")),
            flagged(r.security, beside(r, "security")), r.verdict];
        }), [0, 1, 1, 1, 1, 1, 0, 0]).setAttribute("data-table", "answer");
      const notes = (p.rankings || []).map(rk => rk.line);
      p.rows.forEach(r => (r.flags || []).forEach(f => {
        const line = r.mesh + ": " + f.detail;
        if (f.detail && !said[line]) { said[line] = true; notes.push(line); }
      }));
      if (notes.length) {
        const ul = el("ul", { class: "notes" });
        notes.forEach(n => ul.append(el("li", {}, n)));
        body("answer").append(ul);
      }
    }
    if ((R.capacity_lines || []).length) {
      const ul = el("ul", { class: "notes" });
      R.capacity_lines.forEach(n => ul.append(el("li", {}, n)));
      body("answer").append(ul);
    }
  } else empty("answer", "This run has no load point to answer for.");

  // Verdict table.
  if (R.verdicts && R.verdicts.length) {
    table("verdicts", ["Point", "Metric", "Best", "Value", "Runner-up", "Runner-up value", "Runner-up vs best", "Interval", "Verdict"],
      R.verdicts.map(v => [v.label, v.metric, v.best, val(v.values[v.best], v.unit), v.runner_up, val(v.values[v.runner_up], v.unit),
        pct(v.gap_pct), iv(v.gap_pct_lo, v.gap_pct_hi, true), verdictCell(v.verdict)]), [0, 0, 0, 1, 0, 1, 1, 1, 0]);
  } else empty("verdicts", "No point was measured on two or more meshes, so there is nothing to rank.");

  if (R.comparisons && R.comparisons.length) {
    table("comparisons", ["Point", "Mesh", "Metric", "Baseline", "Mesh value", "Δ", "Δ interval", "Δ%", "Δ% interval", "Noise floor", "Verdict"],
      R.comparisons.map(c => [c.label, c.mesh, c.metric, val(c.base, c.unit), val(c.value, c.unit), fmt(c.delta), iv(c.delta_lo, c.delta_hi),
        pct(c.pct), iv(c.pct_lo, c.pct_hi, true), fmt(c.noise_floor_pct, 3) + "%", verdictCell(c.verdict)]), [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0]);
    if (R.sensitivity) body("comparisons").append(el("p", {}, R.sensitivity));
  } else empty("comparisons", "No mesh shares a point with the baseline.");

  if (R.groups && R.groups.length) {
    table("results", ["Point", "Mesh", "Repeats", "Requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "errors %", "failed without response", "generator behind", "target saturated"],
      R.groups.map(g => [g.label, g.mesh, g.repeats, g.requests, fmt(g.throughput_rps), fmt(g.p50_ms), fmt(g.p90_ms), fmt(g.p99_ms),
        fmt(g.p999_ms), fmt(g.max_ms), fmt(100 * g.error_rate), g.failures || 0, g.generator_behind_trials,
        g.saturated_trials ? el("span", { class: "saturated" }, g.saturated_trials + " of " + g.repeats) : "no"]), [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]);
  } else empty("results", "This run has no successful trials.");

  // Percentile spectrum: x is 1/(1-q) on a log axis, as HdrHistogram plots draw it.
  const spectra = (R.spectra || []).filter(s => s.series && s.series.length);
  if (spectra.length) {
    const pctLabel = x => { const q = 100 * (1 - 1 / x); return q <= 0 ? "0%" : Number(q.toPrecision(6)) + "%"; };
    let c;
    const draw = i => {
      const sp = spectra[i];
      c.setOption({
        textStyle, animation: false,
        title: { text: "Percentile spectrum, " + sp.label, left: "center", textStyle: { fontSize: 14 } },
        tooltip: { trigger: "axis", valueFormatter: v => fmt(v) + " ms", axisPointer: { label: { formatter: p => pctLabel(p.value) } } },
        legend: { top: 28 },
        grid: { left: 70, right: 30, top: 66, bottom: 50 },
        xAxis: Object.assign({ type: "log", name: "percentile", min: 1, logBase: 10, axisLabel: { formatter: pctLabel } }, baseAxis),
        yAxis: Object.assign({ type: "value", name: "latency (ms)", nameGap: 50 }, baseAxis),
        series: sp.series.map(s => ({ name: s.mesh, type: "line", showSymbol: false, data: s.points, color: colourOf(s.mesh), lineStyle: { width: 2 } })),
      }, true);
    };
    if (spectra.length > 1) selector("spectrum", "Point", spectra.map(s => s.label), draw);
    c = chart("spectrum");
    draw(0);
  } else empty("spectrum", "No latency histograms in this run.");

  // Latency against rate with the SLO, capacity and knee.
  if (R.capacity && R.capacity.length) {
    const byExp = {};
    R.capacity.forEach(c => { (byExp[c.experiment] = byExp[c.experiment] || []).push(c); });
    table("capacity", ["Experiment", "Mesh", "Capacity", "req/s at capacity", "Knee", "Limited by"],
      R.capacity.map(c => [c.experiment, c.mesh, c.found ? fmt(c.max_x) + " " + c.x_name : "none", fmt(c.max_throughput),
        c.has_knee ? fmt(c.knee_x) + " " + c.x_name : "none", c.limit || "—"]), [0, 0, 1, 1, 1, 0]);
    for (const [exp, caps] of Object.entries(byExp)) {
      if (!caps.some(cap => cap.points.length >= 2)) { // one point is no curve
        body("capacity").append(el("p", { class: "empty" }, exp + " measured one load level per mesh, so there is no curve to draw; its numbers are in the table."));
        continue;
      }
      const c = chart("capacity", 420);
      const series = [];
      caps.forEach((cap, i) => {
        const col = colourOf(cap.mesh);
        const marks = [];
        if (cap.found) marks.push({ xAxis: cap.max_x, name: cap.mesh + " capacity", label: { formatter: cap.mesh + " capacity " + fmt(cap.max_x) } });
        if (cap.has_knee) marks.push({ xAxis: cap.knee_x, name: cap.mesh + " knee", lineStyle: { type: "dotted" }, label: { formatter: cap.mesh + " knee" } });
        if (i === 0) {
          marks.push({ yAxis: R.slo.p99_ms, name: "SLO p99", lineStyle: { color: "#555", type: "dashed" }, label: { formatter: "SLO p99 " + fmt(R.slo.p99_ms) + " ms" } });
          marks.push({ yAxis: R.slo.p50_ms, name: "SLO p50", lineStyle: { color: "#999", type: "dashed" }, label: { formatter: "SLO p50 " + fmt(R.slo.p50_ms) + " ms" } });
        }
        series.push({ name: cap.mesh + " p99", type: "line", color: col, data: cap.points.map(p => [p.x, p.p99_ms]), symbolSize: 6,
          markLine: { symbol: "none", silent: true, lineStyle: { color: col }, label: { position: "insideEndTop", fontSize: 10 }, data: marks } });
        series.push({ name: cap.mesh + " p50", type: "line", color: col, lineStyle: { type: "dashed" }, data: cap.points.map(p => [p.x, p.p50_ms]), symbol: "emptyCircle", symbolSize: 5 });
      });
      c.setOption({
        textStyle, animation: false,
        title: { text: exp + ": latency against " + caps[0].x_name, left: "center", textStyle: { fontSize: 14 } },
        tooltip: { trigger: "axis", valueFormatter: v => fmt(v) + " ms" },
        legend: { top: 28 },
        grid: { left: 70, right: 40, top: 76, bottom: 50 },
        xAxis: Object.assign({ type: "value", name: caps[0].x_name, scale: true }, baseAxis),
        // Stretch the axis to the SLO so the reader sees how far from it each mesh is.
        yAxis: Object.assign({ type: "log", name: "latency (ms, log)", nameGap: 50, max: v => Math.max(v.max, R.slo.p99_ms) * 2 }, baseAxis),
        series,
      });
    }
  } else empty("capacity", "This run has no sweep (steps, connections or users), so there is no latency-against-rate curve.");

  // S4-style heatmaps: rows latency buckets, columns steps, cell share of the step.
  if (R.heatmaps && R.heatmaps.length) {
    let c;
    const draw = i => {
      const h = R.heatmaps[i];
      c.setOption({
        textStyle, animation: false,
        title: { text: h.mesh + ", " + h.experiment + ": share of each step's requests per latency bucket", left: "center", textStyle: { fontSize: 14 } },
        tooltip: { formatter: p => h.columns[p.value[0]] + ", " + h.rows[p.value[1]] + "<br>" + fmt(p.value[2], 3) + "% of the step, " + p.value[3] + " requests" },
        grid: { left: 150, right: 90, top: 50, bottom: 50 },
        xAxis: Object.assign({ type: "category", data: h.columns, name: "step", splitArea: { show: true } }, baseAxis),
        yAxis: { type: "category", data: h.rows, name: "latency", splitArea: { show: true } },
        visualMap: { min: 0, max: 100, calculable: true, orient: "vertical", right: 10, top: "middle", text: ["100%", "0%"],
          inRange: { color: ["#fde725", "#5ec962", "#21918c", "#3b528b", "#440154"] } },
        series: [{ name: h.mesh, type: "heatmap", data: h.cells, label: { show: h.columns.length <= 12, formatter: p => fmt(p.value[2], 2) + "%", fontSize: 10 } }],
      }, true);
    };
    if (R.heatmaps.length > 1) selector("heatmaps", "Mesh and sweep", R.heatmaps.map(h => h.mesh + " · " + h.experiment), draw);
    c = chart("heatmaps", 460);
    draw(0);
  } else empty("heatmaps", "This run has no sweep with two or more steps, so there is no per-step heatmap.");

  // Time series of achieved rate, p99 and errors.
  const ts = (R.time_series || []).filter(s => s.t && s.t.length);
  if (ts.length) {
    const panel = (title, key, unit) => {
      const c = chart("timeseries", 260);
      c.setOption({
        textStyle, animation: false,
        title: { text: title, left: "center", textStyle: { fontSize: 14 } },
        tooltip: { trigger: "axis", valueFormatter: v => v === null || v === undefined ? "—" : fmt(v) + unit },
        legend: { top: 28 },
        grid: { left: 70, right: 30, top: 55, bottom: 40 },
        xAxis: Object.assign({ type: "value", name: "seconds since the run started", scale: true }, baseAxis),
        yAxis: { type: "value", name: unit.trim() },
        series: ts.map(s => ({ name: s.mesh, type: "line", color: colourOf(s.mesh), showSymbol: false, connectNulls: false,
          data: s.t.map((t, i) => [t, s[key][i]]) })),
      });
    };
    panel("Achieved rate", "rate", " req/s");
    panel("p99 per interval", "p99_ms", " ms");
    panel("Errors per interval", "errors", " errors");
  } else empty("timeseries", "No per-interval data was recorded in this run.");

  // Resources per component.
  if (R.resources && R.resources.length) {
    body("resources").append(el("p", {}, "From experiments: " + (R.resources_from || []).join(", ") +
      " (fixed-load experiments when the run has any: at saturation every mesh runs at a different rate)."));
    const names = R.resources.map(r => r.mesh + " · " + r.component + (r.pod ? " (" + r.pod + ")" : ""));
    const bars = (title, avgKey, peakKey, unit) => {
      const c = chart("resources", Math.max(260, 24 * names.length + 90));
      c.setOption({
        textStyle, animation: false,
        title: { text: title, left: "center", textStyle: { fontSize: 14 } },
        tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: v => fmt(v) + unit },
        legend: { top: 28 },
        grid: { left: 260, right: 40, top: 55, bottom: 30 },
        xAxis: { type: "value", name: unit.trim() },
        yAxis: { type: "category", data: names, inverse: true },
        series: [
          { name: "average", type: "bar", color: "#0072B2", data: R.resources.map(r => r[avgKey]) },
          { name: "peak", type: "bar", color: "#E69F00", data: R.resources.map(r => r[peakKey]) },
        ],
      });
    };
    bars("CPU per component", "avg_cores", "peak_cores", " cores");
    const mem = R.memory_measure || "RSS";
    bars("Memory (" + mem + ") per component", "avg_mem_mib", "peak_mem_mib", " MiB");
    table("resources", ["Mesh", "Component", "Role", "Pod", "CPU avg (cores)", "CPU peak (cores)", mem + " avg (MiB)", mem + " peak (MiB)", "Samples"],
      R.resources.map(r => [r.mesh, r.component, r.role, r.pod || "—", fmt(r.avg_cores), fmt(r.peak_cores), fmt(r.avg_mem_mib), fmt(r.peak_mem_mib), r.samples]),
      [0, 0, 0, 0, 1, 1, 1, 1, 1]);
  } else empty("resources", "No resource samples were recorded in this run.");

  // Network per pod interface (inside the resources section).
  if (R.network && R.network.length) {
    body("resources").append(el("h3", {}, "Network per pod"));
    body("resources").append(el("p", {}, "From experiments: " + (R.network_from || []).join(", ") +
      ". Rates are the mean over repeats, drops are summed; loopback (lo) is listed only where it carried traffic."));
    table("resources", ["Mesh", "Pod", "Interface", "Rx KiB/s", "Tx KiB/s", "Rx pkt/s", "Tx pkt/s", "Dropped rx / tx"],
      R.network.map(n => [n.mesh, n.pod, n.interface, fmt(n.rx_bytes_per_s / 1024), fmt(n.tx_bytes_per_s / 1024),
        fmt(n.rx_packets_per_s), fmt(n.tx_packets_per_s), n.rx_dropped + " / " + n.tx_dropped]),
      [0, 0, 0, 1, 1, 1, 1, 1]).setAttribute("data-table", "network");
  } else if (R.resources && R.resources.length) {
    body("resources").append(el("p", {}, "No network counters were recorded in this run."));
  }

  if (R.costs && R.costs.length) {
    const cm = R.cost_model;
    body("cost").append(el("p", {}, "Usage is every measured component but the load generator, at the load measured. The overhead over the baseline is priced on " +
      cm.instance + " (" + cm.vcpu + " vCPU, " + cm.memory_gib + " GiB, " + cm.currency + " " + cm.price_per_hour + "/hour, " + (cm.source || "") + ") as the share of that instance it fills, " +
      cm.hours_per_month + " hours a month."));
    const c = chart("cost", 300);
    c.setOption({
      textStyle, animation: false,
      title: { text: "Resources and monthly cost of the overhead over the baseline", left: "center", textStyle: { fontSize: 14 } },
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" } },
      legend: { top: 28 },
      grid: { left: 70, right: 70, top: 66, bottom: 40 },
      xAxis: { type: "category", data: R.costs.map(x => x.mesh) },
      yAxis: [{ type: "value", name: "vCPU" }, { type: "value", name: cm.currency + " / month" }],
      series: [
        { name: "mesh components vCPU", type: "bar", color: "#D55E00", data: R.costs.map(x => x.mesh_vcpu) },
        { name: "all components vCPU", type: "bar", color: "#56B4E9", data: R.costs.map(x => x.vcpu) },
        { name: "overhead " + cm.currency + "/month", type: "line", yAxisIndex: 1, color: "#000000", data: R.costs.map(x => x.per_month) },
      ],
    });
    table("cost", ["Mesh", "vCPU", "Memory (MiB)", "Mesh vCPU", "Mesh memory (MiB)", "req/s", "Extra vCPU", "Extra GiB", "Instances (bound by)",
      cm.currency + "/month", cm.currency + " per million requests"],
      R.costs.map(x => [x.mesh, fmt(x.vcpu), fmt(x.mem_mib), fmt(x.mesh_vcpu), fmt(x.mesh_mem_mib), fmt(x.throughput_rps), fmt(x.extra_vcpu, 3),
        fmt(x.extra_mem_gib, 3), fmt(x.instance_equivalents, 3) + " (" + (x.bound_by || "—") + ")", x.per_month.toFixed(2), x.per_million_requests.toFixed(4)]),
      [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
  } else empty("cost", "No resource samples, so no cost.");

  // Security matrix: mesh (and experiment) × probe; a cell's title holds what was
  // promised, what was observed and every check behind it.
  if (R.security && R.security.length) {
    const probes = R.security_probes || [];
    const rows = [], at = {};
    for (const c of R.security) {
      const key = c.mesh + "\u0000" + c.experiment;
      if (!at[key]) { at[key] = {}; rows.push([c.mesh, c.experiment, key]); }
      at[key][c.probe] = c;
    }
    body("security").append(el("p", {}, "pass: promised and held on every check; fail: promised and broken; " +
      "expected: not promised with these options, and indeed not held; n/a: does not apply. Hover a cell for the evidence " +
      "(✓ held, ✗ broken, · open by the mesh's own design, not judged)."));
    table("security", ["Mesh", "Experiment", ...probes], rows.map(([mesh, exp, key]) => [mesh, exp, ...probes.map(p => {
      const c = at[key][p];
      if (!c) return "—";
      const lines = [(c.promised ? "promised: " + c.promised + "\n" : "") + "observed: " + c.summary];
      for (const ch of (c.checks || [])) lines.push((ch.documented ? "· " : ch.held ? "✓ " : "✗ ") + ch.target + ": " + ch.observed);
      const cls = { "pass": "pass", "fail": "fail", "expected": "expected", "n/a": "na" }[c.outcome] || "";
      return el("span", { class: "sec " + cls, title: lines.join("\n"), "data-probe": p, "data-mesh": mesh }, c.outcome);
    })]));
  } else empty("security", "This run has no security experiment.");

  if (R.checks && R.checks.length) {
    table("checks", ["Mesh", "Check", "Result", "Detail"],
      R.checks.map(c => [c.mesh, c.check, c.not_applicable ? el("span", {}, "n/a") : el("span", { class: c.pass ? "pass" : "fail" }, c.pass ? "PASS" : "FAIL"), c.detail]));
  } else empty("checks", "No checks were stored with this run.");

  const cfgs = (R.provenance && R.provenance.config_digests) || [];
  if (cfgs.length) {
    table("provenance", ["Config", "Mesh", "Component", "Bytes", "SHA-256"],
      cfgs.map(c => [c.name, c.mesh || "—", c.component || "—", c.bytes, el("code", {}, c.sha256)]), [0, 0, 0, 1, 0]);
  } else empty("provenance", "No generated configuration files were recorded.");

  window.addEventListener("resize", () => charts.forEach(c => c.resize()));
  document.body.setAttribute("data-rendered", "true");
})();
