// LM Warden routing card and stats page. No dependencies; every number
// arrives already humanised from the server as {v: raw, t: text}.
"use strict";
(function () {
  var body = document.body;
  var page = body.dataset.page;
  var model = body.dataset.model;
  var base = body.dataset.base || "./";
  var every = Number(body.dataset.refresh) || 2000;
  var live = document.getElementById("live");
  var replica = "";
  var busy = false;

  function url(path) { return new URL(base + path, location.href).toString(); }
  function enc(s) { return encodeURIComponent(s); }
  function $(id) { return document.getElementById(id); }

  function getJSON(path) {
    return fetch(url(path), { credentials: "same-origin", cache: "no-store" }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (j) {
        if (!r.ok) { throw new Error(j.error || r.status + " " + r.statusText); }
        return j;
      });
    });
  }

  // set writes text and the raw value only when they changed, so the DOM
  // does not churn and nothing flickers.
  function set(el, val) {
    if (!el || !val) { return; }
    var raw = typeof val.v === "object" && val.v !== null ? JSON.stringify(val.v) : String(val.v);
    if (el.textContent !== val.t) { el.textContent = val.t; }
    if (el.getAttribute("data-v") !== raw) { el.setAttribute("data-v", raw); }
    var tip = val.h || "";
    if ((el.getAttribute("title") || "") !== tip) {
      if (tip) { el.setAttribute("title", tip); } else { el.removeAttribute("title"); }
    }
  }

  function setClass(el, name, on) {
    if (el.classList.contains(name) !== on) { el.classList.toggle(name, on); }
  }

  // syncRows keeps one <tr> per key in tbody, in the given order, creating
  // and removing rows only when the set of keys changes.
  function syncRows(tbody, items, keyOf, make) {
    var have = {};
    Array.prototype.forEach.call(tbody.rows, function (tr) { have[tr.dataset.key] = tr; });
    items.forEach(function (it, i) {
      var k = keyOf(it);
      var tr = have[k];
      if (!tr) { tr = make(it); tr.dataset.key = k; }
      delete have[k];
      if (tbody.rows[i] !== tr) { tbody.insertBefore(tr, tbody.rows[i] || null); }
    });
    Object.keys(have).forEach(function (k) { tbody.removeChild(have[k]); });
  }

  // row makes a table row of one cell per column key; labels, when given,
  // go into data-label (the narrow layout shows them beside the values).
  function row(cols, first, labels) {
    var tr = document.createElement("tr");
    cols.forEach(function (c, i) {
      var td = document.createElement(i === 0 ? "th" : "td");
      if (i === 0) { td.scope = "row"; if (first) { td.appendChild(first); } }
      td.dataset.col = c;
      if (labels && labels[i]) { td.dataset.label = labels[i]; }
      tr.appendChild(td);
    });
    return tr;
  }

  function status(ok, text) {
    setClass(live, "bad", !ok);
    if (live.textContent !== text) { live.textContent = text; }
  }

  function stamp() {
    var d = new Date();
    return "live · " + d.toLocaleTimeString();
  }

  // Models page.
  var modelCols = ["model", "affinity", "spill", "sticky", "in_flight", "replicas", "bindings", "share"];

  function renderModels(view) {
    var tbody = $("models").tBodies[0];
    syncRows(tbody, view.models || [], function (m) { return m.model; }, function (m) {
      var a = document.createElement("a");
      a.href = url(m.href);
      a.textContent = m.model;
      return row(modelCols, a);
    });
    (view.models || []).forEach(function (m, i) {
      var tr = tbody.rows[i];
      modelCols.slice(1).forEach(function (c) { set(tr.querySelector('[data-col="' + c + '"]'), m.cells[c]); });
    });
    $("empty").hidden = (view.models || []).length > 0;
  }

  // Card page. The replica table's columns come with the view (one list
  // in Go): a group heading row, then a heading per column.
  var replicaCols = [];
  var replicaLabels = [];
  var writable = false;
  var affinityOn = null;

  function heading(table, columns) {
    var keys = ["id"].concat(columns.map(function (c) { return c.key; }));
    if (keys.join(",") === replicaCols.join(",")) { return false; }
    replicaCols = keys;
    replicaLabels = ["Replica"].concat(columns.map(function (c) { return c.label; }));
    var thead = table.tHead;
    while (thead.rows.length) { thead.deleteRow(0); }
    var groups = thead.insertRow(), names = thead.insertRow();
    groups.className = "groups";
    var first = document.createElement("th");
    first.scope = "col";
    first.rowSpan = 2;
    first.textContent = "Replica";
    groups.appendChild(first);
    columns.forEach(function (c, i) {
      if (i === 0 || columns[i - 1].group !== c.group) {
        var g = document.createElement("th");
        g.scope = "colgroup";
        g.colSpan = columns.filter(function (d) { return d.group === c.group; }).length;
        g.textContent = c.group;
        g.dataset.group = c.group;
        groups.appendChild(g);
      }
      var th = document.createElement("th");
      th.scope = "col";
      th.textContent = c.label;
      th.dataset.col = c.key;
      if (c.title) { th.title = c.title; }
      names.appendChild(th);
    });
    return true;
  }

  function renderCard(view) {
    Object.keys(view.head).forEach(function (k) { set($("h-" + k), view.head[k]); });
    // a figure the view leaves out (the store, without one) hides its line
    document.querySelectorAll(".head dd").forEach(function (dd) {
      var hide = !(dd.id.slice(2) in view.head);
      if (dd.parentNode.hidden !== hide) { dd.parentNode.hidden = hide; }
    });
    set($("since"), view.since);
    var warn = $("warning");
    if (warn.textContent !== (view.warning || "")) { warn.textContent = view.warning || ""; }
    warn.hidden = !view.warning;
    affinityOn = view.head.affinity.v;
    setClass($("h-affinity"), "off", !affinityOn);
    writable = !!view.writable;
    $("actions").hidden = !writable;
    var btn = $("toggle-affinity");
    var label = affinityOn ? "Turn affinity off" : "Turn affinity on";
    if (btn.textContent !== label) { btn.textContent = label; }

    var tbody = $("replicas").tBodies[0];
    if (heading($("replicas"), view.columns || [])) {
      while (tbody.rows.length) { tbody.deleteRow(0); }
    }
    syncRows(tbody, view.replicas, function (r) { return r.id; }, function (r) {
      var s = document.createElement("span");
      s.textContent = r.id;
      return row(replicaCols, s, replicaLabels);
    });
    view.replicas.forEach(function (r, i) {
      var tr = tbody.rows[i];
      setClass(tr, "down", !r.ok);
      replicaCols.slice(1).forEach(function (c) { set(tr.querySelector('[data-col="' + c + '"]'), r.cells[c]); });
    });

    var pick = $("replica-pick");
    var ids = view.replicas.map(function (r) { return r.id; });
    var opts = Array.prototype.slice.call(pick.options, 1).map(function (o) { return o.value; });
    if (opts.join("\n") !== ids.join("\n")) {
      while (pick.options.length > 1) { pick.remove(1); }
      ids.forEach(function (id) { pick.add(new Option(id, id)); });
      pick.value = ids.indexOf(replica) >= 0 ? replica : "";
    }
  }

  // area returns an SVG path filling between the lower and upper series.
  function area(lower, upper, w, h, top) {
    var n = upper.length;
    if (n === 0 || top <= 0) { return ""; }
    var dx = n > 1 ? w / (n - 1) : w;
    function y(v) { return (h - Math.min(v, top) / top * h).toFixed(1); }
    var d = "M0 " + y(lower[0]);
    for (var i = 0; i < n; i++) { d += "L" + (i * dx).toFixed(1) + " " + y(upper[i]); }
    for (var j = n - 1; j >= 0; j--) { d += "L" + (j * dx).toFixed(1) + " " + y(lower[j]); }
    return d + "Z";
  }

  // line returns an SVG path through the 0–1 values, broken where a value
  // is null (no sticky turn checked in that minute).
  function line(vals, w, h) {
    var n = vals.length, d = "", pen = false;
    var dx = n > 1 ? w / (n - 1) : w;
    for (var i = 0; i < n; i++) {
      if (vals[i] === null) { pen = false; continue; }
      var y = (h - Math.min(Math.max(vals[i], 0), 1) * h).toFixed(1);
      d += (pen ? "L" : "M") + (i * dx).toFixed(1) + " " + y;
      if (!pen && (i + 1 >= n || vals[i + 1] === null)) { d += "h2"; } // a lone minute shows as a dash
      pen = true;
    }
    return d;
  }

  function setPath(el, d) { if (el.getAttribute("d") !== d) { el.setAttribute("d", d); } }

  function renderStats(view) {
    var zero = view.cached.map(function () { return 0; });
    var prompt = view.cached.map(function (c, i) { return c + view.computed[i]; });
    var pTop = view.prompt_max.v, gTop = view.gen_max.v;
    setPath($("p-cached"), area(zero, view.cached, 720, 180, pTop));
    setPath($("p-computed"), area(view.cached, prompt, 720, 180, pTop));
    setPath($("p-generated"), area(zero, view.generated, 720, 70, gTop));
    set($("prompt-max"), view.prompt_max);
    set($("gen-max"), view.gen_max);
    set($("share"), view.share);
    var delivered = view.delivered || [];
    setPath($("p-delivered"), line(delivered, 720, 70));
    set($("delivered-share"), view.delivered_share);
    $("delivered-chart").setAttribute("data-points", String(delivered.length));
    setClass($("delivered-chart"), "empty", !delivered.some(function (v) { return v !== null; }));
    ["cached", "computed", "generated"].forEach(function (k) { set($("t-" + k), view.totals[k]); });
    $("prompt-chart").setAttribute("data-points", String(view.cached.length));
    setClass($("prompt-chart"), "empty", !view.has_data);
  }

  function tick() {
    if (busy) { return; }
    busy = true;
    var work;
    if (page === "card") {
      var m = enc(model);
      work = Promise.all([
        getJSON(m + "/view.json").then(renderCard),
        getJSON(m + "/stats.json" + (replica ? "?replica=" + enc(replica) : "")).then(renderStats)
      ]);
    } else {
      work = getJSON("-/models.json").then(renderModels);
    }
    work.then(function () {
      status(true, stamp());
      var n = Number(body.getAttribute("data-rendered") || 0) + 1;
      if (n === 1 && window.performance && performance.mark) { performance.mark("lmw-first-render"); }
      body.setAttribute("data-rendered", String(n));
    }, function (err) {
      status(false, "not updating: " + err.message);
    }).then(function () {
      busy = false;
      setTimeout(tick, every);
    });
  }

  function say(text, ok) {
    var el = $("action-msg");
    el.textContent = text;
    setClass(el, "bad", !ok);
  }

  function send(method, path, payload) {
    var init = { method: method, credentials: "same-origin", headers: {} };
    if (payload !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    return fetch(url("../models/" + path), init).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (j) {
        if (!r.ok) { throw new Error(j.error || r.status + " " + r.statusText); }
        return j;
      });
    });
  }

  if (page === "card") {
    $("toggle-affinity").addEventListener("click", function () {
      if (!writable || affinityOn === null) { return; }
      var want = !affinityOn;
      send("PUT", enc(model) + "/affinity", { affinity: want }).then(function () {
        say("affinity is now " + (want ? "on" : "off"), true);
      }, function (err) { say("could not change affinity: " + err.message, false); });
    });
    $("unpin").addEventListener("submit", function (ev) {
      ev.preventDefault();
      var key = $("unpin-key").value.trim();
      if (!writable || !key) { return; }
      send("DELETE", enc(model) + "/sessions/" + enc(key)).then(function () {
        say("unpinned " + key + ": its next turn is placed afresh", true);
        $("unpin-key").value = "";
      }, function (err) { say("could not unpin " + key + ": " + err.message, false); });
    });
    $("replica-pick").addEventListener("change", function (ev) {
      replica = ev.target.value;
      var m = enc(model);
      getJSON(m + "/stats.json" + (replica ? "?replica=" + enc(replica) : "")).then(renderStats, function (err) {
        status(false, "not updating: " + err.message);
      });
    });
  }
  tick();
})();
