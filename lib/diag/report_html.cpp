// report.html of `kilter report` (see report.h): one self-contained file. The C++ side reduces the
// run to chart-sized data (at most kMaxHeatRows x kMaxHeatCols heatmap cells, kMaxLinePoints
// points per line) and embeds it as JSON; a small inline script draws SVG charts from it, so the
// page needs no network and no library, and opens from a cluster's file system as it is.
#include <algorithm>
#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "lib/diag/report.h"

namespace kilter::diag {

namespace {

constexpr size_t kMaxHeatRows = 256;   // rank groups
constexpr size_t kMaxHeatCols = 400;   // step groups
constexpr size_t kMaxLinePoints = 1000;

// Index ranges [begin, end) splitting n items into at most `bins` contiguous groups.
std::vector<std::pair<size_t, size_t>> bins_of(size_t n, size_t bins) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t k = std::min(n, bins);
  for (size_t b = 0; b < k; ++b) out.push_back({b * n / k, (b + 1) * n / k});
  return out;
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// The run reduced to what the charts draw.
nlohmann::json chart_data(const RunData& run, const nlohmann::json& stats) {
  using nlohmann::json;
  const size_t n_steps = run.steps.size();
  const int P = run.world_size;
  // records[r][i]: rank r's record of run.steps[i].
  std::vector<std::vector<const StepRecord*>> records(P);
  for (int r = 0; r < P; ++r) {
    size_t cur = 0;
    for (int64_t step : run.steps) {
      while (run.rows[r][cur].step < step) ++cur;
      records[r].push_back(&run.rows[r][cur]);
    }
  }

  json d;
  d["run_dir"] = run.run_dir;
  d["world_size"] = P;
  d["steps"] = n_steps;

  // Heatmap: rank groups (max, so one slow rank stays visible) x step groups (mean).
  json heat;
  auto row_bins = bins_of(size_t(P), kMaxHeatRows);
  auto col_bins = bins_of(n_steps, kMaxHeatCols);
  json rows = json::array(), cols = json::array(), values = json::array();
  double vmin = INFINITY, vmax = 0;
  for (auto [rb, re] : row_bins) {
    rows.push_back(re - rb == 1 ? fmt::format("{}", rb) : fmt::format("{}-{}", rb, re - 1));
    json line = json::array();
    for (auto [cb, ce] : col_bins) {
      double worst = 0;
      for (size_t r = rb; r < re; ++r) {
        double sum = 0;
        for (size_t i = cb; i < ce; ++i) sum += compute_seconds(*records[r][i]);
        worst = std::max(worst, sum / double(ce - cb));
      }
      vmin = std::min(vmin, worst);
      vmax = std::max(vmax, worst);
      line.push_back(worst);
    }
    values.push_back(line);
  }
  for (auto [cb, ce] : col_bins) cols.push_back({run.steps[cb], run.steps[ce - 1]});
  heat["rows"] = rows;
  heat["cols"] = cols;
  heat["values"] = values;
  heat["min"] = std::isfinite(vmin) ? vmin : 0.0;
  heat["max"] = vmax;
  d["heatmap"] = heat;

  // Stacked phase bars: mean seconds per step of each component per rank.
  json phases;
  json names = json::array(), series = json::array();
  for (int c = 0; c < kNumComponents; ++c) {
    names.push_back(component_name(c));
    series.push_back(stats["phase_means_seconds"][component_name(c)]);
  }
  phases["names"] = names;
  phases["values"] = series;
  phases["last_share"] = stats["last_arrival_share"];
  d["phases"] = phases;

  // Loss and tokens/s over steps (the step's wall time: the slowest rank, outside time included).
  json loss = json::array(), tps = json::array();
  for (auto [b, e] : bins_of(n_steps, kMaxLinePoints)) {
    double loss_sum = 0, tokens = 0, wall = 0;
    for (size_t i = b; i < e; ++i) {
      loss_sum += records[0][i]->loss;
      tokens += double(records[0][i]->tokens);
      double w = 0;
      for (int r = 0; r < P; ++r) w = std::max(w, records[r][i]->phase[kStepTotal] + records[r][i]->outside);
      wall += w;
    }
    loss.push_back({run.steps[b], loss_sum / double(e - b)});
    tps.push_back({run.steps[b], wall > 0 ? tokens / wall : 0.0});
  }
  d["loss"] = loss;
  d["tokens_per_second"] = tps;
  // metrics/train.csv: train and eval loss against tokens seen (absent in older runs).
  json train_points = json::array(), eval_points = json::array();
  for (const TrainRow& r : run.train) {
    if (std::isfinite(r.loss)) train_points.push_back({r.tokens, r.loss});
    if (std::isfinite(r.eval_loss)) eval_points.push_back({r.tokens, r.eval_loss});
  }
  json curves = json::array();
  if (!train_points.empty()) curves.push_back({{"name", "train loss"}, {"color", "#1f77b4"}, {"points", train_points}});
  if (!eval_points.empty())
    curves.push_back({{"name", "eval loss"}, {"color", "#d62728"}, {"dashed", true}, {"points", eval_points}});
  d["curves"] = curves;

  // Figures for the tables: the summary's scalars (plan statistics among them), then ours.
  json figures = json::array();
  if (run.summary.is_object())
    for (const auto& item : run.summary.items())
      if (item.value().is_primitive() && !stats.contains(item.key()))
        figures.push_back({item.key(), item.value()});
  for (const char* key : {"step_time_imbalance_p50", "step_time_imbalance_p95", "step_time_imbalance_max",
                          "sync_wait_fraction", "median_step_seconds", "straggler_rank"})
    figures.push_back({key, stats[key]});
  d["figures"] = figures;
  d["straggler"] = stats["straggler"];
  d["straggler_rank"] = stats["straggler_rank"];
  d["stalls"] = stats["stalls"];
  d["memory"] = stats["memory"];
  return d;
}

constexpr const char* kStyle = R"CSS(
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 2px 10px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.verdict { padding: 8px 12px; background: #f7f7f7; border-left: 4px solid #888; }
.verdict.bad { border-color: #d62728; } .verdict.ok { border-color: #2ca02c; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
pre { background: #f7f7f7; padding: 8px; font-size: 12px; overflow: auto; }
)CSS";

constexpr const char* kScript = R"JS(
(function () {
  const D = JSON.parse(document.getElementById('kilter-data').textContent);
  const NS = 'http://www.w3.org/2000/svg';
  const PHASE_COLORS = ['#8c564b', '#e377c2', '#1f77b4', '#ff7f0e', '#d62728', '#2ca02c', '#7f7f7f', '#bcbd22'];
  function el(tag, attrs, parent, text) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function svg(id, w, h) {
    // Scales with the window (viewBox), never wider than drawn.
    const s = el('svg', {id: id + '-svg', width: '100%', viewBox: '0 0 ' + w + ' ' + h, style: 'max-width:' + w + 'px'});
    document.getElementById(id).appendChild(s);
    return s;
  }
  function fmt(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(3); }
  // Viridis, a few stops interpolated.
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function viridis(t) {
    t = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
    const i = Math.min(VIRIDIS.length - 2, Math.floor(t)), f = t - i, a = VIRIDIS[i], b = VIRIDIS[i + 1];
    return 'rgb(' + a.map((x, k) => Math.round(x + (b[k] - x) * f)).join(',') + ')';
  }

  function heatmap() {
    const H = D.heatmap, nr = H.rows.length, nc = H.cols.length;
    if (!nr || !nc) return 0;
    const left = 60, top = 10, W = 1000, cw = (W - left - 20) / nc, ch = Math.max(3, Math.min(22, 420 / nr));
    const s = svg('heatmap', W, top + nr * ch + 70);
    const span = H.max - H.min || 1;
    for (let r = 0; r < nr; ++r) {
      for (let c = 0; c < nc; ++c) {
        const v = H.values[r][c];
        const rect = el('rect', {x: left + c * cw, y: top + r * ch, width: cw + 0.3, height: ch + 0.3,
                                 fill: viridis((v - H.min) / span), 'class': 'cell'}, s);
        const st = H.cols[c][0] === H.cols[c][1] ? 'step ' + H.cols[c][0] : 'steps ' + H.cols[c][0] + '-' + H.cols[c][1];
        el('title', {}, rect, 'rank ' + H.rows[r] + ', ' + st + ': compute ' + fmt(v) + ' s');
      }
      if (nr <= 40 || r % Math.ceil(nr / 40) === 0)
        el('text', {x: left - 6, y: top + r * ch + ch / 2 + 4, 'text-anchor': 'end'}, s, H.rows[r]);
    }
    const yb = top + nr * ch;
    for (let c = 0; c < nc; c += Math.max(1, Math.ceil(nc / 10)))
      el('text', {x: left + c * cw, y: yb + 14}, s, H.cols[c][0]);
    el('text', {x: left + (W - left) / 2, y: yb + 30, 'text-anchor': 'middle'}, s, 'step');
    for (let i = 0; i <= 50; ++i)
      el('rect', {x: left + i * 4, y: yb + 42, width: 4, height: 10, fill: viridis(i / 50)}, s);
    el('text', {x: left, y: yb + 66}, s, fmt(H.min) + ' s');
    el('text', {x: left + 204, y: yb + 66, 'text-anchor': 'end'}, s, fmt(H.max) + ' s');
    el('text', {x: left + 214, y: yb + 52}, s, 'compute time per step (step_total - comm_exposed)');
    return 1;
  }

  function phaseBars() {
    const P = D.phases, n = D.world_size, names = P.names;
    let maxTotal = 0;
    for (let r = 0; r < n; ++r) {
      let t = 0;
      for (let k = 0; k < names.length; ++k) t += P.values[k][r];
      maxTotal = Math.max(maxTotal, t);
    }
    const left = 60, top = 10, W = 1000, plotH = 260, bw = (W - left - 20) / n;
    const s = svg('phases', W, top + plotH + 60);
    const scale = maxTotal > 0 ? plotH / maxTotal : 0;
    for (let r = 0; r < n; ++r) {
      let y = top + plotH;
      for (let k = 0; k < names.length; ++k) {
        const h = P.values[k][r] * scale;
        y -= h;
        const rect = el('rect', {x: left + r * bw + bw * 0.1, y: y, width: bw * 0.8, height: h,
                                 fill: PHASE_COLORS[k], 'class': 'bar'}, s);
        el('title', {}, rect, 'rank ' + r + ' ' + names[k] + ': ' + fmt(P.values[k][r]) + ' s per step');
      }
      if (n <= 40 || r % Math.ceil(n / 40) === 0)
        el('text', {x: left + r * bw + bw / 2, y: top + plotH + 14, 'text-anchor': 'middle'}, s, r);
    }
    for (let i = 0; i <= 4; ++i) {
      const v = maxTotal * i / 4, y = top + plotH - v * scale;
      el('line', {x1: left - 4, x2: left, y1: y, y2: y, stroke: '#333'}, s);
      el('text', {x: left - 6, y: y + 4, 'text-anchor': 'end'}, s, fmt(v));
    }
    el('line', {x1: left, x2: left, y1: top, y2: top + plotH, stroke: '#333'}, s);
    let lx = left;
    for (let k = 0; k < names.length; ++k) {
      el('rect', {x: lx, y: top + plotH + 30, width: 10, height: 10, fill: PHASE_COLORS[k]}, s);
      el('text', {x: lx + 14, y: top + plotH + 39}, s, names[k]);
      lx += 24 + names[k].length * 7;
    }
    el('text', {x: left, y: top + plotH + 56}, s, 'mean seconds per step by rank (x axis: rank)');
    return 1;
  }

  function lineChart(id, points, label, color) {
    if (!points.length) return 0;
    const left = 60, top = 10, W = 1000, plotH = 200, plotW = W - left - 20;
    const s = svg(id, W, top + plotH + 40);
    const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (y1 === y0) { y0 -= 1; y1 += 1; }
    const X = x => left + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * plotW;
    const Y = y => top + plotH - (y - y0) / (y1 - y0) * plotH;
    el('polyline', {points: points.map(p => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' '),
                    fill: 'none', stroke: color, 'stroke-width': 1.5, 'class': 'series'}, s);
    el('line', {x1: left, x2: left, y1: top, y2: top + plotH, stroke: '#333'}, s);
    el('line', {x1: left, x2: left + plotW, y1: top + plotH, y2: top + plotH, stroke: '#333'}, s);
    // Enough decimals that the five tick labels differ (a loss curve may span 4.571..4.579).
    const tick = (y1 - y0) / 4, decimals = tick >= 1 ? 0 : Math.min(8, Math.ceil(-Math.log10(tick)) + 1);
    for (let i = 0; i <= 4; ++i) {
      const v = y0 + (y1 - y0) * i / 4;
      el('text', {x: left - 6, y: Y(v) + 4, 'text-anchor': 'end'}, s, tick >= 1 && Math.abs(v) < 100 ? fmt(v) : v.toFixed(decimals));
      const xv = x0 + (x1 - x0) * i / 4;
      el('text', {x: X(xv), y: top + plotH + 14, 'text-anchor': 'middle'}, s, Math.round(xv));
    }
    el('text', {x: left + plotW / 2, y: top + plotH + 32, 'text-anchor': 'middle'}, s, 'step — ' + label);
    return 1;
  }

  function figures() {
    const t = document.getElementById('figures');
    for (const [k, v] of D.figures) {
      const tr = document.createElement('tr');
      const a = document.createElement('td'), b = document.createElement('td');
      a.textContent = k;
      b.textContent = typeof v === 'number' && !Number.isInteger(v) ? fmt(v) : String(v);
      tr.appendChild(a); tr.appendChild(b); t.appendChild(tr);
    }
    return D.figures.length ? 1 : 0;
  }

  let rendered = 0;
  rendered += heatmap();
  rendered += phaseBars();
  rendered += lineChart('loss', D.loss, 'loss', '#1f77b4');
  rendered += lineChart('tps', D.tokens_per_second, 'tokens/s (step tokens / slowest rank\'s step time)', '#2ca02c');
  rendered += figures();
  if (D.curves.length) rendered += kilterMultiLine('curves', D.curves, 'tokens seen', 'loss');
  document.body.setAttribute('data-charts-rendered', rendered);
})();
)JS";

}  // namespace

std::string html_escape(const std::string& s) { return escape_html(s); }

std::string report_html(const RunData& run, const nlohmann::json& stats) {
  nlohmann::json data = chart_data(run, stats);
  std::string data_json = data.dump();
  // Inside <script>, "</" could close the element; "<\/" is the same JSON string.
  for (size_t pos = 0; (pos = data_json.find("</", pos)) != std::string::npos; pos += 3)
    data_json.replace(pos, 2, "<\\/");

  const nlohmann::json& sg = stats["straggler"];
  std::string verdict;
  if (stats["straggler_rank"].get<int>() >= 0)
    verdict = fmt::format(
        "<div class=\"verdict bad\" id=\"straggler\">Straggler: <b>rank {}</b>, last to arrive at the gradient "
        "collective in {:.0f}% of steps (mean lag {:.4f} s); slowest phase <b>{}</b> (+{:.4f} s per step over the "
        "other ranks' median).</div>",
        sg["candidate"].get<int>(), 100 * sg["share"].get<double>(), sg["mean_lag_seconds"].get<double>(),
        escape_html(sg["phase"].get<std::string>()), sg["phase_excess_seconds"].get<double>());
  else
    verdict = "<div class=\"verdict ok\" id=\"straggler\">No straggler beyond noise.</div>";

  std::ostringstream stall_rows;
  for (const auto& s : stats["stalls"]["steps"])
    stall_rows << fmt::format("<tr><td>{}</td><td>{:.4f}</td><td>{}</td><td>{:.4f}</td><td>{}</td></tr>",
                              s["step"].get<int64_t>(), s["seconds"].get<double>(),
                              escape_html(s["phase"].get<std::string>()), s["excess_seconds"].get<double>(),
                              escape_html(stall_cause(run, s["step"].get<int64_t>(), s["phase"].get<std::string>())));
  int64_t period = stats["stalls"]["period"].get<int64_t>();

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>kilter report: "
       << escape_html(run.run_dir) << "</title>\n<style>" << kStyle << "</style></head>\n<body>\n";
  html << "<h1>kilter report: " << escape_html(run.run_dir) << "</h1>\n";
  html << fmt::format("<p>{} ranks, {} steps recorded by every rank.</p>\n", run.world_size, run.steps.size());
  html << verdict << "\n";
  html << "<h2>Compute time per rank and step</h2>\n<div id=\"heatmap\"></div>\n";
  html << "<h2>Phases per rank</h2>\n<div id=\"phases\"></div>\n";
  html << "<h2>Loss</h2>\n<div id=\"loss\"></div>\n";
  if (!run.train.empty())
    html << "<h2>Train and eval loss against tokens (metrics/train.csv)</h2>\n<div id=\"curves\"></div>\n";
  html << "<h2>Throughput</h2>\n<div id=\"tps\"></div>\n";
  html << "<h2>Run and plan statistics</h2>\n<table id=\"figures\"><tr><th>figure</th><th>value</th></tr></table>\n";
  html << fmt::format("<h2>Stalls</h2>\n<p>{} step(s) slower than {:.1f}&times; the median step{}.</p>\n",
                      stats["stalls"]["count"].get<int>(), stats["stalls"]["factor"].get<double>(),
                      period > 0 ? fmt::format(", recurring every {} steps", period) : "");
  if (!stall_rows.str().empty())
    html << "<table id=\"stalls\"><tr><th>step</th><th>seconds</th><th>phase that grew</th><th>excess (s)</th><th>cause</th></tr>"
         << stall_rows.str() << "</table>\n";
  const std::string calibration = calibration_text(run) + rank_speed_text(run);
  if (!calibration.empty()) html << "<h2>Cost calibration</h2>\n<pre>" << escape_html(calibration) << "</pre>\n";
  if (!run.config_text.empty()) html << "<h2>Configuration</h2>\n<pre>" << escape_html(run.config_text) << "</pre>\n";
  html << "<script type=\"application/json\" id=\"kilter-data\">" << data_json << "</script>\n";
  html << "<script>" << multi_line_chart_js() << "</script>\n";
  html << "<script>" << kScript << "</script>\n</body></html>\n";
  return html.str();
}

}  // namespace kilter::diag
