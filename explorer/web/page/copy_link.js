// The header's "copy link to this view": the visible tab's settings (the event's inputs, in the order of `index`)
// written as a link with the page's model (the last input) and projector mode, copied where the browser allows it.
(...values) => {
  const model = values.pop();
  const index = $INDEX;
  const named = $NAMED;
  let tab = null;
  for (const id of Object.keys(index)) {
    const el = document.getElementById('tab-' + id);
    if (el && el.offsetParent !== null) { tab = id; break; }
  }
  const url = new URL(window.location.href);
  url.search = '';
  if (tab === null) return [url.toString()];
  url.searchParams.set('tab', tab);
  for (const [key, i] of Object.entries(index[tab])) {
    let v = values[i];
    if (v === null || v === undefined) continue;
    const byName = (named[tab] || {})[key];
    if (byName && byName[String(v)] !== undefined) v = byName[String(v)];
    url.searchParams.set(key, Array.isArray(v) ? v.join(',') : (typeof v === 'boolean' ? (v ? '1' : '0') : String(v)));
  }
  if (model && model !== 'default') url.searchParams.set('model', model);
  if (document.body.classList.contains('projector')) url.searchParams.set('present', '1');
  const link = url.toString();
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(link).catch(() => {});
  return [link];
}
