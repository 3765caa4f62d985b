/* MathJax 3's configuration for the course's pages, loaded before MathJax.

   MyST writes inline maths as \( \) and display maths as \[ \] in elements of class "math", and marks the rest of
   the page tex2jax_ignore (no stray $). Until MathJax has typeset the page its formulas are hidden (site.css,
   html.rlhf-math-pending), so the reader never sees raw TeX; if MathJax cannot run, they show after MATH_WAIT_MS.
   Tables are laid out again once their formulas are typeset (rlhf-tables.js). */
(function () {
  "use strict";
  var MATH_WAIT_MS = 8000;
  var root = document.documentElement;
  function shown() { root.classList.remove("rlhf-math-pending"); }
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
          try { if (window.rlhfTables) window.rlhfTables.fit(); } finally { shown(); }
        }, function (error) { shown(); throw error; });
      }
    }
  };
})();
