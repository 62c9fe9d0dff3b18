"use strict";
/* A small live plot on a canvas: stacked panels of signals per axis over the last `span`
   seconds, each panel scaled to its largest magnitude, redrawn a few times a second. */
class PkrtPlot {
  constructor(canvas, panels, span = 10) {
    this.canvas = canvas;
    this.panels = panels;  // [{key, title, unit}]
    this.span = span;
    this.samples = [];  // [t (s), {key: [values]}]
    this.colors = ["#4fc3f7", "#ffb74d", "#81c784", "#e57373", "#ba68c8", "#fff176"];
    this.labels = [];
  }

  push(t, values) {
    this.samples.push([t, values]);
    while (this.samples.length && this.samples[0][0] < t - this.span) this.samples.shift();
  }

  draw() {
    const c = this.canvas, g = c.getContext("2d");
    const w = c.width, h = c.height, n = this.panels.length, ph = h / n, left = 58;
    g.clearRect(0, 0, w, h);
    g.font = "11px system-ui, sans-serif";
    const tEnd = this.samples.length ? this.samples[this.samples.length - 1][0] : 0;
    this.panels.forEach((p, i) => {
      const top = i * ph;
      let peak = 0;
      for (const [, v] of this.samples) for (const x of v[p.key] || []) if (x !== null) peak = Math.max(peak, Math.abs(x));
      peak = peak > 0 ? peak * 1.1 : 1;
      const y = (x) => top + ph / 2 - (x / peak) * (ph / 2 - 8);
      g.strokeStyle = "#323a44";
      g.beginPath(); g.moveTo(left, y(0)); g.lineTo(w, y(0)); g.stroke();
      g.fillStyle = "#9aa4ae";
      g.fillText(`${p.title} (${p.unit})`, left + 6, top + 13);
      g.fillText(peak.toExponential(1), 2, top + 12);
      g.fillText((-peak).toExponential(1), 2, top + ph - 4);
      const axes = this.samples.length ? (this.samples[this.samples.length - 1][1][p.key] || []).length : 0;
      for (let a = 0; a < axes; a++) {
        g.strokeStyle = this.colors[a % this.colors.length];
        g.beginPath();
        let started = false;
        for (const [t, v] of this.samples) {
          const x = v[p.key] ? v[p.key][a] : null;
          if (x === null || x === undefined) { started = false; continue; }
          const px = left + (w - left) * (1 - (tEnd - t) / this.span);
          if (started) g.lineTo(px, y(x)); else g.moveTo(px, y(x));
          started = true;
        }
        g.stroke();
      }
    });
    g.fillStyle = "#9aa4ae";
    this.labels.forEach((name, a) => {
      g.fillStyle = this.colors[a % this.colors.length];
      g.fillText(name, w - 70 * (this.labels.length - a), h - 4);
    });
  }
}
window.PkrtPlot = PkrtPlot;
