// The phone page of a class room (explorer/web/hall.py): the room's question, one button per choice, one small
// request per vote, and a long poll that comes back as soon as the teacher asks, reveals or ends. Everything
// from the server or the link is shown as text (textContent), never as markup.
(function () {
  'use strict';
  const VOTER_KEY = 'explorer-voter';
  const LETTERS = 'ABCDEF';
  const el = (id) => document.getElementById(id);
  const sleep = (ms) => new Promise((done) => setTimeout(done, ms));
  let code = '', seen = '', qid = null, choices = [], polling = false, memoryVoter = '';

  function fresh() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  }

  // One id per browser, random, nothing personal: a reload, a second tab or a second scan keeps it, so the
  // server changes this phone's vote instead of adding one. Without storage (some private modes) it lasts the page.
  function voterId() {
    try {
      let id = localStorage.getItem(VOTER_KEY);
      if (!id || !/^[A-Za-z0-9_-]{16,64}$/.test(id)) {
        id = fresh();
        localStorage.setItem(VOTER_KEY, id);
      }
      return id;
    } catch (e) {
      memoryVoter = memoryVoter || fresh();
      return memoryVoter;
    }
  }

  function say(text) { el('status').textContent = text; }

  function buttons(s) {
    const box = el('choices');
    const same = s.qid === qid && s.choices.length === choices.length && s.choices.every((c, i) => c === choices[i]);
    if (!same) {
      qid = s.qid;
      choices = s.choices.slice();
      box.textContent = '';
      choices.forEach((choice, i) => {
        const b = document.createElement('button');
        b.type = 'button';
        b.className = 'choice';
        b.id = 'choice-' + i;
        b.textContent = LETTERS[i] + '  ' + choice;
        b.addEventListener('click', () => vote(i));
        box.appendChild(b);
      });
    }
    Array.from(box.children).forEach((b, i) => {
      b.classList.toggle('mine', s.mine === i);
      b.classList.remove('sending');
      b.disabled = s.state !== 'question';
    });
  }

  function render(s) {
    if (s.state === 'question' || s.state === 'revealed') {
      el('join').hidden = true;
      el('question').textContent = s.text;
      buttons(s);
      seen = s.key;
    } else if (s.state === 'ended') {
      el('question').textContent = '';
      el('choices').textContent = '';
      qid = null;
      choices = [];
      seen = s.key;
    } else if (s.state === 'error' && !seen) {
      el('join').hidden = false;  // no room yet: the code is typed again
    }
    if (s.message) say(s.message);
  }

  async function ask(path, options) {
    const r = await fetch('vote/api/' + path, Object.assign({cache: 'no-store'}, options || {}));
    return r.json();
  }

  async function poll() {
    if (polling) return;
    polling = true;
    let backoff = 1000;
    while (code && seen && seen !== 'ended') {
      try {
        const q = new URLSearchParams({code: code, voter: voterId(), seen: seen, wait: '1'});
        const s = await ask('state?' + q.toString());
        render(s);
        backoff = 1000;
        if (s.state === 'error') break;
        if (s.retry) await sleep(s.retry * 1000);
      } catch (e) {
        say('Reconnecting…');
        await sleep(backoff);
        backoff = Math.min(2 * backoff, 10000);
      }
    }
    polling = false;
  }

  async function vote(i) {
    const b = el('choice-' + i);
    if (b) b.classList.add('sending');
    say('Sending your vote…');
    try {
      const s = await ask('vote', {method: 'POST', headers: {'content-type': 'application/json'},
        body: JSON.stringify({code: code, qid: qid, choice: i, voter: voterId()})});
      render(s);
    } catch (e) {
      if (b) b.classList.remove('sending');
      say('Your vote was not sent: check your connection and tap your answer again.');
    }
  }

  async function join(typed) {
    say('Opening the room…');
    try {
      const s = await ask('state?' + new URLSearchParams({code: typed, voter: voterId()}).toString());
      if (s.state === 'question' || s.state === 'revealed') {
        code = s.code;
        history.replaceState(null, '', '?code=' + encodeURIComponent(code));
      }
      render(s);
      if (code) poll();
    } catch (e) {
      el('join').hidden = false;
      say('The server could not be reached: check your connection and press Join again.');
    }
  }

  el('join').addEventListener('submit', (event) => {
    event.preventDefault();
    join(el('code').value);
  });
  const params = new URLSearchParams(window.location.search);
  const linked = params.get('code') || params.get('join') || '';
  if (linked) {
    join(linked);
  } else {
    el('join').hidden = false;
    say('Type the room code shown on the projector.');
  }
})();
