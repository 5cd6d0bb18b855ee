// Run on page load (explorer.web.links.link_js): a link's tab trigger clicked, then its focus=<name> placed and framed.
() => {
  const params = new URLSearchParams(window.location.search);
  if (![...params.keys()].some(k => !$PAGE_KEYS.includes(k))) return;
  const own = document.getElementById($APPLY_LINK_ID + '-' + (params.get('tab') || ''));
  const trigger = own || document.getElementById($APPLY_LINK_ID);
  if (trigger) trigger.click();
  const ids = (($FOCUS)[params.get('tab')] || {})[params.get('focus')];
  if (!own || !ids) return;
  const BUSY = '.progress-text, .progress-level, .eta-bar, .meta-text, .meta-text-center';
  const started = Date.now();
  let quiet = 0, placed = 0, flashed = false, stopped = false;
  const stop = () => { stopped = true; };
  ['wheel', 'touchstart', 'keydown', 'mousedown'].forEach(e => window.addEventListener(e, stop, {once: true, passive: true}));
  const shown = () => ids.map(id => document.getElementById(id)).filter(el => el && el.offsetParent !== null);
  const box = (els) => {
    const r = els.map(el => el.getBoundingClientRect());
    return {top: Math.min(...r.map(b => b.top)), bottom: Math.max(...r.map(b => b.bottom))};
  };
  const place = async (els) => {
    // projector mode: the figure takes the window (present.js), framed there
    if (window.explorerPresent && window.explorerPresent(ids)) {
      document.body.dataset.focused = ids.join(' ');
      if (!flashed) {
        flashed = true;
        setTimeout(() => els.forEach(el => { el.classList.add('focus-flash'); setTimeout(() => el.classList.remove('focus-flash'), 3000); }), 700);
      }
      return;
    }
    const room = window.innerHeight - 16;
    let b = box(els);
    const excess = b.bottom - b.top - room;
    if (excess > 0 && window.Plotly) {  // side by side or alone, each figure gives up the excess
      for (const gd of els.flatMap(el => [...el.querySelectorAll('.js-plotly-plot')])) {
        const h = window.explorerHeight(gd);
        if (h && h - excess >= 240) await window.Plotly.relayout(gd, {height: Math.floor(h - excess)});
      }
      b = box(els);
    }
    window.scrollTo(0, Math.max(0, b.top + window.scrollY - 8));
    document.body.dataset.focused = ids.join(' ');  // what the link landed on (tests read it)
    if (!flashed) {
      flashed = true;
      els.forEach(el => { el.classList.add('focus-flash'); setTimeout(() => el.classList.remove('focus-flash'), 3000); });
    }
  };
  const watch = async () => {
    if (stopped || Date.now() - started > 180000 || (placed && Date.now() - placed > 30000)) return;
    const els = shown();
    const drawn = els.length && els.every(el => !el.querySelector('.js-plotly-plot, .plot-container') ||
                                                 [...el.querySelectorAll('.js-plotly-plot')].some(gd => window.explorerDrawn(gd)));
    quiet = drawn && !document.querySelector(BUSY) ? quiet + 1 : 0;
    if (quiet >= 5) {
      const b = box(els);
      if (!placed || b.top < 0 || b.bottom > window.innerHeight) { await place(els); placed = placed || Date.now(); }
    }
    setTimeout(watch, 250);
  };
  setTimeout(watch, 250);
}
