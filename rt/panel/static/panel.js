"use strict";
/* pkrt operator panel: renders the view the panel pushes (a snapshot, then changed fields)
   and sends the operator's commands over the WebSocket. The emergency stop goes out on
   pointerdown (and over POST /estop when the WebSocket is down). A continuous jog lasts only
   while its button is held: keep-alives every 100 ms; release, leaving the page or losing the
   connection ends it (the machine's dead-man releases a jog without keep-alives). */
(() => {
  const $ = (id) => document.getElementById(id);
  const view = {};
  const stats = {snapshots: 0, updates: 0, replies: 0};  // messages received (read by the benchmark)
  const now = () => performance.timeOrigin + performance.now();  // ms since the epoch
  let ws = null, nextId = 1, retry = 0, jog = null, lastEstop = 0, overrideSent = 0, overrideValue = null, shown = null;
  let previewAsked = null;  // the program whose tool path was asked for last
  const toolpath = new window.PkrtToolpath($("toolpath"));
  const plot = new window.PkrtPlot($("plot"), [
    {key: "error", title: "following error", unit: "axis units"},
    {key: "torque", title: "force / torque", unit: "N, N m"},
  ]);

  // -- connection ---------------------------------------------------------------------------
  function connect() {
    ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
    ws.onopen = () => { retry = 0; setLink("panel: connected"); };
    ws.onmessage = (ev) => onMessage(JSON.parse(ev.data));
    ws.onclose = () => {
      ws = null;
      endJog(false);
      setLink("panel: connection lost, reconnecting");
      setBanner("offline", "panel offline");
      setTimeout(connect, Math.min(5000, 500 * ++retry));
    };
  }

  function send(cmd, args = {}) {
    if (!ws || ws.readyState !== WebSocket.OPEN) { say(`${cmd}: not connected to the panel`, true); return null; }
    const id = nextId++;
    ws.send(JSON.stringify({id, cmd, ...args}));
    return id;
  }

  function onMessage(m) {
    stats[`${m.type}s`] = (stats[`${m.type}s`] || 0) + 1;
    if (m.type === "snapshot") {
      for (const k of Object.keys(view)) delete view[k];
      Object.assign(view, m.view);
      render(Object.keys(RENDER));
    } else if (m.type === "update") {
      Object.assign(view, m.changes);
      render(Object.keys(m.changes));
    } else if (m.type === "reply") {
      onReply(m);
    } else if (m.type === "error") {
      say(m.error, true);
    }
  }

  function onReply(m) {
    if (m.cmd === "read") { if (m.ok) showProgram(m.reply.text, true); else say(`read: ${m.error}`, true); return; }
    if (m.cmd === "preview") { onPreview(m); return; }
    if (!m.ok) { say(`${m.cmd}: ${m.error}`, true); return; }
    if (m.cmd === "estop") $("estop").dataset.repliedAt = now().toFixed(1);
    if (m.cmd !== "release") say(`${m.cmd}: ok${m.reply && m.reply.planning ? " (planning)" : ""}`);
  }

  function say(text, error = false) {
    const el = $("message");
    el.textContent = text;
    if (error) el.dataset.error = ""; else delete el.dataset.error;
  }

  function setLink(text) { $("link").textContent = text; }

  function setBanner(state, text) {
    const b = $("banner");
    if (b.dataset.state !== state) { b.dataset.state = state; b.dataset.at = now().toFixed(1); }
    $("state").textContent = text;
  }

  // -- rendering ----------------------------------------------------------------------------
  const fmt = (x, d = 6) => (x === null || x === undefined ? "—" : Number(x).toFixed(d).replace(/^-(0\.0*)$/, "$1"));
  const cell = (text) => { const td = document.createElement("td"); td.textContent = text; return td; };

  const RENDER = {
    link() {
      const l = view.link || {};
      if (!l.up) {
        setBanner("unreachable", "machine not reachable");
        const f = $("fault"); f.hidden = false; f.textContent = `${l.socket || ""}: ${l.error || ""}`;
      }
    },
    state() {
      if (!view.link || !view.link.up || !view.state) return;
      setBanner(view.state, view.state.replace("_", " "));
    },
    info() { buildAxes(); },
    homed() { $("homed").textContent = view.homed ? "homed" : "not homed"; },
    torque_on() { $("torque").textContent = view.torque_on ? "torque on" : "torque off"; },
    fault() {
      if (view.link && !view.link.up) return;
      const f = $("fault"); f.hidden = !view.fault; f.textContent = view.fault ? `fault: ${view.fault}` : "";
    },
    motion() {
      const m = view.motion;
      $("motion").textContent = m && m.kind !== "hold" ? `${m.kind}${m.held ? " (held)" : ""}` : "";
    },
    override() {
      if (view.override === undefined || document.activeElement === $("override")) return;
      $("override").value = Math.round(view.override * 100);
      $("override-value").textContent = `${Math.round(view.override * 100)} %`;
    },
    joint() { renderJoints(); samplePlot(); },
    torque() { renderJoints(); },
    task() { renderTask(); toolpath.setTool(view.task && view.task.reference); },
    programs() { renderPrograms(); },
    program() { renderProgress(); highlight(); followProgram(); },
    program_text() { if (view.program_text) showProgram(view.program_text, false); },
    planning() { renderProgress(); },
    plan_result() { renderProgress(); },
    events() { renderEvents(); },
    alarms() { renderEvents(); },
  };

  function render(keys) {
    const order = ["link", "info", ...Object.keys(RENDER)];
    const want = new Set(keys);
    for (const k of new Set(order)) if (want.has(k) && RENDER[k]) RENDER[k]();
  }

  function buildAxes() {
    const info = view.info;
    if (!info) return;
    $("machine").textContent = `${info.machine} · ${info.rate_hz} Hz`;
    const joints = $("joints").tBodies[0];
    joints.replaceChildren(...info.axes.map((a, i) => {
      const tr = document.createElement("tr");
      tr.append(cell(`${a} (${info.units[i]})`), cell("—"), cell("—"), cell("—"), cell("—"));
      return tr;
    }));
    const jj = $("jog-joint").tBodies[0];
    jj.replaceChildren(...info.axes.map((a, i) => jogRow(a, {axis: i}, (d) => ({axis: i, step: d * Number($("joint-step").value)}),
      (d) => ({axis: i, velocity: d * Number($("jog-speed").value) * (view.homed ? info.jog_cap[i] : info.unhomed_cap[i])}))));
    plot.labels = info.axes;
    buildMoveInputs();
  }

  function taskCoordinates() { return view.task ? view.task.coordinates : null; }

  function buildTaskJog() {
    const coords = taskCoordinates() || [];
    const tj = $("jog-task").tBodies[0];
    if (tj.dataset.coords === coords.join(",")) return;
    tj.dataset.coords = coords.join(",");
    const unit = (k) => coords.map((_, j) => (j === k ? 1 : 0));
    tj.replaceChildren(...coords.map((c, k) => jogRow(`tool ${c}`, {space: "task"},
      (d) => ({space: "task", step: unit(k).map((u) => u * d * Number($("task-step").value))}),
      (d) => ({space: "task", direction: unit(k).map((u) => u * d), speed: Number($("task-speed").value)}))));
  }

  function jogRow(name, base, step, continuous) {
    const tr = document.createElement("tr");
    const td = (...els) => { const x = document.createElement("td"); x.append(...els); return x; };
    const button = (text, cls) => { const b = document.createElement("button"); b.type = "button"; b.textContent = text; b.className = cls; return b; };
    const minus = button("−", "jog-minus"), plus = button("+", "jog-plus");
    const sminus = button("step −", "step-minus"), splus = button("step +", "step-plus");
    holdToJog(minus, () => continuous(-1));
    holdToJog(plus, () => continuous(1));
    sminus.addEventListener("click", () => send("jog", step(-1)));
    splus.addEventListener("click", () => send("jog", step(1)));
    tr.append(td(name), td(minus, plus), td(sminus, splus));
    tr.dataset.axis = name;
    return tr;
  }

  function holdToJog(el, args) {
    el.addEventListener("pointerdown", (e) => {
      if (e.button !== 0) return;
      e.preventDefault();
      el.setPointerCapture(e.pointerId);
      startJog(el, args());
    });
    for (const ev of ["pointerup", "pointercancel", "lostpointercapture"]) el.addEventListener(ev, () => { if (jog && jog.el === el) endJog(true); });
  }

  function startJog(el, args) {
    endJog(true);
    if (send("jog", args) === null) return;
    el.classList.add("held");
    jog = {el, timer: setInterval(() => send("alive"), 100)};
  }

  function endJog(release) {
    if (!jog) return;
    clearInterval(jog.timer);
    jog.el.classList.remove("held");
    jog = null;
    if (release) send("release");
  }

  function renderJoints() {
    const j = view.joint, rows = $("joints").tBodies[0].rows;
    if (!j) return;
    for (let i = 0; i < rows.length; i++) {
      const c = rows[i].cells;
      c[1].textContent = fmt(j.reference[i]);
      c[2].textContent = fmt(j.position[i]);
      c[3].textContent = j.error[i] === null ? "—" : Number(j.error[i]).toExponential(2);
      c[4].textContent = view.torque ? fmt(view.torque[i], 3) : "—";
    }
  }

  function renderTask() {
    const t = view.task, table = $("task"), note = $("task-note");
    table.hidden = !t;
    if (!t) return;
    const body = table.tBodies[0];
    if (body.rows.length !== t.coordinates.length) {
      body.replaceChildren(...t.coordinates.map((c) => { const tr = document.createElement("tr"); tr.append(cell(c), cell("—"), cell("—"), cell("—")); return tr; }));
      buildTaskJog();
      buildMoveInputs();
    }
    note.hidden = t.reference !== null;
    note.textContent = t.reference === null ? "the tool's position is not known here (the model does not assemble)" : "";
    for (let k = 0; k < t.coordinates.length; k++) {
      const c = body.rows[k].cells;
      c[1].textContent = t.reference ? fmt(t.reference[k]) : "—";
      c[2].textContent = t.position ? fmt(t.position[k]) : "—";
      c[3].textContent = t.error ? Number(t.error[k]).toExponential(2) : "—";
    }
  }

  function samplePlot() {
    if (view.joint) plot.push(performance.now() / 1000, {error: view.joint.error, torque: view.torque || []});
  }

  function buildMoveInputs() {
    const space = $("move-space").value, info = view.info;
    if (!info) return;
    const names = space === "task" ? taskCoordinates() || [] : info.axes;
    const box = $("move-inputs");
    if (box.dataset.names === `${space}:${names.join(",")}`) return;
    box.dataset.names = `${space}:${names.join(",")}`;
    box.replaceChildren(...names.map((n, i) => {
      const inp = document.createElement("input");
      inp.type = "number"; inp.step = "any"; inp.id = `move-${i}`; inp.setAttribute("aria-label", n); inp.placeholder = n;
      const src = space === "task" ? view.task && view.task.reference : view.joint && view.joint.reference;
      if (src && src[i] !== null) inp.value = Number(src[i]).toFixed(6);
      return inp;
    }));
  }

  function renderPrograms() {
    const sel = $("programs"), keep = sel.value, names = view.programs || [];
    if (sel.dataset.names === names.join("\n")) return;
    sel.dataset.names = names.join("\n");
    sel.replaceChildren(...names.map((n) => { const o = document.createElement("option"); o.value = n; o.textContent = n; return o; }));
    if (names.includes(keep)) sel.value = keep;
  }

  function showProgram(text, preview) {
    const code = $("code");
    const file = text ? text.file : null;
    if (!preview && shown === file && code.childElementCount) { highlight(); return; }
    shown = file;
    code.replaceChildren(...((text && text.lines) || []).map((line) => { const li = document.createElement("li"); li.textContent = line || " "; return li; }));
    code.dataset.file = text ? text.name : "";
    highlight();
  }

  function highlight() {
    const code = $("code"), p = view.program;
    const old = code.querySelector("li.current");
    const line = p && shown === p.file ? p.line : null;
    const li = line ? code.children[line - 1] : null;
    if (old && old !== li) old.classList.remove("current");
    if (li && !li.classList.contains("current")) { li.classList.add("current"); li.scrollIntoView({block: "nearest"}); }
    code.dataset.line = line || "";
  }

  // -- the tool path ------------------------------------------------------------------------
  function askPreview(name) {
    if (!name || name === previewAsked) return;
    previewAsked = name;
    toolpath.set(null);
    toolpath.setNote(`checking ${name} ...`);
    send("preview", {name});
  }

  function onPreview(m) {
    const name = m.reply && m.reply.file ? m.reply.file.split("/").pop() : previewAsked;
    if (name !== previewAsked) return;  // an answer to an earlier question
    if (!m.ok) { toolpath.set(null); toolpath.setNote(`not runnable: ${m.error}`); return; }
    toolpath.set(m.reply.preview, name);
    toolpath.setNote(m.reply.preview ? "" : `${name}: no tool path (not a G-code program)`);
    followProgram();
  }

  function followProgram() {
    /* the running G-code program's path (if it is one of the listed programs), its current line */
    const p = view.program, name = p && p.file ? p.file.split("/").pop() : null;
    if (p && p.kind === "gcode" && (view.programs || []).includes(name) && p.progress < 1) askPreview(name);
    const ours = p && name === previewAsked;
    toolpath.setProgress(ours && p.line ? p.line : null, !!(ours && p.progress >= 1));
  }

  function renderProgress() {
    const p = view.program, st = $("program-status");
    $("progress").value = p ? p.progress : 0;
    $("progress-text").textContent = p ? `${(p.progress * 100).toFixed(1)} %` : "";
    if (view.planning) st.textContent = `planning ${view.planning.file} (job ${view.planning.job})`;
    else if (view.plan_result && !view.plan_result.ok) st.textContent = `not started: ${view.plan_result.error}`;
    else st.textContent = p ? `${p.file.split("/").pop()} (${p.kind})${p.line ? `, line ${p.line}` : ""}` : "no program run yet";
  }

  function renderEvents() {
    const events = view.events || [], acked = view.alarms ? view.alarms.acked : 0;
    const body = $("event-list").tBodies[0];
    body.replaceChildren(...events.slice().reverse().map((e) => {
      const tr = document.createElement("tr");
      const t = new Date(e.time * 1000);
      tr.append(cell(`${t.toLocaleTimeString([], {hour12: false})}.${String(t.getMilliseconds()).padStart(3, "0")}`), cell(e.kind), cell(e.text));
      tr.dataset.seq = e.seq;
      if (e.kind === "fault") tr.classList.add("alarm");
      if (e.kind === "fault" && e.seq > acked) tr.classList.add("unacked");
      return tr;
    }));
    $("ack").disabled = !(view.alarms && view.alarms.unacked_alarm);
  }

  // -- the emergency stop -------------------------------------------------------------------
  function estop() {
    const t = now();
    if (t - lastEstop < 5) return;  // one press (pointerdown, then its click)
    lastEstop = t;
    $("estop").dataset.pressedAt = t.toFixed(1);
    endJog(false);
    if (send("estop") !== null) return;
    fetch("/estop", {method: "POST"}).then((r) => r.json()).then((r) => onReply({cmd: "estop", ok: r.ok, error: r.error, reply: r}))
      .catch((e) => say(`estop: not delivered: ${e}`, true));
  }
  $("estop").addEventListener("pointerdown", (e) => { if (e.button === 0) estop(); });
  $("estop").addEventListener("click", () => { if (now() - lastEstop > 500) estop(); });  // keyboard

  // -- controls -----------------------------------------------------------------------------
  for (const cmd of ["enable", "disable", "home", "stop", "reset", "hold", "resume"]) $(cmd).addEventListener("click", () => send(cmd));
  $("ack").addEventListener("click", () => { if (view.alarms) send("ack", {seq: view.alarms.last}); });
  $("run").addEventListener("click", () => send("run", {program: $("programs").value}));
  $("programs").addEventListener("change", () => { send("read", {name: $("programs").value}); askPreview($("programs").value); });
  $("toolpath-view").addEventListener("change", () => toolpath.setView($("toolpath-view").value));
  $("move-space").addEventListener("change", buildMoveInputs);
  $("move-go").addEventListener("click", () => {
    const inputs = [...$("move-inputs").querySelectorAll("input")];
    const target = inputs.map((i) => Number(i.value));
    if (!inputs.length || inputs.some((i) => i.value.trim() === "") || target.some((x) => !Number.isFinite(x))) {
      say("move: every coordinate needs a number", true);
      return;
    }
    send("move", {space: $("move-space").value, target});
  });
  const ov = $("override");
  const sendOverride = () => {
    if (Number(ov.value) === overrideValue) return;  // the slider's change after its last input
    overrideSent = now();
    overrideValue = Number(ov.value);
    send("override", {value: overrideValue / 100});
  };
  ov.addEventListener("input", () => {
    $("override-value").textContent = `${ov.value} %`;
    if (now() - overrideSent > 100) sendOverride();
  });
  ov.addEventListener("change", () => { sendOverride(); ov.blur(); });

  // leaving the page, or the window losing focus, ends a held jog
  window.addEventListener("blur", () => endJog(true));
  window.addEventListener("pagehide", () => endJog(true));
  document.addEventListener("visibilitychange", () => { if (document.hidden) endJog(true); });

  setInterval(() => plot.draw(), 250);
  setInterval(() => toolpath.draw(), 100);
  window.pkrtPanel = {view, send, stats, toolpath};
  connect();
})();
