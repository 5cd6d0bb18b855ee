// The deck's "Ask the class": the step's tab's own Ask the class (explorer/panels/vote.py), opened and pressed,
// on the settings the step has just set. A closed accordion may not hold its buttons yet: they are looked for
// again until it has drawn them.
(info) => {
  let step = {};
  try { step = JSON.parse(info || '{}'); } catch (e) { return; }
  const section = document.getElementById('ask-' + step.tab);
  if (!section) return;
  const toggle = section.querySelector('.label-wrap');
  const go = () => document.getElementById('ask-' + step.tab + '-go');
  const shown = go() && go().offsetParent !== null;
  if (toggle && !shown) toggle.click();
  let tries = 0;
  const press = () => {
    const button = go();
    if (button && button.offsetParent !== null) { button.click(); section.scrollIntoView({block: 'start'}); return; }
    if (++tries < 50) setTimeout(press, 100);
  };
  setTimeout(press, 100);
}
