// berth console: live updates through server-sent events (rows and the project page swap in
// the HTML the server rendered; nothing is polled, nothing reloads) and sorting in place.
// The pages work without it: the forms post, the column headings sort on the server.
"use strict";

(function () {
  function sortKey(row, key) {
    var v = row.dataset[key] || "";
    if (v !== "" && !isNaN(Number(v))) return Number(v);
    return v.toLowerCase();
  }

  function sortRows(table) {
    var key = table.dataset.sort || "name";
    var desc = table.dataset.dir === "desc";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = sortKey(a, key), y = sortKey(b, key);
      var order = x < y ? -1 : x > y ? 1 : 0;
      if (desc) order = -order;
      if (order === 0) order = a.dataset.name < b.dataset.name ? -1 : 1;
      return order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }

  function status(text) {
    var live = document.getElementById("live-status");
    if (live) live.textContent = text;
  }

  function fleet(table) {
    table.querySelectorAll("a.sort").forEach(function (link) {
      link.addEventListener("click", function (e) {
        e.preventDefault();
        var key = link.dataset.key;
        var dir = table.dataset.sort === key && table.dataset.dir !== "desc" ? "desc" : "asc";
        table.dataset.sort = key;
        table.dataset.dir = dir;
        table.querySelectorAll("thead th").forEach(function (th) { th.setAttribute("aria-sort", "none"); });
        link.parentNode.setAttribute("aria-sort", dir === "desc" ? "descending" : "ascending");
        sortRows(table);
        var url = new URL(window.location.href);
        url.searchParams.set("sort", key);
        url.searchParams.set("dir", dir);
        history.replaceState(null, "", url);
      });
    });
    var source = new EventSource("/ui/events" + window.location.search);
    source.onopen = function () { document.body.dataset.live = "connected"; };
    source.onerror = function () { document.body.dataset.live = "reconnecting"; };
    source.addEventListener("row", function (e) {
      var data = JSON.parse(e.data);
      var holder = document.createElement("tbody");
      holder.innerHTML = data.html;
      var row = holder.firstElementChild;
      var old = document.getElementById("p-" + data.uid);
      if (old) {
        if (old.outerHTML === row.outerHTML) return;
        old.replaceWith(row);
      } else {
        table.tBodies[0].appendChild(row);
      }
      var empty = document.getElementById("empty");
      if (empty) empty.remove();
      sortRows(table);
      status("Updated " + data.name + " at " + new Date().toLocaleTimeString());
    });
    source.addEventListener("gone", function (e) {
      var old = document.getElementById("p-" + JSON.parse(e.data).uid);
      if (old) old.remove();
    });
  }

  function project(live) {
    var name = live.dataset.name;
    var url = "/ui/projects/" + encodeURIComponent(name) + "/events?offset=" + encodeURIComponent(live.dataset.offset || "0");
    var source = new EventSource(url);
    source.onopen = function () { document.body.dataset.live = "connected"; };
    source.onerror = function () { document.body.dataset.live = "reconnecting"; };
    source.addEventListener("summary", function (e) {
      var data = JSON.parse(e.data);
      live.innerHTML = data.html;
      var answer = document.getElementById("answer");
      if (answer) answer.hidden = !data.blocked;
    });
    source.addEventListener("log", function (e) {
      var log = document.getElementById("log");
      if (!log) return;
      log.hidden = false;
      var atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.textContent = (log.textContent + JSON.parse(e.data).text).slice(-262144);
      if (atEnd) log.scrollTop = log.scrollHeight;
    });
    source.addEventListener("gone", function () {
      source.close();
      live.insertAdjacentHTML("afterbegin", "<p class=\"error\" role=\"alert\">This project is gone.</p>");
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var table = document.getElementById("fleet");
    if (table) fleet(table);
    var live = document.getElementById("project-live");
    if (live) project(live);
  });
})();
