/* Long tables on a narrow screen: one card per row.

   A table wider than its column scrolls sideways in its own box (site.css); when that box is also taller than the
   window, its scrollbar is out of sight until the reader reaches the table's foot. Such a table is shown instead as
   one card per row, each cell under its column's name (class rlhf-cards, data-label), and laid out again when the
   window's width changes. */
(function () {
  "use strict";
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
      table.classList.remove("rlhf-cards");
      var box = scroller(table);
      var wide = table.getBoundingClientRect().width > box.clientWidth + 2;
      if (wide && box.getBoundingClientRect().height > window.innerHeight) {
        label(table);
        table.classList.add("rlhf-cards");
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
