// Run on page load: with ?lesson=<name> in the address, the page becomes a deck (deck.css shows its bar), the
// step of the address opens, and the arrow keys step through it (not while typing in a text box).
() => {
  const params = new URLSearchParams(window.location.search);
  if (!params.has('lesson')) return;
  document.body.classList.add('deck');
  const model = params.get('model');
  if (model && model !== 'default' && window.explorerLoading) window.explorerLoading(model);
  const typing = (el) => el && (el.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName));
  document.addEventListener('keydown', (e) => {
    if (e.altKey || e.ctrlKey || e.metaKey || typing(e.target) || typing(document.activeElement)) return;
    const id = {ArrowRight: 'lesson-next', PageDown: 'lesson-next', ArrowLeft: 'lesson-prev', PageUp: 'lesson-prev'}[e.key];
    const button = id && document.getElementById(id);
    if (!button) return;
    e.preventDefault();
    button.click();
  });
  const open = () => { const b = document.getElementById('lesson-open'); if (b) b.click(); else setTimeout(open, 100); };
  open();
}
