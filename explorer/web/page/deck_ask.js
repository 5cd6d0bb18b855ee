// The deck's "Ask the class": the step's tab's own Ask the class (explorer/panels/vote.py), opened and pressed,
// on the settings the step has just set.
(info) => {
  let step = {};
  try { step = JSON.parse(info || '{}'); } catch (e) { return; }
  const section = document.getElementById('ask-' + step.tab);
  const go = document.getElementById('ask-' + step.tab + '-go');
  if (!section || !go) return;
  const toggle = section.querySelector('.label-wrap');
  if (toggle && !toggle.classList.contains('open')) toggle.click();
  setTimeout(() => { go.click(); section.scrollIntoView({block: 'start'}); }, 300);
}
