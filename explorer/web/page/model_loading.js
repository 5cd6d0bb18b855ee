// Run on page load: the line that says a model is loading, at once and on whichever tab is in view, with the seconds
// counting ("Loading <model>… 4 s"), until the load ends (model_loaded.js). Text only, never markup.
() => {
  let timer = null;
  window.explorerLoading = (name) => {
    if (!name) return;
    let line = document.getElementById('model-loading');
    if (!line) {
      line = document.createElement('div');
      line.id = 'model-loading';
      line.setAttribute('role', 'status');
      document.body.appendChild(line);
    }
    const started = Date.now();
    const show = () => { line.textContent = `Loading ${String(name).slice(0, 80)}… ${Math.round((Date.now() - started) / 1000)} s`; };
    clearInterval(timer);
    show();
    line.hidden = false;
    document.body.dataset.loading = String(name).slice(0, 80);
    timer = setInterval(show, 1000);
  };
  window.explorerLoaded = () => {
    clearInterval(timer);
    const line = document.getElementById('model-loading');
    if (line) line.hidden = true;
    delete document.body.dataset.loading;
  };
}
