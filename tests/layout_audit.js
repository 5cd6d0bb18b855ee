// The layout audit's reading of one view (tests/layout_audit.py injects it): the figures in the window, read from
// their SVG as drawn. Takes {main: a CSS selector of the view's main figure's block, minPlot, minFont, inWindow};
// returns {figures: [...], failures: [{figure, check, detail}]}.
//   plot-area       the main figure's plot area (the union of its subplots) under minPlot px tall or wide
//   font            a figure text (ticks, legends, titles, annotations, colour bars, cell text) under minFont px
//   overlap         two texts of one figure whose boxes overlap (two slanted tick labels excepted)
//   past-edge       a text past its figure's edge, or a figure past the window's right edge
//   label-covers    the figure's block label on one of its texts
//   outside-window  (inWindow) the main figure not wholly inside the window
(opts) => {
  const SLACK = 1;  // px: boxes that share an edge (a rounding) do not overlap
  const box = (el) => { const r = el.getBoundingClientRect(); return {l: r.left, t: r.top, r: r.right, b: r.bottom}; };
  const overlap = (a, b) => Math.min(a.r, b.r) - Math.max(a.l, b.l) > SLACK && Math.min(a.b, b.b) - Math.max(a.t, b.t) > SLACK;
  const shown = (el) => {
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const s = getComputedStyle(e);
      if (s.display === 'none' || s.visibility === 'hidden' || parseFloat(s.opacity) === 0) return false;
    }
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  const kind = (t) => {
    const cls = [];
    for (let e = t; e && e.tagName !== 'svg'; e = e.parentElement) cls.push(e.getAttribute('class') || '');
    const c = cls.join(' ');
    if (/cbtitle/.test(c)) return 'colour bar title';
    if (/cbaxis|colorbar/.test(c)) return 'colour bar';
    if (/tick/.test(c)) return 'tick';
    if (/legend/.test(c)) return 'legend';
    if (/gtitle/.test(c)) return 'title';
    if (/[xy]\d*title/.test(c)) return 'axis title';
    if (/annotation/.test(c)) return 'annotation';
    return 'text';
  };
  const slanted = (t) => /rotate\(\s*-?(?!0[\s,)])\d/.test(t.getAttribute('transform') || '') ||
                         /rotate\(\s*-?(?!0[\s,)])\d/.test((t.parentElement && t.parentElement.getAttribute('transform')) || '');
  // a figure's name: its block's elem_id, else its place among the figures shown (its title varies with the prompt)
  const nameOf = (gd, i) => {
    const block = gd.closest('.block');
    return block && block.id && !/^component-/.test(block.id) ? block.id : 'figure ' + (i + 1);
  };
  const titleOf = (gd) => { const t = gd.querySelector('.gtitle'); return t ? t.textContent.trim().replace(/\s+/g, ' ').slice(0, 60) : ''; };
  // a text's smallest glyphs: Plotly draws <sup>, <sub> and <span style="font-size"> as tspans of their own size
  const sizeOf = (t) => Math.min(parseFloat(getComputedStyle(t).fontSize),
    ...[...t.querySelectorAll('tspan')].filter(s => s.textContent.trim()).map(s => parseFloat(getComputedStyle(s).fontSize)));
  const W = window.innerWidth, H = window.innerHeight;
  // (a lesson's focus names several elements: the first that holds a figure is the main one)
  const mainBlock = opts.main ? [...document.querySelectorAll(opts.main)].find(e => e.matches('.js-plotly-plot') ||
                                                                              e.querySelector('.js-plotly-plot')) : null;
  const mainPlot = mainBlock ? (mainBlock.matches('.js-plotly-plot') ? mainBlock : mainBlock.querySelector('.js-plotly-plot')) : null;
  const all = [...document.querySelectorAll('.js-plotly-plot')].filter(gd => gd.offsetParent !== null);
  const inView = all.filter(gd => { const b = box(gd); return gd === mainPlot || (b.b > 0 && b.t < H && b.r > 0 && b.l < W); });
  const failures = [], figures = [];
  const fail = (figure, check, detail) => failures.push({figure, check, detail});
  if (opts.main && !mainPlot) fail('main figure', 'not-drawn', 'no figure under ' + opts.main);
  inView.forEach((gd, i) => {
    const name = nameOf(gd, all.indexOf(gd)), fig = box(gd), isMain = gd === mainPlot;
    const texts = [...gd.querySelectorAll('svg text')].filter(t => !t.closest('.hoverlayer') && t.textContent.trim() && shown(t))
      .map(t => ({el: t, box: box(t), kind: kind(t), slanted: kind(t) === 'tick' && slanted(t), text: t.textContent.trim().slice(0, 40),
                  px: sizeOf(t)}));
    const subplots = [...gd.querySelectorAll('.draglayer .nsewdrag')].map(box).filter(b => b.r > b.l && b.b > b.t);
    const area = subplots.length ? {w: Math.max(...subplots.map(b => b.r)) - Math.min(...subplots.map(b => b.l)),
                                     h: Math.max(...subplots.map(b => b.b)) - Math.min(...subplots.map(b => b.t))} : null;
    figures.push({name, title: titleOf(gd), main: isMain, box: fig, plot: area, texts: texts.length,
                  minFont: texts.length ? Math.min(...texts.map(t => t.px)) : null});
    if (isMain && area && (area.w < opts.minPlot || area.h < opts.minPlot))
      fail(name, 'plot-area', `${Math.round(area.w)}×${Math.round(area.h)} px < ${opts.minPlot}`);
    if (isMain && opts.inWindow && (fig.t < -SLACK || fig.b > H + SLACK || fig.l < -SLACK || fig.r > W + SLACK))
      fail(name, 'outside-window', `top ${Math.round(fig.t)}, bottom ${Math.round(fig.b)} in a ${W}×${H} window`);
    if (fig.r > W + SLACK) fail(name, 'past-edge', `the figure ends at ${Math.round(fig.r)} px in a ${W} px window`);
    const small = texts.filter(t => t.px < opts.minFont - 0.01);
    if (small.length) {
      const by = {};
      small.forEach(t => { by[t.kind] = Math.min(by[t.kind] || 99, t.px); });
      fail(name, 'font', small.length + ' texts under ' + opts.minFont + ' px: ' +
           Object.entries(by).map(([k, px]) => `${k} ${px}`).join(', '));
    }
    const pairs = [];
    texts.forEach((a, j) => texts.slice(j + 1).forEach(b => {
      if (a.slanted && b.slanted) return;
      if (a.el.contains(b.el) || b.el.contains(a.el)) return;
      if (overlap(a.box, b.box)) pairs.push(`${a.kind} "${a.text}" / ${b.kind} "${b.text}"`);
    }));
    if (pairs.length) fail(name, 'overlap', pairs.length + ' pairs, e.g. ' + pairs.slice(0, 3).join('; '));
    const out = texts.filter(t => t.box.l < fig.l - SLACK || t.box.r > fig.r + SLACK || t.box.t < fig.t - SLACK || t.box.b > fig.b + SLACK);
    if (out.length) fail(name, 'past-edge', out.length + ' texts, e.g. ' + out.slice(0, 3).map(t => `${t.kind} "${t.text}"`).join('; '));
    const block = gd.closest('.block');
    const label = block && block.querySelector('label[data-testid="block-label"]');
    if (label && shown(label)) {
      const lb = box(label), under = texts.filter(t => overlap(lb, t.box));
      if (under.length) fail(name, 'label-covers', under.map(t => `${t.kind} "${t.text}"`).slice(0, 3).join('; '));
    }
  });
  return {window: [W, H], figures, failures};
}
