// The console's live parts: the plots (uPlot, from /samples) and the
// server-rendered live section, swapped in from /live. Both refresh every
// sample interval. window.posthornConsole exposes the charts and a count
// of the updates drawn, for the browser test.
(function () {
  "use strict";
  var state = { charts: {}, updates: 0, errors: [] };
  window.posthornConsole = state;
  var palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

  function series(label, color, scale) {
    return { label: label, stroke: color, width: 1.5, scale: scale || "y", spanGaps: false };
  }

  // showLatest puts the latest sample's values in the legend whenever the
  // cursor is not on the plot: uPlot's live legend reads "--" until hovered.
  function showLatest(u) {
    var n = u.data[0].length;
    if (n > 0 && u.cursor.idx == null) {
      u.setLegend({ idx: n - 1 }, false);
    }
  }

  function make(id, defs, axes) {
    var el = document.getElementById(id);
    var opts = {
      title: el.dataset.title,
      width: Math.max(480, el.clientWidth - 8),
      height: 200,
      series: [{}].concat(defs),
      axes: [{}].concat(axes || [{}]),
      scales: { x: { time: true } },
      legend: { live: true },
      hooks: { setData: [showLatest], setCursor: [showLatest] },
    };
    var data = [[]].concat(defs.map(function () { return []; }));
    return new uPlot(opts, data, el);
  }

  function build(s) {
    var cons = s.consumers || [];
    state.charts.backlog = make("plot-backlog",
      [series("backlog (events)", palette[0]), series("oldest unrelayed age (s)", palette[1], "s")],
      [{ label: "events" }, { scale: "s", side: 1, label: "seconds", grid: { show: false } }]);
    state.charts.rates = make("plot-rates",
      [series("relay publish", palette[0])].concat(cons.map(function (c, i) { return series(c + " applied", palette[i + 2]); })));
    state.charts.lag = make("plot-lag", cons.map(function (c, i) { return series(c, palette[i + 2]); }));
    state.charts.dups = make("plot-dups", cons.map(function (c, i) { return series(c, palette[i + 2]); }));
  }

  function draw(s) {
    if (!state.charts.backlog) {
      build(s);
    }
    state.charts.backlog.setData([s.time, s.backlog, s.oldest_age_seconds]);
    state.charts.rates.setData([s.time, s.publish_rate].concat(s.applied_rate));
    state.charts.lag.setData([s.time].concat(s.lag));
    state.charts.dups.setData([s.time].concat(s.duplicates_rate));
    state.updates++;
    state.points = s.time.length;
  }

  function refreshPlots() {
    return fetch("/samples", { cache: "no-store" })
      .then(function (r) { return r.json(); })
      .then(function (s) {
        draw(s);
        return s.sample_every_seconds;
      });
  }

  function refreshLive() {
    return fetch("/live", { cache: "no-store" })
      .then(function (r) { return r.text(); })
      .then(function (html) { document.getElementById("live").innerHTML = html; });
  }

  function tick() {
    Promise.all([refreshPlots(), refreshLive()])
      .then(function (v) { setTimeout(tick, Math.max(1, v[0] || 2) * 1000); })
      .catch(function (e) {
        // A console that cannot reach its server says so and keeps trying.
        state.errors.push(String(e));
        setTimeout(tick, 5000);
      });
  }

  tick();
})();
