// `kilter report --compare RUN_A RUN_B ...` (see report.h): runs side by side on one
// self-contained page (inline data and script, nothing from the network), the way a hosted
// experiment tracker would show them: loss curves against tokens, tokens/s, and the throughput,
// balance and phase figures of each run in one table. Also the shared multi-series line chart.
#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "lib/diag/report.h"

namespace kilter::diag {
namespace {

using json = nlohmann::json;

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

// Per-step tokens/s of a run: the step's tokens over its slowest rank's time (outside included).
json tokens_per_second_points(const RunData& run) {
  json points = json::array();
  std::vector<size_t> cursor(size_t(run.world_size), 0);
  for (int64_t step : run.steps) {
    double wall = 0, tokens = 0;
    for (int r = 0; r < run.world_size; ++r) {
      const auto& rows = run.rows[size_t(r)];
      while (rows[cursor[size_t(r)]].step < step) ++cursor[size_t(r)];
      const StepRecord& rec = rows[cursor[size_t(r)]];
      wall = std::max(wall, rec.phase[kStepTotal] + rec.outside);
      if (r == 0) tokens = double(rec.tokens);
    }
    if (wall > 0) points.push_back({step, tokens / wall});
  }
  return points;
}

// Loss against tokens: train.csv when the run has one, else the rank-0 rows (tokens summed).
json loss_points(const RunData& run, bool eval) {
  json points = json::array();
  if (!run.train.empty()) {
    for (const TrainRow& r : run.train) {
      const double y = eval ? r.eval_loss : r.loss;
      if (std::isfinite(y)) points.push_back({r.tokens, y});
    }
    return points;
  }
  if (eval || run.rows.empty()) return points;
  double tokens = 0;
  for (const StepRecord& rec : run.rows[0]) {
    tokens += double(rec.tokens);
    points.push_back({tokens, rec.loss});
  }
  return points;
}

double mean_over_ranks(const json& per_rank) {
  double sum = 0;
  for (const auto& v : per_rank) sum += v.get<double>();
  return per_rank.empty() ? 0.0 : sum / double(per_rank.size());
}

// (figure, one text cell per run) rows of the comparison table.
std::vector<std::pair<std::string, std::vector<std::string>>> figure_rows(const std::vector<RunData>& runs,
                                                                          const std::vector<json>& stats) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto add = [&](const std::string& name, auto&& cell) {
    std::vector<std::string> cells;
    for (size_t i = 0; i < runs.size(); ++i) cells.push_back(cell(runs[i], stats[i]));
    rows.emplace_back(name, cells);
  };
  auto number = [](const json& j, const char* key) -> std::string {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return "n/a";
    return fmt::format("{:.4g}", j[key].get<double>());
  };
  add("world_size", [](const RunData& r, const json&) { return std::to_string(r.world_size); });
  add("steps recorded", [](const RunData& r, const json&) { return std::to_string(r.steps.size()); });
  for (const char* key : {"tokens_per_second", "final_loss", "eval_loss", "padding_efficiency", "cost_imbalance_p95"})
    add(key, [&](const RunData& r, const json&) { return number(r.summary, key); });
  for (const char* key : {"step_time_imbalance_p95", "sync_wait_fraction", "median_step_seconds"})
    add(key, [&](const RunData&, const json& s) { return number(s, key); });
  add("straggler_rank", [](const RunData&, const json& s) {
    const int rank = s["straggler_rank"].get<int>();
    return rank >= 0 ? std::to_string(rank) : std::string("none");
  });
  add("stalls", [](const RunData&, const json& s) { return std::to_string(s["stalls"]["count"].get<int>()); });
  for (const char* phase : {"data_wait", "h2d", "forward", "backward", "gather_wait", "scatter_wait", "comm_exposed",
                            "optimizer", "outside", "step_total"})
    add(std::string("mean ") + phase + " (s/step)", [&](const RunData&, const json& s) {
      const json& means = s["phase_means_seconds"];
      return means.contains(phase) ? fmt::format("{:.5f}", mean_over_ranks(means[phase])) : std::string("n/a");
    });
  return rows;
}

}  // namespace

const char* multi_line_chart_js() {
  return R"JS(
function kilterMultiLine(id, series, xLabel, yLabel) {
  const drawn = series.filter(s => s.points && s.points.length);
  if (!drawn.length) return 0;
  const NS = 'http://www.w3.org/2000/svg';
  const add = (tag, attrs, parent, text) => {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  };
  const left = 70, top = 10, W = 1000, plotH = 240, plotW = W - left - 200;
  const s = add('svg', {width: W, height: top + plotH + 44, id: id + '-svg'}, document.getElementById(id));
  const xs = drawn.flatMap(d => d.points.map(p => p[0])), ys = drawn.flatMap(d => d.points.map(p => p[1]));
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const X = x => left + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * plotW;
  const Y = y => top + plotH - (y - y0) / (y1 - y0) * plotH;
  add('line', {x1: left, x2: left, y1: top, y2: top + plotH, stroke: '#333'}, s);
  add('line', {x1: left, x2: left + plotW, y1: top + plotH, y2: top + plotH, stroke: '#333'}, s);
  const tick = (y1 - y0) / 4, decimals = tick >= 1 ? 0 : Math.min(8, Math.ceil(-Math.log10(tick)) + 1);
  for (let i = 0; i <= 4; ++i) {
    const v = y0 + (y1 - y0) * i / 4, xv = x0 + (x1 - x0) * i / 4;
    add('text', {x: left - 6, y: Y(v) + 4, 'text-anchor': 'end'}, s, v.toFixed(decimals));
    add('text', {x: X(xv), y: top + plotH + 14, 'text-anchor': 'middle'}, s, xv >= 1e4 ? xv.toExponential(2) : Math.round(xv));
  }
  add('text', {x: left + plotW / 2, y: top + plotH + 34, 'text-anchor': 'middle'}, s, xLabel + ' — ' + yLabel);
  drawn.forEach((d, i) => {
    const attrs = {points: d.points.map(p => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' '), fill: 'none',
                   stroke: d.color, 'stroke-width': 1.5, 'class': 'curve', 'data-points': d.points.length};
    if (d.dashed) attrs['stroke-dasharray'] = '5,3';
    add('polyline', attrs, s);
    if (d.points.length === 1) add('circle', {cx: X(d.points[0][0]), cy: Y(d.points[0][1]), r: 3, fill: d.color}, s);
    add('line', {x1: left + plotW + 16, x2: left + plotW + 36, y1: top + 10 + 16 * i, y2: top + 10 + 16 * i,
                 stroke: d.color, 'stroke-width': 2, 'stroke-dasharray': d.dashed ? '5,3' : ''}, s);
    add('text', {x: left + plotW + 42, y: top + 14 + 16 * i}, s, d.name);
  });
  return 1;
}
)JS";
}

std::string compare_html(const std::vector<RunData>& runs, const std::vector<json>& stats) {
  json loss = json::array(), tps = json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    loss.push_back({{"name", runs[i].run_dir + " train"}, {"color", color}, {"points", loss_points(runs[i], false)}});
    json eval = loss_points(runs[i], true);
    if (!eval.empty())
      loss.push_back({{"name", runs[i].run_dir + " eval"}, {"color", color}, {"dashed", true}, {"points", eval}});
    tps.push_back({{"name", runs[i].run_dir}, {"color", color}, {"points", tokens_per_second_points(runs[i])}});
  }
  std::string data = json{{"loss", loss}, {"tps", tps}}.dump();
  for (size_t pos = 0; (pos = data.find("</", pos)) != std::string::npos; pos += 3) data.replace(pos, 2, "<\\/");

  std::ostringstream table;
  table << "<table id=\"figures\"><tr><th>figure</th>";
  for (const RunData& run : runs) table << "<th>" << html_escape(run.run_dir) << "</th>";
  table << "</tr>\n";
  for (const auto& [name, cells] : figure_rows(runs, stats)) {
    table << "<tr><td>" << html_escape(name) << "</td>";
    for (const std::string& cell : cells) table << "<td>" << html_escape(cell) << "</td>";
    table << "</tr>\n";
  }
  table << "</table>\n";

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>kilter report --compare</title>\n"
       << "<style>body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }\n"
       << "h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ddd; }\n"
       << "table { border-collapse: collapse; font-size: 13px; } td, th { padding: 2px 10px; text-align: right; }\n"
       << "th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }\n"
       << "svg text { font: 11px system-ui, sans-serif; fill: #333; }</style></head>\n<body>\n";
  html << "<h1>kilter report --compare: " << runs.size() << " runs</h1>\n";
  html << "<h2>Loss against tokens (solid: train, dashed: eval)</h2>\n<div id=\"loss\"></div>\n";
  html << "<h2>Throughput (step tokens / slowest rank's step time)</h2>\n<div id=\"tps\"></div>\n";
  html << "<h2>Throughput, balance and phases</h2>\n" << table.str();
  html << "<script type=\"application/json\" id=\"kilter-data\">" << data << "</script>\n";
  html << "<script>" << multi_line_chart_js() << "</script>\n";
  html << "<script>(function () {\n"
          "  const D = JSON.parse(document.getElementById('kilter-data').textContent);\n"
          "  let rendered = 0;\n"
          "  rendered += kilterMultiLine('loss', D.loss, 'tokens seen', 'loss');\n"
          "  rendered += kilterMultiLine('tps', D.tps, 'step', 'tokens/s');\n"
          "  document.body.setAttribute('data-charts-rendered', rendered);\n"
          "})();</script>\n</body></html>\n";
  return html.str();
}

std::string compare_text(const std::vector<RunData>& runs, const std::vector<json>& stats) {
  std::ostringstream os;
  os << fmt::format("{:<28}", "figure");
  for (size_t i = 0; i < runs.size(); ++i) os << fmt::format(" {:>16}", fmt::format("run {}", i + 1));
  os << "\n";
  for (const auto& [name, cells] : figure_rows(runs, stats)) {
    os << fmt::format("{:<28}", name);
    for (const std::string& cell : cells) os << fmt::format(" {:>16}", cell);
    os << "\n";
  }
  for (size_t i = 0; i < runs.size(); ++i) os << fmt::format("run {}: {}\n", i + 1, runs[i].run_dir);
  return os.str();
}

}  // namespace kilter::diag
