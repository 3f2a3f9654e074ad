// The status page's live updates and breaker actions. Each update from
// /events is a run of template elements, each holding one element of the
// page with an id: its class and content replace those of the page's
// element. Written without the characters that would need escaping in
// markup, so the page stays well-formed as XML too.
(function () {
  "use strict";
  var doc = document;
  doc.documentElement.className = "js";
  var live = doc.getElementById("live");
  var result = doc.getElementById("ctl-result");
  var token = doc.getElementById("token");

  function setLive(kind, text) {
    live.className = "live " + kind;
    live.textContent = text;
  }

  function apply(html) {
    var outer = doc.createElement("template");
    outer.innerHTML = html;
    Array.prototype.forEach.call(outer.content.children, function (tpl) {
      var el = tpl.content ? tpl.content.firstElementChild : null;
      var old = el ? doc.getElementById(el.id) : null;
      if (!old) {
        return;
      }
      if (old.className !== el.className) {
        old.className = el.className;
      }
      if (old.innerHTML !== el.innerHTML) {
        old.innerHTML = el.innerHTML;
      }
    });
  }

  if (window.EventSource) {
    setLive("down", "connecting…");
    var events = new EventSource("events");
    events.addEventListener("open", function () {
      setLive("on", "live");
    });
    events.addEventListener("update", function (e) {
      apply(e.data);
      setLive("on", "live");
    });
    events.addEventListener("end", function () {
      setLive("down", "the relay is shutting down; reconnecting…");
    });
    events.addEventListener("error", function () {
      if (live.className.indexOf("down") === -1) {
        setLive("down", "disconnected; reconnecting…");
      }
    });
  }

  function say(kind, text) {
    result.className = kind;
    result.textContent = text;
  }

  // The token is read from the field at each action and sent only to this
  // page's own origin; it is never stored.
  doc.addEventListener("click", function (e) {
    var button = e.target.closest ? e.target.closest("button[data-action]") : null;
    if (!button) {
      return;
    }
    var name = button.getAttribute("data-target");
    var action = button.getAttribute("data-action");
    var headers = { "Content-Type": "application/json" };
    if (token) {
      if (token.value !== "") {
        headers.Authorization = "Bearer " + token.value;
      }
    }
    say("", name + ": " + action + "…");
    fetch("breakers/" + encodeURIComponent(name), {
      method: "POST",
      headers: headers,
      body: JSON.stringify({ action: action }),
      cache: "no-store",
      credentials: "omit"
    }).then(function (resp) {
      return resp.json().then(function (body) {
        if (resp.ok) {
          var how = body.held ? ", held open" : body.disabled ? ", disabled" : "";
          say("ok", name + ": " + action + " done; now " + body.state + how);
        } else {
          say("err", name + ": " + action + " refused: HTTP " + resp.status + ": " + (body.error || ""));
        }
      });
    }).catch(function (err) {
      say("err", name + ": " + action + " failed: " + err);
    });
  });
})();
