"""Transformer Explorer: a Gradio app around a from-scratch Llama-style decoder and a classic encoder.

``python app.py`` serves it; ``build_demo()`` assembles the tabs from explorer/panels/ (tests launch it
in-process). Nothing else lives here.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time

if __name__ == "__main__" and os.name == "posix" and "PYTHONMALLOC" not in os.environ:
    # Python's own small-object arenas stay pinned by a few survivors after many sessions (about 350 MiB after
    # 600, measured); in glibc's heaps the idle sweeper's malloc_trim hands them back. Same process id, same args.
    os.environ["PYTHONMALLOC"] = "malloc"
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])

if importlib.util.find_spec("spaces"):  # Hugging Face ZeroGPU: its package must load before torch sets up CUDA
    import spaces  # noqa: F401

import gradio as gr

from explorer import glossary

from explorer.web import links

from explorer.state import session

from explorer.web import serving

from explorer.web import gradio_adapter
from explorer.web import middleware
from explorer.web.clients import with_client
from explorer.web.groups import VIEW, lane
from explorer.panels.attention import build_attention
from explorer.panels.encoder_decoder import build_encoder_decoder
from explorer.panels.experiments import build_experiments
from explorer.panels.generation import build_generation
from explorer.panels.lora import build_lora
from explorer.panels.memory import build_memory
from explorer.panels.model import build_model, load_model, local_checkpoints
from explorer.panels.positions import build_positions
from explorer.panels import vote
from explorer.panels.training import build_training, connect_header
from explorer.state.snapshots import snapshot_names
from explorer.panels.walkthrough import build_walkthrough

TITLE = "Transformer Explorer"
# Lecture order: one token through the model, then attention and experiments that test it, positions, generation with its cache, what
# attention costs, adapting and shrinking the model, the encoder for contrast; the model card last.
TABS = [
    ("Inside the model", "walkthrough", build_walkthrough),
    ("Attention", "attention", build_attention),
    ("Experiments", "experiments", build_experiments),
    ("Training", "training", build_training),
    ("Positions", "positions", build_positions),
    ("KV cache & generation", "generation", build_generation),
    ("Memory lab", "memory", build_memory),
    ("LoRA & int8", "lora", build_lora),
    ("Encoder vs decoder", "encoder_decoder", build_encoder_decoder),
    ("Model", "model", build_model),
]
CSS = """
#header-row {align-items: end}
abbr.term {text-decoration: underline dotted; cursor: help}
/* projector mode (the header's switch or ?present=1): larger text and plot ticks, intros cut to their first line */
body.projector {--text-xs: 15px; --text-sm: 16px; --text-md: 18px; --text-lg: 20px; --text-xl: 24px;
  --prose-text-size: 18px; --input-text-size: 18px; --block-label-text-size: 16px; --block-info-text-size: 16px;
  --block-title-text-size: 18px; --button-large-text-size: 18px; --button-small-text-size: 16px;
  --section-header-text-size: 18px; font-size: 18px}
body.projector .gradio-container {font-size: 18px}
body.projector .js-plotly-plot .xtick text, body.projector .js-plotly-plot .ytick text,
body.projector .js-plotly-plot .cbaxis text {font-size: 16px !important}
body.projector .textfield, body.projector .textfield .text {font-size: 18px !important}  /* generated text */
body.projector .intro .md > *:not(:first-child) {display: none}
body.projector .intro.open .md > *:not(:first-child) {display: revert}
body.projector .intro .md > :first-child {cursor: pointer; margin-bottom: 0}
body.projector .intro:not(.open) .md > :first-child::after {content: " ▸ more"; font-size: 14px; opacity: 0.7}
#header-row h2 {margin: 0; white-space: nowrap}
/* the title keeps its whole width (Gradio lets a Markdown block shrink to nothing and clips it): the other header
   items wrap instead; on a phone it takes a line of its own, smaller, and wraps between its words */
#header-title {flex: 0 0 auto !important; width: auto !important; min-width: max-content !important;
  overflow: visible !important}
@media (max-width: 640px) {
  #header-title {flex-basis: 100% !important; min-width: 0 !important}
  #header-row #header-title h2 {white-space: normal; font-size: 22px}
}
/* Gradio's dark theme (?__theme=dark): plots drawn on a dark background, their text light */
.dark .js-plotly-plot .main-svg {background: transparent !important}
.dark .js-plotly-plot rect.bg {fill: #1f2430 !important}
.dark .js-plotly-plot .gridlayer path, .dark .js-plotly-plot .zerolinelayer path {stroke: #3a4050 !important}
.dark .js-plotly-plot .xtick text, .dark .js-plotly-plot .ytick text, .dark .js-plotly-plot .gtitle,
.dark .js-plotly-plot .xtitle, .dark .js-plotly-plot .ytitle, .dark .js-plotly-plot .cbaxis text,
.dark .js-plotly-plot .cbtitle text, .dark .js-plotly-plot .legendtext,
.dark .js-plotly-plot .annotation-text {fill: #e6e6e6 !important}
.dark .js-plotly-plot .legend .bg {fill: #1f2430 !important}
/* the generation chart's softmax ticks (#333 on white) drawn light on the dark background, legend symbol too */
.dark .js-plotly-plot path[style*="stroke: rgb(51, 51, 51)"] {stroke: #e6e6e6 !important}
/* generated text: Gradio's HighlightedText sets word-break: break-all, which splits words at a line's end ("bas|ket");
   break between words, and inside one only when it is wider than the whole line */
.textfield, .textfield .token-container, .textfield .token, .textfield .text {word-break: normal !important;
  overflow-wrap: break-word}
/* a link's focus=<name>: the figure it lands on, framed for a few seconds (an overlay: a plot's layers would
   cover an outline, and a parent's overflow would clip one drawn outside) */
.focus-flash {position: relative}
.focus-flash::after {content: ""; position: absolute; inset: 0; border: 4px solid #f59e0b; border-radius: 8px;
  pointer-events: none; z-index: 20}
.save-figures {align-items: center; opacity: 0.85}
.save-figures .prose {margin: 0}
/* a phone: nothing wider than the page; each tab's main figure right under its intro, its controls after it (the
   page script marks the branches that hold them: .main-first, .intro-first); a desktop keeps the written order */
@media (max-width: 640px) {.js-plotly-plot, .plot-container {max-width: 100%; overflow-x: auto}
  /* a figure's label on one line: wrapped, it covered the figure's own title */
  label[data-testid="block-label"].float {white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
    max-width: calc(100% - 16px)}
  [id^="tab-"] .intro-first {order: -2}
  [id^="tab-"] .main-first {order: -1}}
"""
# Runs once on page load: projector mode from ?present=1; each tab's first Markdown becomes its intro (folded
# to its first line in projector mode, a click unfolds it).
ON_LOAD_JS = r"""() => {
  const SAVE = SAVE_FIGURE;
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
  // Projector mode sets its 16 px in each figure's layout, not only in CSS: Plotly then places colour-bar titles,
  // margins and tick spacing for the text as drawn (CSS-enlarged text overlapped the titles Plotly had placed)
  const BIG = 16;
  const bigger = (f) => Object.assign({}, f || {}, {size: Math.max(BIG, (f && f.size) || 0)});
  const withBar = (o) => Object.assign({}, o, {colorbar: Object.assign({}, o.colorbar, {tickfont: bigger((o.colorbar || {}).tickfont)})});
  const projectorSizes = (data, layout) => {
    const L = Object.assign({}, layout);
    ['xaxis', 'yaxis', ...Object.keys(L).filter(k => /^[xy]axis\d+$/.test(k))].forEach(k => {
      // token (category) axes make room for their longer 16 px labels; numeric axes keep their margins: a figure
      // with a legend below (the memory lab's) shrank to nothing when every axis pushed its margin out
      const grow = (L[k] || {}).type === 'category' ? {automargin: true} : {};
      L[k] = Object.assign({}, L[k], {tickfont: bigger((L[k] || {}).tickfont)}, grow);
    });
    Object.keys(L).filter(k => /^coloraxis\d*$/.test(k)).forEach(k => { L[k] = withBar(L[k] || {}); });
    const D = (data || []).map(t => {
      let c = t;
      if (t.colorbar || (/^(heatmap|contour)/.test(t.type || '') && !t.coloraxis && t.showscale !== false)) c = withBar(c);
      if (t.texttemplate || (t.text && /^heatmap/.test(t.type || ''))) c = Object.assign({}, c, {textfont: bigger(t.textfont)});
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
    return narrow ? merged(layout, narrow) : wrapTitle(layout);
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
  // projector mode: the visible tab's main (first) figure made short enough to end inside the window
  const fit = () => {
    if (!document.body.classList.contains('projector') || !window.Plotly) return;
    document.querySelectorAll('[id^="tab-"]').forEach(panel => {
      const el = panel.querySelector('.js-plotly-plot');
      if (!el || el.offsetParent === null || !el._fullLayout) return;
      const top = el.getBoundingClientRect().top + window.scrollY;
      const room = Math.floor(window.innerHeight - top - 12);
      // back up to the height it was sent with as far as the room allows: a figure first drawn while the header
      // above it was still wrapping got a room that later grew (the memory lab's plot area had shrunk to nothing)
      const sent = (el.explorerSource && el.explorerSource[1] && el.explorerSource[1].height) || el._fullLayout.height;
      const want = Math.min(sent, room);
      if (room >= 240 && Math.abs(el._fullLayout.height - want) > 2) window.Plotly.relayout(el, {height: want});
    });
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
      click: (gd) => SAVE(gd, format)}));
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
      if (layout) layout = narrowLayout(layout);
      if (document.body.classList.contains('projector') && layout) [data, layout] = projectorSizes(data, layout);
      const panel = document.body.classList.contains('projector') && el && el.closest && el.closest('[id^="tab-"]');
      if (panel && layout && panel.querySelector('[data-testid="plotly"]') === el) {
        const room = Math.floor(window.innerHeight - (el.getBoundingClientRect().top + window.scrollY) - 12);
        if (room >= 240 && (layout.height || 450) > room) layout = Object.assign({}, layout, {height: room});
      }
      if (layout) layout = Object.assign({}, layout, {modebar: Object.assign({}, layout.modebar, {orientation: 'h'})});
      config = withButtons(config);
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
    // projector mode switched: every drawn figure again from what was sent, at the new sizes
    window.explorerRestyle = () => document.querySelectorAll('.js-plotly-plot').forEach(el => {
      if (el.explorerSource && el._fullLayout) P.react.call({explorerRestyle: true}, el, ...el.explorerSource, el._context);
    });
    // Gradio resizes right after each redraw: a figure whose redraw threw above throws here too until redrawn
    const resize = P.Plots.resize;
    P.Plots.resize = function (gd) {
      try { return resize.apply(this, arguments); } catch (e) { console.warn('explorer: resize', String(e)); return Promise.resolve(gd); }
    };
  };
  // figures drawn before the wrapper was in place get the same buttons once
  const downloads = () => {
    if (!window.Plotly) return;
    window.explorerSave = SAVE;
    document.querySelectorAll('.js-plotly-plot').forEach(el => {
      const c = el._context;
      if (!c || !el._fullLayout || c.modeBarButtonsToAdd === buttons()) return;
      Object.assign(c, withButtons({}));
      window.Plotly.relayout(el, {'modebar.orientation': 'h'});  // redraws the hover bar only
    });
  };
  let timer = null;
  // the wrapper as soon as Plotly is loaded: before the figures of the first answer are drawn (a progress timer
  // can keep the debounced observer below from firing for as long as an event runs)
  if (window.Plotly) wrapRedraws();
  else {
    let plotly;
    Object.defineProperty(window, 'Plotly', {configurable: true, enumerable: true, get: () => plotly,
                                             set: (value) => { plotly = value; wrapRedraws(); }});
  }
  new MutationObserver(() => { wrapRedraws(); clearTimeout(timer); timer = setTimeout(() => { mark(); downloads(); fit(); thin(); }, 150); })
    .observe(document.body, {childList: true, subtree: true});
  window.explorerFit = fit;
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
}"""
# One figure saved as PNG or SVG: laid out as on screen, scaled to fill a 1920×1080 slide (text grows with it),
# named after its title. Returns Plotly's promise, so several can be saved one after the other.
SAVE_FIGURE_JS = r"""(gd, format) => {
  const L = gd._fullLayout || {};
  const w = L.width || 700, h = L.height || 450;
  const title = (L.title && L.title.text) || 'figure';
  const name = title.replace(/<[^>]*>/g, ' ').replace(/&[a-z]+;/g, ' ').replace(/[^\w.-]+/g, '_')
    .replace(/^_+|_+$/g, '').slice(0, 80) || 'figure';
  return window.Plotly.downloadImage(gd, {format: format, width: w, height: h,
                                          scale: Math.min(1920 / w, 1080 / h), filename: name});
}"""
ON_LOAD_JS = ON_LOAD_JS.replace("SAVE_FIGURE", SAVE_FIGURE_JS)


def save_tab_js(tab_id: str, fmt: str) -> str:
    """A button's JS: every figure of the tab ``tab_id`` saved as ``fmt``, one file each, in page order."""
    return (f"async () => {{ for (const gd of document.querySelectorAll('#tab-{tab_id} .js-plotly-plot')) "
            f"{{ if (gd._fullLayout && window.explorerSave) await window.explorerSave(gd, '{fmt}'); }} }}")


def mark_terms(block) -> None:
    """Our texts in a tab (each Markdown's value at build time, never a visitor's) with the glossary's terms
    marked where they first appear: hovering one shows its definition."""
    for child in getattr(block, "children", []):
        if isinstance(child, gr.Markdown) and isinstance(child.value, str) and child.value:
            # set after construction, through the adapter: the panels make these Markdowns, and the page is built later
            gradio_adapter.set_initial(child, glossary.mark(child.value))
        mark_terms(child)


PROJECTOR_JS = ("(on) => { document.body.classList.toggle('projector', !!on); if (window.explorerRestyle) window.explorerRestyle();"
                " window.dispatchEvent(new Event('resize')); if (window.explorerFit) setTimeout(window.explorerFit, 200); }")

# Concurrency per event, the queue's size and each session's share of it are set in explorer/web/serving.py.
QUEUE = serving.QUEUE
MAX_UPLOAD = "1mb"  # per file; no component takes files, so explorer/middleware.py refuses every upload request


def launch_kwargs() -> dict:
    """Theme and CSS (Gradio 6 takes them in launch()). System fonts only: nothing is fetched from a CDN."""
    theme = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
    return {"theme": theme, "css": CSS + vote.CSS, "max_file_size": MAX_UPLOAD, "app_kwargs": middleware.app_kwargs()}


#: For each app built with ``openings_later``: (the tab a page opens on, the status line of the openings).
OPENING_PLACES: dict = {}


def build_demo(openings_later: bool = False) -> gr.Blocks:
    """The whole app. With ``openings_later`` (``python app.py``) the opening examples are computed after the
    server answers (``serving.start_openings``, the page saying so meanwhile); otherwise here, before it returns."""
    started = time.time()
    session.load_default()  # the shipped model, loaded once at start-up from assets/ (no network)
    with gr.Blocks(title=TITLE, analytics_enabled=False, fill_width=True) as demo:  # no calls home
        state = gr.State(session.new_state())  # per browser session: the model this user looks at
        with gr.Row(elem_id="header-row", equal_height=True):
            gr.Markdown(f"## {TITLE}", scale=2, min_width=220, elem_id="header-title")
            picker = gr.Dropdown(["default", *local_checkpoints(), *snapshot_names()], value="default",
                                 allow_custom_value=True, show_label=False, container=False, scale=2, min_width=180, elem_id="header-model")
            load = gr.Button("Load model", variant="primary", scale=0, min_width=110, elem_id="header-load")
            projector = gr.Checkbox(label="Projector mode", value=False, scale=0, min_width=150, container=False,
                                    elem_id="projector")
            copy = gr.Button("🔗 Copy link to this view", scale=0, min_width=200, elem_id="copy-link")
            link = gr.Textbox(show_label=False, interactive=False, buttons=["copy"], container=False, scale=2,
                              min_width=180, elem_id="view-link", lines=1, max_lines=1,
                              placeholder="the view's link appears here")
        notice = gr.Textbox(label="About this link", visible=False, interactive=False, elem_id="link-notice")
        status = gr.Markdown(serving.COMPUTING_ALL, visible=openings_later, elem_id="opening-status")
        vote.build_join(demo)  # a phone's vote view, shown alone for ?join=CODE
        with gr.Accordion(about_label(started), open=False, elem_id="glossary"):
            gr.Markdown("A Llama-style decoder written from scratch, and what happens inside it. Every number on "
                        "screen is computed now, on this machine, by the code that is running. The model picker "
                        "above loads a model for every tab (a Hub id or a folder under the model root; the Model "
                        "tab shows its card).\n\n" + glossary.markdown())
        first_tab = None
        with gr.Tabs(overflow_behavior="wrap") as tabs:  # every tab in sight, on a phone too
            for label, tab_id, build in TABS:
                with gr.Tab(label, id=tab_id, elem_id=f"tab-{tab_id}") as tab:
                    first_tab = first_tab or tab  # the tab a page opens on
                    build(demo, state)
                    with gr.Row(elem_classes="save-figures"):
                        gr.Markdown("Save every figure of this tab, sized for a 1920×1080 slide:")
                        for fmt in ("png", "svg"):
                            gr.Button(f"⬇ {fmt.upper()}", size="sm", scale=0, min_width=90,
                                      elem_id=f"save-{tab_id}-{fmt}").click(
                                None, js=save_tab_js(tab_id, fmt), api_name=f"save_{tab_id}_{fmt}",
                                api_visibility="private")
                mark_terms(tab)
        card = links.views(demo)["model"].outputs
        links.register_model_loads(demo, load.click(with_client(load_model), [picker, state], [*card, state],
                                                    api_name="header_load_model", api_visibility="private", **lane(VIEW)))
        connect_header(demo, tabs, picker, card)  # "knock out at this step" loads a snapshot, opens Experiments
        links.wire(demo, tabs, notice)
        inputs, js = links.copy_link_js(demo)
        copy.click(None, inputs, [link], js=js, api_name="copy_link", api_visibility="private")
        demo.load(None, None, [projector], js=ON_LOAD_JS, api_name="projector_from_link", api_visibility="private")
        projector.change(None, [projector], None, js=PROJECTOR_JS, api_name="projector", api_visibility="private")
    demo.queue(**QUEUE)
    serving.apply(demo, openings_later=openings_later)  # computes every tab's opening example into the page
    if openings_later:
        OPENING_PLACES[demo] = (first_tab, status)
    return demo


def about_label(started: float) -> str:
    """The About line, always in sight: it says that the opening examples were computed at start-up, and when."""
    import datetime

    when = datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%H:%M UTC")
    return f"About · glossary · each tab opens on an example computed at start-up ({when}); what you change is computed now"


def server_name(env=None) -> str:
    """Where ``python app.py`` listens: this machine only (127.0.0.1), unless on a Space (``SPACE_ID`` set: its
    proxy must reach the app) or the operator sets ``GRADIO_SERVER_NAME`` (0.0.0.0 opens it to a classroom's
    network on purpose: docs/operating.md)."""
    import os

    env = os.environ if env is None else env
    if env.get("GRADIO_SERVER_NAME"):
        return env["GRADIO_SERVER_NAME"]
    return "0.0.0.0" if env.get("SPACE_ID") else "127.0.0.1"


def main() -> None:
    """``python app.py``: the server answers first, then computes the opening examples (about as long again on
    2 cores), the page saying so and filling in."""
    demo = build_demo(openings_later=True)
    demo.launch(server_name=server_name(), prevent_thread_lock=True, **launch_kwargs())
    serving.start_openings(demo, *OPENING_PLACES[demo])
    demo.block_thread()


if __name__ == "__main__":
    main()
