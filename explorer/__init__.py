"""Transformer Explorer: the app's panels, figures, probes and measurements around models/."""
