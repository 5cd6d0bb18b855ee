// After the server has read the step (its model loaded, its text computed): the step's tab opens with its settings
// and its figure is placed (link.js's window.explorerOpen); the address carries the page's model from now on.
(info) => {
  if (window.explorerLoaded) window.explorerLoaded();
  let step = {};
  try { step = JSON.parse(info || '{}'); } catch (e) { return; }
  if (!step.tab) return;
  window.explorerDeckStep = step;
  document.body.dataset.lessonStep = String(step.step);
  const url = new URL(window.location.href);
  const model = window.explorerPageModel ? window.explorerPageModel() : '';
  if (model && model !== 'default') url.searchParams.set('model', model);
  else url.searchParams.delete('model');
  history.replaceState(null, '', url.toString());
  if (window.explorerOpen) window.explorerOpen(step.tab, step.focus);
}
