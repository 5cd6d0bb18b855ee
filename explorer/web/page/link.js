// Run on page load (explorer.web.links.link_js): a link's tab trigger clicked, then its focus=<name> placed and framed.
// It also defines window.explorerOpen(tab, focus), which the lesson deck (deck.js) and in-page links call to open a
// view without reloading the page (the link is in the address by then: the server reads it from there), and makes a
// click on one of our own "?tab=..." links open in this tab, carrying the page's model and projector mode.
() => {
  const pageModel = () => { const el = document.querySelector('#page-model textarea, #page-model input');
                            return el ? el.value : ''; };
  window.explorerPageModel = pageModel;
  // The address of a view as this page would share it: its model and projector mode added.
  window.explorerLinkFor = (search) => {
    const url = new URL(window.location.href);
    url.search = search;
    const model = pageModel() || new URLSearchParams(window.location.search).get('model');
    if (model && model !== 'default' && !url.searchParams.has('model')) url.searchParams.set('model', model);
    if (document.body.classList.contains('projector')) url.searchParams.set('present', '1');
    else url.searchParams.delete('present');
    return url;
  };
  window.explorerOpen = (tab, focus) => {
    const trigger = document.getElementById($APPLY_LINK_ID + '-' + tab) || document.getElementById($APPLY_LINK_ID);
    const model = new URLSearchParams(window.location.search).get('model');
    if (model && model !== (pageModel() || 'default') && window.explorerLoading) window.explorerLoading(model);
    if (trigger) trigger.click();
    const ids = (($FOCUS)[tab] || {})[focus];
    if (ids && document.getElementById($APPLY_LINK_ID + '-' + tab)) place_when_drawn(ids);
  };
  document.addEventListener('click', (e) => {
    const a = e.target.closest && e.target.closest('a[href^="?tab="]');
    if (!a || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    e.stopPropagation();
    const url = window.explorerLinkFor(a.getAttribute('href'));
    history.pushState(null, '', url.toString());
    window.explorerOpen(url.searchParams.get('tab'), url.searchParams.get('focus'));
  }, true);
  let run = 0;  // the latest placement: an earlier one stops when another view is opened
  function place_when_drawn(ids) {
    const mine = ++run;
    delete document.body.dataset.focused;
    if (window.explorerUnplace) window.explorerUnplace();
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
    // a lesson's bar (deck.css keeps it at the bottom of the window) takes its height from the room
    const bar = () => { const el = document.getElementById('lesson-bar');
                        return el && getComputedStyle(el).position === 'fixed' && el.getClientRects().length
                          ? el.getBoundingClientRect().height : 0; };
    const place = async (els) => {
      // projector mode outside a deck: the figure takes the window (present.js), framed there; a deck's bar
      // stays, so the deck places the figure above it instead
      if (!bar() && window.explorerPresent && window.explorerPresent(ids)) {
        document.body.dataset.focused = ids.join(' ');
        if (!flashed) {
          flashed = true;
          setTimeout(() => els.forEach(el => { el.classList.add('focus-flash'); setTimeout(() => el.classList.remove('focus-flash'), 3000); }), 700);
        }
        return;
      }
      const room = window.innerHeight - bar() - 16;
      let b = box(els);
      const excess = b.bottom - b.top - room;
      // (a phone scrolls: its figures keep their height, squeezed into the window two stacked maps ran into each
      // other; a deck's step must end above the deck's bar, on a phone too, so there they still give it up, but
      // for stacked panels)
      const deck = bar() > 0;
      if (excess > 0 && window.Plotly && (deck || window.innerWidth >= 640)) {  // side by side or alone, each gives up the excess
        for (const gd of els.flatMap(el => [...el.querySelectorAll('.js-plotly-plot')])) {
          // outside a deck never shorter than keeps its plot area readable (a phone's two maps fell to 65 px each):
          // the figure then runs past the window's bottom, its top in view
          const h = window.explorerHeight(gd), least = window.explorerLeast ? window.explorerLeast(gd) : 240;
          // (a phone's stacked panels keep their height in a deck too: squeezed, 30 layers' head scores overlapped)
          if (deck && window.innerWidth < 640 && window.explorerStacked && window.explorerStacked(gd)) continue;
          const want = deck ? (h - excess >= 240 ? Math.floor(h - excess) : h) : Math.floor(Math.max(h - excess, least, 240));
          if (h && want < h - 2) await window.explorerPlace(gd, want);
        }
        b = box(els);
      } else if (deck && excess < -8 && window.Plotly && document.body.classList.contains('projector')) {
        // a projected deck's figure grows into the room above the bar, as a presented one takes the window (a
        // small model's figures are drawn for a desk: 4 layers of head scores had a 150 px plot); rows share it
        const gds = els.flatMap(el => [...el.querySelectorAll('.js-plotly-plot')]).filter(gd => window.explorerDrawn(gd));
        const shared = window.explorerShared(gds, -excess);
        for (const [i, gd] of gds.entries()) {
          if (window.explorerHeight(gd)) await window.explorerPlace(gd, shared[i]);
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
      if (stopped || mine !== run || Date.now() - started > 180000 || (placed && Date.now() - placed > 30000)) return;
      const els = shown();
      const drawn = els.length && els.every(el => !el.querySelector('.js-plotly-plot, .plot-container') ||
                                                   [...el.querySelectorAll('.js-plotly-plot')].some(gd => window.explorerDrawn(gd)));
      // busy: an answer still coming in the figure's tab (a class's live tally beside it does not count)
      const panel = els.length ? els[0].closest('[id^="tab-"]') || document : document;
      const busy = [...panel.querySelectorAll(BUSY)].some(e => !e.closest('[id^="ask-"]'));
      quiet = drawn && !busy ? quiet + 1 : 0;
      if (quiet >= 5) {
        const b = box(els);
        if (!placed || b.top < 0 || b.bottom > window.innerHeight - bar()) { await place(els); placed = placed || Date.now(); }
      }
      setTimeout(watch, 250);
    };
    setTimeout(watch, 250);
  }
  const params = new URLSearchParams(window.location.search);
  if (params.has('lesson')) return;  // the deck opens its step (deck.js)
  if (![...params.keys()].some(k => !$PAGE_KEYS.includes(k))) return;
  window.explorerOpen(params.get('tab') || '', params.get('focus'));
}
