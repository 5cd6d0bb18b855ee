"""One module per tab: build_<tab>(demo, state) lays out components and wires events.

Shared by the tabs: ``errors`` (what a visitor is told: ``user_errors`` turns a ``ValueError`` into ``gr.Error``
with the same sentence) and ``controls`` (values read from controls, their choices, an event's outputs). A page-load
handler shared by every session is ``explorer.state.openings.cached_opening``.
"""
# Importable from the package as before (explorer/panels/generation.py and the tests import them from here).
from explorer.panels.controls import (  # noqa: F401
    as_index, as_number, as_whole, head_choices, layer_choices, outputs_of)
from explorer.panels.errors import no_paths, plain, short, shown, user_errors  # noqa: F401
