// Every wrapper around Plotly and every read of its private fields (_fullLayout, _context, _categories) is here, in
// the page's head (launch(head=...)), so that each exists before the first figure is drawn. Why each exists:
//   Plotly.react       Gradio redraws through it: phone layouts, projector sizes and the PNG/SVG buttons go in there,
//                      and a redraw Plotly throws on mid-layout ("axis scaling") is retried once it has settled.
//   Plots.resize       Gradio resizes after each redraw: a figure whose redraw threw would throw here too.
//   explorerRestyle    projector mode switched: every drawn figure drawn again from what was sent, at the new sizes.
//   explorerFit        projector mode: the visible tab's main figure short enough to end inside the window.
//   explorerThin       token axes label every k-th token, as many as stand apart at the size drawn.
//   explorerButtons    figures drawn before the Plotly.react wrapper was in place get the same buttons once.
//   explorerSave       one figure as a 1920x1080-slide PNG or SVG (the buttons); explorerSaveTab: all of a tab's.
//   explorerDrawn, explorerHeight   whether a figure is drawn and its drawn height (a link's focus=<name> placing).
//   explorerPlace(gd, h)  a deck's step drew this figure at h px, so that it and its sentence end above the deck's
//                         bar: redraws and fits keep that height (until the next step) instead of the 300 px rule.
//   explorerStacked(gd)   whether a figure's panels stand one above another (a phone's deck keeps their height).
//   explorerShared(gds, more)  each drawn figure's height once they share `more` px (or give them up): figures
//                              side by side (tops within 20 px) share a row's part (presenting; a projected deck).
(() => {
  // Projector mode sets its 16 px in each figure's layout, not only in CSS: Plotly then places colour-bar titles,
  // margins and tick spacing for the text as drawn (CSS-enlarged text overlapped the titles Plotly had placed)
  const BIG = 16;
  const SMALLEST = 14;
  const PHONE_SMALLEST = 11;  // px: a phone is held at reading distance (the layout audit's rule)
  const MIN_PLOT = 300;  // px: projector mode's main figure keeps a plot area this tall rather than fit the window
  const atLeast = (f, size) => Object.assign({}, f || {}, {size: Math.max(size, (f && f.size) || 0)});
  const bigger = (f) => atLeast(f, BIG);
  const withBar = (o) => {
    const bar = o.colorbar || {}, title = bar.title && typeof bar.title === 'object' ? bar.title : {text: bar.title};
    const titled = title.text ? {title: Object.assign({}, title, {font: atLeast(title.font, SMALLEST)})} : {};
    return Object.assign({}, o, {colorbar: Object.assign({}, bar, {tickfont: bigger(bar.tickfont)}, titled)});
  };
  // Plotly draws a <sup> subtitle at 0.7 of its title's size (9.8 px under a 14 px title): projector mode draws it at
  // the title's 14 px, set apart by its colour (figures/common.wrap_title breaks its lines for that size)
  const fullSizeSubtitle = (text) => typeof text !== 'string' ? text :
    text.replace(/<sup>/g, `<span style="font-size:${SMALLEST}px;color:#5a6270">`).replace(/<\/sup>/g, '</span>');
  const projectorSizes = (data, layout) => {
    const L = Object.assign({}, layout);
    ['xaxis', 'yaxis', ...Object.keys(L).filter(k => /^[xy]axis\d+$/.test(k))].forEach(k => {
      // token (category) axes make room for their longer 16 px labels; numeric axes keep their margins: a figure
      // with a legend below (the memory lab's) shrank to nothing when every axis pushed its margin out
      const grow = (L[k] || {}).type === 'category' ? {automargin: true} : {};
      L[k] = Object.assign({}, L[k], {tickfont: bigger((L[k] || {}).tickfont)}, grow);
    });
    Object.keys(L).filter(k => /^coloraxis\d*$/.test(k)).forEach(k => { L[k] = withBar(L[k] || {}); });
    // every other text at least 14 px: titles, axis titles, legends, annotations (subplot titles), colour bar titles
    L.font = atLeast(L.font, SMALLEST);
    if (L.legend) L.legend = Object.assign({}, L.legend, {font: atLeast(L.legend.font, SMALLEST)});
    if (L.title && typeof L.title === 'object') {
      L.title = Object.assign({}, L.title, {font: atLeast(L.title.font, SMALLEST), text: fullSizeSubtitle(L.title.text)});
    }
    if (Array.isArray(L.annotations)) L.annotations = L.annotations.map(a => Object.assign({}, a, {font: atLeast(a.font, SMALLEST)}));
    Object.keys(L).filter(k => /^[xy]axis\d*$/.test(k) && L[k].title && typeof L[k].title === 'object').forEach(k => {
      L[k] = Object.assign({}, L[k], {title: Object.assign({}, L[k].title, {font: atLeast(L[k].title.font, SMALLEST)})});
    });
    const D = (data || []).map(t => {
      let c = t;
      if (t.colorbar || (/^(heatmap|contour)/.test(t.type || '') && !t.coloraxis && t.showscale !== false)) c = withBar(c);
      if (t.texttemplate || (t.text && /^heatmap/.test(t.type || ''))) c = Object.assign({}, c, {textfont: bigger(t.textfont)});
      else if (t.text) c = Object.assign({}, c, {textfont: atLeast(t.textfont, SMALLEST)});  // bars' values
      return c;
    });
    return [D, L];
  };
  // a figure that lays itself out otherwise on a phone carries that layout in layout.meta.narrow (subplots
  // stacked instead of side by side, titles on shorter lines): merged in under 640 px, arrays replaced whole
  const merged = (a, b) => {
    if (!b || typeof b !== 'object' || Array.isArray(b) || !a || typeof a !== 'object' || Array.isArray(a)) return b;
    const out = Object.assign({}, a);
    Object.keys(b).forEach(k => { out[k] = merged(a[k], b[k]); });
    return out;
  };
  // ... and any other figure's title broken at its " · " where a line would run past the phone's width
  const plain = (html) => html.replace(/<[^>]+>/g, '');
  const wrapTitle = (layout) => {
    const t = layout.title, text = t && (typeof t === 'string' ? t : t.text);
    if (typeof text !== 'string') return layout;
    const size = (t.font && t.font.size) || 1.4 * ((layout.font && layout.font.size) || 12);  // Plotly's title size
    const fit = Math.max(16, Math.floor((window.innerWidth - 64) / (0.55 * size)));  // characters a line holds
    let added = 0;
    const lines = text.split('<br>').map(line => {
      if (plain(line).length <= fit) return line;
      const out = [];
      line.split(' · ').forEach(part => {
        const joined = out.length ? out[out.length - 1] + ' · ' + part : null;
        if (joined !== null && plain(joined).length <= fit) out[out.length - 1] = joined;
        else { added += out.length ? 1 : 0; out.push(part); }
      });
      return out.join('<br>');
    });
    if (!added) return layout;
    const margin = Object.assign({}, layout.margin, {t: ((layout.margin || {}).t || 60) + 22 * added});
    const grown = layout.height ? {height: layout.height + 22 * added} : {};
    return Object.assign({}, layout, grown, {margin, title: Object.assign({}, typeof t === 'string' ? {} : t,
                                                                            {text: lines.join('<br>')})});
  };
  const narrowLayout = (layout) => {
    if (window.innerWidth >= 640) return layout;
    const narrow = layout.meta && layout.meta.narrow;
    const out = narrow ? merged(layout, narrow) : wrapTitle(layout), t = out.title;
    if (!t || typeof t !== 'object' || !/<sup>/.test(t.text || '')) return out;
    // a phone draws a <sup> subtitle at 0.7 of its title's size: the title is set so that the subtitle keeps 11 px
    return Object.assign({}, out, {title: Object.assign({}, t, {font: atLeast(t.font, Math.ceil(PHONE_SMALLEST / 0.7))})});
  };
  // ... and a figure with one colour bar beside its map (a heatmap's) gets it laid flat under the figure: upright
  // beside the map it took a quarter of a phone's width, leaving the map 120-160 px wide
  const narrowBar = (data, layout) => {
    if (window.innerWidth >= 640 || !Array.isArray(data)) return data;
    if (Object.keys(layout).some(k => /^coloraxis/.test(k))) return data;
    const maps = data.filter(t => /^(heatmap|contour)/.test(t.type || '') && !t.coloraxis && t.showscale !== false);
    if (maps.length !== 1) return data;
    const bar = maps[0].colorbar || {};
    const title = bar.title && typeof bar.title === 'object' ? bar.title : {text: bar.title};
    const flat = Object.assign({}, bar, {orientation: 'h', x: 0.5, xanchor: 'center', len: 1, lenmode: 'fraction',
                                         thickness: 10, yref: 'container', y: 0, yanchor: 'bottom', ypad: 8, xpad: 0,
                                         title: Object.assign({}, title, {side: 'bottom'})});  // on top: on the bar
    return data.map(t => t === maps[0] ? Object.assign({}, t, {colorbar: flat}) : t);
  };
  const FLAT_BAR = 70;  // px the flat colour bar, its ticks and title take under the figure
  const narrowBarLayout = (layout) => {
    const m = layout.margin || {}, b = m.b === undefined ? 80 : m.b, r = m.r === undefined ? 80 : m.r;
    return Object.assign({}, layout, {height: (layout.height || 450) + FLAT_BAR,
                                      margin: Object.assign({}, m, {b: b + FLAT_BAR, r: Math.min(r, 12)})});
  };
  // Token axes label every token that fits: every k-th category so that labels stand 1.2 font heights apart at
  // the size the figure is drawn (a phone's width, a projector's fitted height, its 16 px), re-thinned on resize
  const thin = () => document.querySelectorAll('.js-plotly-plot').forEach(el => {
    const L = el._fullLayout;
    if (!L || el.offsetParent === null || !window.Plotly) return;
    const update = {};
    Object.keys(L).filter(k => /^[xy]axis\d*$/.test(k)).forEach(k => {
      const ax = L[k], all = ax._categories;
      if (ax.type !== 'category' || ax.tickmode !== 'array' || !all || !all.length || !ax._length) return;
      const vals = ax.tickvals || [], text = ax.ticktext || [];
      if (vals.length !== text.length || vals.some((v, i) => String(v) !== String(text[i]))) return;  // named ticks
      const step = Math.max(1, Math.ceil(1.2 * ((ax.tickfont && ax.tickfont.size) || 12) / (ax._length / all.length)));
      const want = all.filter((_, i) => i % step === 0);
      if (want.length !== vals.length || want.some((v, i) => String(v) !== String(vals[i]))) {
        update[k + '.tickvals'] = want;
        update[k + '.ticktext'] = want;
      }
    });
    if (Object.keys(update).length) window.Plotly.relayout(el, update);
  });
  // the part of the space inside the margins that the subplots take up and down (their domains leave gaps): the
  // plot area that MIN_PLOT is about is theirs, not the margins' inside
  const plotShare = (el) => {
    const boxes = [...el.querySelectorAll('.draglayer .nsewdrag')].map(d => d.getBoundingClientRect())
      .filter(b => b.height > 0);
    const h = boxes.length ? Math.max(...boxes.map(b => b.bottom)) - Math.min(...boxes.map(b => b.top)) : 0;
    return h > 0 && el._fullLayout._size.h > 0 ? Math.min(1, Math.max(0.2, h / el._fullLayout._size.h)) : 1;
  };
  // projector mode: the visible tab's main (first) figure made short enough to end inside the window
  const fit = () => {
    // (a presented figure is sized by present.js)
    if (!document.body.classList.contains('projector') || document.body.classList.contains('presenting') || !window.Plotly) return;
    document.querySelectorAll('[id^="tab-"]').forEach(panel => {
      const el = panel.querySelector('.js-plotly-plot');
      if (!el || el.offsetParent === null || !el._fullLayout || el.explorerPlaced) return;
      const top = el.getBoundingClientRect().top + window.scrollY;
      const room = Math.floor(window.innerHeight - top - 12);
      // back up to the height it was sent with as far as the room allows: a figure first drawn while the header
      // above it was still wrapping got a room that later grew (the memory lab's plot area had shrunk to nothing)
      const sent = (el.explorerSource && el.explorerSource[1] && el.explorerSource[1].height) || el._fullLayout.height;
      // never so short that the plot area falls under MIN_PLOT, even if it was sent shorter: past the window's
      // bottom instead (a figure laid out for a desk had 96-250 px of plot under projector mode's larger text)
      const least = el._fullLayout.height - el._fullLayout._size.h + Math.ceil(MIN_PLOT / plotShare(el)) + 2;
      // (a figure low on the page, with little room under it, keeps its height but still grows to the least)
      const want = room >= 240 ? Math.max(Math.min(sent, room), least) : Math.max(el._fullLayout.height, least);
      if (Math.abs(el._fullLayout.height - want) > 2) window.Plotly.relayout(el, {height: want});
    });
  };
  // One figure saved as PNG or SVG: laid out as on screen, scaled to fill a 1920×1080 slide (text grows with it),
  // named after its title. Returns Plotly's promise, so several can be saved one after the other.
  const save = (gd, format) => {
    const L = gd._fullLayout || {};
    const w = L.width || 700, h = L.height || 450;
    const title = (L.title && L.title.text) || 'figure';
    const name = title.replace(/<[^>]*>/g, ' ').replace(/&[a-z]+;/g, ' ').replace(/[^\w.-]+/g, '_')
      .replace(/^_+|_+$/g, '').slice(0, 80) || 'figure';
    return window.Plotly.downloadImage(gd, {format: format, width: w, height: h,
                                            scale: Math.min(1920 / w, 1080 / h), filename: name});
  };
  // every figure of the tab ``tabId`` saved as ``format``, one file each, in page order
  const saveTab = async (tabId, format) => {
    for (const gd of document.querySelectorAll('#tab-' + tabId + ' .js-plotly-plot')) {
      if (gd._fullLayout) await save(gd, format);
    }
  };
  // every figure's hover bar: "PNG" and "SVG" buttons (in place of Plotly's camera), at slide size. One pair of
  // button objects for all figures, so that a redraw's config equals the figure's own: Plotly then updates the
  // figure in place; a changed config makes it re-plot from scratch while Gradio resizes it, and a colour bar
  // drawn in that race throws and leaves the tab's progress showing.
  let BUTTONS = null;
  const buttons = () => {
    const icon = (format) => format === 'png' ? window.Plotly.Icons.camera  // a picture; SVG: a drawing
                             : (window.Plotly.Icons.pencil || window.Plotly.Icons.disk);
    BUTTONS = BUTTONS || ['png', 'svg'].map(format => ({
      name: 'Download as ' + format.toUpperCase() + ' (sized for a 1920×1080 slide)', icon: icon(format),
      click: (gd) => save(gd, format)}));
    return BUTTONS;
  };
  const withButtons = (config) => Object.assign({}, config || {}, {modeBarButtonsToAdd: buttons(),
                                                                   modeBarButtonsToRemove: ['toImage']});
  // Gradio's redraws (a new answer, Play, a slider) with the buttons, and in projector mode the main figure drawn
  // short enough from the start: no jump from full height
  const wrapRedraws = () => {
    const P = window.Plotly;
    if (!P || P.react.explorerWrapped) return;
    const react = P.react;
    P.react = function (el, data, layout, config) {
      if (el && !this.explorerRestyle) el.explorerSource = [data, layout];  // as sent: projector mode off again
      // Gradio raises a titled figure's top margin to 100 px for a label floated over it; page.css puts the label
      // above the figure instead, so a figure that says what it meant (meta.top) gets those px back for its plot
      const meant = layout && layout.meta && layout.meta.top, m = (layout && layout.margin) || {};
      if (meant !== undefined && meant < 100 && m.t === 100) {
        layout = Object.assign({}, layout, {margin: Object.assign({}, m, {t: meant})});
      }
      if (layout) layout = narrowLayout(layout);
      // ... and the traces' own phone changes (layout.meta.narrow_traces: one patch a trace, such as shorter cell text)
      const patches = layout && window.innerWidth < 640 && layout.meta && layout.meta.narrow_traces;
      if (Array.isArray(patches) && Array.isArray(data)) {
        data = data.map((t, i) => patches[i] ? merged(t, patches[i]) : t);
      }
      if (layout && data) {
        const flat = narrowBar(data, layout);
        if (flat !== data) [data, layout] = [flat, narrowBarLayout(layout)];
      }
      if (document.body.classList.contains('projector') && layout) [data, layout] = projectorSizes(data, layout);
      const panel = document.body.classList.contains('projector') && el && el.closest && el.closest('[id^="tab-"]');
      const presented = window.explorerPresentedHeight && window.explorerPresentedHeight(el);
      if (presented && layout) layout = Object.assign({}, layout, {height: presented});
      else if (el && el.explorerPlaced && layout) layout = Object.assign({}, layout, {height: el.explorerPlaced});
      else if (panel && layout && panel.querySelector('[data-testid="plotly"]') === el) {
        const room = Math.floor(window.innerHeight - (el.getBoundingClientRect().top + window.scrollY) - 12);
        const m = layout.margin || {}, least = MIN_PLOT + (m.t === undefined ? 100 : m.t) + (m.b === undefined ? 80 : m.b);
        const want = Math.max(room, Math.min(least, layout.height || 450));
        if (room >= 240 && (layout.height || 450) > want) layout = Object.assign({}, layout, {height: want});
      }
      if (layout) layout = Object.assign({}, layout, {modebar: Object.assign({}, layout.modebar, {orientation: 'h'})});
      config = withButtons(config);
      if (!this.explorerRestyle && window.explorerRedrawn) window.explorerRedrawn(el);
      try {
        return react.call(this, el, data, layout, config);
      } catch (e) {
        // a figure drawn while its tab is still being laid out can be squeezed until a colour bar has no length
        // (Plotly throws "axis scaling"): drawn again once the layout has settled, instead of leaving the
        // tab's progress showing with the old figure
        console.warn('explorer: redrawing a figure after', String(e), el.getBoundingClientRect().height, el.offsetParent === null);
        setTimeout(() => { try { react.call(P, el, data, layout, config); } catch (e2) { console.warn(String(e2)); } }, 250);
        return Promise.resolve(el);
      }
    };
    P.react.explorerWrapped = true;
    window.explorerRestyle = () => document.querySelectorAll('.js-plotly-plot').forEach(el => {
      if (el.explorerSource && el._fullLayout) P.react.call({explorerRestyle: true}, el, ...el.explorerSource, el._context);
    });
    const resize = P.Plots.resize;
    P.Plots.resize = function (gd) {
      try { return resize.apply(this, arguments); } catch (e) { console.warn('explorer: resize', String(e)); return Promise.resolve(gd); }
    };
  };
  const downloads = () => {
    if (!window.Plotly) return;
    document.querySelectorAll('.js-plotly-plot').forEach(el => {
      const c = el._context;
      if (!c || !el._fullLayout || c.modeBarButtonsToAdd === buttons()) return;
      Object.assign(c, withButtons({}));
      window.Plotly.relayout(el, {'modebar.orientation': 'h'});  // redraws the hover bar only
    });
  };
  window.explorerWrapRedraws = wrapRedraws;
  window.explorerFit = fit;
  window.explorerThin = thin;
  window.explorerButtons = downloads;
  window.explorerSave = save;
  window.explorerSaveTab = saveTab;
  window.explorerDrawn = (gd) => !!gd._fullLayout;
  window.explorerHeight = (gd) => gd._fullLayout && gd._fullLayout.height;
  // the least height that keeps a figure's plot area at the audit's rule: 300 px in projector mode, 200 on a phone
  window.explorerLeast = (gd) => {
    const L = gd._fullLayout, least = document.body.classList.contains('projector') ? MIN_PLOT : 210;
    return L ? L.height - L._size.h + Math.ceil(least / plotShare(gd)) + 2 : 240;
  };
  // panels one above another (their y domains differ): squeezed, the gaps between them shrink with the figure and
  // each panel's ticks run into the next one's title
  window.explorerStacked = (gd) => {
    const L = gd._fullLayout;
    if (!L) return false;
    const tops = new Set(Object.keys(L).filter(k => /^yaxis\d*$/.test(k)).map(k => (L[k].domain || [0, 1]).join()));
    return tops.size > 1;
  };
  window.explorerShared = (gds, more) => {
    const rows = new Set(gds.map(gd => Math.round(gd.getBoundingClientRect().top / 20))).size;
    return gds.map(gd => Math.floor(window.explorerHeight(gd) + more / rows));
  };
  window.explorerPlace = (gd, h) => {
    if (document.body.classList.contains('deck')) gd.explorerPlaced = h;
    return window.Plotly.relayout(gd, {height: h});
  };
  window.explorerUnplace = () => document.querySelectorAll('.js-plotly-plot').forEach(gd => { delete gd.explorerPlaced; });
  // the wrapper as soon as Plotly is loaded: before the figures of the first answer are drawn (a progress timer
  // can keep the page's debounced observer from firing for as long as an event runs)
  if (window.Plotly) wrapRedraws();
  else {
    let plotly;
    Object.defineProperty(window, 'Plotly', {configurable: true, enumerable: true, get: () => plotly,
                                             set: (value) => { plotly = value; wrapRedraws(); }});
  }
})();
