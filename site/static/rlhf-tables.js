/* Tables wider than their column and taller than the window.

   A table wider than its column scrolls sideways in its own box (site.css); when that box is also taller than the
   window, its scrollbar is out of sight until the reader reaches the table's foot. Such a table is shown instead
   - on a phone (a window narrower than CARDS_BELOW_PX): as one card per row, each cell after its column's name
     (class rlhf-cards, data-label);
   - on a wider screen: in a box no taller than the window (class rlhf-tall on its scrolling box), which scrolls both
     ways and keeps the header row in view.
   Laid out again when the window's width changes and once MathJax has typeset the formulas in the tables. */
(function () {
  "use strict";
  var CARDS_BELOW_PX = 700;
  function scroller(table) {
    for (var a = table.parentElement; a && a !== document.body; a = a.parentElement) {
      var overflow = getComputedStyle(a).overflowX;
      if (overflow === "auto" || overflow === "scroll") return a;
    }
    return table.parentElement;
  }
  function label(table) {
    var head = table.querySelector("thead tr:last-child") || table.querySelector("tr");
    var names = head ? Array.prototype.map.call(head.children, function (c) { return c.textContent.trim(); }) : [];
    table.querySelectorAll("tbody tr").forEach(function (row) {
      Array.prototype.forEach.call(row.children, function (cell, i) {
        if (!cell.hasAttribute("data-label")) cell.setAttribute("data-label", names[i] || "");
      });
    });
  }
  function fit() {
    document.querySelectorAll("article table").forEach(function (table) {
      var box = scroller(table);
      table.classList.remove("rlhf-cards");
      box.classList.remove("rlhf-tall");
      var wide = table.getBoundingClientRect().width > box.clientWidth + 2;
      if (!wide || box.getBoundingClientRect().height <= window.innerHeight) return;
      if (window.innerWidth < CARDS_BELOW_PX) {
        label(table);
        table.classList.add("rlhf-cards");
      } else {
        box.classList.add("rlhf-tall");
      }
    });
  }
  var pending = null, width = window.innerWidth;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(function () { if (window.innerWidth !== width) { width = window.innerWidth; fit(); } }, 150);
  });
  window.rlhfTables = {fit: fit};  // again once MathJax has typeset the formulas in the tables (rlhf-math.js)
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", fit); } else { fit(); }
})();
