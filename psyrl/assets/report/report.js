"use strict";
(function () {
  const byId = (id) => document.getElementById(id);
  const parse = (id) => { const el = byId(id); return el ? JSON.parse(el.textContent) : null; };
  const fmt = (v, d) => (typeof v === "number" ? v.toFixed(d) : "-");
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // ------------------------------------------------------------ curves: a cursor and a readout
  const curves = parse("curve-data") || {};
  document.querySelectorAll("svg.panel").forEach((svg) => {
    const lines = curves[svg.dataset.metric] || [];
    const [x0, x1] = [+svg.dataset.x0, +svg.dataset.x1];
    const [left, width] = [+svg.dataset.left, +svg.dataset.width];
    const cursor = svg.querySelector(".cursor");
    const readout = svg.parentNode.querySelector(".readout");
    svg.addEventListener("mousemove", (event) => {
      const pt = svg.createSVGPoint();
      pt.x = event.clientX; pt.y = event.clientY;
      const p = pt.matrixTransform(svg.getScreenCTM().inverse());
      const step = x0 + ((p.x - left) / width) * (x1 - x0);
      readout.textContent = "";
      let shown = null;
      lines.forEach((line) => {
        let best = 0;  // the logged step nearest the mouse
        line.steps.forEach((s, i) => {
          if (Math.abs(s - step) < Math.abs(line.steps[best] - step)) best = i;
        });
        const at = line.steps[best];  // the cursor goes to the nearest step any run logged
        if (shown === null || Math.abs(at - step) < Math.abs(shown - step)) shown = at;
        const span = el("span", "", line.label + " " + fmt(line.values[best], 4) +
          (line.mean ? " (mean " + fmt(line.mean[best], 4) + ")" : "") +
          " @ " + line.steps[best]);
        span.style.color = line.color;
        readout.appendChild(span);
      });
      const x = left + ((shown - x0) / (x1 - x0)) * width;
      cursor.setAttribute("x1", x); cursor.setAttribute("x2", x);
      cursor.style.visibility = "visible";
    });
    svg.addEventListener("mouseleave", () => { cursor.style.visibility = "hidden"; });
  });

  // ------------------------------------------------------------ the rollout browser
  const meta = parse("rollout-meta");
  if (!meta) return;
  const FILTERS = ["min_reward", "max_reward", "min_f1", "max_f1", "format", "finish", "q"];
  const state = { run: 0, step: null };
  const cache = {};
  const samples = (k, step) => {
    const key = k + "-" + step;  // each step's JSON is parsed once, when first shown
    if (!(key in cache)) cache[key] = parse("samples-" + key) || [];
    return cache[key];
  };
  const promptsOf = (k) => {
    if (!(("p" + k) in cache)) cache["p" + k] = parse("prompts-" + k) || {};
    return cache["p" + k];
  };

  function readUrl() {
    const params = new URLSearchParams(location.search);
    new URLSearchParams(location.hash.slice(1)).forEach((v, k) => params.set(k, v));
    const run = meta.findIndex((r) => r.label === params.get("run"));
    state.run = run >= 0 ? run : 0;
    const step = parseInt(params.get("step"), 10);
    const steps = meta[state.run].steps;
    state.step = steps.includes(step) ? step : steps[steps.length - 1];
    FILTERS.forEach((f) => { state[f] = params.get(f) || ""; });
  }

  function writeUrl() {
    const params = new URLSearchParams();
    if (meta.length > 1) params.set("run", meta[state.run].label);
    params.set("step", state.step);
    FILTERS.forEach((f) => { if (state[f] !== "") params.set(f, state[f]); });
    // a shareable link to this view; some browsers refuse it on a file:// page
    try { history.replaceState(null, "", "#" + params.toString()); } catch (e) { /* keep going */ }
  }

  function fillControls() {
    const run = meta[state.run];
    const runSelect = byId("r-run");
    runSelect.textContent = "";
    meta.forEach((r, k) => runSelect.appendChild(new Option(r.label, k, false, k === state.run)));
    byId("r-run-label").style.display = meta.length > 1 ? "" : "none";
    const stepSelect = byId("r-step");
    stepSelect.textContent = "";
    run.steps.forEach((s) => stepSelect.appendChild(new Option(s, s, false, s === state.step)));
    const finish = byId("r-finish");
    finish.textContent = "";
    finish.appendChild(new Option("any", ""));
    const reasons = run.finish.slice();
    if (state.finish && !reasons.includes(state.finish)) reasons.push(state.finish);
    reasons.forEach((f) => finish.appendChild(new Option(f, f)));
    FILTERS.forEach((f) => { byId("r-" + f).value = state[f]; });
    const more = run.available > run.steps.length ?
      " (" + run.steps.length + " of its " + run.available + " sample steps embedded)" : "";
    byId("r-note").textContent = run.note + more;
  }

  function passes(row, prompt) {
    const num = (v) => (v === "" ? null : Number(v));
    const inRange = (v, lo, hi) => (lo === null || v >= lo) && (hi === null || v <= hi);
    if ("final" in row && !inRange(row.final, num(state.min_reward), num(state.max_reward))) {
      return false;
    }
    if ("f1" in row && !inRange(row.f1, num(state.min_f1), num(state.max_f1))) return false;
    if (state.format === "ok" && !(row.fmt >= 1)) return false;
    if (state.format === "bad" && !(row.fmt < 1)) return false;
    if (state.finish && String(row.finish_reason) !== state.finish) return false;
    if (state.q) {
      const q = state.q.toLowerCase();
      const texts = [row.response, row.id];
      if (prompt) texts.push(prompt.story, prompt.question, prompt.answer);
      if (!texts.some((t) => String(t).toLowerCase().includes(q))) return false;
    }
    return true;
  }

  function highlighted(text, q) {
    const pre = el("pre", "response");
    if (!q) { pre.textContent = text; return pre; }
    const lower = text.toLowerCase(), needle = q.toLowerCase();
    let at = 0;
    for (let i = lower.indexOf(needle); i >= 0; i = lower.indexOf(needle, at)) {
      pre.appendChild(document.createTextNode(text.slice(at, i)));
      pre.appendChild(el("mark", "", text.slice(i, i + needle.length)));
      at = i + needle.length;
    }
    pre.appendChild(document.createTextNode(text.slice(at)));
    return pre;
  }

  function promptCard(row, prompt, group) {
    const card = el("div", "prompt");
    card.appendChild(el("div", "id", row.id));
    if (!prompt) {
      card.appendChild(el("p", "empty", "story unknown (see the note above)"));
    } else {
      card.appendChild(el("p", "story", prompt.story));
      card.appendChild(el("p", "question", "Q: " + prompt.question));
      const gold = el("p", "gold", "gold answer: ");
      gold.appendChild(el("b", "", prompt.answer));
      card.appendChild(gold);
      if (prompt.options) {
        const list = el("ol", "options");
        prompt.options.forEach((o) => list.appendChild(el("li", "", o)));
        card.appendChild(list);
      }
    }
    const finals = group.map((r) => r.final).filter((v) => typeof v === "number");
    const mean = finals.reduce((a, b) => a + b, 0) / (finals.length || 1);
    card.appendChild(el("div", "stats", group.length + " samples, mean final reward " +
      fmt(mean, 3)));
    return card;
  }

  function sampleCard(row, columns) {
    const card = el("div", "sample");
    const chips = el("div", "chips");
    chips.appendChild(el("span", "chip", "#" + row.sample));
    columns.forEach(([key, name]) => {
      if (key in row) chips.appendChild(el("span", "chip " + key, name + " " + fmt(row[key], 3)));
    });
    const adv = row.advantage;
    chips.appendChild(el("span", "chip " + (adv > 0 ? "pos" : adv < 0 ? "neg" : ""),
      "advantage " + (adv > 0 ? "+" : "") + fmt(adv, 3)));
    chips.appendChild(el("span", "chip", row.tokens + " tokens"));
    chips.appendChild(el("span", "chip " + (row.finish_reason === "length" ? "length" : ""),
      "finish " + row.finish_reason));
    card.appendChild(chips);
    card.appendChild(highlighted(String(row.response), state.q));
    return card;
  }

  function render() {
    const run = meta[state.run];
    const rows = samples(state.run, state.step);
    const prompts = promptsOf(state.run);
    const groups = [];  // a prompt's G samples are consecutive, sample 0 first
    rows.forEach((row) => {
      const last = groups[groups.length - 1];
      if (!last || row.sample === 0 || row.id !== last[0].id) groups.push([row]);
      else last.push(row);
    });
    const out = document.createDocumentFragment();
    let shown = 0, shownGroups = 0;
    groups.forEach((group) => {
      const prompt = prompts[group[0].id];
      const kept = group.filter((row) => passes(row, prompt));
      if (!kept.length) return;
      shown += kept.length; shownGroups += 1;
      const box = el("article", "group");
      box.appendChild(promptCard(group[0], prompt, group));
      const list = el("div", "responses");
      kept.forEach((row) => list.appendChild(sampleCard(row, run.columns)));
      box.appendChild(list);
      out.appendChild(box);
    });
    const target = byId("r-rows");
    target.textContent = "";
    target.appendChild(out);
    byId("r-count").textContent = "step " + state.step + ": " + shown + " of " + rows.length +
      " samples shown (" + shownGroups + " of " + groups.length + " prompts).";
    byId("r-rows").dataset.shown = shown;
  }

  function update() { writeUrl(); render(); }

  readUrl();
  fillControls();
  render();
  byId("r-run").addEventListener("change", (e) => {
    state.run = +e.target.value;
    const steps = meta[state.run].steps;
    state.step = steps[steps.length - 1];
    fillControls(); update();
  });
  byId("r-step").addEventListener("change", (e) => { state.step = +e.target.value; update(); });
  const move = (by) => {
    const steps = meta[state.run].steps;
    const i = Math.min(steps.length - 1, Math.max(0, steps.indexOf(state.step) + by));
    state.step = steps[i]; byId("r-step").value = state.step; update();
  };
  byId("r-prev").addEventListener("click", () => move(-1));
  byId("r-next").addEventListener("click", () => move(1));
  FILTERS.forEach((f) => byId("r-" + f).addEventListener("input", (e) => {
    state[f] = e.target.value; update();
  }));
  byId("r-reset").addEventListener("click", () => {
    FILTERS.forEach((f) => { state[f] = ""; });
    fillControls(); update();
  });
  // a filter link (#step=...) applies; the section links of the page (#sec-...) do not
  window.addEventListener("hashchange", () => {
    if (location.hash.includes("=")) { readUrl(); fillControls(); render(); }
  });
})();
