/* MathJax 3's configuration for the course's pages, loaded before MathJax.

   MyST writes inline maths as \( \) and display maths as \[ \] in elements of class "math", and marks the rest of
   the page tex2jax_ignore (no stray $). Until MathJax has typeset the page its formulas are hidden (site.css,
   html.rlhf-math-pending), so the reader never sees raw TeX; if MathJax cannot run, they show after MATH_WAIT_MS.
   A formula wider than its column is then drawn smaller, down to MIN_SCALE; an inline one that still does not fit
   scrolls in its own box (class rlhf-scrolls on its span.math; site.css). Tables are laid out again once their
   formulas are typeset (rlhf-tables.js). */
(function () {
  "use strict";
  var MATH_WAIT_MS = 8000;
  var root = document.documentElement;
  var MIN_SCALE = 0.7;
  function shown() { root.classList.remove("rlhf-math-pending"); }

  // each typeset formula fitted to the width of its column (again when the window's width changes)
  function fitFormulas() {
    document.querySelectorAll("mjx-container").forEach(function (m) {
      var display = m.getAttribute("display") === "true";
      var holder = display ? null : m.closest("span.math");
      if (m.dataset.rlhfSize === undefined) m.dataset.rlhfSize = m.style.fontSize || "100%";
      m.style.fontSize = m.dataset.rlhfSize;
      if (holder) holder.classList.remove("rlhf-scrolls");
      var math = m.querySelector("mjx-math");
      var column = display ? m : (m.parentElement.closest("p, li, td, th, dd, dt, div") || m.parentElement);
      var width = math ? math.getBoundingClientRect().width : 0, room = column.clientWidth - 4;
      if (!width || width <= room) return;
      var scale = Math.max(MIN_SCALE, room / width);
      m.style.fontSize = (parseFloat(m.dataset.rlhfSize) * scale).toFixed(1) + "%";
      if (holder && scale === MIN_SCALE) holder.classList.add("rlhf-scrolls");
    });
  }
  window.rlhfMath = {fit: fitFormulas};
  var pending = null, lastWidth = window.innerWidth;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(function () {
      if (window.innerWidth === lastWidth) return;
      lastWidth = window.innerWidth;
      fitFormulas();
    }, 150);
  });
  root.classList.add("rlhf-math-pending");
  setTimeout(shown, MATH_WAIT_MS);
  window.MathJax = {
    tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true,
          processEnvironments: true},
    options: {ignoreHtmlClass: "tex2jax_ignore|mathjax_ignore",
              processHtmlClass: "tex2jax_process|mathjax_process|math|output_area",
              // no context menu and no hidden MathML copy: neither is needed to read the course
              enableMenu: false, renderActions: {assistiveMml: []}},
    startup: {
      pageReady: function () {
        var typeset = window.MathJax.startup.defaultPageReady();
        return typeset.then(function () {
          try { fitFormulas(); if (window.rlhfTables) window.rlhfTables.fit(); } finally { shown(); }
        }, function (error) { shown(); throw error; });
      }
    }
  };
})();
