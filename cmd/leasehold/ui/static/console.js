// The audit stream page: entries pushed by the console as server-sent
// events (/events), each shown as a table row. Every value from etcd goes
// into the page as text (textContent, URL-encoded links), never as markup.
(function () {
  "use strict";
  var body = document.querySelector("#stream tbody");
  var status = document.getElementById("stream-status");
  var count = document.getElementById("stream-count");
  var keep = 1000, n = 0;

  function cell(tr, text, href) {
    var td = document.createElement("td");
    if (href) {
      var a = document.createElement("a");
      a.href = href;
      a.textContent = text;
      td.appendChild(a);
    } else {
      td.textContent = text;
    }
    tr.appendChild(td);
  }

  function detail(e) {
    var parts = [];
    if (e.status) parts.push("status " + e.status);
    if (e.attempted) parts.push("attempted " + e.attempted);
    if (e.current_epoch !== undefined) parts.push(e.current_epoch ? "current=" + e.current_epoch : "current=none");
    if (e.reason) parts.push("\u201c" + e.reason + "\u201d");
    if (e.end_revision) parts.push("ended at rev " + e.end_revision);
    return parts.join(", ");
  }

  // when is an entry's time as the other pages show it; a time the
  // browser cannot represent (a writer's clock may say anything) as sent.
  function when(t) {
    var d = new Date(t);
    return isNaN(d.getTime()) ? String(t) : d.toISOString().replace("T", " ").replace("Z", "");
  }

  function add(e) {
    var tr = document.createElement("tr");
    tr.className = "kind-" + e.kind.replace(/[^a-z]/g, "");
    tr.dataset.revision = String(e.revision);
    tr.dataset.kind = e.kind;
    tr.dataset.resource = e.resource;
    cell(tr, String(e.revision));
    cell(tr, when(e.time));
    cell(tr, e.kind);
    cell(tr, e.resource, "/resource?name=" + encodeURIComponent(e.resource));
    cell(tr, e.worker, "/worker?name=" + encodeURIComponent(e.worker));
    cell(tr, String(e.epoch));
    cell(tr, detail(e));
    body.insertBefore(tr, body.firstChild);
    while (body.rows.length > keep) body.deleteRow(body.rows.length - 1);
    count.textContent = String(++n);
  }

  var src = new EventSource("/events" + location.search);
  src.addEventListener("entry", function (ev) { add(JSON.parse(ev.data)); });
  src.addEventListener("ready", function () { status.textContent = "live"; });
  src.addEventListener("behind", function () { status.textContent = "live (entries were dropped: this page fell behind)"; });
  src.onerror = function () { status.textContent = "reconnecting…"; };
})();
