// The lag chart: samples the topic's consumer groups every 2 s (the
// dashboard's own GET of the API, authorized by the session) and draws
// each group's lag over the last 5 minutes.
(function () {
  "use strict";
  var svg = document.getElementById("lag-chart");
  if (!svg) { return; }
  var legend = document.getElementById("lag-legend");
  var colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];
  var span = 5 * 60 * 1000, series = Object.create(null); // no prototype: a group may be named "__proto__"
  var ns = "http://www.w3.org/2000/svg";
  function draw() {
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var now = Date.now(), top = 1, names = Object.keys(series).sort();
    names.forEach(function (g) { series[g].forEach(function (p) { top = Math.max(top, p[1]); }); });
    legend.textContent = "";
    names.forEach(function (g, i) {
      var pts = series[g].filter(function (p) { return now - p[0] <= span; });
      series[g] = pts;
      var line = document.createElementNS(ns, "polyline");
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", colors[i % colors.length]);
      line.setAttribute("stroke-width", "2");
      line.setAttribute("points", pts.map(function (p) {
        return (600 - (now - p[0]) / span * 600).toFixed(1) + "," + (150 - p[1] / top * 140).toFixed(1);
      }).join(" "));
      svg.appendChild(line);
      if (pts.length) { // the latest sample, visible even when it is the only one
        var last = pts[pts.length - 1], dot = document.createElementNS(ns, "circle");
        dot.setAttribute("cx", (600 - (now - last[0]) / span * 600).toFixed(1));
        dot.setAttribute("cy", (150 - last[1] / top * 140).toFixed(1));
        dot.setAttribute("r", "3");
        dot.setAttribute("fill", colors[i % colors.length]);
        svg.appendChild(dot);
      }
      var item = document.createElement("span");
      item.style.color = colors[i % colors.length];
      item.textContent = g + ": " + (pts.length ? pts[pts.length - 1][1] : 0);
      legend.appendChild(item);
    });
    var label = document.createElementNS(ns, "text");
    label.setAttribute("x", "4"); label.setAttribute("y", "12"); label.setAttribute("font-size", "10");
    label.textContent = "max " + top + " messages · last 5 minutes";
    svg.appendChild(label);
    if (!names.length) { legend.textContent = "No consumer group reads this topic yet."; }
  }
  function sample() {
    fetch(svg.dataset.groups, { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (body) {
        var totals = Object.create(null), now = Date.now();
        body.items.forEach(function (g) { totals[g.group] = g.lag; });
        Object.keys(totals).forEach(function (g) { (series[g] = series[g] || []).push([now, totals[g]]); });
        svg.dataset.samples = String((+svg.dataset.samples || 0) + 1);
        draw();
      })
      .catch(function (e) { legend.textContent = "Lag unavailable: " + e.message; });
  }
  sample();
  setInterval(sample, 2000);
}());
