"use strict";
/* The tool path of a G-code program on a canvas, as AXIS draws it: the preview the panel made
   when it checked the program whole (at most 20,000 points in task coordinates, m, in order,
   each with the program line of the motion ending there and its kind: traverses dashed, feeds
   solid), the part executed so far in its own colour (the points of the lines before the
   current one, then on to the tool), the tool's live position (a cross) and the current line's
   next point (a ring). Views: top (XY), front (XZ), side (YZ) and 3-D (isometric). */
class PkrtToolpath {
  constructor(canvas) {
    this.canvas = canvas;
    this.colors = {traverse: "#7d8791", feed: "#4fc3f7", done: "#ffb74d", tool: "#ff1744", ring: "#ffffff",
                   text: "#9aa4ae"};
    this.preview = null;  // {name, x, y, z (Float64Array), lines (Int32Array), kinds (Uint8Array)}
    this.view = "xy";
    this.line = null;  // the current program line (null: not running this program)
    this.finished = false;
    this.tool = null;  // [x, y, z] m
    this.note = "no program chosen";
    this.layer = null;  // the whole path drawn once per preview, view and size
    this.dirty = true;
  }

  set(preview, name) {
    if (!preview) { this.preview = null; this.layer = null; this.dirty = true; return; }
    const n = preview.lines.length, um = preview.points_um;
    const x = new Float64Array(n), y = new Float64Array(n), z = new Float64Array(n);
    for (let i = 0; i < n; i++) { x[i] = um[3 * i] * 1e-6; y[i] = um[3 * i + 1] * 1e-6; z[i] = um[3 * i + 2] * 1e-6; }
    this.preview = {name, x, y, z, lines: Int32Array.from(preview.lines), kinds: Uint8Array.from(preview.kinds),
                    total: preview.lines_total, motions: preview.motions, tolerance: preview.tolerance_m};
    this.layer = null;
    this.dirty = true;
  }

  setView(view) { if (view !== this.view) { this.view = view; this.layer = null; this.dirty = true; } }

  setProgress(line, finished) {
    if (line !== this.line || finished !== this.finished) { this.line = line; this.finished = finished; this.dirty = true; }
  }

  setTool(xyz) {
    const t = xyz && xyz.length >= 3 && xyz.slice(0, 3).every((v) => v !== null) ? xyz.slice(0, 3) : null;
    if (JSON.stringify(t) !== JSON.stringify(this.tool)) { this.tool = t; this.dirty = true; }
  }

  setNote(text) { if (text !== this.note) { this.note = text; this.dirty = true; } }

  project(x, y, z) {
    switch (this.view) {
      case "xz": return [x, z];
      case "yz": return [y, z];
      case "iso": return [(x - y) * 0.8660254, z + (x + y) * 0.5];
      default: return [x, y];
    }
  }

  fit() {
    const p = this.preview, c = this.canvas;
    let u0 = Infinity, u1 = -Infinity, v0 = Infinity, v1 = -Infinity;
    for (let i = 0; i < p.x.length; i++) {
      const [u, v] = this.project(p.x[i], p.y[i], p.z[i]);
      if (u < u0) u0 = u; if (u > u1) u1 = u; if (v < v0) v0 = v; if (v > v1) v1 = v;
    }
    const pad = 16, foot = 22, span = Math.max(u1 - u0, v1 - v0, 1e-6);  // foot: the caption's band
    const k = Math.min((c.width - 2 * pad) / Math.max(u1 - u0, span * 1e-3),
                       (c.height - 2 * pad - foot) / Math.max(v1 - v0, span * 1e-3));
    const cu = (u0 + u1) / 2, cv = (v0 + v1) / 2, mid = (c.height - foot) / 2;
    this.map = (x, y, z) => { const [u, v] = this.project(x, y, z); return [c.width / 2 + (u - cu) * k, mid - (v - cv) * k]; };
  }

  drawLayer() {
    const c = this.canvas, p = this.preview;
    const layer = document.createElement("canvas");
    layer.width = c.width; layer.height = c.height;
    const g = layer.getContext("2d");
    this.fit();
    this.strokes(g, p.x.length - 1, this.colors.traverse, this.colors.feed, 1, 2);
    this.layer = layer;
  }

  strokes(g, last, traverse, feed, thin, thick) {
    /* the path's pieces up to point ``last``: traverses dashed, feeds solid */
    const p = this.preview;
    for (const [kind, color, width, dash] of [[0, traverse, thin, [4, 4]], [1, feed, thick, []]]) {
      g.strokeStyle = color; g.lineWidth = width; g.setLineDash(dash);
      g.beginPath();
      for (let i = 1; i <= last; i++) {
        if ((p.kinds[i] ? 1 : 0) !== kind) continue;
        const [a, b] = this.map(p.x[i - 1], p.y[i - 1], p.z[i - 1]), [d, e] = this.map(p.x[i], p.y[i], p.z[i]);
        g.moveTo(a, b); g.lineTo(d, e);
      }
      g.stroke();
    }
    g.setLineDash([]);
  }

  executed() {
    /* the index of the last point of a line before the current one (-1: none; all when done) */
    const p = this.preview;
    if (this.finished) return p.lines.length - 1;
    if (this.line === null) return -1;
    let lo = 0, hi = p.lines.length;  // the first point of a line >= the current one
    while (lo < hi) { const m = (lo + hi) >> 1; if (p.lines[m] < this.line) lo = m + 1; else hi = m; }
    return lo - 1;
  }

  draw() {
    if (!this.dirty) return;
    this.dirty = false;
    const c = this.canvas, g = c.getContext("2d"), p = this.preview;
    g.clearRect(0, 0, c.width, c.height);
    g.font = "12px system-ui, sans-serif";
    if (!p || !p.x.length) {
      g.fillStyle = this.colors.text;
      g.fillText(this.note, 12, 22);
      c.dataset.points = "0";
      return;
    }
    if (!this.layer) this.drawLayer();
    g.drawImage(this.layer, 0, 0);
    const k = this.executed();
    this.strokes(g, k, this.colors.done, this.colors.done, 1.5, 3);
    if (k >= 0 && this.tool && !this.finished) {  // on to the tool, along the current line
      g.strokeStyle = this.colors.done; g.lineWidth = k + 1 < p.x.length && !p.kinds[k + 1] ? 1.5 : 3;
      g.beginPath(); g.moveTo(...this.map(p.x[k], p.y[k], p.z[k])); g.lineTo(...this.map(...this.tool)); g.stroke();
    }
    if (k + 1 < p.x.length && this.line !== null && !this.finished) {  // the current line's next point
      const [a, b] = this.map(p.x[k + 1], p.y[k + 1], p.z[k + 1]);
      g.strokeStyle = this.colors.ring; g.lineWidth = 1.5;
      g.beginPath(); g.arc(a, b, 5, 0, 2 * Math.PI); g.stroke();
    }
    if (this.tool) {
      const [a, b] = this.map(...this.tool);
      g.strokeStyle = this.colors.tool; g.lineWidth = 2.5;
      g.beginPath(); g.moveTo(a - 7, b); g.lineTo(a + 7, b); g.moveTo(a, b - 7); g.lineTo(a, b + 7); g.stroke();
    }
    g.fillStyle = this.colors.text;
    g.fillText(`${p.name}: ${p.total} lines, ${p.x.length} points (within ${(p.tolerance * 2e3).toPrecision(2)} mm)`, 8, c.height - 8);
    c.dataset.points = String(p.x.length);
    c.dataset.executed = String(k + 1);
    c.dataset.line = this.line === null ? "" : String(this.line);
  }
}
window.PkrtToolpath = PkrtToolpath;
