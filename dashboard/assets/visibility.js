// Pause live refresh while the tab is hidden (Page Visibility API); resume when shown.
document.addEventListener("visibilitychange", function () {
  var live = document.getElementById("live-toggle");
  var wantLive = !live || !!live.querySelector("input:checked");
  if (window.dash_clientside && window.dash_clientside.set_props) {
    window.dash_clientside.set_props("refresh", { disabled: document.hidden || !wantLive });
  }
});
