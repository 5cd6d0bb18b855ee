// Projector mode's presented figure, in the page's head after plotly_wrappers.js. The figure a lesson link's focus=
// lands on, or the one a tab's action has just drawn, takes the window: the header, the controls and the intro fold
// away (the tab bar stays), the figure grows or shrinks to the room left, and Esc (or the button in the corner, or
// another tab) brings the page back. Without projector mode an action's figure is only scrolled into view: a
// class watching the screen never sees a Generate that answered below the fold.
//   explorerPresent(ids)        present these elements (a figure's block and the sentence that goes with it)
//   explorerUnpresent()         the page back
//   explorerPresentedHeight(el) the height a presented figure is drawn at (plotly_wrappers.js's redraws use it)
//   explorerRedrawn(el)         plotly_wrappers.js tells it each figure Gradio redraws
(() => {
  const GAP = 12;  // px left under the presented elements
  let presented = [];  // element ids
  const heights = {};  // block id -> the height its figure is drawn at while presented
  const projector = () => document.body.classList.contains('projector');
  const shown = () => presented.map(id => document.getElementById(id)).filter(el => el && el.offsetParent !== null);
  const sheet = () => {
    let s = document.getElementById('explorer-presenting');
    if (!s) { s = document.createElement('style'); s.id = 'explorer-presenting'; document.head.appendChild(s); }
    return s;
  };
  const exitButton = () => {
    let b = document.getElementById('present-exit');
    if (!b) {
      b = document.createElement('button');
      b.id = 'present-exit';
      b.type = 'button';
      b.textContent = 'Esc: show the page';
      b.addEventListener('click', () => unpresent());
      document.body.appendChild(b);
    }
    return b;
  };
  const plots = () => shown().flatMap(el => el.matches('.js-plotly-plot') ? [el] : [...el.querySelectorAll('.js-plotly-plot')]);
  // the presented elements fill the window under the tab bar: each row of figures gives up (or takes) its share of
  // the difference; a figure keeps at least 300 px
  const fill = async () => {
    const els = shown();
    if (!els.length || !window.Plotly || !document.body.classList.contains('presenting')) return;
    window.scrollTo(0, 0);
    const rect = () => { const r = els.map(el => el.getBoundingClientRect());
                         return {top: Math.min(...r.map(b => b.top)), bottom: Math.max(...r.map(b => b.bottom))}; };
    const b = rect();
    const room = window.innerHeight - GAP - b.top;
    const gds = plots().filter(gd => window.explorerDrawn(gd));
    if (!gds.length || Math.abs(room - (b.bottom - b.top)) <= 2) return;
    const shared = window.explorerShared(gds, room - (b.bottom - b.top));
    for (const [i, gd] of gds.entries()) {
      const want = Math.max(300, shared[i]);
      const block = gd.closest('.block');
      if (block && block.id) heights[block.id] = want;
      if (Math.abs(window.explorerHeight(gd) - want) > 2) await window.Plotly.relayout(gd, {height: want});
    }
    window.scrollTo(0, 0);
  };
  const present = (ids) => {
    if (!projector() || !ids || !ids.length) return false;
    if (document.body.classList.contains('presenting') && ids.join(' ') === presented.join(' ')) {
      setTimeout(fill, 120);
      return true;
    }
    const tabs = document.querySelector('[role=tablist]');
    if (tabs) tabs.dataset.explorerTabs = '1';
    presented = ids.slice();
    Object.keys(heights).forEach(k => delete heights[k]);
    const sel = ids.map(id => '#' + CSS.escape(id)).join(', ');
    const keep = `:not(:is(${sel})):not(:is(${sel}) *):not(:has(${sel}))` +
                 ':not([data-explorer-tabs]):not([data-explorer-tabs] *):not(:has([data-explorer-tabs]))' +
                 ':not(.toast-wrap):not(.toast-wrap *):not(:has(.toast-wrap))';  // an error still shows
    sheet().textContent = `body.presenting .gradio-container *${keep} {display: none !important}`;
    document.body.classList.add('presenting');
    exitButton().hidden = false;
    window.dispatchEvent(new Event('resize'));  // Plotly's autosize takes the width the hidden columns left
    setTimeout(fill, 120);
    setTimeout(fill, 600);
    return true;
  };
  const unpresent = () => {
    if (!document.body.classList.contains('presenting')) return;
    const gds = plots();
    document.body.classList.remove('presenting');
    sheet().textContent = '';
    exitButton().hidden = true;
    presented = [];
    Object.keys(heights).forEach(k => delete heights[k]);
    gds.forEach(gd => {  // back to the height it was sent with; the page's fit then sizes the main figure
      const sent = gd.explorerSource && gd.explorerSource[1] && gd.explorerSource[1].height;
      if (sent && window.explorerDrawn(gd)) window.Plotly.relayout(gd, {height: sent});
    });
    window.dispatchEvent(new Event('resize'));
    if (window.explorerFit) setTimeout(window.explorerFit, 200);
  };
  const presentedHeight = (el) => {
    if (!document.body.classList.contains('presenting')) return null;
    const block = el && el.closest && el.closest('.block');
    return (block && heights[block.id]) || null;
  };
  // an action: a button of a tab pressed. Its result is the first figure its answer redraws (with those redrawn
  // within 0.3 s of it); an answer equal to what is shown redraws nothing, and then, once the page is idle, the
  // first figure beside the button (in its nearest surrounding element that holds one) is the result.
  const BUSY = '.progress-text, .progress-level, .eta-bar, .meta-text, .meta-text-center';
  let action = null;
  document.addEventListener('click', (e) => {
    // (a Stop, an accordion's header and Ask the class's buttons are no action: the class needs the QR code in view)
    const button = e.isTrusted !== false && e.target.closest && e.target.closest('button.primary, button.secondary');
    const panel = button && !button.closest('[role=tablist], [id^="ask-"]') && button.closest('[id^="tab-"]');
    if (!panel) return;
    const a = action = {panel, button, at: Date.now(), blocks: [], timer: null, quiet: 0};
    const idle = () => {
      if (action !== a || a.timer) return;
      a.quiet = document.querySelector(BUSY) ? 0 : a.quiet + 1;
      if (a.quiet < 3 || Date.now() - a.at < 800) { setTimeout(idle, 250); return; }
      for (let el = a.button.parentElement; el && el !== a.panel.parentElement; el = el.parentElement) {
        const gd = [...el.querySelectorAll('.js-plotly-plot')].find(g => g.offsetParent !== null);
        if (gd) { a.blocks.push(gd.closest('.block')); break; }
      }
      take();
    };
    setTimeout(idle, 250);
  }, true);
  const take = () => {
    const a = action;
    if (!a) return;
    action = null;
    const blocks = a.blocks.filter(b => b && b.isConnected && b.offsetParent !== null)
      .sort((x, y) => x.compareDocumentPosition(y) & Node.DOCUMENT_POSITION_FOLLOWING ? -1 : 1);
    if (!blocks.length) return;
    // the generated text beside the figure (Generate, Compare) is part of the result: presented with it
    const row = blocks[0].closest('.row');
    const texts = row ? [...row.querySelectorAll('.block')].filter(b => b.id && b.offsetParent !== null &&
                                                                      b.querySelector('.textfield') && !b.querySelector('.block')) : [];
    if (projector() && blocks[0].id) present([...texts.map(b => b.id), blocks[0].id]);
    else blocks[0].scrollIntoView({block: 'nearest'});
  };
  // Gradio draws a new figure into an element it attaches afterwards: it is looked at once it is in the page
  const redrawn = (el, tries = 0) => {
    if (!el || !el.closest) return;
    if (!el.isConnected) { if (tries < 40) setTimeout(() => redrawn(el, tries + 1), 50); return; }
    if (document.body.classList.contains('presenting') && shown().some(p => p.contains(el))) {
      clearTimeout(window.explorerPresentTimer);  // a presented figure redrawn at the height it was sent with
      window.explorerPresentTimer = setTimeout(fill, 150);
    }
    const a = action;
    if (!a || Date.now() - a.at > 300000 || !a.panel.contains(el)) return;
    const block = el.closest('.block');
    if (!block || a.blocks.includes(block)) return;
    a.blocks.push(block);
    if (!a.timer) a.timer = setTimeout(take, 300);
  };
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape') unpresent(); });
  document.addEventListener('click', (e) => {
    if (e.target.closest && e.target.closest('[role=tab]')) unpresent();
  }, true);
  window.addEventListener('resize', () => {
    if (!document.body.classList.contains('presenting')) return;
    clearTimeout(window.explorerPresentTimer);
    window.explorerPresentTimer = setTimeout(fill, 200);
  });
  window.explorerPresent = present;
  window.explorerUnpresent = unpresent;
  window.explorerPresentedHeight = presentedHeight;
  window.explorerRedrawn = redrawn;
})();
