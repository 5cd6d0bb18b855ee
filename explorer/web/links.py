"""Links to any view, and every tab following the loaded model.

Each panel registers its main view at the end of its build: the handler that computes the tab's opening example,
its inputs and outputs, and its URL parameters (query key -> component). ``wire`` (called once by app.py, after
every tab is built) then chains each view after a hidden trigger of its tab (``apply-link-<tab>``):

1. ``read_link_<tab>``: reads ``gr.Request``'s query, selects the linked tab and sets the linked components, after
   the same checks the component applies to typed input (a choice among the dropdown's choices, a number inside
   the slider's range, ...); a value that fails is ignored and a sentence says so, in a text box (never HTML);
2. then the tab's view, with the components' values as they now are: the link's where it gave them, the
   defaults elsewhere.

The page's JS (``link_js``) clicks the linked tab's trigger only when the URL carries a link; a link naming no
known tab clicks ``apply-link``, which only says what was ignored. Without a link the page sends nothing: every
view's opening example, with the build-time values, is computed once at start-up into the page itself
(``explorer.web.opening``, run by ``explorer.web.serving.apply`` on the events ``opening_events`` lists).

The scheme: ``?tab=<tab id>&<key>=<value>...``, the keys being the ones each panel registers (``link_keys(demo)``
lists them, docs/lesson.md shows examples); ``present=1`` turns projector mode on; ``focus=<name>`` scrolls to a
figure the tab registered under that name and outlines it (``focus_targets(demo)`` lists them). Lists
(multiselect dropdowns) are comma-separated.

After a model is loaded (the Model tab or the header picker), ``after_model_load`` resets the model-dependent
controls (layer, head, ...) to their defaults (a view's ``model_defaults`` gives those that depend on the model,
such as its rope_theta) and re-runs every registered view for the new model.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import gradio as gr

from explorer.state.openings import cached_opening
from explorer.web import link_model
from explorer.web.clients import with_client
from explorer.web.groups import VIEW, Lane, lane
from explorer.web.page import script

MAX_TEXT = 2000  # characters of a prompt carried by a link; the handlers' own limits apply after
RESERVED = ("tab", "present", "__theme", "focus", "model", "lesson")
#: Keys that change the page, not a view: a URL with only these carries no link.
PAGE_KEYS = ("present", "__theme")


@dataclass
class View:
    """One tab's main view: what computes it, from which components, and which of them a link can set."""
    tab: str
    handler: Callable
    inputs: list
    outputs: list
    api_name: str
    params: dict[str, gr.components.Component] = field(default_factory=dict)
    then: list = field(default_factory=list)  # (fn, inputs, outputs, api_name[, visibility]) run after the view
    follow_model: bool = True
    model_defaults: Callable | None = None  # state -> {key: value or update}: defaults that depend on the model
    names: dict = field(default_factory=dict)  # key -> {name: value}: values a link gives by name (step=scores)
    resets: dict = field(default_factory=dict)  # component -> value after a model load or a link (no key sets them)
    focus: dict = field(default_factory=dict)  # name -> [element ids]: what ``focus=<name>`` scrolls to
    lane: Lane = VIEW  # the queue's lane of the view's runs (``explorer.web.groups``); what runs after it: views


_VIEWS: "weakref.WeakKeyDictionary[gr.Blocks, dict[str, View]]" = weakref.WeakKeyDictionary()


def register(demo: gr.Blocks, tab: str, handler: Callable, inputs: list, outputs: list, *, api_name: str,
             params: dict | None = None, then: list | None = None, follow_model: bool = True,
             model_defaults: Callable | None = None, names: dict | None = None,
             resets: dict | None = None, focus: dict | None = None, lane: Lane = VIEW) -> View:
    """Declare ``tab``'s main view; app.py wires it (opening example, deep link, model reload).

    then: more (fn, inputs, outputs, api_name[, visibility]) run after the view, in order (visibility at page
    load: "undocumented" unless given). model_defaults(state): after a model load, the values (or component
    updates) of the settings whose default depends on the model, by link key; the others go back to their
    build-time values. names: {key: {name: value}}: a link may give those keys' values by name, and "copy link"
    writes the name, so that links keep meaning the same thing when the values behind the names move (a
    walkthrough step added before "scores" shifts every later step's number). resets: {component: value} for
    controls that are not link keys but hold something only the old model or the page's own example has (a token
    position): set after a model load and when a link opens the tab. focus:
    {name: component or [components]}: the figures (with the text that goes with them) a link's ``focus=<name>``
    scrolls into view and highlights once its view has been computed (each component needs an ``elem_id``).
    lane: the queue's lane of the view's runs (``explorer.web.groups``; VIEW unless it is a long job)."""
    views = _VIEWS.setdefault(demo, {})
    if tab in views:
        raise ValueError(f"tab {tab!r} registered twice.")
    for key in params or {}:
        if key in RESERVED:
            raise ValueError(f"{key!r} is a reserved link key.")
    for key in names or {}:
        if key not in (params or {}):
            raise ValueError(f"names given for {key!r}, which is not a link key of {tab!r}.")
    targets = {}
    for name, group in (focus or {}).items():
        group = group if isinstance(group, (list, tuple)) else [group]
        if not group or any(not getattr(c, "elem_id", None) for c in group):
            raise ValueError(f"focus {name!r} of {tab!r}: every component needs an elem_id.")
        targets[name] = [c.elem_id for c in group]
    views[tab] = View(tab, handler, list(inputs), list(outputs), api_name, dict(params or {}), list(then or []),
                      follow_model, model_defaults, dict(names or {}), dict(resets or {}), targets, lane)
    return views[tab]


_LOADS: "weakref.WeakKeyDictionary[gr.Blocks, list]" = weakref.WeakKeyDictionary()
_FOLLOWERS: "weakref.WeakKeyDictionary[gr.Blocks, list]" = weakref.WeakKeyDictionary()


def register_model_loads(demo: gr.Blocks, *events) -> None:
    """Events that load a model for the session (their ``.success`` re-runs every tab's view: see ``wire``)."""
    _LOADS.setdefault(demo, []).append(list(events))


def follow_model_loads(demo: gr.Blocks, fn: Callable, inputs: list, outputs: list, *, api_name: str) -> None:
    """``fn`` runs after every model load, never at page load: for a section that measures only when asked, so
    that its figures never stay on screen under another model's name."""
    _FOLLOWERS.setdefault(demo, []).append((fn, list(inputs), list(outputs), api_name))


def views(demo: gr.Blocks) -> dict[str, View]:
    return _VIEWS.get(demo, {})


# --- checking a value from a link as the component would check typed input -------------------------------------

def _choice_values(component) -> list:
    return [c[1] if isinstance(c, (tuple, list)) else c for c in (component.choices or [])]


def _match_choice(raw: str, component):
    for value in _choice_values(component):
        if str(value) == raw:
            return value
    labels = [c[0] for c in (component.choices or []) if isinstance(c, (tuple, list)) and str(c[0]) != str(c[1])]
    shown = ", ".join(str(v) for v in _choice_values(component)[:12])
    raise ValueError(f"must be one of {shown}" + (f" ({', '.join(labels[:4])}, …)" if labels else ""))


def _as_float(raw: str) -> float:
    try:
        x = float(raw)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(x):
        raise ValueError("must be a finite number")
    return x


def parse_value(raw: str, component):
    """The value ``raw`` (a query string) gives ``component``; ValueError with the reason otherwise."""
    if isinstance(component, gr.Textbox):
        if len(raw) > MAX_TEXT:
            raise ValueError(f"is longer than {MAX_TEXT} characters")
        return raw
    if isinstance(component, gr.Checkbox):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError("must be 1 or 0")
    if isinstance(component, gr.Dropdown) and component.multiselect:
        return [_match_choice(part.strip(), component) for part in raw.split(",") if part.strip()]
    if isinstance(component, (gr.Dropdown, gr.Radio)):
        return _match_choice(raw, component)
    if isinstance(component, (gr.Slider, gr.Number)):
        x = _as_float(raw)
        lo, hi = component.minimum, component.maximum
        if (lo is not None and x < lo) or (hi is not None and x > hi):  # a Number may have one bound only
            if lo is None or hi is None:
                raise ValueError(f"must be at least {lo:g}" if hi is None else f"must be at most {hi:g}")
            raise ValueError(f"must be between {lo:g} and {hi:g}")
        if isinstance(component, gr.Number) and component.precision == 0:
            if not x.is_integer():
                raise ValueError("must be a whole number")
            return int(x)
        step = getattr(component, "step", None)
        if isinstance(component, gr.Slider) and step and float(step).is_integer() and float(lo).is_integer():
            if not x.is_integer() or (x - lo) % step:
                raise ValueError(f"must be {lo:g} plus a multiple of {step:g}")
            return int(x)
        return x
    raise ValueError("cannot be set by a link")


def _quote(raw: str, limit: int = 40) -> str:
    raw = raw if len(raw) <= limit else raw[:limit - 1] + "…"
    return repr(raw)


def read_query(query: dict, views: dict[str, View]) -> tuple[str | None, dict, list[str]]:
    """(tab to select or None, {component: value}, sentences on what was ignored) for a link's query."""
    query, notes, _ = link_model.expand_lesson(query)  # a lesson's step: that step's own link
    tab = query.get("tab")
    if tab is None and not notes:
        extra = [k for k in query if k not in RESERVED or k == "focus"]
        if extra:
            notes.append(f"Ignored {', '.join(extra)}: a link needs tab=… to say which tab they belong to.")
        return None, {}, notes
    if tab is None:
        return None, {}, notes
    if tab not in views:
        notes.append(f"Ignored tab={_quote(tab)}: the tabs are {', '.join(views)}.")
        return None, {}, notes
    view = views[tab]
    values = {}
    for key, raw in query.items():
        if key == "focus" and raw not in view.focus:
            names = ", ".join(view.focus) or "no figure names"
            notes.append(f"Ignored focus={_quote(raw)}: the {tab} tab has {names}.")
        if key in RESERVED:
            continue
        component = view.params.get(key)
        if component is None:
            keys = ", ".join(view.params) or "no settings"
            notes.append(f"Ignored {key}={_quote(raw)}: the {tab} tab takes {keys}.")
            continue
        named = view.names.get(key, {})
        if raw in named:
            values[component] = named[raw]
            continue
        try:
            values[component] = parse_value(raw, component)
        except ValueError as exc:
            hint = f" (or a name: {', '.join(list(named)[:24])})" if named else ""
            notes.append(f"Ignored {key}={_quote(raw)}: it {exc}{hint}; the tab opened with its default.")
    return tab, values, notes


# --- wiring ---------------------------------------------------------------------------------------------------

def _unique(components) -> list:
    seen: list = []
    for c in components:
        if c not in seen:
            seen.append(c)
    return seen


def _param_components(views: dict[str, View]) -> list:
    return _unique(c for view in views.values() for c in view.params.values())


def _run_view(trigger, view: View, *, visibility: str, suffix: str = "", first: bool = False):
    """``trigger`` is an event's ``.then`` or ``.success``: the view runs after that event, then its ``then``.
    Returns the last event of the chain, or with ``first`` the id of the view's own event.

    With ``first`` (the chain a link runs, which also computes the opening example), every step answers from the
    shared result cache (``explorer.state.openings``): a class following one link computes it once."""
    def shared(fn, name):
        return cached_opening(name, fn) if first else fn

    name = view.api_name + suffix
    chained = trigger(shared(view.handler, name), view.inputs, view.outputs, api_name=name,
                      api_visibility=visibility, **lane(view.lane, view.handler))
    view_id = chained["id"]
    for fn, inputs, outputs, api_name, *own in view.then:
        shown = own[0] if own and not suffix else visibility  # after a model load, always private
        name = api_name + suffix
        chained = chained.then(shared(fn, name), inputs, outputs, api_name=name, api_visibility=shown,
                               **lane(VIEW, fn))
    return view_id if first else chained


_OPENINGS: "weakref.WeakKeyDictionary[gr.Blocks, list[int]]" = weakref.WeakKeyDictionary()
_LINK_EVENTS: "weakref.WeakKeyDictionary[gr.Blocks, list[int]]" = weakref.WeakKeyDictionary()

#: Element ids of the hidden buttons the page's JS clicks when its URL carries a link (``link_js``).
APPLY_LINK_ID = "apply-link"


def _link_reader(registered: dict[str, View], tab: str | None, components: list):
    """The handler that reads the link for ``tab``'s trigger (None: the trigger for a link naming no known tab)."""

    def read_link(state, request: gr.Request):
        query = dict(request.query_params) if request is not None else {}
        # the link's model first (as the header picker would load it), so that the view runs on it
        state, said, _ = with_client(link_model.ensure_model)(state, query.get("model"), client_request=request)
        found, values, notes = read_query(query, registered)
        notes = [said, *notes] if said else notes
        if found != tab:  # this trigger belongs to another tab (only an API client can get here)
            values = {}
        elif tab is not None:  # what only the page's own example had (a token position past the link's prompt)
            values = {**registered[tab].resets, **values}
        text = " ".join(notes)
        return [gr.Tabs(selected=found) if found else gr.skip(), gr.Textbox(value=text, visible=bool(text)),
                state, link_model.page_model_id(state), *[values[c] if c in values else gr.skip() for c in components]]

    return read_link


def wire(demo: gr.Blocks, tabs: gr.Tabs, notice: gr.Textbox, state: gr.State, page_model: gr.Textbox) -> None:
    """Every view's opening example and the links (see the module docstring).

    The views are chained after one hidden trigger per tab (``apply-link-<tab>``), which the page's JS clicks
    only when the URL carries a link (``link_js``): the link's values, then that tab's view. Their opening
    examples, with the build-time values, are computed once into the page (``explorer.web.opening``, from
    ``explorer.web.serving.apply``): a page opened without a link sends nothing. A link's ``model=`` is loaded
    into ``state`` before its view runs (``explorer.web.link_model``); ``page_model`` holds the id every link the
    page makes carries, after a link's load and after every model load (``register_model_loads``)."""
    registered = views(demo)
    general = gr.Button(visible="hidden", elem_id=APPLY_LINK_ID)
    read = general.click(_link_reader(registered, None, []), [state], [tabs, notice, state, page_model], api_name="read_link",
                         api_visibility="private", show_progress="hidden", **lane(VIEW))
    _LINK_EVENTS[demo] = [read["id"]]
    _OPENINGS[demo] = []
    for view in registered.values():
        components = _unique([*view.params.values(), *view.resets])
        trigger = gr.Button(visible="hidden", elem_id=f"{APPLY_LINK_ID}-{view.tab}")
        read = trigger.click(_link_reader(registered, view.tab, components), [state], [tabs, notice, state, page_model, *components],
                             api_name=f"read_link_{view.tab}", api_visibility="private", show_progress="hidden", **lane(VIEW))
        _LINK_EVENTS[demo].append(read["id"])
        _OPENINGS[demo].append(_run_view(read.then, view, visibility="undocumented", first=True))
    demo.load(None, js=link_js(focus_targets(demo)), api_name="open_link", api_visibility="private")
    for loads in _LOADS.get(demo, []):
        after_model_load(demo, loads, suffix=f"_{_LOADS[demo].index(loads)}")
        for n, event in enumerate(loads):  # the page's model id, for the links it makes; the loading line ends
            event.success(link_model.page_model_id, [state], [page_model], api_name=f"page_model_{_LOADS[demo].index(loads)}_{n}",
                          api_visibility="private", show_progress="hidden", **lane(VIEW))
            event.then(None, js=script("model_loaded.js"), api_name=f"model_loaded_{_LOADS[demo].index(loads)}_{n}",
                       api_visibility="private")


def opening_events(demo: gr.Blocks) -> list[int]:
    """The first event of each view's chain (the view itself; its ``then`` follow it): the opening examples."""
    return list(_OPENINGS.get(demo, []))


def link_events(demo: gr.Blocks) -> list[int]:
    """The events the hidden link triggers start (each tab's, and the one for a link naming no known tab)."""
    return list(_LINK_EVENTS.get(demo, []))


def link_js(focus: dict[str, dict[str, list[str]]]) -> str:
    """Run by the page on load: when the URL carries more than ``present`` / ``__theme``, click the linked tab's
    hidden trigger (or, for an unknown or missing tab, the one that explains what was ignored). With
    ``focus=<name>`` (``focus``: {tab: {name: [element ids]}}), once the page has been quiet for a moment, the named
    figure and its text are shrunk to fit the window if they must, scrolled to its top and outlined for a few
    seconds; placed again when a later answer redraws them, until the visitor scrolls, clicks or types."""
    return script("link.js", PAGE_KEYS=list(PAGE_KEYS), APPLY_LINK_ID=APPLY_LINK_ID, FOCUS=focus)


def focus_targets(demo: gr.Blocks) -> dict[str, dict[str, list[str]]]:
    """{tab: {name: [element ids]}}: what each tab's ``focus=<name>`` scrolls to."""
    return {tab: dict(view.focus) for tab, view in views(demo).items() if view.focus}


def defaults_of(view: View) -> list:
    """The build-time values of a view's non-text settings (layer 0 and head 0 exist in every model)."""
    return [c.value for c in view.params.values() if not isinstance(c, gr.Textbox)]


def after_model_load(demo: gr.Blocks, events: list, suffix: str) -> None:
    """After each of ``events`` (a model load) succeeds: model-dependent settings back to their defaults, then
    every registered view re-run for the new model, and every follower (``follow_model_loads``) run."""
    for fn, inputs, outputs, api_name in _FOLLOWERS.get(demo, []):
        for n, event in enumerate(events):
            event.success(fn, inputs, outputs, api_name=f"{api_name}{suffix}_{n}", api_visibility="private",
                          show_progress="hidden", **lane(VIEW))
    for view in views(demo).values():
        if not view.follow_model:
            continue
        keys = [k for k, c in view.params.items() if not isinstance(c, gr.Textbox)]
        settings = [view.params[k] for k in keys] + list(view.resets)
        state = next((c for c in view.inputs if isinstance(c, gr.State)), None)
        reset_inputs = [state] if view.model_defaults is not None and state is not None else None

        def reset(*args, view=view, keys=keys, defaults=defaults_of(view)):
            values = list(defaults)
            if view.model_defaults is not None:
                given = view.model_defaults(args[0] if args else None)
                values = [given.get(k, v) for k, v in zip(keys, values)]
            values += list(view.resets.values())
            return values if len(values) != 1 else values[0]

        for n, event in enumerate(events):
            tag = f"{suffix}_{n}"
            trigger = event.success
            if settings:
                trigger = event.success(reset, reset_inputs, settings, api_name=f"{view.tab}_defaults{tag}",
                                        api_visibility="private", show_progress="hidden", **lane(VIEW)).then
            _run_view(trigger, view, visibility="private", suffix=f"_after_load{tag}")


def link_keys(demo: gr.Blocks) -> dict[str, list[str]]:
    return {tab: list(view.params) for tab, view in views(demo).items()}


def copy_link_js(demo: gr.Blocks, page_model: gr.Textbox) -> tuple[list, str]:
    """(inputs, js) of the "copy link to this view" control: JS that finds the visible tab, reads its settings'
    values (passed in as the event's inputs, in the order of ``inputs``; the page's model id last) and builds the
    link, with ``model=`` unless the model is the default and ``present=1`` in projector mode."""
    registered = views(demo)
    components = _param_components(registered)
    index = {tab: {key: components.index(c) for key, c in view.params.items()} for tab, view in registered.items()}
    # value -> name, for the keys a link gives by name
    named = {tab: {key: {str(v): n for n, v in names.items()} for key, names in view.names.items()}
             for tab, view in registered.items() if view.names}
    return [*components, page_model], script("copy_link.js", INDEX=index, NAMED=named)
