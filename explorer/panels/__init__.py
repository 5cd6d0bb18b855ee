"""One module per tab: build_<tab>(demo, state) lays out components and wires events."""
