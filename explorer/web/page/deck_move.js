// The deck's Previous / Next: the step in the address moves by $BY (kept within the deck's $DECKS steps), then
// the step opens without reloading the page (the server reads the step from the address).
() => {
  const url = new URL(window.location.href);
  const n = ($DECKS)[url.searchParams.get('lesson')] || 1;
  const now = parseInt(url.searchParams.get('step') || '1', 10);
  const next = Math.min(n, Math.max(1, (Number.isFinite(now) ? now : 1) + $BY));
  if (next === now && url.searchParams.has('step')) return;
  url.searchParams.set('step', String(next));
  history.replaceState(null, '', url.toString());
  document.getElementById('lesson-open').click();
}
