"""Pure figure builders: arrays in, plotly Figures out (no torch modules, no gradio)."""
