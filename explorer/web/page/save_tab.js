// A tab's "⬇ PNG" / "⬇ SVG" button: every figure of the tab saved at slide size (plotly_wrappers.js).
async () => { if (window.explorerSaveTab) await window.explorerSaveTab($TAB_ID, $FORMAT); }
