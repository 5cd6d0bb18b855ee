// Run once on page load (demo.load): projector mode from ?present=1, each tab's intro and a phone's order, the
// figures kept in step through plotly_wrappers.js, and a page served before its opening examples reloaded when ready.
() => {
  const on = new URLSearchParams(window.location.search).get('present') === '1';
  document.body.classList.toggle('projector', on);
  // each tab's first Markdown is its intro: folded to its first line in projector mode, a click unfolds it
  // and on a phone (the CSS's .intro-first / .main-first) the main figure's branch is put right after the intro's:
  // each element from the figure up to where it meets the intro's branch is marked
  const branch = (from, other, panel, cls) => {
    for (let el = from; el && el !== panel && !el.contains(other); el = el.parentElement) el.classList.add(cls);
  };
  const mark = () => document.querySelectorAll('[id^="tab-"]').forEach(panel => {
    const first = panel.querySelector('.prose');
    if (first && !first.classList.contains('intro')) {
      first.classList.add('intro');
      first.addEventListener('click', () => first.classList.toggle('open'));
    }
    const main = panel.querySelector('.js-plotly-plot');
    const block = main && main.closest('.block');
    if (first && block && !block.classList.contains('main-first')) {
      branch(block, first, panel, 'main-first');
      branch(first, block, panel, 'intro-first');
    }
  });
  let timer = null;
  // after the page changes (debounced): intros and a phone's order marked, then each figure's buttons, fit and labels
  new MutationObserver(() => {
    window.explorerWrapRedraws(); clearTimeout(timer);
    timer = setTimeout(() => { mark(); window.explorerButtons(); window.explorerFit(); window.explorerThin(); }, 150);
  }).observe(document.body, {childList: true, subtree: true});
  // a page served while the opening examples are still being computed (python app.py answers first): fetch the
  // page's configuration every 2 s and, once its status line changed, reload to show the new figures, unless the
  // visitor has started changing things (then the line says to reload)
  const cfg = window.gradio_config || {};
  const statusOf = (c) => { const s = (c.components || []).find(x => (x.props || {}).elem_id === 'opening-status');
                            return s && s.props.visible !== false ? String(s.props.value) : ''; };
  // (a status that does not start with ⏳ says something failed: nothing more will come)
  const pending = statusOf(cfg);
  if (pending.startsWith('⏳')) {
    let touched = false;
    const touch = (e) => { if (e.isTrusted && (e.type !== 'click' || (e.target.closest('button') && !e.target.closest('[role=tab]'))))
                             touched = true; };
    ['input', 'change', 'click'].forEach(t => document.addEventListener(t, touch, true));
    const url = String(cfg.root || '.').replace(/\/$/, '') + '/config';
    const poll = setInterval(() => fetch(url, {cache: 'no-store'}).then(r => r.json()).then(c => {
      if (statusOf(c) === pending) return;
      clearInterval(poll);
      if (!touched) { window.location.reload(); return; }
      const el = document.getElementById('opening-status');
      if (el) el.textContent = 'The opening examples are ready: reload the page to see them.';
    }).catch(() => {}), 2000);
  }
  mark();
  if (on) setTimeout(() => window.dispatchEvent(new Event('resize')), 300);  // the tab bar re-measures its overflow
  return on;
}
